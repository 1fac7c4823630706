#include "kvo/oracle/explain.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "kvo/oracle/cache_diff.hpp"
#include "kvo/oracle/read_diff.hpp"
#include "kvo/oracle/read_judge.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"

namespace kvo::oracle {
namespace {

constexpr std::size_t kSamples = 12;
constexpr std::int64_t kPictureBlocks = 16;
constexpr std::int64_t kPictureWidth = 64;

/// Slot -> the token whose bytes must be there (the last one that maps to it).
std::map<std::int64_t, std::int64_t> targets(const spec::ModelConfig& c,
                                             const spec::SlotMapping& m) {
  std::map<std::int64_t, std::int64_t> out;
  for (std::size_t t = 0; t < m.slots.size(); ++t) {
    std::int64_t s = m.slots[t];
    if (s < 0) s = c.slot_mode == spec::SlotMode::kLegacyWrap ? s + c.geometry.capacity() : -1;
    if (s >= 0) out[s] = static_cast<std::int64_t>(t);
  }
  return out;
}

/// The picture of one buffer: one row per block involved, one character per offset.
void picture(std::ostringstream& s, const reference::PagedCacheLayout& layout,
             const spec::CacheBuffer& expected, const spec::CacheBuffer& actual,
             const std::map<std::int64_t, std::int64_t>& target) {
  const std::int64_t bs = layout.config().geometry.block_size;
  std::set<std::int64_t> differ;
  for (std::int64_t byte = 0; byte < expected.body_bytes(); ++byte) {
    if (expected.body()[byte] != actual.body()[byte]) {
      const auto c = layout.locate(expected.kind, byte);
      differ.insert(c->block * bs + c->offset);
    }
  }
  std::set<std::int64_t> blocks;
  for (std::int64_t slot : differ) blocks.insert(slot / bs);
  for (const auto& [slot, token] : target) blocks.insert(slot / bs);
  s << "  buffer " << spec::name_of(expected.kind) << ": " << differ.size() << " slots differ; "
    << "o written as expected, X targeted but wrong, ! not targeted but changed, . untouched\n";
  std::int64_t shown = 0;
  for (std::int64_t b : blocks) {
    if (shown++ == kPictureBlocks) {
      s << "    ... " << blocks.size() - static_cast<std::size_t>(kPictureBlocks)
        << " more blocks\n";
      break;
    }
    for (std::int64_t start = 0; start < bs; start += kPictureWidth) {
      s << "    block " << b << " [" << start << ".." << std::min(bs, start + kPictureWidth) - 1
        << "] ";
      for (std::int64_t o = start; o < std::min(bs, start + kPictureWidth); ++o) {
        const std::int64_t slot = b * bs + o;
        const bool targeted = target.count(slot) != 0, wrong = differ.count(slot) != 0;
        s << (targeted ? (wrong ? 'X' : 'o') : (wrong ? '!' : '.'));
      }
      s << "\n";
    }
  }
}

std::string explain_write(const CheckOptions& o, std::uint64_t seed, WriteSubject& subject,
                          spec::Outcome& outcome) {
  const WriteCase wc = make_write_case(seed, o.overrides);
  const reference::PagedCacheLayout layout(wc.config);
  std::vector<spec::LayerCaches> expected = reference::make_model_caches(layout);
  std::vector<spec::LayerCaches> actual = expected;
  std::ostringstream s;
  s << "case seed " << std::hex << "0x" << seed << std::dec << ": " << wc.describe() << "\nsubject "
    << subject.name() << ", op write\n";
  for (std::size_t r = 0; r < wc.requests.size(); ++r) {
    s << "  request " << r << ": context " << wc.requests[r].context << ", " << wc.requests[r].q_len
      << " new tokens, blocks";
    for (std::int64_t b : wc.requests[r].block_table) s << " " << b;
    s << "\n";
  }
  s << "  slot_mapping:";
  for (std::int64_t slot : wc.writes.front().slots.slots) s << " " << slot;
  s << "\n";
  try {
    for (std::size_t l = 0; l < wc.writes.size(); ++l) {
      reference::write_layer(wc.config, wc.writes[l], expected[l]);
      subject.write_layer(wc.config, wc.writes[l], actual[l]);
    }
  } catch (const std::exception& e) {
    outcome = dynamic_cast<const spec::InvalidInput*>(&e) ? spec::Outcome::kInvalidInput
                                                          : spec::Outcome::kFailedToRun;
    s << "the subject did not complete: " << e.what() << "\n";
    return s.str();
  }
  CacheDiff all;
  std::vector<CacheDiff> per_layer;
  for (std::size_t l = 0; l < wc.writes.size(); ++l) {
    per_layer.push_back(diff_layer_caches(layout, static_cast<std::int64_t>(l), expected[l],
                                          actual[l], &wc.writes[l], kSamples));
    all.merge(per_layer.back());
  }
  outcome = all.equal() ? spec::Outcome::kPass : spec::Outcome::kMismatch;
  s << all.report() << "\n";
  for (std::size_t l = 0; l < wc.writes.size(); ++l) {
    if (per_layer[l].equal()) continue;
    s << "layer " << l << " (" << spec::name_of(wc.writes[l].kind) << "):\n";
    for (const spec::CacheBuffer& e : expected[l].buffers) {
      const spec::CacheBuffer& a = *actual[l].find(e.kind);
      if (e.storage == a.storage) continue;
      const spec::SlotMapping& m =
          e.kind == spec::BufferKind::kIndexK && wc.config.separate_index_slots
              ? wc.writes[l].index_slots
              : wc.writes[l].slots;
      picture(s, layout, e, a, targets(wc.config, m));
    }
  }
  s << "first differing elements:\n";
  for (std::size_t i = 0; i < std::min(kSamples, all.samples.size()); ++i)
    s << "  " << all.samples[i].describe() << "\n";
  return s.str();
}

std::string explain_read(const CheckOptions& o, std::uint64_t seed, ReadSubject& subject,
                         const std::string& op, spec::Outcome& outcome) {
  const ReadCase rc = make_read_case(seed, effective_read_overrides(o));
  std::ostringstream s;
  s << "case seed 0x" << std::hex << seed << std::dec << ": " << rc.describe() << "\nsubject "
    << subject.name() << " ("
    << (subject.ordering() == reference::Ordering::kCanonical ? "canonical: exact"
                                                              : "foreign: bounded, tie-aware")
    << "), op " << op << "\n";
  for (std::int64_t q = 0, rq = 0; rq < rc.batch.num_requests(); ++rq) {
    s << "  request " << rq << ": seq_len " << rc.batch.seq_lens[static_cast<std::size_t>(rq)]
      << ", queries "
      << rc.batch.query_start_loc[static_cast<std::size_t>(rq + 1)] -
             rc.batch.query_start_loc[static_cast<std::size_t>(rq)]
      << " (rows from " << q << ")\n";
    q = rc.batch.query_start_loc[static_cast<std::size_t>(rq + 1)];
  }
  ReadExpectation expected(rc);
  const ReadVerdict v =
      judge_read(subject, op == "indexer" ? ReadOp::kIndexer : ReadOp::kAttention, expected);
  outcome = v.outcome;
  if (v.outcome == spec::Outcome::kPass || v.outcome == spec::Outcome::kMismatch) {
    s << v.report << "\n";
  } else {
    s << "the subject did not complete: " << v.report << "\n";
  }
  return s.str();
}

}  // namespace

Explanation explain_case(const CheckOptions& o, std::uint64_t seed, const std::string& name,
                         const std::string& op, std::vector<std::unique_ptr<WriteSubject>>& writes,
                         std::vector<std::unique_ptr<ReadSubject>>& reads) {
  Explanation ex;
  if (op == "write") {
    for (auto& s : writes) {
      if (s->name() == name) {
        ex.text = explain_write(o, seed, *s, ex.outcome);
        return ex;
      }
    }
  } else if (op == "indexer" || op == "attention") {
    for (auto& s : reads) {
      if (s->name() == name) {
        ex.text = explain_read(o, seed, *s, op, ex.outcome);
        return ex;
      }
    }
  } else {
    throw spec::InvalidInput("ops", -1, op, "explain takes one op: write, indexer or attention");
  }
  throw spec::InvalidInput("subject", -1, name, "no " + op + " subject of that name");
}

}  // namespace kvo::oracle
