#include "kvo/traces/simulator.hpp"

#include <algorithm>
#include <deque>
#include <numeric>
#include <string>

#include "kvo/reference/generator.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::traces {
namespace {

struct Request {
  std::int64_t id = 0;
  std::int64_t prompt = 0;
  std::int64_t output = 0;
  std::int64_t generated = 0;  ///< sampled output tokens
  std::int64_t computed = 0;   ///< tokens whose K/V is in the cache
  std::vector<std::int64_t> blocks;
  bool ever_ran = false;
  std::int64_t known() const { return prompt + generated; }  ///< tokens the engine knows
};

class Allocator {
 public:
  explicit Allocator(std::int64_t num_blocks) : refs_(static_cast<std::size_t>(num_blocks), 0) {
    for (std::int64_t b = 0; b < num_blocks; ++b) free_.push_back(b);
  }
  std::int64_t free_count() const { return static_cast<std::int64_t>(free_.size()); }
  std::int64_t allocate(SimStats& stats) {
    const std::int64_t b = free_.front();
    free_.pop_front();
    if (was_freed_.size() <= static_cast<std::size_t>(b)) was_freed_.resize(refs_.size(), false);
    if (was_freed_[static_cast<std::size_t>(b)]) ++stats.blocks_reused;
    refs_[static_cast<std::size_t>(b)] = 1;
    return b;
  }
  void share(std::int64_t b) { ++refs_[static_cast<std::size_t>(b)]; }
  void release(std::int64_t b) {
    if (--refs_[static_cast<std::size_t>(b)] == 0) {
      free_.push_back(b);  // LRU: reused after every block freed before it
      if (was_freed_.size() < refs_.size()) was_freed_.resize(refs_.size(), false);
      was_freed_[static_cast<std::size_t>(b)] = true;
    }
  }

 private:
  std::deque<std::int64_t> free_;
  std::vector<int> refs_;
  std::vector<bool> was_freed_;
};

void require(bool ok, const char* knob, std::int64_t value, const std::string& why) {
  if (!ok) throw spec::InvalidInput(knob, -1, std::to_string(value), why);
}

IntTensor int_tensor(spec::SlotType type, std::vector<std::int64_t> shape,
                     std::vector<std::int64_t> values) {
  IntTensor t;
  t.type = type;
  t.shape = std::move(shape);
  t.values = std::move(values);
  return t;
}

}  // namespace

Trace simulate(const SimOptions& o, SimStats* stats_out) {
  spec::validate(o.config);
  const spec::CacheGeometry& g = o.config.geometry;
  const std::int64_t bs = g.block_size;
  require(o.steps >= 1 && o.steps <= 1000000, "steps", o.steps, "expected in [1, 1000000]");
  require(o.max_batch >= 1, "max-batch", o.max_batch, "expected >= 1");
  require(o.mtp >= 0 && o.mtp <= 16, "mtp", o.mtp, "expected in [0, 16]");
  require(o.token_budget >= 1 + o.mtp, "token-budget", o.token_budget,
          "expected >= 1 + mtp = " + std::to_string(1 + o.mtp));
  require(o.prompt_min >= 1 && o.prompt_min <= o.prompt_max, "prompt-min", o.prompt_min,
          "expected in [1, prompt-max = " + std::to_string(o.prompt_max) + "]");
  require(o.output_min >= 1 && o.output_min <= o.output_max, "output-min", o.output_min,
          "expected in [1, output-max = " + std::to_string(o.output_max) + "]");
  require(o.arrival_percent <= 100, "arrival-percent", o.arrival_percent, "expected <= 100");
  require(o.prefix_share_percent <= 100, "prefix-share-percent", o.prefix_share_percent,
          "expected <= 100");
  const std::int64_t longest = o.prompt_max + o.output_max + o.mtp;
  require(longest <= g.capacity(), "num_blocks", g.num_blocks,
          "the longest request (prompt-max + output-max + mtp = " + std::to_string(longest) +
              " tokens) must fit the cache's " + std::to_string(g.capacity()) + " slots");
  for (std::size_t i = 0; i < o.capture_sizes.size(); ++i) {
    require(o.capture_sizes[i] >= 1 && (i == 0 || o.capture_sizes[i] > o.capture_sizes[i - 1]),
            "capture-sizes", o.capture_sizes[i], "expected positive and increasing");
  }

  reference::SplitMix64 rng(reference::mix64(o.seed ^ 0x74726163ull));
  SimStats stats;
  Allocator alloc(g.num_blocks);
  std::vector<Request> running;
  std::deque<Request> waiting;
  std::int64_t next_id = 0;
  // The index cache of separate_index_slots engines is managed apart: a fixed block permutation.
  std::vector<std::int64_t> index_perm(static_cast<std::size_t>(g.num_blocks));
  std::iota(index_perm.begin(), index_perm.end(), 0);
  for (std::size_t i = index_perm.size(); i > 1; --i) {
    std::swap(
        index_perm[i - 1],
        index_perm[static_cast<std::size_t>(rng.uniform(0, static_cast<std::int64_t>(i) - 1))]);
  }
  const spec::SlotType slot_type = o.config.slot_type;

  Trace trace;
  trace.config = o.config;
  trace.engine = "kvoracle-sim";
  trace.engine_version = "1";
  const std::int64_t nscale = o.config.kv.per_head_scale ? g.num_kv_heads : 1;
  // KV scales from their own stream (the schedule does not depend on them): arbitrary values in
  // (0, 16], where divide and mul_recip may round differently.
  reference::SplitMix64 scale_rng(reference::mix64(o.seed ^ 0x7363616Cull));
  for (auto* scales : {&trace.k_scale, &trace.v_scale}) {
    scales->clear();
    for (std::int64_t i = 0; i < nscale; ++i) {
      scales->push_back(static_cast<float>(scale_rng.uniform(1, 1 << 20)) / 65536.0f);
    }
  }

  const auto preempt = [&](Request& r) {
    for (std::int64_t b : r.blocks) alloc.release(b);
    r.blocks.clear();
    r.computed = 0;  // recompute: every known token is prefilled again
    ++stats.preemptions;
  };
  const auto blocks_for = [bs](std::int64_t tokens) { return (tokens + bs - 1) / bs; };

  while (static_cast<std::int64_t>(trace.steps.size()) < o.steps) {
    for (int a = 0; a < 2; ++a) {
      if (rng.chance(o.arrival_percent, 100) || (running.empty() && waiting.empty())) {
        Request r;
        r.id = next_id++;
        r.prompt = rng.uniform(o.prompt_min, o.prompt_max);
        r.output = rng.uniform(o.output_min, o.output_max);
        waiting.push_back(std::move(r));
      }
    }
    struct Sched {
      std::int64_t id;
      std::int64_t start;  ///< first position written
      std::int64_t q;
    };
    std::vector<Sched> sched;
    std::int64_t budget = o.token_budget;
    bool preempted_now = false;
    // Running requests first, oldest first; a victim is always the newest, not yet scheduled.
    for (std::size_t i = 0; i < running.size() && budget > 0;) {
      Request& r = running[i];
      std::int64_t q = r.known() - r.computed;
      const bool decode = q == 1;
      if (decode) q += o.mtp;
      if (decode && q > budget) break;
      q = std::min(q, budget);
      const std::int64_t need = blocks_for(r.computed + q);
      bool self_preempted = false;
      while (static_cast<std::int64_t>(r.blocks.size()) + alloc.free_count() < need) {
        Request& victim = running.back();
        preempt(victim);
        preempted_now = true;
        waiting.push_front(std::move(victim));
        running.pop_back();
        if (running.size() == i) {
          self_preempted = true;
          break;
        }
      }
      if (self_preempted) break;
      Request& rr = running[i];
      while (static_cast<std::int64_t>(rr.blocks.size()) < need) {
        rr.blocks.push_back(alloc.allocate(stats));
      }
      sched.push_back({rr.id, rr.computed, q});
      budget -= q;
      ++i;
    }
    // Then waiting requests (recomputes first: they were pushed to the front), FIFO.
    while (!waiting.empty() && !preempted_now && budget > 0 &&
           static_cast<std::int64_t>(running.size()) < o.max_batch) {
      Request& r = waiting.front();
      std::vector<std::int64_t> shared;
      if (!r.ever_ran && !running.empty() && rng.chance(o.prefix_share_percent, 100)) {
        const Request& donor = running[static_cast<std::size_t>(
            rng.uniform(0, static_cast<std::int64_t>(running.size()) - 1))];
        // Only blocks the donor has filled and will never write again, and leaving the new
        // request at least one prompt token to compute.
        const std::int64_t k = std::min(donor.computed / bs, (r.prompt - 1) / bs);
        if (k > 0) shared.assign(donor.blocks.begin(), donor.blocks.begin() + k);
      }
      const std::int64_t computed = static_cast<std::int64_t>(shared.size()) * bs;
      const std::int64_t q = std::min(r.known() - computed, budget);
      const std::int64_t need = blocks_for(computed + q) - static_cast<std::int64_t>(shared.size());
      if (alloc.free_count() < need) break;
      for (std::int64_t b : shared) alloc.share(b);
      stats.shared_blocks += static_cast<std::int64_t>(shared.size());
      r.blocks = shared;
      r.computed = computed;
      for (std::int64_t j = 0; j < need; ++j) r.blocks.push_back(alloc.allocate(stats));
      if (!r.ever_ran) ++stats.requests_admitted;
      r.ever_ran = true;
      sched.push_back({r.id, r.computed, q});
      budget -= q;
      running.push_back(std::move(r));
      waiting.pop_front();
    }

    // The step's tensors, in scheduling order.
    TraceStep st;
    const auto batch = static_cast<std::int64_t>(sched.size());
    std::int64_t max_blocks = 0;
    const auto find = [&](std::int64_t id) -> Request& {
      return *std::find_if(running.begin(), running.end(),
                           [id](const Request& r) { return r.id == id; });
    };
    for (const Sched& s : sched) {
      max_blocks =
          std::max<std::int64_t>(max_blocks, static_cast<std::int64_t>(find(s.id).blocks.size()));
    }
    std::vector<std::int64_t> slots, table(static_cast<std::size_t>(batch * max_blocks), 0),
        seq_lens, starts{0}, q_lens, ids;
    for (std::int64_t b = 0; b < batch; ++b) {
      const Sched& s = sched[static_cast<std::size_t>(b)];
      const Request& r = find(s.id);
      for (std::int64_t p = s.start; p < s.start + s.q; ++p) {
        slots.push_back(r.blocks[static_cast<std::size_t>(p / bs)] * bs + p % bs);
      }
      std::copy(r.blocks.begin(), r.blocks.end(),
                table.begin() + static_cast<std::ptrdiff_t>(b * max_blocks));
      seq_lens.push_back(s.start + s.q);
      starts.push_back(starts.back() + s.q);
      q_lens.push_back(s.q);
      ids.push_back(s.id);
    }
    const auto real = static_cast<std::int64_t>(slots.size());
    if (!o.capture_sizes.empty() && real <= o.capture_sizes.back()) {
      const std::int64_t padded = *std::lower_bound(o.capture_sizes.begin(), o.capture_sizes.end(),
                                                    std::max<std::int64_t>(real, 1));
      if (padded > real) ++stats.padded_steps;
      slots.resize(static_cast<std::size_t>(padded), -1);
    }
    if (o.config.separate_index_slots) {
      std::vector<std::int64_t> idx;
      for (std::int64_t s : slots) {
        idx.push_back(s < 0 ? s : index_perm[static_cast<std::size_t>(s / bs)] * bs + s % bs);
      }
      st.index_slot_mapping = int_tensor(slot_type, {static_cast<std::int64_t>(idx.size())}, idx);
    }
    st.slot_mapping = int_tensor(slot_type, {static_cast<std::int64_t>(slots.size())}, slots);
    st.block_table = int_tensor(spec::SlotType::kI32, {batch, max_blocks}, std::move(table));
    st.seq_lens = int_tensor(spec::SlotType::kI32, {batch}, seq_lens);
    if (o.query_lens_form) {
      st.query_lens = int_tensor(spec::SlotType::kI32, {batch}, q_lens);
    } else {
      st.query_start_loc = int_tensor(spec::SlotType::kI32, {batch + 1}, starts);
    }
    st.request_ids = int_tensor(spec::SlotType::kI64, {batch}, ids);
    trace.steps.push_back(std::move(st));

    // Advance: a request whose known tokens are all computed samples 1 (+ accepted drafts).
    for (const Sched& s : sched) {
      Request& r = find(s.id);
      const bool decode = s.q == 1 + o.mtp && s.start + 1 == r.known();
      if (decode) {
        const std::int64_t accepted = rng.uniform(0, o.mtp);
        stats.rejected_drafts += o.mtp - accepted;
        r.computed = s.start + 1 + accepted;
        r.generated += 1 + accepted;
      } else {
        r.computed = s.start + s.q;
        if (r.computed == r.known()) {
          r.generated += 1;
        } else {
          ++stats.chunked_prefills;
        }
      }
    }
    for (std::size_t i = 0; i < running.size();) {
      if (running[i].generated >= running[i].output) {
        for (std::int64_t b : running[i].blocks) alloc.release(b);
        ++stats.requests_finished;
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  if (stats_out) *stats_out = stats;
  return trace;
}

}  // namespace kvo::traces
