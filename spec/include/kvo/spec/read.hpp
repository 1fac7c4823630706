#pragma once
/// \file read.hpp
/// Plain data of the read side (SPEC 5-6): a batch of requests reading their paged caches through a
/// block table, the indexer's and attention's parameters and inputs, and their validators. Bad
/// input (block tables past the cache, sequence lengths beyond the table, topk 0, head counts that
/// do not divide) is rejected before anything runs.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvo/spec/config.hpp"
#include "kvo/spec/types.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::spec {

/// How a float32 read-side computation is ordered (SPEC 1, principle 4), which decides how it is
/// judged: bit for bit against the reference, or against the float64 truth within a derived bound.
enum class Ordering : std::uint8_t {
  kCanonical,  ///< SPEC 6.1-6.3 exactly (8-wide fma groups, trees, polynomial exp)
  kForeign,    ///< any summation order, hardware exp2 (relative error <= 2^-22), any chunking
};

template <>
struct EnumInfo<Ordering> {
  static constexpr std::string_view kNoun = "ordering";
  static constexpr std::array<EnumName<Ordering>, 2> kNames{
      {{Ordering::kCanonical, "canonical"}, {Ordering::kForeign, "foreign"}}};
};

/// The arithmetic profile a foreign attention declares (SPEC principle 4): what its float32
/// arithmetic rounds where, so that the float64 truth's bound covers a correct kernel of that
/// kind and no more. Canonical subjects have none (they are judged bit for bit). Listed in
/// declaration order; by looseness fp32 < fp16_p < bf16_p (mode detection's axis says so).
enum class AttentionProfile : std::uint8_t {
  kFp32,   ///< fp32 throughout: any summation order, exp within 2^-22 relative (the default)
  kBf16P,  ///< FlashAttention/FlashMLA style: P rounded to bf16 before P.V, ex2.approx
  kFp16P,  ///< the same with P rounded to fp16
};

template <>
struct EnumInfo<AttentionProfile> {
  static constexpr std::string_view kNoun = "attention profile";
  static constexpr std::array<EnumName<AttentionProfile>, 3> kNames{
      {{AttentionProfile::kFp32, "fp32"},
       {AttentionProfile::kBf16P, "bf16_p"},
       {AttentionProfile::kFp16P, "fp16_p"}}};
};

/// How a foreign kernel accumulates a sum of products in fp32 (the score dot q.k and P.V).
enum class Accumulation : std::uint8_t {
  kFp32,        ///< IEEE fp32 add or fma, round to nearest, any order: at most u per operation
  kTensorCore,  ///< tensor-core MMA: exact products of 16-bit operands, fp32 accumulation whose
                ///< alignment and normalisation truncate (Fasi, Higham, Mikaitis and Pranesh,
                ///< "Numerical behavior of NVIDIA tensor cores", 2021): at most 2u per addition
};

/// The facts of one arithmetic profile (SPEC principle 4), u = 2^-24 the fp32 unit roundoff. The
/// float64 truth derives its bound from these and nothing else (truth/src/truth.cpp).
///
/// The flash profiles are what FlashAttention 2/3, FlashMLA and Triton's fused attention do: Q, K
/// and V enter the tensor-core products in the kernel's 16-bit input type (FlashMLA dequantizes an
/// fp8 cache to bf16 first; FlashAttention takes bf16/fp16 tensors, so a caller with wider values
/// rounds them), so the operands are modelled rounded to the P type, with the exact effect of that
/// rounding in the bound (nothing where the case's values are representable). Scores accumulate on
/// tensor cores; p = ex2.approx(fma(s, sm * log2(e), -m * sm * log2(e))) against the running
/// maximum m of 64-token tiles (PTX ISA: ex2.approx.f32 is within 2 ulp of the correctly rounded
/// result, so 2.5 ulp <= 5u of the true 2^x; ftz flushes results below 2^-126); P is rounded to
/// the 16-bit type before P.V, while the row sum L adds P in fp32 before that rounding (FA2, FA3,
/// FlashMLA, Triton; a kernel that sums the rounded P is covered too); O accumulates on tensor
/// cores; out = O * rcp.approx(L) (within 1 ulp, then one rounding: 3u).
struct AttentionProfileFacts {
  AttentionProfile profile;
  Accumulation dots;         ///< q.k and P.V
  double exp_error_u;        ///< relative error of the exp, in units of u
  DType operands;            ///< Q, K, V enter both products rounded to this (kF32: as given)
  DType p;                   ///< P before P.V (kF32: not rounded)
  double normalize_error_u;  ///< relative error of the final O / L, in units of u
};

/// One row per profile, in enum order. fp32: a hardware exp2 within 2^-22 and a final division
/// within 2 ulp (correctly rounded, a reciprocal then a multiply, or CUDA's __fdividef).
inline constexpr std::array<AttentionProfileFacts, 3> kAttentionProfileFacts{{
    {AttentionProfile::kFp32, Accumulation::kFp32, 4.0, DType::kF32, DType::kF32, 4.0},
    {AttentionProfile::kBf16P, Accumulation::kTensorCore, 5.0, DType::kBF16, DType::kBF16, 3.0},
    {AttentionProfile::kFp16P, Accumulation::kTensorCore, 5.0, DType::kF16, DType::kF16, 3.0},
}};

constexpr const AttentionProfileFacts& profile_facts(AttentionProfile p) {
  return kAttentionProfileFacts[static_cast<std::size_t>(p)];
}
static_assert(profile_facts(AttentionProfile::kBf16P).profile == AttentionProfile::kBf16P &&
                  profile_facts(AttentionProfile::kFp16P).profile == AttentionProfile::kFp16P,
              "kAttentionProfileFacts is in enum order");

/// Planted attention bugs of the size a flash kernel could have (SPEC principle 4, last
/// sentence): every profile's bound must catch each. The float64 truth plants each in its own
/// result so the oracle can report a case on which a profile's bound cannot see one; the CPU and
/// CUDA flash subjects plant them as mutants.
enum class AttentionBug : std::uint8_t {
  kNone,
  kDropChunkLast,  ///< the last visible token of every chunk (selected block) is skipped
  kScaleOff,       ///< the softmax scale is fl(sm_scale * kScaleOffFactor)
  kNeighbourV,     ///< V (and its scale) read from KV head (g + 1) mod nkv
  /// The selection read up to its first -1 (a kernel that takes -1 as the end of the row, where
  /// SPEC 6 allows -1 anywhere: vLLM M3's descending rows put -1 last, a -1-first row loses all)
  kStopAtMinusOne,
  /// Ids past n_valid kept as blocks whose tokens are all masked, with no guard on a running
  /// maximum of -inf: such a block met before any visible token gives exp2(-inf - -inf) = NaN
  /// (FlashAttention's Check_inf, missing)
  kMaskedChunkNan,
};

template <>
struct EnumInfo<AttentionBug> {
  static constexpr std::string_view kNoun = "attention bug";
  static constexpr std::array<EnumName<AttentionBug>, 6> kNames{
      {{AttentionBug::kNone, "none"},
       {AttentionBug::kDropChunkLast, "drop_chunk_last"},
       {AttentionBug::kScaleOff, "scale_off"},
       {AttentionBug::kNeighbourV, "neighbour_v"},
       {AttentionBug::kStopAtMinusOne, "stop_at_minus_one"},
       {AttentionBug::kMaskedChunkNan, "masked_chunk_nan"}}};
};

/// Whether a planted bug changes the arithmetic (a size a bound might hide, so the float64 truth
/// plants it to find blind spots) or what is read (the selection bugs: no bound hides them).
constexpr bool bug_is_numeric(AttentionBug bug) {
  return bug == AttentionBug::kDropChunkLast || bug == AttentionBug::kScaleOff ||
         bug == AttentionBug::kNeighbourV;
}

/// kScaleOff's factor: 1 + 2^-7, one bf16 step of the scale (sm_scale passed through a bf16 tensor
/// and rounded the wrong way is off by as much).
inline constexpr float kScaleOffFactor = 1.0f + 0x1p-7f;

/// Requests of one step as the read side sees them. Query row i (of Tq) belongs to request r with
/// query_start_loc[r] <= i < query_start_loc[r + 1]; its position is p = seq_lens[r] - q_len_r + j
/// (j its index within the request). A request with seq_len 0 is a padded row: it selects nothing.
struct ReadBatch {
  std::int64_t max_blocks = 0;
  std::vector<std::int32_t> block_table;      ///< [B, max_blocks] physical blocks; -1 unused
  std::vector<std::int64_t> seq_lens;         ///< [B] tokens in the cache, the step's included
  std::vector<std::int64_t> query_start_loc;  ///< [B + 1], query_start_loc[0] = 0

  std::int64_t num_requests() const { return static_cast<std::int64_t>(seq_lens.size()); }
  std::int64_t num_queries() const { return query_start_loc.empty() ? 0 : query_start_loc.back(); }
};

/// What a NaN token score does to its index head's block score (SPEC 5 `index_nan`).
enum class IndexNan : std::uint8_t {
  kSkip,    ///< ignored (fmax; vLLM's Triton indexer); a block of only NaN scores -1e30 (default)
  kFirst,   ///< the block ranks above every score (+inf; torch amax + topk, TRT-LLM's torch path)
  kLowest,  ///< the block scores -1e30
};

template <>
struct EnumInfo<IndexNan> {
  static constexpr std::string_view kNoun = "index_nan";
  static constexpr std::array<EnumName<IndexNan>, 3> kNames{
      {{IndexNan::kSkip, "skip"}, {IndexNan::kFirst, "first"}, {IndexNan::kLowest, "lowest"}}};
};

/// The factor of every token score (SPEC 5 `index_score_scale`): 1 (vLLM, TensorRT-LLM's MSA
/// path), or fl(index_dim^-0.5) applied in fp32 to the dot (TensorRT-LLM's triton and vanilla
/// backends, MSA's reference).
enum class IndexScoreScale : std::uint8_t { kOne, kRsqrtDim };

template <>
struct EnumInfo<IndexScoreScale> {
  static constexpr std::string_view kNoun = "index_score_scale";
  static constexpr std::array<EnumName<IndexScoreScale>, 2> kNames{
      {{IndexScoreScale::kOne, "one"}, {IndexScoreScale::kRsqrtDim, "rsqrt_dim"}}};
};

/// How a KV head's selection comes from its index heads (SPEC 5 `index_group`): `max` (one top-k
/// over the max of the heads' block scores; TensorRT-LLM's MSA path), or `union` (each index head
/// its own top-k, the KV head the ascending union of their ids, padded with -1 to topk * heads per
/// KV head; TensorRT-LLM's triton and vanilla backends, SGLang).
enum class IndexGroup : std::uint8_t { kMax, kUnion };

template <>
struct EnumInfo<IndexGroup> {
  static constexpr std::string_view kNoun = "index_group";
  static constexpr std::array<EnumName<IndexGroup>, 2> kNames{
      {{IndexGroup::kMax, "max"}, {IndexGroup::kUnion, "union"}}};
};

/// What top-k does with a chosen valid block whose score is -inf (SPEC 5): keep it (default), or
/// drop it to -1 (`drop_neg_inf`, TensorRT-LLM's selector).
enum class IndexNegInf : std::uint8_t { kKeep, kDrop };

template <>
struct EnumInfo<IndexNegInf> {
  static constexpr std::string_view kNoun = "index_neg_inf";
  static constexpr std::array<EnumName<IndexNegInf>, 2> kNames{
      {{IndexNegInf::kKeep, "keep"}, {IndexNegInf::kDrop, "drop"}}};
};

/// The element type of index-Q (SPEC 5): the activation dtype, or e4m3 read unscaled (vLLM's fp8
/// indexer; only over an e4m3 index-K cache, flat or block-scaled).
enum class IndexQType : std::uint8_t { kActivation, kFp8E4m3 };

template <>
struct EnumInfo<IndexQType> {
  static constexpr std::string_view kNoun = "index_q";
  static constexpr std::array<EnumName<IndexQType>, 2> kNames{
      {{IndexQType::kActivation, "activation"}, {IndexQType::kFp8E4m3, "e4m3"}}};
};

/// Block top-k selection parameters (SPEC 5; MiniMax-M3 defaults).
struct IndexerParams {
  std::int64_t num_index_heads = 4;  ///< a multiple of num_kv_heads
  std::int64_t sparse_block = 128;   ///< selection granularity, independent of the page size
  std::int64_t topk = 16;
  std::int64_t init_blocks = 0;
  std::int64_t local_blocks = 1;
  IndexNan index_nan = IndexNan::kSkip;
  IndexScoreScale score_scale = IndexScoreScale::kOne;
  IndexGroup index_group = IndexGroup::kMax;
  IndexNegInf neg_inf = IndexNegInf::kKeep;
  IndexQType index_q_type = IndexQType::kActivation;
};

/// Index heads whose own top-k a KV head's selection is the union of: 1 under `max` (the group's
/// score is one row), num_index_heads / nkv under `union`.
std::int64_t selection_lanes(const IndexerParams& params, std::int64_t num_kv_heads);
/// Ids per (query row, KV head) of the indexer's output: topk * selection_lanes.
std::int64_t selection_width(const IndexerParams& params, std::int64_t num_kv_heads);
/// The element type of index-Q: the activation dtype, or e4m3.
DType index_q_dtype(const ModelConfig& config, const IndexerParams& params);

/// The order of a top-k kernel's rows (SPEC 5; checked only when a kernel declares one).
enum class TopkOrder : std::uint8_t {
  kAscendingIds,     ///< ids ascending, then -1 (kvoracle's reference, TRT-LLM MSA, vLLM SM100)
  kDescendingScore,  ///< best first, ties in the kernel's own order, then -1 (vLLM M3 Triton)
  kUnordered,        ///< the chosen ids and -1 entries in any order
};
template <>
struct EnumInfo<TopkOrder> {
  static constexpr std::string_view kNoun = "topk_order";
  static constexpr std::array<EnumName<TopkOrder>, 3> kNames{
      {{TopkOrder::kAscendingIds, "ascending_ids"},
       {TopkOrder::kDescendingScore, "descending_score"},
       {TopkOrder::kUnordered, "unordered"}}};
};

/// Where row (q, g) of a top-k output lives: token-major [Tq, nkv, width] (kvoracle, TRT-LLM,
/// vLLM's SM100 MSA path) or head-major [nkv, Tq, width] (vLLM's Triton M3 indexer).
enum class TopkLayout : std::uint8_t { kTokenMajor, kHeadMajor };
template <>
struct EnumInfo<TopkLayout> {
  static constexpr std::string_view kNoun = "topk_layout";
  static constexpr std::array<EnumName<TopkLayout>, 2> kNames{
      {{TopkLayout::kTokenMajor, "token_major"}, {TopkLayout::kHeadMajor, "head_major"}}};
};

/// What a foreign top-k kernel declares about its output (SPEC 5): the rows' order, their layout,
/// and the precision of the keys it selects on. Its text form, the one every interface takes
/// (kvoracle judge --topk-order, case and result files, the Python package), is
/// `<order>[,<layout>][,keys<N>]` with the defaults left out: "descending_score,head_major",
/// "ascending_ids,keys16".
struct TopkForm {
  TopkOrder order = TopkOrder::kAscendingIds;
  TopkLayout layout = TopkLayout::kTokenMajor;
  /// The kernel ranks blocks by the top `key_bits` bits of each fp32 score's order-preserving
  /// image (sign, 8 exponent bits, key_bits - 9 mantissa bits): 32 is the score itself, 16 MSA's
  /// msa_v1 keys. Two scores within one key step of each other may tie (SPEC 5: the tie-aware
  /// bound widens by one key step). kMinKeyBits..32.
  int key_bits = 32;

  static constexpr int kMinKeyBits = 9;
  bool operator==(const TopkForm&) const = default;
};

/// The text form above; parse_topk_form throws InvalidInput naming `field` on anything else.
std::string topk_form_text(const TopkForm& form);
TopkForm parse_topk_form(std::string_view text, const std::string& field);

/// Offset of entry k of row (q, g) in a top-k output of `num_queries` rows, `num_kv_heads` heads
/// and `width` ids per row, laid out as `layout` says.
std::int64_t topk_offset(TopkLayout layout, std::int64_t q, std::int64_t g, std::int64_t k,
                         std::int64_t num_queries, std::int64_t num_kv_heads, std::int64_t width);

/// The score a kernel with `key_bits`-bit keys ranks by: the top key_bits bits of the score's
/// order-preserving image kept and the rest cleared (rounding toward -inf), mapped back to a float;
/// -inf stays -inf. Scores whose keys are equal tie.
float topk_score_key(float score, int key_bits);

/// One key step near score x under `key_bits`-bit keys: the spacing of the keys in x's binade
/// (the smallest normal binade for subnormals and zero, the largest for magnitudes past it and
/// infinities), 0 for 32-bit keys.
double topk_key_step(double x, int key_bits);

/// The factor of SPEC 5's token scores: 1, or index_dim^-0.5 correctly rounded to fp32.
float index_score_factor(IndexScoreScale scale, std::int64_t index_dim);

/// How the selection handed to attention is arranged (SPEC 6: ids in any order, -1 anywhere; the
/// result depends only on the set). Case generation draws one per case; the reference reads any.
enum class SelectionOrder : std::uint8_t {
  kAscendingIds,     ///< ids ascending, then the rest (kvoracle's indexer, TRT-LLM)
  kDescendingScore,  ///< best first, then the rest (vLLM M3's Triton indexer)
  kMinusOneFirst,    ///< the rest (-1, ids past n_valid) first, then the ids ascending
  kShuffled,         ///< every entry at a random place
};
template <>
struct EnumInfo<SelectionOrder> {
  static constexpr std::string_view kNoun = "selection order";
  static constexpr std::array<EnumName<SelectionOrder>, 4> kNames{
      {{SelectionOrder::kAscendingIds, "ascending_ids"},
       {SelectionOrder::kDescendingScore, "descending_score"},
       {SelectionOrder::kMinusOneFirst, "minus_one_first"},
       {SelectionOrder::kShuffled, "shuffled"}}};
};

/// Attention parameters (SPEC 6).
struct AttentionParams {
  std::int64_t num_q_heads = 16;  ///< a multiple of num_kv_heads (GQA)
  std::int64_t sparse_block = 128;
  float sm_scale = 0.0f;  ///< 0: the default fl(1 / fl(sqrt(hd)))
  DType out_dtype = DType::kBF16;
};

/// Throws InvalidInput unless the batch is consistent with the cache: B >= 1 rows of max_blocks
/// entries; query_start_loc non-decreasing from 0; q_len_r <= seq_lens[r] unless seq_lens[r] is 0
/// (a padded row); seq_lens[r] <= max_blocks * block_size; every block-table
/// entry a request reads (the first ceil(seq_len / block_size)) in [0, num_blocks).
void validate_batch(const ModelConfig& config, const ReadBatch& batch);

/// Throws InvalidInput on topk < 1, sparse_block < 1, negative init/local blocks, index heads
/// not a positive multiple of the KV heads, or e4m3 index-Q over an index-K cache that is not e4m3.
void validate_indexer(const ModelConfig& config, const IndexerParams& params);

/// Throws InvalidInput on query heads not a positive multiple of the KV heads, sparse_block < 1, a
/// non-finite or negative sm_scale, or an output dtype that is not f32, bf16 or fp16.
void validate_attention(const ModelConfig& config, const AttentionParams& params);

}  // namespace kvo::spec
