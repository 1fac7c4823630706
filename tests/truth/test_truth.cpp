// The float64 truth of the read side: it follows the reference's rules (read_rules.hpp), the
// per-head NaN rule of SPEC 5 included, and the canonical float32 results stay within the bounds
// it derives.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "../common/tiny.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/reference/read_path.hpp"
#include "kvo/reference/read_rules.hpp"
#include "kvo/spec/read.hpp"
#include "kvo/truth/truth.hpp"

namespace kvo::truth {
namespace {

using reference::AttentionResult;
using reference::TopkSelection;
using spec::Ordering;

constexpr float kInf = std::numeric_limits<float>::infinity();

using testing::f32_tensor;

/// One request of 8 tokens in a sparse layer (one KV head, index_dim 8, flat bf16 index-K, page
/// size 4), read by one query at position 7 with two index heads per KV head; sparse_block 4, so
/// n_valid = 2 and, with no init and no local blocks, both block scores are real ones.
struct NanCase {
  spec::ModelConfig config;
  spec::ReadBatch batch;
  spec::LayerCaches caches;
  spec::IndexerParams params{2, 4, 2, 0, 0};
  spec::HostTensor index_q;
};

/// index-K rows ik[t] (dims 0 and 1; the others 0) and the two heads' index-Q rows (dims 0 and 1).
NanCase nan_case(const std::vector<std::pair<float, float>>& ik, std::pair<float, float> head0,
                 std::pair<float, float> head1) {
  NanCase n;
  spec::ModelConfig& c = n.config;
  c.layers = {spec::LayerKind::kSparse};
  c.act_dtype = spec::DType::kF32;
  c.geometry = {4, 4, 1, 8, 8};
  c.kv.cache_dtype = spec::DType::kBF16;
  c.layout = spec::KvLayout::kHnd;
  const reference::PagedCacheLayout layout(c);
  n.caches = oracle::make_layer_caches(layout, 0, spec::LayerKind::kSparse);
  n.batch.max_blocks = 2;
  n.batch.block_table = {3, 1};  // pages out of order: the reader must use the table
  n.batch.seq_lens = {8};
  n.batch.query_start_loc = {0, 1};
  spec::LayerWrite w;
  w.kind = spec::LayerKind::kSparse;
  std::vector<float> kv, ix;
  for (std::int64_t t = 0; t < 8; ++t) {
    w.slots.slots.push_back(n.batch.block_table[static_cast<std::size_t>(t / 4)] * 4 + t % 4);
    for (int d = 0; d < 8; ++d) {
      const auto& row = ik[static_cast<std::size_t>(t)];
      ix.push_back(d == 0 ? row.first : d == 1 ? row.second : 0.0f);
      kv.push_back(1.0f);
    }
  }
  w.k = f32_tensor({8, 1, 8}, kv);
  w.v = f32_tensor({8, 1, 8}, kv);
  w.index_k = f32_tensor({8, 8}, ix);
  w.k_scale = w.v_scale = {1.0f};
  reference::write_layer(c, w, n.caches);
  std::vector<float> q(16, 0.0f);
  q[0] = head0.first, q[1] = head0.second, q[8] = head1.first, q[9] = head1.second;
  n.index_q = f32_tensor({1, 2, 8}, q);
  return n;
}

// SPEC 5: the NaN rule is per index head. Head 0 has a NaN token score in block 0 (0 * inf) beside
// 3, 1 and 2, and scores 1 in block 1; head 1 scores -inf on that token, and 6 and 2 elsewhere.
// Head 0's block 0 is 3 (skip), +inf (first) or -1e30 (lowest), so the KV group's block 0 is 6,
// +inf and 6, in the reference and in the truth (a truth that flags NaN per KV group gives -1e30
// for lowest).
TEST(IndexerTruth, NanRuleIsPerIndexHeadAsInTheReference) {
  const std::vector<std::pair<float, float>> ik{{0, 3}, {kInf, 0}, {0, 1}, {0, 2},
                                                {0, 1}, {0, 1},    {0, 1}, {0, 1}};
  for (const auto& [rule, block0] :
       {std::pair{spec::IndexNan::kSkip, 6.0f}, std::pair{spec::IndexNan::kFirst, kInf},
        std::pair{spec::IndexNan::kLowest, 6.0f}}) {
    NanCase n = nan_case(ik, {0, 1}, {-1, 2});
    n.params.index_nan = rule;
    const TopkSelection ref =
        reference::indexer_topk(n.config, n.params, n.batch, n.index_q, n.caches);
    ASSERT_EQ(ref.score(0, 0, 0), block0) << spec::name_of(rule);
    ASSERT_EQ(ref.score(0, 0, 1), 2.0f) << spec::name_of(rule);  // max(1, 2)
    for (Ordering o : {Ordering::kCanonical, Ordering::kForeign}) {
      const ScoreTruth truth = indexer_truth(n.config, n.params, n.batch, n.index_q, n.caches, o);
      for (std::int64_t j = 0; j < 2; ++j) {
        const std::size_t at = reference::score_index(0, 0, j, 1, ref.max_blocks);
        EXPECT_EQ(truth.scores[at], static_cast<double>(ref.score(0, 0, j)))
            << "block " << j << ", " << spec::name_of(o) << ", " << spec::name_of(rule);
      }
    }
  }
}

// The three NaN rules decide the selection when both heads see the NaN token: block 0's token
// scores are 3, NaN, 1, 2 and block 1's all 1; with topk 1, skip keeps block 0 (3 > 1), first keeps
// it (+inf), lowest gives it -1e30 and keeps block 1. index_score_scale rsqrt_dim multiplies every
// token score by fl(8^-0.5) in fp32, which keeps the order.
TEST(IndexerReference, NanRulesAndScoreScaleByHand) {
  const std::vector<std::pair<float, float>> ik{{0, 3}, {kInf, 0}, {0, 1}, {0, 2},
                                                {0, 1}, {0, 1},    {0, 1}, {0, 1}};
  const float f = spec::index_score_factor(spec::IndexScoreScale::kRsqrtDim, 8);
  EXPECT_EQ(f, static_cast<float>(1.0 / std::sqrt(8.0)));
  EXPECT_EQ(spec::index_score_factor(spec::IndexScoreScale::kOne, 8), 1.0f);
  for (const auto& [rule, block0, kept] :
       {std::tuple{spec::IndexNan::kSkip, 3.0f, 0}, std::tuple{spec::IndexNan::kFirst, kInf, 0},
        std::tuple{spec::IndexNan::kLowest, -1e30f, 1}}) {
    for (const spec::IndexScoreScale scale :
         {spec::IndexScoreScale::kOne, spec::IndexScoreScale::kRsqrtDim}) {
      NanCase n = nan_case(ik, {0, 1}, {0, 1});
      n.params.index_nan = rule;
      n.params.score_scale = scale;
      n.params.topk = 1;
      const float factor = spec::index_score_factor(scale, 8);
      const TopkSelection ref =
          reference::indexer_topk(n.config, n.params, n.batch, n.index_q, n.caches);
      const float want0 = std::isfinite(block0) && block0 > -1e29f ? block0 * factor : block0;
      EXPECT_EQ(ref.score(0, 0, 0), want0) << spec::name_of(rule) << " " << spec::name_of(scale);
      EXPECT_EQ(ref.score(0, 0, 1), 1.0f * factor) << spec::name_of(rule);
      EXPECT_EQ(ref.ids[0], kept) << spec::name_of(rule) << " " << spec::name_of(scale);
    }
  }
}

// A head whose index-Q row is NaN has the NaN block score in every block; its group takes the
// other head's scores, with that head's (finite) bound.
TEST(IndexerTruth, NanQueryHeadLeavesTheOtherHeadsScoresAndBounds) {
  const std::vector<std::pair<float, float>> ik{{1, 3}, {1, 0}, {1, 1}, {1, 2},
                                                {1, 1}, {2, 1}, {1, 1}, {1, 1}};
  const NanCase n = nan_case(ik, {NAN, 1}, {1, 2});
  const TopkSelection ref =
      reference::indexer_topk(n.config, n.params, n.batch, n.index_q, n.caches);
  const ScoreTruth truth =
      indexer_truth(n.config, n.params, n.batch, n.index_q, n.caches, Ordering::kCanonical);
  EXPECT_EQ(ref.score(0, 0, 0), 7.0f);  // 1 + 2 * 3
  EXPECT_EQ(ref.score(0, 0, 1), 4.0f);  // 2 + 2 * 1
  for (std::int64_t j = 0; j < 2; ++j) {
    const std::size_t at = reference::score_index(0, 0, j, 1, ref.max_blocks);
    EXPECT_EQ(truth.scores[at], static_cast<double>(ref.score(0, 0, j))) << "block " << j;
    EXPECT_TRUE(std::isfinite(truth.bound[at])) << "block " << j;
    EXPECT_GT(truth.bound[at], 0.0) << "block " << j;
  }
}

// The reference's group block scores stay within the truth's derived bound (forced blocks exact).
RC_GTEST_PROP(IndexerTruth, ReferenceBlockScoresAreWithinTheDerivedBound, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  oracle::ReadOverrides o;
  o.max_seq_len = 400;
  const oracle::ReadCase rc = oracle::make_read_case(seed, o);
  const TopkSelection s =
      reference::indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
  const ScoreTruth truth =
      indexer_truth(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches, Ordering::kCanonical);
  for (std::int64_t q = 0; q < s.num_queries; ++q) {
    for (std::int64_t r = 0; r < s.num_kv_heads * s.lanes; ++r) {
      for (std::int64_t j = 0; j < s.n_valid[static_cast<std::size_t>(q)]; ++j) {
        const std::size_t at =
            reference::score_index(q, r, j, s.num_kv_heads * s.lanes, s.max_blocks);
        // Equal covers the infinite scores of index_nan first (and an overflowed dot's -inf,
        // checked apart below).
        const double ref = s.score(q, r / s.lanes, j, r % s.lanes);
        if (std::isinf(ref) && ref < 0) {
          // The float32 dot overflowed (before index_score_scale's factor): the exact dot is
          // past -FLT_MAX, or the truth is -inf too.
          const double factor =
              spec::index_score_factor(rc.indexer.score_scale, rc.config.geometry.index_dim);
          const double exact_dot = truth.scores[at] / factor;
          RC_ASSERT(exact_dot <= -static_cast<double>(std::numeric_limits<float>::max()));
          continue;
        }
        RC_ASSERT(ref == truth.scores[at] || std::fabs(ref - truth.scores[at]) <= truth.bound[at]);
      }
    }
  }
}

// The canonical path stays within its derived bound of the float64 truth, on random and adversarial
// (large score spreads, V with a large common offset) cases, dense and sparse.
RC_GTEST_PROP(AttentionTruth, CanonicalAttentionIsWithinTheDerivedBound, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  oracle::ReadOverrides o;
  o.max_seq_len = 300;
  const oracle::ReadCase rc = oracle::make_read_case(seed, o);
  const TopkSelection sel =
      reference::indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
  for (const TopkSelection* s : {static_cast<const TopkSelection*>(nullptr), &sel}) {
    const AttentionResult got = reference::attention(rc.config, rc.attention, rc.batch, rc.q,
                                                     rc.caches, rc.k_scale, rc.v_scale, s);
    const AttentionTruth truth = attention_truth(rc.config, rc.attention, rc.batch, rc.q, rc.caches,
                                                 rc.k_scale, rc.v_scale, s, Ordering::kCanonical);
    for (std::size_t i = 0; i < got.out_f32.size(); ++i) {
      const double err = std::fabs(static_cast<double>(got.out_f32[i]) - truth.out[i]);
      if (!(err <= truth.bound[i])) {
        RC_FAIL("element " + std::to_string(i) + ": got " + std::to_string(got.out_f32[i]) +
                ", truth " + std::to_string(truth.out[i]) + ", |err| " + std::to_string(err) +
                " > bound " + std::to_string(truth.bound[i]) + "; case " + rc.describe());
      }
    }
  }
}

// A canonical ordering has no profile.
TEST(AttentionTruth, CanonicalOrderingTakesNoProfile) {
  const oracle::ReadCase rc = oracle::make_read_case(11, {});
  EXPECT_THROW(
      attention_truth(rc.config, rc.attention, rc.batch, rc.q, rc.caches, rc.k_scale, rc.v_scale,
                      nullptr, Ordering::kCanonical, spec::AttentionProfile::kBf16P),
      std::invalid_argument);
}

// The worst P rounding a flash profile allows stays within its bound, whichever way the kernel
// forms L: every p_t moved by u_P in the direction that pushes element d furthest, with L summed
// from the unrounded P (FlashAttention: out = o + sum w_t delta_t v_t) or from the rounded P
// (out = sum w_t (1 + delta_t) v_t / sum w_t (1 + delta_t)). Adversarial cases put a common offset
// of 1000 on V, where the two differ by orders of magnitude. Dense attention, exact arithmetic.
RC_GTEST_PROP(AttentionTruth, WorstPRoundingIsWithinTheProfileBound, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  oracle::ReadOverrides o;
  o.max_seq_len = 200;
  const oracle::ReadCase rc = oracle::make_read_case(seed, o);
  const std::int64_t nkv = rc.config.geometry.num_kv_heads, hd = rc.config.geometry.head_dim;
  const std::int64_t nq = rc.attention.num_q_heads;
  const double sm = reference::default_sm_scale(hd);
  for (const auto profile : {spec::AttentionProfile::kFp16P, spec::AttentionProfile::kBf16P}) {
    const double u_p = profile == spec::AttentionProfile::kBf16P ? 0x1p-8 : 0x1p-11;
    const AttentionTruth truth =
        attention_truth(rc.config, rc.attention, rc.batch, rc.q, rc.caches, rc.k_scale, rc.v_scale,
                        nullptr, Ordering::kForeign, profile);
    const auto rows = reference::query_rows(rc.batch);
    for (std::size_t qi = 0; qi < rows.size(); ++qi) {
      const auto& row = rows[qi];
      if (rc.batch.seq_lens[static_cast<std::size_t>(row.request)] == 0) continue;
      for (std::int64_t hq = 0; hq < nq; ++hq) {
        const std::int64_t g = hq / (nq / nkv);
        std::vector<double> s;
        std::vector<std::vector<float>> v;
        for (std::int64_t t = 0; t <= row.position; ++t) {
          const auto k =
              reference::read_kv(rc.config, rc.batch, rc.caches, rc.k_scale, 0, row.request, t, g);
          double dot = 0.0;
          for (std::int64_t d = 0; d < hd; ++d) {
            dot += static_cast<double>(reference::source_value(
                       rc.q, (static_cast<std::int64_t>(qi) * nq + hq) * hd + d)) *
                   k[static_cast<std::size_t>(d)];
          }
          s.push_back(dot * sm);
          v.push_back(
              reference::read_kv(rc.config, rc.batch, rc.caches, rc.v_scale, 1, row.request, t, g));
        }
        const double m = *std::max_element(s.begin(), s.end());
        std::vector<double> w;
        double l = 0.0;
        for (double x : s) l += std::exp(x - m);
        for (double x : s) w.push_back(std::exp(x - m) / l);
        for (std::int64_t d = 0; d < hd; ++d) {
          const auto at =
              static_cast<std::size_t>((static_cast<std::int64_t>(qi) * nq + hq) * hd + d);
          const double o_d = truth.out[at];
          double unrounded_l = o_d, num = 0.0, den = 0.0;
          for (std::size_t t = 0; t < w.size(); ++t) {
            const double vt = v[t][static_cast<std::size_t>(d)];
            unrounded_l += w[t] * u_p * std::fabs(vt);
            const double delta = vt - o_d >= 0.0 ? u_p : -u_p;
            num += w[t] * (1.0 + delta) * vt;
            den += w[t] * (1.0 + delta);
          }
          const double rounded_l = num / den;
          RC_ASSERT(std::fabs(unrounded_l - o_d) <= truth.bound[at]);
          RC_ASSERT(std::fabs(rounded_l - o_d) <= truth.bound[at]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvo::truth
