#pragma once
/// \file cpu_read.hpp
/// cpu-naive-f32: the indexer with block top-k and attention in float32 the way a torch user
/// writes them (sequential sums without fma, std::exp, one softmax over all visible tokens, top-k
/// by descending score with ties to the higher id, ids best first): a foreign implementation,
/// judged against the float64 truth and the tie-aware rules. Bugs can be planted (ReadMutation),
/// each modelled on a real one (anchors_kvcache.md 6). cpu-flash-bf16 / cpu-flash-fp16: attention
/// in the arithmetic of a FlashAttention-style kernel (flash_attention), with its planted bugs.

#include <cstdint>
#include <vector>

#include "kvo/reference/read_path.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/read.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::subjects {

/// Bugs that can be planted in the CPU read subjects.
struct ReadMutation {
  bool no_causal_mask = false;      ///< attention reads the whole selected block, future tokens too
  std::int64_t n_valid_offset = 0;  ///< the indexer's n_valid off by this much
  bool ignore_local = false;        ///< local blocks not forced
  bool nan_first = false;  ///< a block with a NaN token score ranks first, whatever index_nan says
  bool ties_to_higher_id = false;  ///< canonical scores, but equal scores won by the higher id
  bool scale_twice = false;        ///< sm_scale applied twice
  /// Each index head's own top-k and their union, cut to the row's width, where index_group max
  /// is declared (TensorRT-LLM's triton backend's reduce under the MSA path's contract)
  bool union_where_max = false;
  /// Chosen -inf blocks dropped to -1 where index_neg_inf keep is declared (TensorRT-LLM's
  /// selector under another engine's contract)
  bool drop_neg_inf_always = false;
  /// Ids kept in this many bits (0: all): a top-k whose block index wraps past 2^id_bits, as a
  /// kernel's short path (<= 1024 blocks) applied to a longer row does
  int id_bits = 0;
  /// The indexer keeps at most this many ids a row (0: every one): a top-k whose output buffer
  /// is narrower than the row it fills (an 8-wide register array under a 16-wide contract)
  std::int64_t kept_at_most = 0;
  /// A tie at the cut wider than 16 blocks won by the higher ids (a 16-lane tie-breaking network
  /// that orders only its own lanes); narrower ties by the rule
  bool wide_ties_to_higher_id = false;
  /// Attention reads a selection row's first n entries, n its count of ids >= 0, as if every
  /// masked (-1) entry trailed: rows that start with -1 lose their last blocks (vllm#48364's
  /// class: leading masked entries)
  bool masked_entries_trailing = false;
  /// Cache byte offsets kept in this many bits (0: all): a K/V or index-K read past byte
  /// 2^offset_bits of a huge cache lands 2^offset_bits bytes early (32: uint32 offsets, the class
  /// of vllm#50427's int32 slot * stride)
  int offset_bits = 0;
};

/// Top-k ids [Tq, nkv, spec::selection_width] of the batch's query rows, each row best first
/// (under index_group union: each index head's best first in turn, each id once), then -1.
/// `key_bits` < 32: blocks ranked by spec::topk_score_key of their scores (MSA's msa_v1 keys).
std::vector<std::int32_t> naive_indexer(const spec::ModelConfig& config,
                                        const spec::IndexerParams& params,
                                        const spec::ReadBatch& batch,
                                        const spec::HostTensor& index_q,
                                        const spec::LayerCaches& caches,
                                        const ReadMutation& mutation = {}, int key_bits = 32);

/// The attention output of `rows` query rows, all +0: [rows, num_q_heads, head_dim] in
/// p.out_dtype (a row with no tokens stays +0, SPEC 6).
spec::HostTensor zero_attention_output(std::size_t rows, const spec::AttentionParams& p,
                                       std::int64_t head_dim);

/// Attention [Tq, nq, hd] in params.out_dtype over `selection` (null: every visible token).
spec::HostTensor naive_attention(const spec::ModelConfig& config,
                                 const spec::AttentionParams& params, const spec::ReadBatch& batch,
                                 const spec::HostTensor& q, const spec::LayerCaches& caches,
                                 const std::vector<float>& k_scale,
                                 const std::vector<float>& v_scale,
                                 const reference::TopkSelection* selection,
                                 const ReadMutation& mutation = {});

/// Tokens per tile of the flash emulation (FlashAttention's and FlashMLA's kBlockN for these
/// head sizes).
inline constexpr std::int64_t kFlashTile = 64;

/// cpu-flash-bf16 / cpu-flash-fp16 (profile fp32: the same with P in fp32): attention [Tq, nq, hd]
/// in params.out_dtype as a flash-style kernel computes it under `profile`
/// (spec::profile_facts): the row's tokens in kFlashTile-token tiles with an online softmax
/// (running maximum, rescale), exp2 with log2(e) folded into the scale, Q, K and V rounded to the
/// profile's operand type, P rounded to its P type before P.V while the row sum adds P in fp32,
/// fma accumulation, and a final reciprocal multiply. A foreign implementation; `bug` plants one
/// of spec::AttentionBug. `selection` null: every visible token.
spec::HostTensor flash_attention(const spec::ModelConfig& config,
                                 const spec::AttentionParams& params, const spec::ReadBatch& batch,
                                 const spec::HostTensor& q, const spec::LayerCaches& caches,
                                 const std::vector<float>& k_scale,
                                 const std::vector<float>& v_scale,
                                 const reference::TopkSelection* selection,
                                 spec::AttentionProfile profile,
                                 spec::AttentionBug bug = spec::AttentionBug::kNone);

/// Top-k of one row of block scores: descending score; `higher_wins` breaks ties by the higher id,
/// otherwise the lower; ids ascending when `ascending`, else best first; padded with -1 to topk.
std::vector<std::int32_t> select_topk(const std::vector<float>& scores, std::int64_t topk,
                                      bool higher_wins, bool ascending);

}  // namespace kvo::subjects
