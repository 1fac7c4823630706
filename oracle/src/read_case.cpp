#include "kvo/oracle/read_case.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <set>
#include <sstream>
#include <tuple>

#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/reference/generator.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"

namespace kvo::oracle {
namespace {

using reference::GenTensor;
using reference::SplitMix64;

template <class T, std::size_t N>
T pick(SplitMix64& rng, const std::array<T, N>& a) {
  return a[static_cast<std::size_t>(rng.uniform(0, static_cast<std::int64_t>(N) - 1))];
}

}  // namespace

std::string ReadOverrides::to_flags() const {
  std::ostringstream s;
  if (sparse_block) s << " --sparse-block " << *sparse_block;
  if (topk) s << " --topk " << *topk;
  if (group_size) s << " --group-size " << *group_size;
  if (max_seq_len) s << " --max-seq-len " << *max_seq_len;
  if (seq_len) s << " --seq-len " << *seq_len;
  if (requests) s << " --read-requests " << *requests;
  if (index_heads_per_kv) s << " --index-heads-per-kv " << *index_heads_per_kv;
  if (adversarial) s << " --adversarial " << (*adversarial ? "true" : "false");
  if (tied_scores) s << " --tied-scores " << (*tied_scores ? "true" : "false");
  if (profile) s << " --profile " << spec::name_of(*profile);
  if (index_nan) s << " --index-nan " << spec::name_of(*index_nan);
  if (index_score_scale) s << " --index-score-scale " << spec::name_of(*index_score_scale);
  if (nan_index_k) s << " --nan-index-k " << (*nan_index_k ? "true" : "false");
  if (index_group) s << " --index-group " << spec::name_of(*index_group);
  if (index_neg_inf) s << " --index-neg-inf " << spec::name_of(*index_neg_inf);
  if (index_q) s << " --index-q " << spec::name_of(*index_q);
  if (neg_inf_block) s << " --neg-inf-block " << (*neg_inf_block ? "true" : "false");
  if (selection_order) s << " --selection-order " << spec::name_of(*selection_order);
  return s.str();
}

std::vector<ReadCaseValues::Patch> ReadCaseValues::distinct_patches() const {
  std::vector<Patch> out;
  std::set<std::tuple<std::int32_t, std::int64_t, std::int64_t>> seen;
  for (auto it = patches.rbegin(); it != patches.rend(); ++it) {
    if (seen.insert({it->tensor, it->row, it->element}).second) out.push_back(*it);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::string ReadCase::describe() const {
  std::ostringstream s;
  s << spec::describe(config) << " sparse_block=" << indexer.sparse_block
    << " topk=" << indexer.topk << " index_heads=" << indexer.num_index_heads
    << " q_heads=" << attention.num_q_heads << " requests=" << batch.num_requests()
    << " queries=" << batch.num_queries() << " attended=" << spec::name_of(attended.order);
  if (attended.extra > 0) s << "+" << attended.extra;
  if (attended.past_n_valid) s << ",past_n_valid";
  return s.str();
}

ReadCase make_read_case(std::uint64_t seed, const ReadOverrides& o, CaseValues values) {
  SplitMix64 rng(seed);
  ReadCase rc;
  rc.seed = seed;
  spec::ModelConfig& c = rc.config;
  c.layers = {spec::LayerKind::kSparse};
  c.act_dtype = spec::DType::kBF16;
  c.geometry.block_size =
      o.block_size.value_or(pick(rng, std::array<std::int64_t, 6>{1, 3, 16, 17, 64, 128}));
  c.geometry.num_kv_heads = o.num_kv_heads.value_or(rng.uniform(1, 3));
  c.geometry.head_dim = o.head_dim.value_or(pick(rng, std::array<std::int64_t, 4>{8, 16, 32, 64}));
  c.index.layout = o.index_layout.value_or(rng.chance(1, 2) ? spec::IndexLayout::kFlat
                                                            : spec::IndexLayout::kBlockScale);
  c.geometry.index_dim =
      o.index_dim.value_or(c.index.layout == spec::IndexLayout::kBlockScale
                               ? 128
                               : pick(rng, std::array<std::int64_t, 3>{16, 64, 128}));
  c.index.flat_dtype = rng.chance(1, 2) ? spec::DType::kBF16 : spec::DType::kFp8E4M3;
  // fp8 index-Q asked for over a flat cache implies its e4m3 dtype (SPEC 5); an explicit
  // contradicting --index-dtype stays, and validation names index_q.
  if (o.index_q == spec::IndexQType::kFp8E4m3) c.index.flat_dtype = spec::DType::kFp8E4M3;
  c.index.flat_dtype = o.index_dtype.value_or(c.index.flat_dtype);
  c.index.ue8m0 = rng.chance(1, 2);
  c.kv.cache_dtype =
      o.kv_dtype.value_or(pick(rng, std::array{spec::DType::kBF16, spec::DType::kFp8E4M3,
                                               spec::DType::kFp8E5M2, spec::DType::kF16}));
  c.kv.scale_mode =
      spec::is_fp8(c.kv.cache_dtype) ? spec::ScaleMode::kDivide : spec::ScaleMode::kNone;
  c.kv.per_head_scale = rng.chance(1, 2);
  c.layout = o.layout.value_or(
      pick(rng, std::array{spec::KvLayout::kNhd, spec::KvLayout::kHnd, spec::KvLayout::kPackedHnd,
                           spec::KvLayout::kPackedNhd, spec::KvLayout::kSplitNhd,
                           spec::KvLayout::kSplitHnd}));
  const bool adversarial = o.adversarial.value_or(rng.chance(1, 4));

  rc.indexer.sparse_block =
      o.sparse_block.value_or(pick(rng, std::array<std::int64_t, 4>{4, 16, 32, 128}));
  rc.indexer.topk = o.topk.value_or(rng.uniform(1, 6));
  rc.indexer.init_blocks = rng.uniform(0, 1);
  rc.indexer.local_blocks = rng.uniform(0, 2);
  rc.indexer.num_index_heads =
      c.geometry.num_kv_heads * o.index_heads_per_kv.value_or(rng.uniform(1, 2));
  rc.attention.sparse_block = rc.indexer.sparse_block;
  rc.attention.num_q_heads =
      c.geometry.num_kv_heads *
      o.group_size.value_or(pick(rng, std::array<std::int64_t, 4>{1, 2, 4, 16}));
  rc.attention.out_dtype = rng.chance(1, 3) ? spec::DType::kF32 : spec::DType::kBF16;
  // The later modes (SPEC 5 index_nan, index_score_scale) and NaN index-K rows come from their own
  // stream, so that every older seed keeps its case (with the contract's defaults). Drawn first,
  // then overridden, so that an override leaves the other draws alone.
  SplitMix64 later(reference::mix64(seed ^ 0x1DE7A5ull));
  const auto drawn_nan = pick(
      later, std::array{spec::IndexNan::kSkip, spec::IndexNan::kFirst, spec::IndexNan::kLowest});
  const auto drawn_scale =
      later.chance(1, 2) ? spec::IndexScoreScale::kOne : spec::IndexScoreScale::kRsqrtDim;
  const bool nan_index_k = o.nan_index_k.value_or(later.chance(1, 4));
  rc.indexer.index_nan = o.index_nan.value_or(drawn_nan);
  rc.indexer.score_scale = o.index_score_scale.value_or(drawn_scale);
  // The modes of session 7 (index_group, drop_neg_inf, fp8 index-Q, -inf blocks): a third stream,
  // for the same reason.
  SplitMix64 third(reference::mix64(seed ^ 0x5E1EC7ull));
  const auto drawn_group = third.chance(1, 2) ? spec::IndexGroup::kMax : spec::IndexGroup::kUnion;
  const auto drawn_neg_inf =
      third.chance(2, 3) ? spec::IndexNegInf::kKeep : spec::IndexNegInf::kDrop;
  const bool e4m3_index_k = c.index.layout == spec::IndexLayout::kBlockScale ||
                            c.index.flat_dtype == spec::DType::kFp8E4M3;
  const auto drawn_q = e4m3_index_k && third.chance(1, 2) ? spec::IndexQType::kFp8E4m3
                                                          : spec::IndexQType::kActivation;
  bool neg_inf_block = o.neg_inf_block.value_or(third.chance(1, 4));
  rc.indexer.index_group = o.index_group.value_or(drawn_group);
  rc.indexer.neg_inf = o.index_neg_inf.value_or(drawn_neg_inf);
  rc.indexer.index_q_type = o.index_q.value_or(drawn_q);
  // SPEC 6's selection as attention's input (issue 14): a fourth stream.
  SplitMix64 fourth(reference::mix64(seed ^ 0xA77E4Dull));
  rc.attended.order =
      pick(fourth,
           std::array{spec::SelectionOrder::kAscendingIds, spec::SelectionOrder::kDescendingScore,
                      spec::SelectionOrder::kMinusOneFirst, spec::SelectionOrder::kShuffled});
  rc.attended.extra = fourth.chance(1, 2) ? fourth.uniform(1, 3) : 0;
  rc.attended.past_n_valid = fourth.chance(1, 2);
  if (o.selection_order) rc.attended.order = *o.selection_order;
  // Production widths (issue 54), a fifth stream: MiniMax-M3's 16-wide selection rows in a third of
  // the cases (most rows shorter than 16 blocks: 16 wide with masked -1 entries, first under
  // kMinusOneFirst), 7 to 15 in a sixth; the others keep the small widths drawn above, cheap rows
  // whose cut falls inside them.
  SplitMix64 fifth(reference::mix64(seed ^ 0x70B16ull));
  const std::int64_t production_width = fifth.chance(1, 3)   ? 16
                                        : fifth.chance(1, 4) ? fifth.uniform(7, 15)
                                                             : 0;
  if (!o.topk && production_width > 0) rc.indexer.topk = production_width;
  // Stress themes (write_case.hpp): a union over two index heads per KV head with a -inf block
  // planted over a block-scaled index-K (2^127 survives its scale; a flat e4m3 one saturates).
  const std::uint64_t theme = theme_slot(seed);
  if (theme == kThemeUnionNegInf) {
    if (!o.index_group) rc.indexer.index_group = spec::IndexGroup::kUnion;
    if (!o.index_heads_per_kv) rc.indexer.num_index_heads = 2 * c.geometry.num_kv_heads;
    if (!o.neg_inf_block) neg_inf_block = true;
    if (!o.index_layout && !o.index_dim && !o.index_dtype) {
      c.index.layout = spec::IndexLayout::kBlockScale;
      c.geometry.index_dim = 128;
    }
  }

  // Requests: lengths up to max_seq_len; query lengths of decode (1), MTP (2-4) or a prefill chunk;
  // one in five a padded row (seq_len 0).
  // Stress themes (write_case.hpp): ties over longer rows; a long context.
  // Both keep their rows cheap: ties over small blocks (at most 16 tokens, up to 16 blocks a row),
  // and one long decode row (4-token blocks, 4097-4600 tokens) beside ordinary requests.
  if (theme == kThemeLongContext) {
    // Narrow rows, so that generating 4600 tokens costs what an ordinary case does.
    if (!o.head_dim) c.geometry.head_dim = 8;
    if (!o.index_layout && !o.index_dim && !o.index_dtype && !o.index_q) {
      c.index.layout = spec::IndexLayout::kFlat;
      c.geometry.index_dim = 16;
      // e4m3 index-Q, drawn over a block-scaled cache, keeps an e4m3 index-K (SPEC 5).
      if (rc.indexer.index_q_type == spec::IndexQType::kFp8E4m3)
        c.index.flat_dtype = spec::DType::kFp8E4M3;
    }
  }
  // The huge-cache theme (write_case.hpp): K, V and index-K all past 2^32 bytes (one index_dim,
  // head rows of at least 64 dims, pages of at least 64 slots: a few million blocks at most, and
  // every buffer within a few times the smallest), every block the rows read near the end. (Not
  // over a fixed view of one allocation: its kv_part is fixed, so blocks would not fit.)
  const bool huge = theme == kThemeHugeCache && !o.kv_strides && !o.index_strides;
  if (huge) {
    if (!o.block_size) c.geometry.block_size = std::max<std::int64_t>(c.geometry.block_size, 64);
    if (!o.head_dim) c.geometry.head_dim = std::max<std::int64_t>(c.geometry.head_dim, 64);
    if (!o.index_dim) c.geometry.index_dim = 128;
  }
  // Ties and huge caches over small blocks (at most 16 tokens) in rows of up to 48 and 16 blocks:
  // more blocks than topk, so that what the indexer reads decides what it keeps, and cheap rows.
  if (!o.sparse_block && (theme == kThemeLongContext || theme == kThemeTies || huge)) {
    // The long theme's blocks: 4 tokens (past 1024 blocks) or, in half its cases, 1 (past 4096).
    const std::int64_t long_block = (reference::mix64(seed ^ 0x4096B10Cull) & 1) != 0 ? 1 : 4;
    rc.indexer.sparse_block = rc.attention.sparse_block =
        theme == kThemeLongContext ? long_block
                                   : std::min<std::int64_t>(rc.indexer.sparse_block, 16);
    // DeepSeek-V3.2's token-level selection (issue 54): over 1-token blocks, the top 2048 of the
    // long row's 4097-4600 tokens, so that the cut falls inside it and a selection buffer or
    // shared array sized for 1024 entries loses its later half.
    if (theme == kThemeLongContext && long_block == 1 && !o.topk) rc.indexer.topk = kTokenSelection;
  }
  // The ties theme: rows of up to 48 blocks cut at 16 (unless overridden), so that a tie wider than
  // a 16-wide top-k straddles its cut (a tie-breaking network of 16 lanes' bug).
  if (theme == kThemeTies && !o.topk) rc.indexer.topk = 16;
  const std::int64_t row_blocks = theme == kThemeTies ? kTiesRowBlocks : huge ? 16 : 4;
  const std::int64_t max_seq = o.max_seq_len.value_or(row_blocks * rc.indexer.sparse_block + 7);
  const bool long_row = theme == kThemeLongContext && !o.max_seq_len && !o.seq_len;
  const std::int64_t nreq = o.requests.value_or(rng.uniform(1, 3));
  spec::ReadBatch& b = rc.batch;
  b.query_start_loc = {0};
  std::int64_t blocks_needed = 0;
  for (std::int64_t r = 0; r < nreq; ++r) {
    const bool padded = nreq > 1 && rng.chance(1, 5);
    std::int64_t seq = padded ? 0 : rng.uniform(1, max_seq);
    if (!padded && o.seq_len) seq = *o.seq_len;
    std::int64_t kind = rng.uniform(0, 2);
    // The long theme's first request: one decode row past 4096 tokens (over 1024 blocks of 4).
    if (long_row && r == 0) {
      seq = 4097 + static_cast<std::int64_t>(reference::mix64(seed ^ 0x4096ull) % 504);
      kind = 0;
    }
    const std::int64_t q_len = padded ? rng.uniform(0, 1)
                                      : std::min(seq, kind == 0   ? 1
                                                      : kind == 1 ? rng.uniform(2, 4)
                                                                  : rng.uniform(1, 9));
    b.seq_lens.push_back(padded ? 0 : seq);
    b.query_start_loc.push_back(b.query_start_loc.back() + q_len);
    blocks_needed += (seq + c.geometry.block_size - 1) / c.geometry.block_size;
  }
  c.geometry.num_blocks = blocks_needed + rng.uniform(1, 4);
  // The blocks handed out: all of them, or a huge cache's last ones (as many), every one of them
  // past 2^32 bytes into each buffer.
  const std::int64_t handed = c.geometry.num_blocks;
  if (huge) c.geometry.num_blocks = draw_huge_blocks(seed, c, HugeReach::kEveryBuffer) + handed;
  b.max_blocks = 1;
  for (std::int64_t s : b.seq_lens)
    b.max_blocks = std::max(b.max_blocks, (s + c.geometry.block_size - 1) / c.geometry.block_size);
  std::vector<std::int32_t> free_blocks(static_cast<std::size_t>(handed));
  std::iota(free_blocks.begin(), free_blocks.end(),
            static_cast<std::int32_t>(c.geometry.num_blocks - handed));
  rng.shuffle(free_blocks);
  b.block_table.assign(static_cast<std::size_t>(nreq * b.max_blocks), -1);
  std::size_t next = 0;
  for (std::int64_t r = 0; r < nreq; ++r) {
    const std::int64_t nb = (b.seq_lens[static_cast<std::size_t>(r)] + c.geometry.block_size - 1) /
                            c.geometry.block_size;
    for (std::int64_t j = 0; j < nb; ++j)
      b.block_table[static_cast<std::size_t>(r * b.max_blocks + j)] = free_blocks[next++];
  }

  reference::ValueGenerator gen;
  gen.seed = rng.next();
  gen.act = c.act_dtype;
  gen.range = adversarial ? 64.0f : 2.0f;  // adversarial: score spreads in the thousands
  const std::int64_t nkv = c.geometry.num_kv_heads;
  rc.k_scale.assign(static_cast<std::size_t>(c.kv.per_head_scale ? nkv : 1), 0.0f);
  rc.v_scale = rc.k_scale;
  for (float& s : rc.k_scale) s = std::ldexp(1.0f, static_cast<int>(rng.uniform(-3, 3)));
  for (float& s : rc.v_scale)
    s = static_cast<float>(rng.uniform(1, 1 << 16)) / static_cast<float>(1 << 14);

  // Every request's tokens, their rows drawn from SPEC 8 with the planted values (ReadCaseValues),
  // written through the reference write path into strided views under the strided theme (SPEC 3).
  choose_strides(seed, o.kv_strides, o.index_strides, c);
  const reference::PagedCacheLayout layout(c);
  ReadCaseValues& plan = rc.values;
  plan.gen = gen;
  plan.slots.type = c.slot_type;
  // Adversarial V: a large common offset, so the output cancels it against the weights.
  plan.v_bias = adversarial ? 1000.0f : 0.0f;
  for (std::int64_t r = 0; r < nreq; ++r) {
    for (std::int64_t t = 0; t < b.seq_lens[static_cast<std::size_t>(r)]; ++t) {
      const std::int32_t blk =
          b.block_table[static_cast<std::size_t>(r * b.max_blocks + t / c.geometry.block_size)];
      plan.slots.slots.push_back(static_cast<std::int64_t>(blk) * c.geometry.block_size +
                                 t % c.geometry.block_size);
      plan.keys.push_back({r, t});
    }
  }
  if (!plan.keys.empty()) {
    const auto index_code = [&](std::int64_t row, std::int64_t dim, std::uint32_t code) {
      plan.patches.push_back({static_cast<std::int32_t>(GenTensor::kIndexK), row, dim, code});
    };
    if (nan_index_k) {
      // One to three tokens get a NaN in one index dim: their token scores are NaN in every head,
      // and the blocks holding them are where the index_nan rules differ (blockscale keeps the
      // NaN too: amax ignores it and the cast stores e4m3's NaN).
      const std::uint32_t nan_code =
          reference::encode(std::nanf(""), c.act_dtype, spec::Saturation::kSatFinite);
      const auto last_key = static_cast<std::int64_t>(plan.keys.size()) - 1;
      for (std::int64_t n = later.uniform(1, 3); n > 0; --n) {
        const std::int64_t k = later.uniform(0, last_key);
        index_code(k, later.uniform(0, c.geometry.index_dim - 1), nan_code);
      }
    }
    if (neg_inf_block) {
      // Every token of one logical block of request 0 (its tokens are the first keys, in order):
      // index-K [2^127, 0, ...] (see ReadOverrides::neg_inf_block; index-Q's dim 0 is set below).
      const std::int64_t seq0 = b.seq_lens[0];
      const std::int64_t sb = rc.indexer.sparse_block;
      const std::int64_t j = seq0 > 0 ? third.uniform(0, (seq0 - 1) / sb) : 0;
      const std::uint32_t big =
          reference::encode(0x1p127f, c.act_dtype, spec::Saturation::kSatFinite);
      for (std::int64_t t = j * sb; t < std::min(seq0, (j + 1) * sb); ++t) {
        index_code(t, 0, big);
        for (std::int64_t d = 1; d < c.geometry.index_dim; ++d) index_code(t, d, 0);
      }
    }
  }
  // A deferred case's caches hold nothing on the host: the device poisons and writes them.
  rc.caches = values == CaseValues::kDeferred
                  ? oracle::make_layer_caches(layout, 0, spec::LayerKind::kSparse, /*lazy=*/true,
                                              /*hold_guards=*/false)
                  : oracle::make_layer_caches(layout, 0, spec::LayerKind::kSparse);
  if (values == CaseValues::kGenerated) {
    // A huge cache's pages (harness.hpp): every block a row's table names, whole (reads touch a
    // block's slots past the context too, to mask them).
    std::set<std::int32_t> table_blocks(b.block_table.begin(), b.block_table.end());
    for (std::int32_t blk : table_blocks) {
      if (blk >= 0 && blk < c.geometry.num_blocks) materialise_block(layout, rc.caches, blk);
    }
    if (!plan.keys.empty()) {
      spec::LayerWrite w;
      w.kind = spec::LayerKind::kSparse;
      w.k = reference::generated_rows(gen, 0, GenTensor::kK, plan.keys, nkv, c.geometry.head_dim,
                                      0.0f);
      w.v = reference::generated_rows(gen, 0, GenTensor::kV, plan.keys, nkv, c.geometry.head_dim,
                                      plan.v_bias);
      w.index_k = reference::generated_rows(gen, 0, GenTensor::kIndexK, plan.keys, 0,
                                            c.geometry.index_dim, 0.0f);
      const std::size_t eb = spec::dtype_bytes(c.act_dtype);
      spec::HostTensor* tensors[3] = {&w.k, &w.v, &w.index_k};
      const std::int64_t row_elements[3] = {nkv * c.geometry.head_dim, nkv * c.geometry.head_dim,
                                            c.geometry.index_dim};
      for (const ReadCaseValues::Patch& q : plan.patches) {
        const auto t = static_cast<std::size_t>(q.tensor);
        reference::store_code(
            q.code, c.act_dtype,
            &tensors[t]->bytes[static_cast<std::size_t>(q.row * row_elements[t] + q.element) * eb]);
      }
      w.slots = plan.slots;
      w.k_scale = rc.k_scale;
      w.v_scale = rc.v_scale;
      reference::write_layer(c, w, rc.caches);
    }
  }
  std::vector<reference::RowKey> qkeys;
  for (std::int64_t r = 0; r < nreq; ++r) {
    const std::int64_t q_len = b.query_start_loc[static_cast<std::size_t>(r + 1)] -
                               b.query_start_loc[static_cast<std::size_t>(r)];
    for (std::int64_t j = 0; j < q_len; ++j)
      qkeys.push_back({r, b.seq_lens[static_cast<std::size_t>(r)] - q_len + j});
  }
  rc.index_q = reference::generated_rows(gen, 0, GenTensor::kIndexQ, qkeys,
                                         rc.indexer.num_index_heads, c.geometry.index_dim, 0.0f);
  if (o.tied_scores.value_or(theme == kThemeTies))
    std::fill(rc.index_q.bytes.begin(), rc.index_q.bytes.end(), 0);
  if (neg_inf_block) {
    // Dim 0 of request 0's index-Q rows is -4 in every head: fma(-4, 2^127, 0) overflows to -inf.
    const std::size_t eb = spec::dtype_bytes(c.act_dtype);
    const std::uint32_t minus4 =
        reference::encode(-4.0f, c.act_dtype, spec::Saturation::kSatFinite);
    const std::int64_t rows0 = b.query_start_loc[1] * rc.indexer.num_index_heads;
    for (std::int64_t r = 0; r < rows0; ++r) {
      reference::store_code(
          minus4, c.act_dtype,
          &rc.index_q.bytes[static_cast<std::size_t>(r * c.geometry.index_dim) * eb]);
    }
  }
  // fp8 index-Q: the activation values cast to e4m3.
  rc.index_q = reference::cast_tensor(rc.index_q, spec::index_q_dtype(c, rc.indexer));
  rc.q = reference::generated_rows(gen, 0, GenTensor::kQ, qkeys, rc.attention.num_q_heads,
                                   c.geometry.head_dim, 0.0f);
  return rc;
}

}  // namespace kvo::oracle
