#pragma once
/// \file read_path.hpp
/// The read side of SPEC 5-6 in canonical arithmetic: the indexer's token and block scores, the
/// group reduce, forced init and local blocks, block top-k with its tie rule and output convention;
/// sparse and dense attention over a paged cache through block tables (decode, MTP and causal
/// prefill, GQA), chunked by `sparse_block` logical blocks and combined in ascending order.
/// Bit-exact by definition. The rules shared with the float64 truth (n_valid, forced blocks, the
/// per-head NaN rule, the group reduce, row and score addressing) are in read_rules.hpp.

#include <cstdint>
#include <utility>
#include <vector>

#include "kvo/reference/read_rules.hpp"
#include "kvo/spec/read.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::reference {

/// The indexer's result for every query row and KV head. A KV head's ids are the union of the
/// top-k of its `lanes` score rows (spec::selection_lanes: 1 under index_group max, its index
/// heads under union), so a row of ids is topk * lanes wide.
struct TopkSelection {
  std::int64_t num_queries = 0, num_kv_heads = 0;
  std::int64_t topk = 0;              ///< ids per (query row, KV head): params.topk * lanes
  std::int64_t lanes = 1;             ///< score rows per KV head
  std::int64_t max_blocks = 0;        ///< logical blocks per row in `scores`
  std::vector<std::int32_t> ids;      ///< [Tq, nkv, topk]: chosen ids ascending, then -1
  std::vector<float> scores;          ///< [Tq, nkv, lanes, max_blocks]: scores after forcing
  std::vector<std::int64_t> n_valid;  ///< [Tq]: valid logical blocks (0 for a padded row)

  std::int32_t id(std::int64_t q, std::int64_t g, std::int64_t k) const {
    return ids[static_cast<std::size_t>((q * num_kv_heads + g) * topk + k)];
  }
  /// The score of block j in lane `lane` of KV head g (under max, the group's score).
  float score(std::int64_t q, std::int64_t g, std::int64_t j, std::int64_t lane = 0) const {
    return scores[score_index(q, g * lanes + lane, j, num_kv_heads * lanes, max_blocks)];
  }
};

/// Dequantized index-K row of token t of request r (through the block table): `index_dim` floats.
/// Reads through the SPEC 3 offsets of the (valid) configuration, building no layout: cheap
/// enough to call once per token in a loop.
std::vector<float> read_index_k(const spec::ModelConfig& config, const spec::ReadBatch& batch,
                                const spec::LayerCaches& caches, std::int64_t request,
                                std::int64_t t);

/// Physical (block, offset) of token t of request r: the block table maps pages of block_size.
std::pair<std::int64_t, std::int64_t> locate_token(const spec::ModelConfig& config,
                                                   const spec::ReadBatch& batch,
                                                   std::int64_t request, std::int64_t t);

/// The dequantized index-K row whose index_dim values start at `row` (flat: codes of the flat
/// dtype; blockscale: e4m3 codes, their group scales fp32 from `scales`, unused when flat):
/// read_index_k's arithmetic, for a reader that addresses the cache itself.
std::vector<float> dequantize_index_row(const spec::ModelConfig& config, const std::uint8_t* row,
                                        const std::uint8_t* scales);

/// SPEC 5: index_q [Tq, num_index_heads, index_dim] in spec::index_q_dtype (the activation dtype,
/// or e4m3 read unscaled); the layer's caches hold the index-K written by the write path.
TopkSelection indexer_topk(const spec::ModelConfig& config, const spec::IndexerParams& params,
                           const spec::ReadBatch& batch, const spec::HostTensor& index_q,
                           const spec::LayerCaches& caches);

/// Dequantized K (kv = 0) or V (kv = 1) of token t of request r, head h: head_dim floats
/// (SPEC 2: fl(decode(code) * s) with the head's scale; the plain decode with scale mode none).
/// Builds no layout, as read_index_k.
std::vector<float> read_kv(const spec::ModelConfig& config, const spec::ReadBatch& batch,
                           const spec::LayerCaches& caches, const std::vector<float>& scales,
                           int kv, std::int64_t request, std::int64_t t, std::int64_t h);

/// The dequantized head row whose head_dim codes start at `row` (SPEC 2: fl(decode(code) * scale),
/// the plain decode with scale mode none): read_kv's arithmetic, for a reader that addresses the
/// cache itself.
std::vector<float> dequantize_kv_row(const spec::ModelConfig& config, const std::uint8_t* row,
                                     float scale);

struct AttentionResult {
  std::vector<float> out_f32;  ///< [Tq, nq, hd]: fl(O / L) before the output rounding
  spec::HostTensor out;        ///< [Tq, nq, hd] in params.out_dtype
};

/// SPEC 6. `selection` null: dense attention over every token t <= p. Otherwise the selected
/// logical blocks of (q, KV head) (ids < n_valid, -1 ignored, no duplicates, else InvalidInput).
AttentionResult attention(const spec::ModelConfig& config, const spec::AttentionParams& params,
                          const spec::ReadBatch& batch, const spec::HostTensor& q,
                          const spec::LayerCaches& caches, const std::vector<float>& k_scale,
                          const std::vector<float>& v_scale, const TopkSelection* selection);

/// The logical blocks query row q attends with KV head g, ascending: all n_valid of them when
/// `selection` is null (dense), else the selected ones (SPEC 6): the row's entries in any order,
/// ids < 0 or >= n_valid selecting nothing. Throws InvalidInput on an id >= 0 twice in the row.
std::vector<std::int64_t> attention_chunks(const TopkSelection* selection, std::int64_t q,
                                           std::int64_t g, std::int64_t n_valid);

/// The default softmax scale fl(1 / fl(sqrt(head_dim))).
float default_sm_scale(std::int64_t head_dim);

}  // namespace kvo::reference
