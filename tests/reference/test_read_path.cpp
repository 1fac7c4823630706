// SPEC 5-6 read side: hand-checked indexer and attention cases, and the top-k invariants as a
// property. Against the float64 truth and its derived bound: tests/truth.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "../common/tiny.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/reference/read_path.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::reference {
namespace {

using testing::f32_tensor;

/// One request (or several) written into a sparse layer: nkv 1, head_dim 8, index_dim 8 (flat
/// bf16), bf16 K/V cache, f32 activations; page size `bs`. Token t of request r: index-K dim 0 =
/// ik0[r][t], K dim 0 = k0[r][t], V all dims = v[r][t]; other dims 0.
struct Hand {
  spec::ModelConfig config;
  spec::ReadBatch batch;
  spec::LayerCaches caches;
};
Hand hand(std::int64_t bs, const std::vector<std::vector<float>>& ik0,
          const std::vector<std::vector<float>>& k0, const std::vector<std::vector<float>>& v,
          const std::vector<std::int64_t>& q_lens) {
  Hand h;
  spec::ModelConfig& c = h.config;
  c.layers = {spec::LayerKind::kSparse};
  c.act_dtype = spec::DType::kF32;
  c.geometry = {64, bs, 1, 8, 8};
  c.kv.cache_dtype = spec::DType::kBF16;
  c.layout = spec::KvLayout::kHnd;
  const PagedCacheLayout layout(c);
  h.caches = oracle::make_layer_caches(layout, 0, spec::LayerKind::kSparse);
  spec::ReadBatch& b = h.batch;
  b.max_blocks = 64 / static_cast<std::int64_t>(ik0.size());
  b.query_start_loc = {0};
  std::int64_t next_block = 63;  // hand pages out from the top: the reader must use the table
  spec::LayerWrite w;
  w.kind = spec::LayerKind::kSparse;
  std::vector<float> kx, vx, ix;
  for (std::size_t r = 0; r < ik0.size(); ++r) {
    const auto seq = static_cast<std::int64_t>(ik0[r].size());
    b.seq_lens.push_back(seq);
    b.query_start_loc.push_back(b.query_start_loc.back() + q_lens[r]);
    for (std::int64_t j = 0; j < b.max_blocks; ++j)
      b.block_table.push_back(j * bs < seq ? static_cast<std::int32_t>(next_block--) : -1);
    for (std::int64_t t = 0; t < seq; ++t) {
      w.slots.slots.push_back(b.block_table[r * static_cast<std::size_t>(b.max_blocks) +
                                            static_cast<std::size_t>(t / bs)] *
                                  bs +
                              t % bs);
      for (int d = 0; d < 8; ++d) {
        ix.push_back(d == 0 ? ik0[r][static_cast<std::size_t>(t)] : 0.0f);
        kx.push_back(d == 0 ? k0[r][static_cast<std::size_t>(t)] : 0.0f);
        vx.push_back(v[r][static_cast<std::size_t>(t)]);
      }
    }
  }
  const auto rows = static_cast<std::int64_t>(w.slots.slots.size());
  w.k = f32_tensor({rows, 1, 8}, kx);
  w.v = f32_tensor({rows, 1, 8}, vx);
  w.index_k = f32_tensor({rows, 8}, ix);
  w.k_scale = w.v_scale = {1.0f};
  write_layer(c, w, h.caches);
  return h;
}

/// index_q rows: for every query, head 0 = [1, 0...] and head 1 = [0.5, 0...].
spec::HostTensor index_q(std::int64_t queries) {
  std::vector<float> v;
  for (std::int64_t q = 0; q < queries; ++q) {
    for (float head : {1.0f, 0.5f}) {
      for (int d = 0; d < 8; ++d) v.push_back(d == 0 ? head : 0.0f);
    }
  }
  return f32_tensor({queries, 2, 8}, v);
}

std::vector<std::int32_t> ids_of(const TopkSelection& s, std::int64_t q) {
  return {s.ids.begin() + q * s.topk, s.ids.begin() + (q + 1) * s.topk};
}

TEST(Indexer, BlockScoresThroughTheBlockTableWithPageSizeUnequalToSparseBlock) {
  // Page size 2, sparse block 4: block scores b0 = 5 (t 0-3), b1 = 4 (t 4-7), b2 = 9 (t 8-9,
  // local).
  const std::vector<float> ik{1, 5, 2, 0, 3, 3, 1, 4, 9, 0};
  const Hand h = hand(2, {ik}, {ik}, {ik}, {1});
  spec::IndexerParams p{2, 4, 2, 0, 1};
  const TopkSelection s = indexer_topk(h.config, p, h.batch, index_q(1), h.caches);
  EXPECT_EQ(s.n_valid[0], 3);
  EXPECT_EQ(s.score(0, 0, 0), 5.0f);  // group max over the 2 index heads: max(5, 2.5)
  EXPECT_EQ(s.score(0, 0, 1), 4.0f);
  EXPECT_EQ(s.score(0, 0, 2), kLocalBlockScore);
  EXPECT_EQ(ids_of(s, 0), (std::vector<std::int32_t>{0, 2}));
  p.topk = 5;  // k_eff = n_valid = 3 < topk: ascending ids, then -1
  EXPECT_EQ(ids_of(indexer_topk(h.config, p, h.batch, index_q(1), h.caches), 0),
            (std::vector<std::int32_t>{0, 1, 2, -1, -1}));
}

TEST(Indexer, TiesGoToTheLowerBlockId) {
  const std::vector<float> ik{1, 5, 2, 0, 3, 3, 1, 5, 9, 0};  // b0 = b1 = 5
  const Hand h = hand(2, {ik}, {ik}, {ik}, {1});
  const TopkSelection s = indexer_topk(h.config, {2, 4, 2, 0, 1}, h.batch, index_q(1), h.caches);
  EXPECT_EQ(ids_of(s, 0), (std::vector<std::int32_t>{0, 2}));
}

TEST(Indexer, InitAndLocalBlocksAreForced) {
  const std::vector<float> ik{1, 0,  0, 0, 0, 0, 0,
                              0, 99, 0, 0, 0, 0};  // b2 = 99 would win on score
  const Hand h = hand(2, {ik}, {ik}, {ik}, {1});
  // n_valid = 12 / 4 + 1 = 4: init block 0 (1e30), local block 3 (1e29), then b2 on score.
  const TopkSelection s = indexer_topk(h.config, {2, 4, 2, 1, 1}, h.batch, index_q(1), h.caches);
  EXPECT_EQ(s.score(0, 0, 0), kInitBlockScore);
  EXPECT_EQ(s.score(0, 0, 3), kLocalBlockScore);
  EXPECT_EQ(ids_of(s, 0), (std::vector<std::int32_t>{0, 3}));
  // Local overrides init when a block is both: n_valid 1.
  const Hand one = hand(2, {{1, 2}}, {{1, 2}}, {{1, 2}}, {1});
  EXPECT_EQ(
      indexer_topk(one.config, {2, 4, 2, 1, 1}, one.batch, index_q(1), one.caches).score(0, 0, 0),
      kLocalBlockScore);
}

TEST(Indexer, PositionsAroundTheBlockEdgeAndPaddedRows) {
  // Positions 127, 128, 129 with sparse_block 128: n_valid 1, 2, 2. A padded row (seq_len 0): all
  // -1.
  std::vector<std::vector<float>> ik;
  for (std::int64_t seq : {128, 129, 130}) ik.emplace_back(static_cast<std::size_t>(seq), 1.0f);
  ik.emplace_back();
  const Hand h = hand(16, ik, ik, ik, {1, 1, 1, 1});
  const TopkSelection s = indexer_topk(h.config, {2, 128, 3, 0, 1}, h.batch, index_q(4), h.caches);
  EXPECT_EQ(s.n_valid, (std::vector<std::int64_t>{1, 2, 2, 0}));
  EXPECT_EQ(ids_of(s, 0), (std::vector<std::int32_t>{0, -1, -1}));
  EXPECT_EQ(ids_of(s, 1), (std::vector<std::int32_t>{0, 1, -1}));
  EXPECT_EQ(ids_of(s, 3), (std::vector<std::int32_t>{-1, -1, -1}));
}

TEST(Indexer, BadParametersAreRejected) {
  const Hand h = hand(2, {{1, 2}}, {{1, 2}}, {{1, 2}}, {1});
  EXPECT_THROW(indexer_topk(h.config, {2, 4, 0, 0, 1}, h.batch, index_q(1), h.caches),
               spec::InvalidInput);  // topk 0
  EXPECT_THROW(indexer_topk(h.config, {3, 4, 2, 0, 1}, h.batch, index_q(1), h.caches),
               spec::InvalidInput);  // heads
  spec::ReadBatch past = h.batch;
  past.block_table[0] = 64;  // past the cache of 64 blocks
  try {
    indexer_topk(h.config, {2, 4, 2, 0, 1}, past, index_q(1), h.caches);
    FAIL();
  } catch (const spec::InvalidInput& e) {
    EXPECT_EQ(e.field(), "block_table");
    EXPECT_EQ(e.index(), 0);
    EXPECT_EQ(e.value(), "64");
  }
  spec::ReadBatch long_seq = h.batch;
  long_seq.seq_lens[0] = 1000;  // beyond the table
  EXPECT_THROW(indexer_topk(h.config, {2, 4, 2, 0, 1}, long_seq, index_q(1), h.caches),
               spec::InvalidInput);
}

/// q rows all [1, 0...]: scores s_t = k0[t] * sm_scale.
spec::HostTensor q_rows(std::int64_t queries, std::int64_t heads) {
  std::vector<float> v;
  for (std::int64_t i = 0; i < queries * heads; ++i) {
    for (int d = 0; d < 8; ++d) v.push_back(d == 0 ? 1.0f : 0.0f);
  }
  return f32_tensor({queries, heads, 8}, v);
}

TEST(Attention, EqualScoresAverageTheVisibleValuesWithTheCausalMask) {
  // Equal keys: every p_t = exp(0) = 1, so out = fl(sum v / count), exactly. Two query rows of one
  // request (MTP): p = 1 sees t 0-1, p = 2 sees t 0-2; sparse_block 2 makes t 2 its own chunk.
  const Hand h = hand(2, {{0, 0, 0}}, {{0, 0, 0}}, {{2, 4, 9}}, {2});
  spec::AttentionParams p;
  p.num_q_heads = 1;
  p.sparse_block = 2;
  p.out_dtype = spec::DType::kF32;
  const AttentionResult r =
      attention(h.config, p, h.batch, q_rows(2, 1), h.caches, {1.0f}, {1.0f}, nullptr);
  for (int d = 0; d < 8; ++d) {
    EXPECT_EQ(r.out_f32[static_cast<std::size_t>(d)], 3.0f) << d;      // (2 + 4) / 2
    EXPECT_EQ(r.out_f32[static_cast<std::size_t>(8 + d)], 5.0f) << d;  // (2 + 4 + 9) / 3
  }
}

/// The sparse hand case: request 0 of five tokens with V = 1, 1, 7, 7, 4 (equal keys) and a padded
/// request 1; one query row each, two query heads on one KV head (GQA 2:1), blocks of 2 tokens; the
/// selection rows 0: blocks 1 (t 2-3) and 2 (t 4), 1 (padded): none.
struct SparseHand {
  Hand h = hand(2, {{0, 0, 0, 0, 0}, {}}, {{0, 0, 0, 0, 0}, {}}, {{1, 1, 7, 7, 4}, {}}, {1, 1});
  spec::AttentionParams p = [] {
    spec::AttentionParams a;
    a.num_q_heads = 2;
    a.sparse_block = 2;
    a.out_dtype = spec::DType::kBF16;
    return a;
  }();
  TopkSelection sel = [] {
    TopkSelection s;
    s.num_queries = 2;
    s.num_kv_heads = 1;
    s.topk = 2;
    s.ids = {1, 2, -1, -1};
    return s;
  }();
  AttentionResult run() const {
    return attention(h.config, p, h.batch, q_rows(2, 2), h.caches, {1.0f}, {1.0f}, &sel);
  }
};

TEST(Attention, SparseAttendsOnlyTheSelectedBlocksAndPaddedRowsAreZero) {
  SparseHand c;
  const AttentionResult r = c.run();
  EXPECT_EQ(r.out_f32[0], 6.0f);  // (7 + 7 + 4) / 3
  EXPECT_EQ(r.out_f32[8], 6.0f);  // the second query head of the group
  for (std::size_t i = 16; i < 32; ++i) EXPECT_EQ(bits_of(r.out_f32[i]), 0u) << i;
  EXPECT_EQ(load_code(&r.out.bytes[0], spec::DType::kBF16), 0x40C0u);  // 6.0 in bf16
  c.sel.ids = {2, 2, -1, -1};
  EXPECT_THROW(c.run(), spec::InvalidInput);
  spec::ModelConfig two_kv = c.h.config;
  two_kv.geometry.num_kv_heads = 2;
  c.p.num_q_heads = 3;  // not a multiple of 2 KV heads
  EXPECT_THROW(spec::validate_attention(two_kv, c.p), spec::InvalidInput);
}

// SPEC 6: the selection is an input in its own right. The hand case above (blocks 1 and 2 of row 0)
// in every arrangement engines emit: descending, -1 first, -1 between the ids, ids past n_valid
// (3, 1024, INT32_MAX) anywhere, a wider row: each is bit for bit the same output. The same id
// twice is invalid input, in a padded row too.
TEST(Attention, TheSelectionIsASetInAnyOrderWithMinusOneAndIdsPastNValidAnywhere) {
  SparseHand c;
  const AttentionResult want = c.run();
  constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
  const std::vector<std::vector<std::int32_t>> rows = {{2, 1, -1, -1, -1},   {-1, -1, 1, 2, -1},
                                                       {1, -1, 2, -1, -1},   {3, 1, kMax, 2, 1024},
                                                       {-1, 1024, -1, 2, 1}, {kMax, -7, 2, -1, 1}};
  for (const auto& row : rows) {
    c.sel.topk = 5;
    c.sel.ids = row;
    c.sel.ids.insert(c.sel.ids.end(), {0, 1, -1, -1, -1});  // the padded row: reads nothing
    EXPECT_EQ(c.run().out.bytes, want.out.bytes) << ::testing::PrintToString(row);
  }
  c.sel.ids = {1, 2, -1, 3, 3, /* padded row */ 0, 1, 2, -1, -1};
  EXPECT_THROW(c.run(), spec::InvalidInput);  // 3 twice, past n_valid: still a duplicate
  c.sel.ids = {1, 2, -1, -1, -1, /* padded row */ 4, -1, 4, -1, -1};
  EXPECT_THROW(c.run(), spec::InvalidInput);
}

// Every drawn case, all indexer modes included: per (query row, KV head) the ids are ascending,
// distinct, below n_valid, then -1; per lane (one under index_group max, each index head under
// union) its k_eff best are chosen (ties aside) and nothing below its k_eff-th score, -inf blocks
// left out under drop_neg_inf; the forced blocks are there when there is room.
RC_GTEST_PROP(ReadPath, TopkInvariantsHold, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  oracle::ReadOverrides o;
  o.max_seq_len = 400;
  const oracle::ReadCase rc = oracle::make_read_case(seed, o);
  const TopkSelection s = indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
  const bool drop = rc.indexer.neg_inf == spec::IndexNegInf::kDrop;
  RC_ASSERT(s.lanes == spec::selection_lanes(rc.indexer, rc.config.geometry.num_kv_heads));
  RC_ASSERT(s.topk == rc.indexer.topk * s.lanes);
  for (std::int64_t q = 0; q < s.num_queries; ++q) {
    const std::int64_t n_valid = s.n_valid[static_cast<std::size_t>(q)];
    const std::int64_t k_eff = std::min(rc.indexer.topk, n_valid);
    for (std::int64_t g = 0; g < s.num_kv_heads; ++g) {
      std::set<std::int32_t> seen;
      bool padding = false;
      for (std::int64_t k = 0; k < s.topk; ++k) {
        const std::int32_t id = s.id(q, g, k);
        if (id == -1) {
          padding = true;
          continue;
        }
        // RC_ASSERT captures its expression, so && and || would not short-circuit: test booleans.
        const bool below_n_valid = id >= 0 && id < n_valid && !padding;
        RC_ASSERT(below_n_valid);
        RC_ASSERT(seen.insert(id).second);  // no duplicates
        const bool ascending = k == 0 || id > s.id(q, g, k - 1);
        RC_ASSERT(ascending);
      }
      std::set<std::int32_t> explained;  // ids some lane chose
      for (std::int64_t l = 0; l < s.lanes; ++l) {
        std::vector<float> scores;
        for (std::int64_t j = 0; j < n_valid; ++j) scores.push_back(s.score(q, g, j, l));
        std::sort(scores.begin(), scores.end(), std::greater<>());
        const float kth = k_eff > 0 ? scores[static_cast<std::size_t>(k_eff - 1)] : INFINITY;
        std::int64_t above = 0;  // the lane's blocks strictly above its k_eff-th score
        for (std::int64_t j = 0; j < n_valid; ++j) {
          const float sj = s.score(q, g, j, l);
          const bool dropped = drop && sj == -INFINITY;
          if (sj > kth && !dropped) {
            RC_ASSERT(seen.count(static_cast<std::int32_t>(j)) == 1u);
            ++above;
          }
          if (sj >= kth && !dropped && seen.count(static_cast<std::int32_t>(j)))
            explained.insert(static_cast<std::int32_t>(j));
        }
        RC_ASSERT(above <= k_eff);
        // Forced blocks (init, local) are all present when there is room for them and for the
        // blocks that outrank them (index_nan first's NaN blocks).
        const reference::ForcedBlocks fb = reference::forced_blocks(
            n_valid, k_eff, rc.indexer, [&](std::int64_t j) { return s.score(q, g, j, l); });
        for (std::int32_t j : fb.forced) {
          const bool present = !fb.room || seen.count(j) == 1u;
          RC_ASSERT(present);
        }
      }
      RC_ASSERT(explained == seen);  // every chosen block is at least some lane's k_eff-th
      const bool sized = s.lanes > 1 || drop ? static_cast<std::int64_t>(seen.size()) <= s.topk
                                             : static_cast<std::int64_t>(seen.size()) == k_eff;
      RC_ASSERT(sized);
    }
  }
}

/// One request of `seq_len` tokens on one KV head, sparse blocks of 4, no NaN rows.
oracle::ReadOverrides one_request(std::int64_t seq_len, std::int64_t heads_per_kv,
                                  std::int64_t topk, spec::IndexLayout index_layout) {
  oracle::ReadOverrides o;
  o.num_kv_heads = 1;
  o.index_heads_per_kv = heads_per_kv;
  o.sparse_block = 4;
  o.seq_len = seq_len;
  o.requests = 1;
  o.topk = topk;
  o.index_layout = index_layout;
  o.nan_index_k = false;
  return o;
}

// Hand-checked: two index heads on one KV head, four blocks, topk 1. Head 0 scores blocks
// [1, 5, 2, 0], head 1 [4, 0, 3, 0] (one token per block, dot with index-K e0 or e1). Under max
// the group scores [4, 5, 3, 0]: block 1 alone. Under union head 0 picks 1 and head 1 picks 0:
// [0, 1] in a row two wide. Local blocks 0 so block 3 is not forced.
TEST(ReadPath, IndexGroupMaxAndUnionHandChecked) {
  oracle::ReadOverrides o = one_request(16, 2, 1, spec::IndexLayout::kFlat);
  o.index_dim = 16;
  o.neg_inf_block = false;
  oracle::ReadCase rc = oracle::make_read_case(11, o);
  rc.config.index.flat_dtype = spec::DType::kBF16;
  rc.indexer.local_blocks = 0;
  rc.indexer.init_blocks = 0;
  rc.indexer.index_q_type = spec::IndexQType::kActivation;
  rc.indexer.score_scale = spec::IndexScoreScale::kOne;
  rc.indexer.neg_inf = spec::IndexNegInf::kKeep;
  rc.batch.query_start_loc = {0, 1};
  rc.caches = oracle::make_layer_caches(PagedCacheLayout(rc.config), 0, spec::LayerKind::kSparse);
  const float head0[4] = {1, 5, 2, 0}, head1[4] = {4, 0, 3, 0};
  // Index-K: token t of block j is e0 * head0[j] + e1 * head1[j] at its first token, 0 elsewhere.
  spec::LayerWrite w;
  w.kind = spec::LayerKind::kSparse;
  const std::int64_t nkv = 1, hd = rc.config.geometry.head_dim, idim = 16;
  auto zeros = [](std::int64_t n, std::int64_t a, std::int64_t b) {
    spec::HostTensor t;
    t.dtype = spec::DType::kBF16;
    t.shape = {n, a, b};
    t.bytes.assign(static_cast<std::size_t>(n * a * b * 2), 0);
    return t;
  };
  w.k = zeros(16, nkv, hd);
  w.v = zeros(16, nkv, hd);
  w.index_k = zeros(16, 1, idim);
  w.index_k.shape = {16, idim};
  auto put = [](spec::HostTensor& t, std::int64_t i, float x) {
    store_code(encode(x, spec::DType::kBF16, spec::Saturation::kSatFinite), spec::DType::kBF16,
               &t.bytes[static_cast<std::size_t>(i) * 2]);
  };
  for (std::int64_t j = 0; j < 4; ++j) {
    put(w.index_k, (4 * j) * idim + 0, head0[j]);
    put(w.index_k, (4 * j) * idim + 1, head1[j]);
  }
  w.slots.type = rc.config.slot_type;
  for (std::int64_t t = 0; t < 16; ++t) {
    w.slots.slots.push_back(
        rc.batch.block_table[static_cast<std::size_t>(t / rc.config.geometry.block_size)] *
            rc.config.geometry.block_size +
        t % rc.config.geometry.block_size);
  }
  w.k_scale = rc.k_scale;
  w.v_scale = rc.v_scale;
  write_layer(rc.config, w, rc.caches);
  rc.index_q = zeros(1, 2, idim);
  put(rc.index_q, 0 * idim + 0, 1.0f);  // head 0 reads e0
  put(rc.index_q, 1 * idim + 1, 1.0f);  // head 1 reads e1
  rc.indexer.index_group = spec::IndexGroup::kMax;
  const TopkSelection by_max = indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
  EXPECT_EQ(by_max.ids, (std::vector<std::int32_t>{1}));
  rc.indexer.index_group = spec::IndexGroup::kUnion;
  const TopkSelection by_union =
      indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
  EXPECT_EQ(by_union.ids, (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(by_union.score(0, 0, 1, 0), 5.0f);
  EXPECT_EQ(by_union.score(0, 0, 0, 1), 4.0f);
  // Under union with topk 2: head 0 picks {1, 2}, head 1 {0, 2}: the union {0, 1, 2}, then -1.
  rc.indexer.topk = 2;
  EXPECT_EQ(indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches).ids,
            (std::vector<std::int32_t>{0, 1, 2, -1}));
}

// Hand-checked drop_neg_inf: a block whose every token scores -inf is chosen (topk covers every
// block) and kept, or dropped to -1.
TEST(ReadPath, DropNegInfLeavesOutMinusInfinityBlocks) {
  oracle::ReadOverrides o = one_request(12, 1, 3, spec::IndexLayout::kBlockScale);
  o.neg_inf_block = true;
  o.index_q = spec::IndexQType::kActivation;
  for (std::uint64_t seed = 1; seed < 40; ++seed) {
    oracle::ReadCase rc = oracle::make_read_case(seed, o);
    rc.indexer.local_blocks = 0;
    rc.indexer.init_blocks = 0;
    rc.indexer.neg_inf = spec::IndexNegInf::kKeep;
    const TopkSelection keep = indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
    std::int64_t minus_inf = 0;
    for (std::int64_t j = 0; j < 3; ++j) minus_inf += keep.score(0, 0, j) == -INFINITY;
    if (minus_inf != 1) continue;  // the planted block must be fully visible to row 0
    EXPECT_EQ(keep.ids, (std::vector<std::int32_t>{0, 1, 2})) << seed;
    rc.indexer.neg_inf = spec::IndexNegInf::kDrop;
    const TopkSelection drop = indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
    std::vector<std::int32_t> want;
    for (std::int32_t j = 0; j < 3; ++j)
      if (keep.score(0, 0, j) != -INFINITY) want.push_back(j);
    want.push_back(-1);
    EXPECT_EQ(drop.ids, want) << seed;
    return;
  }
  FAIL() << "no seed planted a -inf block visible to query row 0";
}

// fp8 index-Q: the reference reads e4m3 codes unscaled; the same values in bf16 give the same
// selection; e4m3 index-Q over a bf16 index-K cache is invalid input naming index_q.
TEST(ReadPath, Fp8IndexQReadsCodesUnscaled) {
  oracle::ReadOverrides o;
  o.index_layout = spec::IndexLayout::kBlockScale;
  o.index_q = spec::IndexQType::kFp8E4m3;
  const oracle::ReadCase rc = oracle::make_read_case(5, o);
  ASSERT_EQ(rc.index_q.dtype, spec::DType::kFp8E4M3);
  const TopkSelection fp8 = indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
  spec::IndexerParams as_bf16 = rc.indexer;
  as_bf16.index_q_type = spec::IndexQType::kActivation;
  const TopkSelection bf16 = indexer_topk(rc.config, as_bf16, rc.batch,
                                          cast_tensor(rc.index_q, spec::DType::kBF16), rc.caches);
  EXPECT_EQ(fp8.ids, bf16.ids);
  EXPECT_EQ(fp8.scores, bf16.scores);
  spec::ModelConfig flat = rc.config;
  flat.index.layout = spec::IndexLayout::kFlat;
  flat.index.flat_dtype = spec::DType::kBF16;
  try {
    spec::validate_indexer(flat, rc.indexer);
    FAIL() << "e4m3 index-Q over a bf16 index-K cache was accepted";
  } catch (const spec::InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("index_q"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvo::reference
