// The read ops (SPEC 5-6): the indexer with block top-k, and sparse attention over the reference's
// selection (so an indexer bug does not mask an attention one), handed to it in the case's order
// (SPEC 6). Both draw the same read case from a seed, so the campaign prepares it once for both;
// judge_read applies the subject's ordering (and, for foreign attention, its arithmetic profile or
// --profile). Attention's mode for mode detection (SPEC 7) is that profile: one answer judged
// exactly and under every profile's bound;
// the indexer's are kIndexerModeAxes (index_nan, index_score_scale, index_neg_inf): one answer
// judged against the reference's selection of the case under each combination, and under each
// declared order and layout (judged-only axes: detection names a foreign indexer's form).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <sstream>
#include <utility>

#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/read_judge.hpp"
#include "kvo/oracle/resident_reads.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "op_drivers.hpp"

namespace kvo::oracle {
namespace {

std::string hex_byte(std::uint8_t b) {
  constexpr char kDigits[] = "0123456789abcdef";
  return {kDigits[b >> 4], kDigits[b & 15]};
}

struct ReadPrepared final : PreparedCase {
  /// `answerer`: a reference tier's, which answers the selection and the exact output (null: the
  /// CPU reference).
  ReadPrepared(ReadCase c, std::optional<spec::AttentionProfile> p, Subject* answerer = nullptr)
      : rc(std::move(c)), profile(p) {
    expectation.emplace(rc, false, answerer);
  }
  /// A case for the device (its values deferred): its expectation comes when the tier answers it
  /// there (ReadDriver::judge_on_device).
  struct Deferred {};
  ReadPrepared(ReadCase c, std::optional<spec::AttentionProfile> p, Deferred)
      : rc(std::move(c)), profile(p) {}
  std::uint64_t seed() const override { return rc.seed; }
  std::string describe() const override { return rc.describe(); }

  ReadCase rc;
  /// Refers to rc: never moved after construction. Set but on a deferred case until judged.
  std::optional<ReadExpectation> expectation;
  /// A deferred case's copies as they start (found by the worker that drew it; taken when judged).
  std::optional<ResidentRead::Plan> plan;
  /// Answers the read conditions ask more than once, found once (kv_read_end, index_read_end,
  /// ties_at_cut).
  struct TiesAtCut {
    bool straddles = false, wider_than_16 = false;
  };
  mutable std::optional<std::pair<std::int64_t, std::int64_t>> kv_read_end_memo;
  mutable std::optional<std::int64_t> index_read_end_memo;
  mutable std::optional<TiesAtCut> ties_memo;
  std::optional<spec::AttentionProfile> profile;  ///< --profile: foreign attention judged under it
};

/// The values of attention's mode axis "profile", tightest first: bit for bit, then the profiles
/// by increasing bound (tests/oracle/test_attention_modes.cpp checks the bounds are nested in this
/// order on random cases: fp16's P and operand roundings are finer than bf16's).
inline constexpr std::array<spec::AttentionProfile, 3> kProfilesByLooseness{
    spec::AttentionProfile::kFp32, spec::AttentionProfile::kFp16P, spec::AttentionProfile::kBf16P};
constexpr std::string_view kExact = "exact";

/// A foreign or canonical subject's attention output on one case, judged under any value of the
/// profile axis: 0 exact (bit for bit), i >= 1 the bound of kProfilesByLooseness[i - 1].
class AttentionAnswer final : public CapturedAnswer {
 public:
  explicit AttentionAnswer(ReadPrepared& c) : c_(c) {}
  Verdict judge_under(const ModeChoice& choice) override {
    const std::size_t value = choice.at(0);
    const AttentionDiff d = diff_attention_output(
        *c_.expectation, out,
        value == 0 ? std::nullopt
                   : std::optional<spec::AttentionProfile>(kProfilesByLooseness.at(value - 1)));
    return {d.pass() ? spec::Outcome::kPass : spec::Outcome::kMismatch,
            d.report(),
            0,
            0,
            nullptr,
            d.pass() ? "" : "attention output differs"};
  }

  spec::HostTensor out;  ///< [Tq, nq, hd] in the case's output dtype

 private:
  ReadPrepared& c_;
};

/// The indexer's mode axes, in ModeChoice order (each value in its name table's order, the
/// contract's default first): the one table mode_axes, pin_modes and IndexerAnswer read.
/// index_group is not among them: it sets the output's width, so a subject is told it and never
/// detected in it; index-Q's type is an input, not a mode of the answer.
struct IndexerModeAxis {
  const char* name;
  std::size_t values;
  std::optional<std::size_t> (*overridden)(const ReadOverrides&);
  void (*set)(spec::IndexerParams&, std::size_t value);
};

template <class E, std::optional<E> ReadOverrides::*kField, E spec::IndexerParams::*kParam>
constexpr IndexerModeAxis indexer_axis() {
  return {spec::EnumInfo<E>::kNoun.data(), spec::EnumInfo<E>::kNames.size(),
          [](const ReadOverrides& o) -> std::optional<std::size_t> {
            if (!(o.*kField)) return std::nullopt;
            return static_cast<std::size_t>(*(o.*kField));
          },
          [](spec::IndexerParams& p, std::size_t v) {
            p.*kParam = spec::EnumInfo<E>::kNames.at(v).value;
          }};
}

constexpr std::array kIndexerModeAxes{
    indexer_axis<spec::IndexNan, &ReadOverrides::index_nan, &spec::IndexerParams::index_nan>(),
    indexer_axis<spec::IndexScoreScale, &ReadOverrides::index_score_scale,
                 &spec::IndexerParams::score_scale>(),
    indexer_axis<spec::IndexNegInf, &ReadOverrides::index_neg_inf, &spec::IndexerParams::neg_inf>(),
};

/// The declared-form axes detection adds after kIndexerModeAxes: the rows' order (the two orders
/// engines emit; `unordered` is implied by either and left out) and their layout. They change how
/// an answer is judged, never the case, and the subject is told neither.
constexpr std::array kDetectedTopkOrders{spec::TopkOrder::kAscendingIds,
                                         spec::TopkOrder::kDescendingScore};

constexpr std::size_t kIndexerModeCombinations = [] {
  std::size_t n = 1;
  for (const IndexerModeAxis& a : kIndexerModeAxes) n *= a.values;
  return n;
}();

/// An indexer's ids on one case, judged under any combination of the indexer's modes: the case
/// with those modes, its reference selection (and score truth, for a foreign subject) computed once
/// per combination, the ids diffed by the subject's ordering and top-k order.
class IndexerAnswer final : public CapturedAnswer {
 public:
  IndexerAnswer(const ReadCase& c, spec::Ordering ordering, int key_bits)
      : c_(c), ordering_(ordering), key_bits_(key_bits) {}
  Verdict judge_under(const ModeChoice& choice) override {
    std::size_t at = 0;
    for (std::size_t a = 0; a < kIndexerModeAxes.size(); ++a)
      at = at * kIndexerModeAxes[a].values + choice.at(a);
    Variant& v = variants_[at];
    if (!v.expectation) {
      v.rc = std::make_unique<ReadCase>(c_);
      for (std::size_t a = 0; a < kIndexerModeAxes.size(); ++a)
        kIndexerModeAxes[a].set(v.rc->indexer, choice.at(a));
      v.expectation = std::make_unique<ReadExpectation>(*v.rc);
    }
    ReadExpectation& e = *v.expectation;
    const std::size_t form_at = kIndexerModeAxes.size();
    TopkForm form;
    form.order = kDetectedTopkOrders.at(choice.at(form_at));
    form.layout = spec::EnumInfo<spec::TopkLayout>::kNames.at(choice.at(form_at + 1)).value;
    form.key_bits = key_bits_;
    const TopkDiff d = diff_topk_declared(
        e.selection(),
        ordering_ == spec::Ordering::kCanonical ? nullptr : &e.score_truth(ordering_),
        v.rc->indexer, ids, ordering_, form);
    return {d.equal() ? spec::Outcome::kPass : spec::Outcome::kMismatch,
            d.report(),
            d.differing,
            0,
            nullptr,
            d.equal() ? "" : "top-k ids differ"};
  }

  std::vector<std::int32_t> ids;  ///< [Tq, nkv, spec::selection_width]

 private:
  struct Variant {
    std::unique_ptr<ReadCase> rc;  ///< the expectation refers to it: never moved
    std::unique_ptr<ReadExpectation> expectation;
  };
  const ReadCase& c_;
  spec::Ordering ordering_;
  int key_bits_;  ///< the subject's declared key precision (not detected: it only loosens)
  std::array<Variant, kIndexerModeCombinations> variants_;
};

/// The dimensions a read case shares with the write side (--block-size, --head-dim, --num-kv-heads,
/// --index-dim, --kv-dtype, --layout, --index-layout, --index-dtype): `f(write member, read
/// member)` for each, the one table both directions below use.
template <class F>
void for_each_shared_dimension(F&& f) {
  f(&CaseOverrides::block_size, &ReadOverrides::block_size);
  f(&CaseOverrides::num_kv_heads, &ReadOverrides::num_kv_heads);
  f(&CaseOverrides::head_dim, &ReadOverrides::head_dim);
  f(&CaseOverrides::index_dim, &ReadOverrides::index_dim);
  f(&CaseOverrides::kv_dtype, &ReadOverrides::kv_dtype);
  f(&CaseOverrides::layout, &ReadOverrides::layout);
  f(&CaseOverrides::index_layout, &ReadOverrides::index_layout);
  f(&CaseOverrides::index_dtype, &ReadOverrides::index_dtype);
  f(&CaseOverrides::kv_strides, &ReadOverrides::kv_strides);
  f(&CaseOverrides::index_strides, &ReadOverrides::index_strides);
}

/// The read overrides, the shared dimensions taken from the write overrides where the read ones
/// leave them open.
ReadOverrides effective_read(const Overrides& o) {
  ReadOverrides r = o.read;
  for_each_shared_dimension([&](auto w, auto rd) {
    if (!(r.*rd)) r.*rd = o.write.*w;
  });
  return r;
}

/// The write overrides with the shared dimensions fixed on the read side only (a C++ caller's
/// ReadOverrides): their flags are the write side's, so the reproduce line carries them.
CaseOverrides shared_as_write(const Overrides& o) {
  CaseOverrides w = o.write;
  for_each_shared_dimension([&](auto wr, auto r) {
    if (!(w.*wr)) w.*wr = o.read.*r;
  });
  return w;
}

/// Per (query row, KV head, lane) of a selection: how many valid blocks tie at the k_eff-th score,
/// and how many of them the top-k keeps. `f(tied, kept, k_eff)` for each.
template <class F>
void for_each_cut(const reference::TopkSelection& s, std::int64_t topk, F&& f) {
  std::vector<float> v, order;  // one row's scores; reused row after row
  for (std::int64_t q = 0; q < s.num_queries; ++q) {
    const std::int64_t n_valid = s.n_valid[static_cast<std::size_t>(q)];
    const std::int64_t k_eff = std::min(topk, n_valid);
    if (k_eff == 0) continue;
    for (std::int64_t g = 0; g < s.num_kv_heads; ++g) {
      for (std::int64_t l = 0; l < s.lanes; ++l) {
        v.clear();
        for (std::int64_t j = 0; j < n_valid; ++j) v.push_back(s.score(q, g, j, l));
        // The k_eff-th largest score (no full sort: rows run to thousands of blocks).
        order.assign(v.begin(), v.end());
        std::nth_element(order.begin(), order.begin() + (k_eff - 1), order.end(), std::greater<>());
        const float cut = order[static_cast<std::size_t>(k_eff - 1)];
        const auto above = std::count_if(v.begin(), v.end(), [&](float x) { return x > cut; });
        const auto tied = std::count(v.begin(), v.end(), cut);
        f(tied, k_eff - above, k_eff);
      }
    }
  }
}

/// Which read ops a rare condition matters to.
enum class ReadOps : std::uint8_t { kIndexer, kBoth, kAttention };

/// Whether some row (q, g) of the selection handed to attention satisfies `f(row ids, n_valid)`.
template <class F>
bool any_attended_row(const ReadPrepared& c, F&& f) {
  const reference::TopkSelection& s = *c.expectation->attended();
  for (std::int64_t q = 0; q < s.num_queries; ++q) {
    for (std::int64_t g = 0; g < s.num_kv_heads; ++g) {
      const auto at = s.ids.begin() + (q * s.num_kv_heads + g) * s.topk;
      if (f(std::vector<std::int32_t>(at, at + s.topk), s.n_valid[static_cast<std::size_t>(q)]))
        return true;
    }
  }
  return false;
}

/// The physical pages a read of the case touches. The indexer: every block of a request with query
/// rows (its last row reads [0, n_valid) of them all). Attention: the pages of the logical blocks
/// its selection names below n_valid (dense attention: those of the indexer).
std::vector<std::int64_t> pages_read(const ReadPrepared& c, spec::Op op) {
  const spec::ReadBatch& b = c.rc.batch;
  const std::int64_t bs = c.rc.config.geometry.block_size;
  const reference::TopkSelection* s =
      op == spec::Op::kAttention ? c.expectation->attended() : nullptr;
  std::vector<std::int64_t> pages;
  // Each page once: a prefill request's rows select the same blocks over and over.
  std::vector<std::uint8_t> seen(static_cast<std::size_t>(c.rc.config.geometry.num_blocks), 0);
  const auto page = [&](std::int64_t r, std::int64_t token) {
    const std::int64_t p = b.block_table[static_cast<std::size_t>(r * b.max_blocks + token / bs)];
    if (p >= 0 && p < static_cast<std::int64_t>(seen.size())) {
      if (seen[static_cast<std::size_t>(p)]) return;
      seen[static_cast<std::size_t>(p)] = 1;
    }
    pages.push_back(p);
  };
  for (std::int64_t r = 0; r < b.num_requests(); ++r) {
    const auto first = static_cast<std::size_t>(r);
    const std::int64_t seq = b.seq_lens[first];
    if (seq == 0 || b.query_start_loc[first + 1] == b.query_start_loc[first]) continue;
    if (s == nullptr) {
      for (std::int64_t t = 0; t < seq; t += bs) page(r, t);
      continue;
    }
    const std::int64_t sb = c.rc.indexer.sparse_block;
    for (std::int64_t q = b.query_start_loc[first]; q < b.query_start_loc[first + 1]; ++q) {
      const std::int64_t n_valid = s->n_valid[static_cast<std::size_t>(q)];
      const std::int64_t pos_end = std::min(seq, n_valid * sb);  // tokens the row may see
      for (std::int64_t k = 0; k < s->num_kv_heads * s->topk; ++k) {
        const std::int32_t id = s->ids[static_cast<std::size_t>(q * s->num_kv_heads * s->topk + k)];
        if (id < 0 || id >= n_valid) continue;
        const std::int64_t last = std::min(pos_end, (id + std::int64_t{1}) * sb) - 1;
        for (std::int64_t t = id * sb; t <= last; t += bs) page(r, t);
        page(r, last);
      }
    }
  }
  return pages;
}

/// One past the last K/V element a read of the case touches, and the byte after it (found once a
/// case: three conditions ask).
std::pair<std::int64_t, std::int64_t> kv_read_end(const ReadPrepared& c) {
  if (c.kv_read_end_memo) return *c.kv_read_end_memo;
  const spec::ModelConfig& cfg = c.rc.config;
  const spec::CacheGeometry& g = cfg.geometry;
  std::int64_t end = 0;
  for (const std::int64_t p : pages_read(c, spec::Op::kAttention)) {
    for (int kv = 0; kv < 2; ++kv) {
      end = std::max(end, reference::kv_element(cfg, kv, p, g.block_size - 1, g.num_kv_heads - 1,
                                                g.head_dim - 1) +
                              1);
    }
  }
  c.kv_read_end_memo.emplace(
      end, end * static_cast<std::int64_t>(spec::dtype_bytes(cfg.kv.cache_dtype)));
  return *c.kv_read_end_memo;
}

/// One past the last index-K byte (value or scale) the indexer reads.
std::int64_t index_read_end(const ReadPrepared& c) {
  if (c.index_read_end_memo) return *c.index_read_end_memo;
  const spec::ModelConfig& cfg = c.rc.config;
  const spec::CacheGeometry& g = cfg.geometry;
  const bool block_scale = cfg.index.layout == spec::IndexLayout::kBlockScale;
  const std::int64_t value_bytes =
      block_scale ? 1 : static_cast<std::int64_t>(spec::dtype_bytes(cfg.index.flat_dtype));
  std::int64_t end = 0;
  for (const std::int64_t p : pages_read(c, spec::Op::kIndexer)) {
    end = std::max(
        end, reference::index_value_byte(cfg, p, g.block_size - 1, g.index_dim - 1) + value_bytes);
    if (block_scale) {
      end = std::max(end, reference::index_scale_byte(cfg, p, g.block_size - 1,
                                                      g.index_dim / spec::kScaleGroup - 1) +
                              4);
    }
  }
  return c.index_read_end_memo.emplace(end);
}

/// The width of MiniMax-M3's selection rows (SPEC 5's default topk): a tie wider than this at the
/// cut is one a 16-wide top-k must break by the rule.
constexpr std::int64_t kWideTie = 16;

/// The ties at each selection row's cut (found once a case: two conditions ask).
const ReadPrepared::TiesAtCut& ties_at_cut(const ReadPrepared& c) {
  if (c.ties_memo) return *c.ties_memo;
  ReadPrepared::TiesAtCut t;
  for_each_cut(c.expectation->selection(), c.rc.indexer.topk,
               [&](std::int64_t tied, std::int64_t kept, std::int64_t) {
                 t.straddles |= tied > kept;
                 // A tie a 16-wide top-k (MiniMax-M3's) must break, whatever the case's topk.
                 t.wider_than_16 |= tied > kWideTie && tied > kept;
               });
  return c.ties_memo.emplace(t);
}

/// The read side's rare conditions (issue 14): the one table conditions() and reached() read.
struct ReadCondition {
  CaseCondition info;
  bool (*reached)(const ReadPrepared&);
  ReadOps ops = ReadOps::kIndexer;
};

const std::array<ReadCondition, 23> kReadConditions{{
    {{"kv_bytes_past_2_31", "a K/V read past byte 2^31 of its buffer (int32 byte offsets wrap)"},
     [](const ReadPrepared& c) { return kv_read_end(c).second > (std::int64_t{1} << 31); },
     ReadOps::kAttention},
    {{"kv_bytes_past_2_32", "a K/V read past byte 2^32 of its buffer (uint32 byte offsets wrap)"},
     [](const ReadPrepared& c) { return kv_read_end(c).second > (std::int64_t{1} << 32); },
     ReadOps::kAttention},
    {{"kv_elements_past_2_31", "a K/V read past element 2^31 (int32 element offsets wrap)"},
     [](const ReadPrepared& c) { return kv_read_end(c).first > (std::int64_t{1} << 31); },
     ReadOps::kAttention},
    {{"index_bytes_past_2_31", "an index-K read past byte 2^31 of its buffer"},
     [](const ReadPrepared& c) { return index_read_end(c) > (std::int64_t{1} << 31); }},
    {{"index_bytes_past_2_32", "an index-K read past byte 2^32 of its buffer"},
     [](const ReadPrepared& c) { return index_read_end(c) > (std::int64_t{1} << 32); }},
    {{"strided_cache", "K/V caches read as strided views (padding between blocks, tokens, heads)"},
     [](const ReadPrepared& c) { return !c.rc.config.kv_strides.dense(); },
     ReadOps::kAttention},
    {{"strided_index_cache", "the index-K cache read as a strided view (padded rows or blocks)"},
     [](const ReadPrepared& c) { return !c.rc.config.index_strides.dense(); }},
    {{"padded_row", "a request with seq_len 0 (its rows all -1, attention +0)"},
     [](const ReadPrepared& c) {
       return std::count(c.rc.batch.seq_lens.begin(), c.rc.batch.seq_lens.end(), 0) > 0;
     },
     ReadOps::kBoth},
    {{"prefill_rows", "a request with several query rows (MTP or prefill)"},
     [](const ReadPrepared& c) {
       const auto& s = c.rc.batch.query_start_loc;
       for (std::size_t r = 1; r < s.size(); ++r)
         if (s[r] - s[r - 1] > 1) return true;
       return false;
     },
     ReadOps::kBoth},
    {{"tie_straddles_cut", "blocks tied at the k_eff-th score, some kept and some not"},
     [](const ReadPrepared& c) { return ties_at_cut(c).straddles; }},
    {{"tie_wider_than_16", "more than 16 blocks tied at the cut, some kept and some not"},
     [](const ReadPrepared& c) { return ties_at_cut(c).wider_than_16; }},
    {{"neg_inf_block", "a valid block whose score is -inf"},
     [](const ReadPrepared& c) {
       const reference::TopkSelection& s = c.expectation->selection();
       for (std::int64_t q = 0; q < s.num_queries; ++q)
         for (std::int64_t g = 0; g < s.num_kv_heads; ++g)
           for (std::int64_t l = 0; l < s.lanes; ++l)
             for (std::int64_t j = 0; j < s.n_valid[static_cast<std::size_t>(q)]; ++j)
               if (s.score(q, g, j, l) == -INFINITY) return true;
       return false;
     }},
    {{"union_lanes", "index_group union over several index heads per KV head"},
     [](const ReadPrepared& c) { return c.expectation->selection().lanes > 1; }},
    {{"e4m3_index_q", "fp8 index-Q"},
     [](const ReadPrepared& c) { return c.rc.indexer.index_q_type == spec::IndexQType::kFp8E4m3; }},
    {{"gqa_16", "16 or more query heads per KV head"},
     [](const ReadPrepared& c) {
       return c.rc.attention.num_q_heads / c.rc.config.geometry.num_kv_heads >= 16;
     },
     ReadOps::kBoth},
    {{"fp8_kv", "an fp8 K/V cache read with its scales"},
     [](const ReadPrepared& c) { return spec::is_fp8(c.rc.config.kv.cache_dtype); },
     ReadOps::kBoth},
    {{"block_ids_past_1024", "a row with more than 1024 logical blocks (top-k's long path)"},
     [](const ReadPrepared& c) {
       const auto& n = c.expectation->selection().n_valid;
       return std::any_of(n.begin(), n.end(), [](std::int64_t v) { return v > 1024; });
     },
     ReadOps::kBoth},
    {{"selection_2048_tokens",
      "a top-2048 token selection cut inside a longer row (DeepSeek-V3.2's index_topk)"},
     [](const ReadPrepared& c) {
       const auto& n = c.expectation->selection().n_valid;
       const std::int64_t topk = c.rc.indexer.topk;
       return topk * c.rc.indexer.sparse_block >= kTokenSelection &&
              std::any_of(n.begin(), n.end(), [&](std::int64_t v) { return v > topk; });
     },
     ReadOps::kBoth},
    {{"block_ids_past_4096", "a row with more than 4096 logical blocks"},
     [](const ReadPrepared& c) {
       const auto& n = c.expectation->selection().n_valid;
       return std::any_of(n.begin(), n.end(), [](std::int64_t v) { return v > 4096; });
     },
     ReadOps::kBoth},
    {{"selection_unordered", "a selection row handed to attention with its ids not ascending"},
     [](const ReadPrepared& c) {
       return any_attended_row(c, [](std::vector<std::int32_t> row, std::int64_t) {
         std::erase_if(row, [](std::int32_t id) { return id < 0; });
         return !std::is_sorted(row.begin(), row.end());
       });
     },
     ReadOps::kAttention},
    {{"selection_16_wide_minus_one_first",
      "a selection row 16 wide or wider that starts with -1 entries before a selected block "
      "(vllm#48364's leading masked entries)"},
     [](const ReadPrepared& c) {
       return any_attended_row(c, [](const std::vector<std::int32_t>& row, std::int64_t n_valid) {
         return row.size() >= static_cast<std::size_t>(kWideTie) && row.front() < 0 &&
                std::any_of(row.begin(), row.end(),
                            [&](std::int32_t id) { return id >= 0 && id < n_valid; });
       });
     },
     ReadOps::kAttention},
    {{"selection_minus_one_first", "a selection row with -1 before a selected block"},
     [](const ReadPrepared& c) {
       return any_attended_row(c, [](const std::vector<std::int32_t>& row, std::int64_t n_valid) {
         const auto minus = std::find_if(row.begin(), row.end(), [](auto id) { return id < 0; });
         return std::any_of(minus, row.end(),
                            [&](std::int32_t id) { return id >= 0 && id < n_valid; });
       });
     },
     ReadOps::kAttention},
    {{"selection_past_n_valid", "a selection row holding ids past n_valid (masked)"},
     [](const ReadPrepared& c) {
       return any_attended_row(c, [](const std::vector<std::int32_t>& row, std::int64_t n_valid) {
         return n_valid > 0 &&
                std::any_of(row.begin(), row.end(), [&](std::int32_t id) { return id >= n_valid; });
       });
     },
     ReadOps::kAttention},
}};

/// The rows of kReadConditions that matter to op `op`.
struct ConditionsOf {
  spec::Op op;
  bool operator()(const ReadCondition& c) const {
    return c.ops == ReadOps::kBoth || (c.ops == ReadOps::kIndexer) == (op == spec::Op::kIndexer);
  }
};

class ReadDriver final : public OpDriver {
 public:
  explicit ReadDriver(spec::Op op) : op_(op) {}
  spec::Op op() const override { return op_; }
  std::string_view case_kind() const override { return "read"; }

  std::unique_ptr<PreparedCase> prepare(std::uint64_t seed, const Overrides& o,
                                        Subject* answerer) const override {
    const ReadOverrides r = effective_read(o);
    return std::make_unique<ReadPrepared>(make_read_case(seed, r), r.profile, answerer);
  }
  bool answers_through_tier() const override { return true; }

  Verdict judge(Subject& subject, PreparedCase& pc) const override {
    auto& rp = static_cast<ReadPrepared&>(pc);
    const ReadVerdict r = judge_read(subject, op_, *rp.expectation, rp.profile);
    return {r.outcome, r.report, 0, 0, nullptr, r.failure_class, r.blind_spots};
  }

  void ready_to_judge(const Subject& subject, PreparedCase& pc) const override {
    auto& rp = static_cast<ReadPrepared&>(pc);
    if (subject.ordering() == spec::Ordering::kCanonical) {
      if (op_ == spec::Op::kAttention) rp.expectation->exact();
    } else if (op_ == spec::Op::kIndexer) {
      rp.expectation->score_truth(subject.ordering());
    } else if (profile_override_problem(subject, rp.profile).empty()) {
      rp.expectation->attention_truth(subject.ordering(),
                                      rp.profile.value_or(subject.attention_profile()));
    }
  }

  /// The tier answers the whole read case, whichever of its ops asks: its selection (ids, n_valid
  /// and block scores, bit for bit), then its exact output over the CPU reference's selection
  /// handed to attention.
  Verdict judge_answerer(Subject& answerer, PreparedCase& pc) const override {
    auto& rp = static_cast<ReadPrepared&>(pc);
    Verdict v;
    v.outcome = run_guarded(
        [&] {
          v.report =
              diff_selection_exact(rp.expectation->selection(), answerer.indexer_selection(rp.rc));
          if (!v.report.empty()) {
            v.report = "the selection: " + v.report;
            return spec::Outcome::kMismatch;
          }
          const AttentionDiff d = diff_attention_exact(
              rp.expectation->exact(), answerer.attention(rp.rc, rp.expectation->attended()));
          v.report = "the attention output: " + d.report();
          return d.pass() ? spec::Outcome::kPass : spec::Outcome::kMismatch;
        },
        v.report);
    return v;
  }

  // The GPU tier's resident path (resident_reads.hpp): a read case drawn without its values, its
  // layer generated and written on the device, the tier's answerer reading one copy and the
  // canonical subjects the other, through their device reads.
  bool runs_on_device(const Subject& subject) const override {
    return ResidentRead::unavailable(subject, op_).empty();
  }
  bool device_heavy(const PreparedCase& pc) const override {
    const auto& rp = static_cast<const ReadPrepared&>(pc);
    return !(rp.plan ? rp.plan->whole : ResidentRead::plan(rp.rc).whole);
  }
  std::unique_ptr<PreparedCase> prepare_for_device(std::uint64_t seed,
                                                   const Overrides& o) const override {
    const ReadOverrides r = effective_read(o);
    auto c = std::make_unique<ReadPrepared>(make_read_case(seed, r, CaseValues::kDeferred),
                                            r.profile, ReadPrepared::Deferred{});
    c->plan = ResidentRead::plan(c->rc);
    return c;
  }
  bool conditions_before_device() const override { return false; }

  /// The tier's answerer gives the case's expectation from copy 0 (its selection with the scores,
  /// its exact output over the selection handed to attention), then each row's subject is judged
  /// on copy 1 as judge judges it, and copy 1 is compared with copy 0 (a read that changed its
  /// caches fails to run). The tier reads on a thread of its own (ResidentRead::side_thread, its
  /// own stream) while the rows' subjects read here, their answers asked ahead (ReadsAhead) and
  /// judged after: the indexers side by side, then the attentions over the selection the tier's
  /// indexer gave.
  std::vector<Verdict> judge_on_device(PreparedCase& pc, Subject& answerer,
                                       const std::vector<DeviceRow>& rows) const override {
    auto& rp = static_cast<ReadPrepared&>(pc);
    ResidentRead device(
        rp.rc, rp.plan ? *std::exchange(rp.plan, std::nullopt) : ResidentRead::plan(rp.rc));
    const std::unique_ptr<Subject> tier = device.reader(answerer, 0, /*own_stream=*/true);
    std::vector<std::unique_ptr<Subject>> readers;  // per row: its subject reading copy 1
    std::vector<std::unique_ptr<ReadsAhead>> ahead;
    for (const DeviceRow& row : rows) {
      readers.push_back(device.reader(*row.subject, 1));
      ahead.push_back(std::make_unique<ReadsAhead>(*readers.back()));
    }
    const auto ask_ahead = [&](spec::Op op, const reference::TopkSelection* attended) {
      for (std::size_t i = 0; i < rows.size(); ++i) {
        if (rows[i].op != op) continue;
        if (op == spec::Op::kIndexer) ahead[i]->indexer_ahead(rp.rc);
        if (op == spec::Op::kAttention) ahead[i]->attention_ahead(rp.rc, attended);
      }
    };
    device.synchronize();
    OneThread& side = ResidentRead::side_thread();
    rp.expectation.emplace(rp.rc,
                           side.beside([&] { return tier->indexer_selection(rp.rc); },
                                       [&] { ask_ahead(spec::Op::kIndexer, nullptr); }),
                           [&](const reference::TopkSelection& attended) {
                             return side.beside(
                                 [&] { return tier->attention(rp.rc, &attended); },
                                 [&] { ask_ahead(spec::Op::kAttention, &attended); });
                           });
    const auto judge_row = [&](Subject& reader, const DeviceRow& row) {
      const ReadVerdict r = judge_read(reader, row.op, *rp.expectation, rp.profile);
      return Verdict{r.outcome, r.report, 0, 0, nullptr, r.failure_class, r.blind_spots};
    };
    std::vector<Verdict> out;
    for (std::size_t i = 0; i < rows.size(); ++i) out.push_back(judge_row(*ahead[i], rows[i]));
    // Copy 1 compared once after every row's reads; where it changed, each row runs again on a
    // restored copy, compared after it, to name the reads that change their caches.
    if (device.compare().count == 0) return out;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      device.resync();
      out[i] = judge_row(*device.reader(*rows[i].subject, 1), rows[i]);
      const LayerDifference d = device.compare();
      if (d.count == 0) continue;
      out[i].outcome = spec::Outcome::kFailedToRun;
      out[i].report =
          "failed to run: a read changed its caches on the device: " +
          (d.buffer < 0 ? std::string("a margin outside every buffer")
                        : std::string(spec::name_of(
                              rp.rc.caches.buffers[static_cast<std::size_t>(d.buffer)].kind))) +
          " byte " + std::to_string(d.byte) + " of its storage (" + std::to_string(d.count) +
          " bytes differ)";
    }
    return out;
  }

  /// The resident path's trust chain on a case the CPU reference answered: the layer the device
  /// wrote (every byte of its buffers; of a huge cache's, the pages the reference holds) and the
  /// tier's answer read from it (judge_answerer) against the reference's.
  std::string check_on_device(PreparedCase& pc, Subject& answerer) const override {
    auto& rp = static_cast<ReadPrepared&>(pc);
    ResidentRead device(rp.rc);
    const reference::PagedCacheLayout layout(rp.rc.config);
    spec::LayerCaches got = make_layer_caches(layout, 0, spec::LayerKind::kSparse, /*lazy=*/true,
                                              /*hold_guards=*/false);
    std::vector<BufferBytes> ranges;
    for (std::size_t b = 0; b < rp.rc.caches.buffers.size(); ++b) {
      const spec::ByteStorage& st = rp.rc.caches.buffers[b].storage;
      const auto index = static_cast<std::int32_t>(b);
      if (!st.is_lazy()) {
        ranges.push_back({index, 0, st.size()});
        continue;
      }
      for (const spec::ByteRange& r : st.materialised())
        ranges.push_back({index, r.first, r.second});
    }
    device.download(ranges, got);
    for (std::size_t b = 0; b < got.buffers.size(); ++b) {
      const spec::CacheBuffer& want = rp.rc.caches.buffers[b];
      const spec::ByteStorage& have = got.buffers[b].storage;
      if (want.storage.same_as(have)) continue;
      for (const auto& [from, to] : want.storage.compare_ranges(have)) {
        for (std::int64_t j = from; j < to; ++j) {
          if (want.storage.byte(j) == have.byte(j)) continue;
          return "the canonical fused write of the read case on the device (rows generated "
                 "there) disagrees with the CPU reference's on " +
                 rp.describe() + ": " + std::string(spec::name_of(want.kind)) + " byte " +
                 std::to_string(j - want.guard_bytes) + " of its body: device 0x" +
                 hex_byte(have.byte(j)) + ", reference 0x" + hex_byte(want.storage.byte(j));
        }
      }
    }
    const std::unique_ptr<Subject> tier = device.reader(answerer, 0);
    const Verdict v = judge_answerer(*tier, pc);
    if (v.outcome == spec::Outcome::kPass) return {};
    return "the read answerer " + answerer.name() +
           " reading on the device (the layer written there) disagrees with the CPU reference (" +
           std::string(spec::name_of(v.outcome)) + ") on " + rp.describe() + "\n" + v.report;
  }

  Verdict explain(Subject& subject, PreparedCase& pc) const override {
    const ReadCase& rc = static_cast<ReadPrepared&>(pc).rc;
    std::ostringstream s;
    explain_header(s, pc, subject, op_);
    for (std::int64_t q = 0, rq = 0; rq < rc.batch.num_requests(); ++rq) {
      const auto at = static_cast<std::size_t>(rq);
      s << "  request " << rq << ": seq_len " << rc.batch.seq_lens[at] << ", queries "
        << rc.batch.query_start_loc[at + 1] - rc.batch.query_start_loc[at] << " (rows from " << q
        << ")\n";
      q = rc.batch.query_start_loc[at + 1];
    }
    Verdict v = judge(subject, pc);
    explain_verdict(s, v);
    v.report = s.str();
    return v;
  }

  std::vector<Reduction> reductions() const override {
    using W = CaseOverrides;
    using R = ReadOverrides;
    std::vector<Reduction> r;
    r.push_back(set_override("one request", &Overrides::read, &R::requests, std::int64_t{1}));
    for (std::int64_t s : {2, 8, 32})
      r.push_back(set_override("shorter sequences", &Overrides::read, &R::max_seq_len, s));
    r.push_back(set_override("one KV head", &Overrides::write, &W::num_kv_heads, std::int64_t{1}));
    r.push_back(set_override("one query head per KV head", &Overrides::read, &R::group_size,
                             std::int64_t{1}));
    r.push_back(set_override("one index head per KV head", &Overrides::read, &R::index_heads_per_kv,
                             std::int64_t{1}));
    r.push_back(set_override("head_dim 8", &Overrides::write, &W::head_dim, std::int64_t{8}));
    for (std::int64_t k : {1, 2})
      r.push_back(set_override("smaller k", &Overrides::read, &R::topk, k));
    for (std::int64_t sb : {1, 2, 4})
      r.push_back(set_override("smaller blocks", &Overrides::read, &R::sparse_block, sb));
    r.push_back(set_override("pages of 1", &Overrides::write, &W::block_size, std::int64_t{1}));
    r.push_back(set_override("no adversarial values", &Overrides::read, &R::adversarial, false));
    return r;
  }

  std::string flags(const Overrides& o) const override {
    return shared_as_write(o).to_flags() + o.read.to_flags();
  }

  // Coverage: the indexer's and attention's cases are the same read case: one table for both,
  // each op reading the conditions that matter to it.
  std::vector<CaseCondition> conditions() const override {
    return table_conditions(kReadConditions, ConditionsOf{op_});
  }
  std::vector<bool> reached(const PreparedCase& pc) const override {
    return table_reached(kReadConditions, static_cast<const ReadPrepared&>(pc), ConditionsOf{op_});
  }

  // Mode detection: attention has one axis, the arithmetic profile (exact first); the indexer
  // kIndexerModeAxes (SPEC 5; the contract's defaults first).
  std::vector<ModeAxis> mode_axes() const override {
    if (op_ == spec::Op::kIndexer) {
      ModeAxis order{"topk_order", {}};
      for (const spec::TopkOrder o : kDetectedTopkOrders)
        order.values.emplace_back(spec::name_of(o));
      return {names_axis<spec::IndexNan>("index_nan"),
              names_axis<spec::IndexScoreScale>("index_score_scale"),
              names_axis<spec::IndexNegInf>("index_neg_inf"), order,
              names_axis<spec::TopkLayout>("topk_layout")};
    }
    ModeAxis axis{"profile", {std::string(kExact)}};
    for (spec::AttentionProfile p : kProfilesByLooseness)
      axis.values.emplace_back(spec::name_of(p));
    return {axis};
  }

  /// Attention: the overrides as given, the profile pinned to --profile, else the
  /// subject-independent default fp32 (the profile changes how an answer is judged, never what a
  /// subject is asked). The indexer: its modes pinned to the overrides', else the defaults, and the
  /// case drawn with them (the subject is told them in its params).
  Overrides pin_modes(const Overrides& o, ModeChoice& pinned) const override {
    pinned.clear();
    if (op_ == spec::Op::kIndexer) {
      Overrides p = o;
      p.read.index_nan = o.read.index_nan.value_or(spec::IndexNan::kSkip);
      p.read.index_score_scale = o.read.index_score_scale.value_or(spec::IndexScoreScale::kOne);
      p.read.index_neg_inf = o.read.index_neg_inf.value_or(spec::IndexNegInf::kKeep);
      for (const IndexerModeAxis& a : kIndexerModeAxes) pinned.push_back(*a.overridden(p.read));
      return p;
    }
    const spec::AttentionProfile p = o.read.profile.value_or(spec::AttentionProfile::kFp32);
    const auto at = std::find(kProfilesByLooseness.begin(), kProfilesByLooseness.end(), p);
    pinned.push_back(1 + static_cast<std::size_t>(at - kProfilesByLooseness.begin()));
    return o;
  }

  std::unique_ptr<CapturedAnswer> capture(Subject& subject, PreparedCase& pc) const override {
    auto& rp = static_cast<ReadPrepared&>(pc);
    if (op_ == spec::Op::kIndexer) {
      auto answer =
          std::make_unique<IndexerAnswer>(rp.rc, subject.ordering(), subject.topk_form().key_bits);
      answer->run_outcome = run_guarded(
          [&] {
            answer->ids = subject.indexer(rp.rc);
            return spec::Outcome::kPass;
          },
          answer->run_error);
      return answer;
    }
    auto answer = std::make_unique<AttentionAnswer>(rp);
    answer->run_outcome = run_guarded(
        [&] {
          answer->out = subject.attention(rp.rc, rp.expectation->attended());
          return spec::Outcome::kPass;
        },
        answer->run_error);
    return answer;
  }

  // Case file (the same inputs for both ops): metadata the configuration, requests (B),
  // max_blocks, queries (Tq), num_index_heads (nih), num_q_heads (nq), sparse_block, topk,
  // init_blocks, local_blocks, index_nan, index_score_scale, index_group, index_neg_inf, index_q,
  // sm_scale, out_dtype and attention_width (W); tensors input.block_table [B, max_blocks] I32,
  // input.seq_lens [B] and input.query_start_loc [B + 1] I64, input.index_q [Tq, nih, index_dim]
  // (act dtype, or e4m3 under index_q e4m3) and input.q [Tq, nq, hd] (act dtype),
  // input.attention_selection [Tq, nkv, W] I32 (SPEC 6: the reference's ids in the case's order,
  // -1 and ids past n_valid anywhere), input.k_scale, input.v_scale [1 or nkv] F32 and
  // cache.<buffer> (the sparse layer, written). Expected and result: the indexer's topk_ids
  // [Tq, nkv, topk * lanes] I32 (ids ascending, then -1), attention's out [Tq, nq, hd]
  // (out_dtype) over input.attention_selection.

  void encode_case(PreparedCase& pc, TensorWriter& out) const override {
    auto& rp = static_cast<ReadPrepared&>(pc);
    const ReadCase& rc = rp.rc;
    spec::Metadata& m = out.metadata();
    spec::write_config(rc.config, m);
    const auto text = [](std::int64_t v) { return std::to_string(v); };
    m["requests"] = text(rc.batch.num_requests());
    m["max_blocks"] = text(rc.batch.max_blocks);
    m["queries"] = text(rc.batch.num_queries());
    m["num_index_heads"] = text(rc.indexer.num_index_heads);
    m["num_q_heads"] = text(rc.attention.num_q_heads);
    m["sparse_block"] = text(rc.indexer.sparse_block);
    m["topk"] = text(rc.indexer.topk);
    m["init_blocks"] = text(rc.indexer.init_blocks);
    m["local_blocks"] = text(rc.indexer.local_blocks);
    m["index_nan"] = spec::name_of(rc.indexer.index_nan);
    m["index_score_scale"] = spec::name_of(rc.indexer.score_scale);
    m["index_group"] = spec::name_of(rc.indexer.index_group);
    m["index_neg_inf"] = spec::name_of(rc.indexer.neg_inf);
    m["index_q"] = spec::name_of(rc.indexer.index_q_type);
    m["sm_scale"] = spec::floats_text(std::vector<float>{rc.attention.sm_scale});
    m["out_dtype"] = spec::name_of(rc.attention.out_dtype);
    out.put_i32("input.block_table", {rc.batch.num_requests(), rc.batch.max_blocks},
                rc.batch.block_table);
    out.put_i64("input.seq_lens", {rc.batch.num_requests()}, rc.batch.seq_lens);
    out.put_i64("input.query_start_loc", {rc.batch.num_requests() + 1}, rc.batch.query_start_loc);
    out.put_host("input.index_q", rc.index_q);
    out.put_host("input.q", rc.q);
    // SPEC 6: the selection attention is handed, as it was drawn (the indexer ignores it).
    const reference::TopkSelection& attended = *rp.expectation->attended();
    m["attention_width"] = text(attended.topk);
    out.put_i32("input.attention_selection",
                {rc.batch.num_queries(), rc.config.geometry.num_kv_heads, attended.topk},
                attended.ids);
    out.put_f32("input.k_scale", rc.k_scale);
    out.put_f32("input.v_scale", rc.v_scale);
    out.put_caches("cache.", rc.caches);
    const NamedTensor answer = reference_answer(rp);
    out.put("expected." + answer.name, answer.dtype, answer.shape, answer.bytes);
  }

  std::unique_ptr<PreparedCase> decode_case(TensorReader& in, std::uint64_t seed) const override {
    spec::MetadataReader& m = in.metadata();
    ReadCase rc;
    rc.seed = seed;
    rc.config = spec::read_config(m);
    const spec::CacheGeometry& g = rc.config.geometry;
    const std::int64_t nreq = case_count(m, "requests");
    rc.batch.max_blocks = case_count(m, "max_blocks");
    const std::int64_t queries = case_count(m, "queries");
    rc.indexer.num_index_heads = case_count(m, "num_index_heads");
    rc.attention.num_q_heads = case_count(m, "num_q_heads");
    rc.indexer.sparse_block = rc.attention.sparse_block = case_count(m, "sparse_block");
    rc.indexer.topk = case_count(m, "topk");
    rc.indexer.init_blocks = case_count(m, "init_blocks");
    rc.indexer.local_blocks = case_count(m, "local_blocks");
    rc.indexer.index_nan = m.choice<spec::IndexNan>("index_nan");
    rc.indexer.score_scale = m.choice<spec::IndexScoreScale>("index_score_scale");
    // The later modes may be absent (case files before them): the contract's defaults.
    rc.indexer.index_group = m.optional_choice("index_group", spec::IndexGroup::kMax);
    rc.indexer.neg_inf = m.optional_choice("index_neg_inf", spec::IndexNegInf::kKeep);
    rc.indexer.index_q_type = m.optional_choice("index_q", spec::IndexQType::kActivation);
    const std::vector<float> sm = m.floats("sm_scale");
    if (sm.size() != 1) {
      throw spec::InvalidInput("__metadata__ 'sm_scale'", -1, m.text("sm_scale"),
                               "expected one float32 (0: the default)");
    }
    rc.attention.sm_scale = sm.front();
    rc.attention.out_dtype = m.choice<spec::DType>("out_dtype");
    if (rc.config.layers != std::vector<spec::LayerKind>{spec::LayerKind::kSparse}) {
      throw spec::InvalidInput("__metadata__ 'layers'", -1, m.text("layers"),
                               "a read case is one sparse layer: expected S");
    }
    rc.batch.block_table = in.take_i32("input.block_table", {nreq, rc.batch.max_blocks});
    rc.batch.seq_lens = in.take_i64("input.seq_lens", {nreq});
    rc.batch.query_start_loc = in.take_i64("input.query_start_loc", {nreq + 1});
    // The batch's own bounds first, so that validate_batch's arithmetic stays in range.
    const std::int64_t max_seq = rc.batch.max_blocks * std::min(g.block_size, kMaxCaseCount);
    for (std::int64_t r = 0; r <= nreq; ++r) {
      const std::int64_t at = rc.batch.query_start_loc[static_cast<std::size_t>(r)];
      const std::int64_t before =
          r == 0 ? 0 : rc.batch.query_start_loc[static_cast<std::size_t>(r - 1)];
      if (at < before || at > queries || (r == nreq && at != queries) || (r == 0 && at != 0)) {
        throw spec::InvalidInput("tensor 'input.query_start_loc'", r, std::to_string(at),
                                 "expected non-decreasing from 0 to __metadata__ 'queries' = " +
                                     std::to_string(queries));
      }
      const std::int64_t seq = r < nreq ? rc.batch.seq_lens[static_cast<std::size_t>(r)] : 0;
      if (seq < 0 || seq > max_seq) {
        throw spec::InvalidInput(
            "tensor 'input.seq_lens'", r, std::to_string(seq),
            "expected in [0, max_blocks * block_size = " + std::to_string(max_seq) + "]");
      }
    }
    rc.index_q = in.take_host("input.index_q", spec::index_q_dtype(rc.config, rc.indexer),
                              {queries, rc.indexer.num_index_heads, g.index_dim});
    rc.q = in.take_host("input.q", rc.config.act_dtype,
                        {queries, rc.attention.num_q_heads, g.head_dim});
    // Case files before SPEC 6's selection input hand attention the reference's rows.
    if (m.has("attention_width")) {
      rc.attention_width = case_count(m, "attention_width");
      if (rc.attention_width < 1) {
        throw spec::InvalidInput("__metadata__ 'attention_width'", -1,
                                 std::to_string(rc.attention_width), "expected at least 1");
      }
      rc.attention_ids =
          in.take_i32("input.attention_selection", {queries, g.num_kv_heads, rc.attention_width});
    }
    const std::int64_t nscale = rc.config.kv.per_head_scale ? g.num_kv_heads : 1;
    rc.k_scale = in.take_f32("input.k_scale", nscale);
    rc.v_scale = in.take_f32("input.v_scale", nscale);
    validate_as("input.", [&] {
      spec::validate_batch(rc.config, rc.batch);
      spec::validate_indexer(rc.config, rc.indexer);
      spec::validate_attention(rc.config, rc.attention);
      spec::validate_scales(rc.config, rc.k_scale, "k_scale");
      spec::validate_scales(rc.config, rc.v_scale, "v_scale");
    });
    rc.caches = in.take_caches("cache.", rc.config, spec::LayerKind::kSparse);
    auto c = std::make_unique<ReadPrepared>(std::move(rc), std::nullopt);
    validate_as("input.attention_", [&] {  // SPEC 6: no id twice in a row
      const reference::TopkSelection& s = *c->expectation->attended();
      for (std::int64_t q = 0; q < s.num_queries; ++q)
        for (std::int64_t h = 0; h < s.num_kv_heads; ++h) reference::attention_chunks(&s, q, h, 0);
    });
    const NamedTensor answer = reference_answer(*c);
    check_expected(in, answer.name, answer.dtype, answer.shape, answer.bytes);
    return c;
  }

  void encode_answer(Subject& subject, PreparedCase& pc, TensorWriter& out) const override {
    auto& rp = static_cast<ReadPrepared&>(pc);
    if (op_ == spec::Op::kIndexer) {
      const std::vector<std::int32_t> ids = subject.indexer(rp.rc);
      const std::vector<std::int64_t> shape = topk_shape(rp.rc);
      const bool whole = static_cast<std::int64_t>(ids.size()) == shape[0] * shape[1] * shape[2];
      out.put_i32("topk_ids", whole ? shape : std::vector<std::int64_t>{std::ssize(ids)}, ids);
    } else {
      out.put_host("out", subject.attention(rp.rc, rp.expectation->attended()));
    }
  }

  void answer_from(const TensorSet& result, PreparedCase& pc,
                   SubjectFunctions& into) const override {
    const NamedTensor answer = reference_answer(static_cast<ReadPrepared&>(pc));
    const std::vector<std::uint8_t> bytes = tensors_by_name(result).at(answer.name);
    if (op_ == spec::Op::kIndexer) {
      std::vector<std::int32_t> ids(bytes.size() / sizeof(std::int32_t));
      if (!ids.empty()) std::memcpy(ids.data(), bytes.data(), ids.size() * sizeof(std::int32_t));
      into.indexer = [ids](const ReadCase&) { return ids; };
    } else {
      const spec::HostTensor out{static_cast<ReadPrepared&>(pc).rc.attention.out_dtype,
                                 answer.shape, bytes};
      into.attention = [out](const ReadCase&, const reference::TopkSelection*) { return out; };
    }
  }

 private:
  static std::vector<std::int64_t> topk_shape(const ReadCase& rc) {
    return {rc.batch.num_queries(), rc.config.geometry.num_kv_heads,
            spec::selection_width(rc.indexer, rc.config.geometry.num_kv_heads)};
  }

  /// The reference's answer to this op of the case, named as a result holds it.
  NamedTensor reference_answer(ReadPrepared& rp) const {
    if (op_ == spec::Op::kIndexer) {
      const std::vector<std::int32_t>& ids = rp.expectation->selection().ids;
      std::vector<std::uint8_t> bytes(ids.size() * sizeof(std::int32_t));
      if (!ids.empty()) std::memcpy(bytes.data(), ids.data(), bytes.size());
      return {"topk_ids", TensorDType::kI32, topk_shape(rp.rc), std::move(bytes)};
    }
    const spec::HostTensor& out = rp.expectation->exact();
    return {"out", tensor_dtype(out.dtype), out.shape, out.bytes};
  }

  spec::Op op_;
};

}  // namespace

const OpDriver& indexer_driver() {
  static const ReadDriver driver(spec::Op::kIndexer);
  return driver;
}

const OpDriver& attention_driver() {
  static const ReadDriver driver(spec::Op::kAttention);
  return driver;
}

}  // namespace kvo::oracle
