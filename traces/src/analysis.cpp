#include "kvo/traces/analysis.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace kvo::traces {
namespace {

class Collector {
 public:
  Collector(TraceValidation& out, std::size_t limit) : out_(out), limit_(limit) {}
  void add(std::int64_t step, const char* part, std::int64_t index, std::int64_t value,
           std::string what) {
    ++out_.count;
    if (out_.problems.size() < limit_) {
      out_.problems.push_back(
          {step, "step." + std::to_string(step) + "." + part, index, value, std::move(what)});
    }
  }

 private:
  TraceValidation& out_;
  std::size_t limit_;
};

/// Range, duplicate and tail checks of one slot mapping of a step; `real` entries are tokens.
void check_slots(const spec::ModelConfig& c, std::int64_t s, const char* part,
                 const std::vector<std::int64_t>& slots, std::int64_t real, Collector& out) {
  const std::int64_t cap = c.geometry.capacity();
  std::unordered_map<std::int64_t, std::int64_t> first;
  first.reserve(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::int64_t v = slots[i];
    const auto idx = static_cast<std::int64_t>(i);
    if (v >= cap) {
      out.add(s, part, idx, v,
              "out of range: past the cache's " + std::to_string(cap) + " slots (" +
                  std::to_string(c.geometry.num_blocks) + " blocks of " +
                  std::to_string(c.geometry.block_size) + ")");
      continue;
    }
    if (v < 0) {
      if (c.slot_mode == spec::SlotMode::kLegacyWrap && v < -cap) {
        out.add(s, part, idx, v, "out of range: below -capacity " + std::to_string(-cap));
      } else if (c.slot_mode == spec::SlotMode::kStrict && idx < real) {
        out.add(s, part, idx, v,
                "padding slot inside the step's tokens (first " + std::to_string(real) +
                    " entries); padding belongs in the tail");
      }
      continue;
    }
    if (idx >= real) {
      out.add(s, part, idx, v,
              "a real slot in the padding tail (entries " + std::to_string(real) +
                  " and later belong to no request and must be negative)");
    }
    const auto [it, inserted] = first.emplace(v, idx);
    if (!inserted) {
      out.add(s, part, idx, v,
              "duplicate slot: entry " + std::to_string(it->second) + " writes it too");
    }
  }
}

}  // namespace

std::string TraceProblem::describe() const {
  return "step " + std::to_string(step) + ": " + tensor + "[" + std::to_string(index) +
         "] = " + std::to_string(value) + ": " + what;
}

TraceValidation validate_trace(const Trace& t, std::size_t limit) {
  TraceValidation v;
  Collector out(v, limit);
  const spec::ModelConfig& c = t.config;
  const std::int64_t bs = c.geometry.block_size;
  const std::int64_t nb = c.geometry.num_blocks;
  for (std::size_t si = 0; si < t.steps.size(); ++si) {
    const auto s = static_cast<std::int64_t>(si);
    const TraceStep& st = t.steps[si];
    const std::vector<std::int64_t> starts = st.starts();
    const std::int64_t real = starts.back();
    const std::int64_t width = st.block_table.dim(1);
    // Block-table entries in use (those covering seq_len) must name a block of the cache.
    for (std::int64_t b = 0; b < st.batch(); ++b) {
      const std::int64_t seq = st.seq_lens.values[static_cast<std::size_t>(b)];
      const std::int64_t used = seq / bs + (seq % bs != 0 ? 1 : 0);
      for (std::int64_t j = 0; j < used; ++j) {
        const std::int64_t e = st.block_table.values[static_cast<std::size_t>(b * width + j)];
        if (e < 0 || e >= nb) {
          out.add(s, "block_table", b * width + j, e,
                  "request " + std::to_string(b) + "'s block " + std::to_string(j) +
                      " is past the cache (expected in [0, " + std::to_string(nb) + ") for the " +
                      std::to_string(used) + " blocks of seq_len " + std::to_string(seq) + ")");
        }
      }
    }
    check_slots(c, s, "slot_mapping", st.slot_mapping.values, real, out);
    if (st.index_slot_mapping) {
      check_slots(c, s, "index_slot_mapping", st.index_slot_mapping->values, real, out);
      for (std::size_t i = 0; i < st.slot_mapping.values.size(); ++i) {
        const std::int64_t a = st.slot_mapping.values[i];
        const std::int64_t x = st.index_slot_mapping->values[i];
        if ((a < 0) != (x < 0)) {
          out.add(s, "index_slot_mapping", static_cast<std::int64_t>(i), x,
                  "padding disagrees with slot_mapping (= " + std::to_string(a) + ")");
        }
      }
    }
    // Each real token's slot must be its position's slot in its request's block table.
    for (std::int64_t b = 0; b < st.batch(); ++b) {
      const auto bi = static_cast<std::size_t>(b);
      const std::int64_t q = starts[bi + 1] - starts[bi];
      const std::int64_t seq = st.seq_lens.values[bi];
      const std::int64_t used = seq / bs + (seq % bs != 0 ? 1 : 0);
      const auto row = st.block_table.values.begin() + static_cast<std::ptrdiff_t>(b * width);
      for (std::int64_t j = 0; j < q; ++j) {
        const std::int64_t idx = starts[bi] + j;
        const std::int64_t slot = st.slot_mapping.values[static_cast<std::size_t>(idx)];
        if (slot < 0 || slot >= c.geometry.capacity()) continue;  // reported above
        const std::int64_t p = seq - q + j;
        const std::int64_t expect_block = *(row + p / bs);
        if (expect_block < 0 || expect_block >= nb) continue;  // reported above
        const std::int64_t expect = expect_block * bs + p % bs;
        if (slot == expect) continue;
        const bool in_row = std::find(row, row + used, slot / bs) != row + used;
        out.add(s, "slot_mapping", idx, slot,
                std::string(in_row ? "disagrees with" : "outside") + " request " +
                    std::to_string(b) + " (id " + std::to_string(st.request_id(b)) +
                    ")'s block table: position " + std::to_string(p) + " maps to block " +
                    std::to_string(expect_block) + " offset " + std::to_string(p % bs) + ", slot " +
                    std::to_string(expect));
      }
    }
  }
  return v;
}

TraceInfo trace_info(const Trace& t) {
  TraceInfo info;
  const std::int64_t bs = t.config.geometry.block_size;
  info.steps = static_cast<std::int64_t>(t.steps.size());
  std::unordered_set<std::int64_t> ids;
  double frag_sum = 0;
  std::int64_t frag_steps = 0, neighbours = 0, apart = 0;
  for (const TraceStep& st : t.steps) {
    const std::vector<std::int64_t> starts = st.starts();
    const std::int64_t real = starts.back();
    info.tokens += real;
    info.slot_entries += st.tokens();
    for (std::int64_t i = real; i < st.tokens(); ++i) {
      if (st.slot_mapping.values[static_cast<std::size_t>(i)] < 0) ++info.padding;
    }
    info.max_batch = std::max(info.max_batch, st.batch());
    info.max_step_tokens = std::max(info.max_step_tokens, real);
    std::int64_t q0 = -1;
    bool uniform = st.batch() > 0;
    std::unordered_set<std::int64_t> blocks;
    std::int64_t used_slots = 0;
    const std::int64_t width = st.block_table.dim(1);
    for (std::int64_t b = 0; b < st.batch(); ++b) {
      const auto bi = static_cast<std::size_t>(b);
      ids.insert(st.request_id(b));
      const std::int64_t q = starts[bi + 1] - starts[bi];
      if (q0 < 0) q0 = q;
      uniform = uniform && q == q0;
      const std::int64_t seq = st.seq_lens.values[bi];
      info.longest_sequence = std::max(info.longest_sequence, seq);
      const std::int64_t used = seq / bs + (seq % bs != 0 ? 1 : 0);
      for (std::int64_t j = 0; j < used; ++j) {
        const std::int64_t e = st.block_table.values[static_cast<std::size_t>(b * width + j)];
        blocks.insert(e);
        if (j > 0) {
          ++neighbours;
          const auto prev = static_cast<std::uint64_t>(
              st.block_table.values[static_cast<std::size_t>(b * width + j - 1)]);
          if (static_cast<std::uint64_t>(e) != prev + 1) ++apart;
        }
      }
      used_slots += seq;
    }
    if (uniform && q0 <= 8) {
      ++info.decode_steps;
      if (q0 > 1) ++info.multi_token_decode_steps;
    }
    info.max_blocks_in_use =
        std::max(info.max_blocks_in_use, static_cast<std::int64_t>(blocks.size()));
    // Shared prefix blocks count once in `blocks` but once per sharer in used_slots: clamp.
    const auto held = static_cast<std::int64_t>(blocks.size()) * bs;
    if (held > 0) {
      frag_sum += static_cast<double>(std::max<std::int64_t>(held - used_slots, 0)) /
                  static_cast<double>(held);
      ++frag_steps;
    }
  }
  info.requests = static_cast<std::int64_t>(ids.size());
  info.internal_fragmentation = frag_steps ? frag_sum / static_cast<double>(frag_steps) : 0.0;
  info.scatter = neighbours ? static_cast<double>(apart) / static_cast<double>(neighbours) : 0.0;
  return info;
}

std::string TraceInfo::report(const spec::ModelConfig& c) const {
  std::ostringstream s;
  char pct[64];
  s << "model: " << spec::describe(c) << "\n";
  s << "steps: " << steps << " (" << decode_steps << " decode-only, " << multi_token_decode_steps
    << " with q_len > 1)\n";
  s << "tokens: " << tokens << " written, " << slot_entries << " slot entries\n";
  std::snprintf(pct, sizeof pct, "%.2f%%", 100.0 * padding_share());
  s << "padding: " << padding << " entries (" << pct << " of slot entries)\n";
  s << "requests: " << requests << ", largest batch " << max_batch << ", most tokens in a step "
    << max_step_tokens << "\n";
  s << "longest sequence: " << longest_sequence << " tokens\n";
  std::snprintf(pct, sizeof pct, "%.2f%%", 100.0 * internal_fragmentation);
  s << "fragmentation: " << pct << " of the slots of blocks in use are empty (mean over steps); ";
  std::snprintf(pct, sizeof pct, "%.2f%%", 100.0 * scatter);
  s << pct << " of block-table neighbours are not adjacent blocks\n";
  s << "blocks in use: at most " << max_blocks_in_use << " of " << c.geometry.num_blocks << "\n";
  return s.str();
}

}  // namespace kvo::traces
