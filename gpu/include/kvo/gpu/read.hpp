#pragma once
/// \file read.hpp
/// The read side on the GPU: the indexer with block top-k, and sparse or dense attention, over the
/// paged caches of one sparse layer read through block tables. Two kernel families:
///   kCanonical follows SPEC 5-6 operation for operation (bit-exact with the reference);
///   kFast does not (hardware exp2, butterfly reductions, split accumulators, top-k ids by
///   descending score) and is judged in the oracle's foreign mode;
/// and a third for attention alone, the flash family (flash_attention_host): FlashAttention's
/// arithmetic with P in bf16, judged in foreign mode under the profile bf16_p.
/// Host-memory entry points validate their inputs on the host before anything is copied or
/// launched (spec::InvalidInput), turn CUDA errors into spec::FailedToRun, and report sizes past
/// the kernels' limits as spec::Unsupported. The device-memory launchers below serve benchmarks and
/// graphs: they take validated inputs already on the device. No CUDA types in this header.
/// Planted bugs of the fast family (the oracle's self-tests) live in kvo_gpu_testing
/// (kvo/gpu/testing/faults.hpp), never here.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvo/gpu/device_calls.hpp"
#include "kvo/spec/read.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::gpu {

/// Which kernel family runs a read.
enum class ReadKernel : std::uint8_t { kCanonical, kFast };

/// How the indexer runs: kTwoLaunch, the score kernel then the top-k kernel; kFused, one launch
/// (scores and selection, the last CUDA block of a row selecting) where indexer_is_fused, else
/// two. Both give the same ids. (launch_indexer_topk takes the one launch when handed
/// DeviceIndexer::row_done; the host paths hand it under kFused.)
enum class IndexerPath : std::uint8_t { kTwoLaunch, kFused };

/// The one launch's shape, forced (tests and benchmarks; every shape gives the same ids): lanes a
/// token (1 or 2) and logical blocks a CUDA block (clamped to [1, min(64, max_n_valid)]); 0, the
/// launch's choice.
struct FusedShape {
  int split = 0;
  int span = 0;
};

/// SPEC 5: ids [Tq, nkv, spec::selection_width] ([nkv, Tq, width] when form.layout is head-major).
/// kCanonical: the chosen logical blocks ascending, then -1.
/// kFast: the chosen blocks by descending score (ranked by form.key_bits-bit keys), then -1 (under
/// index_group union, ascending). index_q: [Tq, num_index_heads, index_dim] in
/// spec::index_q_dtype; caches: the sparse layer's.
std::vector<std::int32_t> indexer_topk_host(
    const spec::ModelConfig& config, const spec::IndexerParams& params,
    const spec::ReadBatch& batch, const spec::HostTensor& index_q, const spec::LayerCaches& caches,
    ReadKernel kernel = ReadKernel::kCanonical, const spec::TopkForm& form = {},
    IndexerPath path = IndexerPath::kTwoLaunch, FusedShape shape = {});

/// The block scores behind an indexer's selection: what the top-k ranked, after the SPEC 5
/// forcing, [Tq, nkv * spec::selection_lanes, max_n_valid] (a row's entries past its n_valid, and a
/// padded row's, unspecified). The GPU reference tier (issue 15) answers a read case with them, as
/// the CPU reference's selection carries its own.
struct BlockScores {
  std::vector<float> scores;
  std::int64_t max_n_valid = 0;
};

/// indexer_topk_host (two launches, token-major, the family's order) that also brings back the
/// block scores the selection ranked into `scores`.
std::vector<std::int32_t> indexer_selection_host(const spec::ModelConfig& config,
                                                 const spec::IndexerParams& params,
                                                 const spec::ReadBatch& batch,
                                                 const spec::HostTensor& index_q,
                                                 const spec::LayerCaches& caches, ReadKernel kernel,
                                                 BlockScores& scores);

/// Whether launch_indexer_topk runs this call in one launch (given DeviceIndexer::row_done and an
/// index-K view starting 16-byte aligned): index_group max (one score row per KV head), the
/// canonical family under drop_neg_inf only up to topk 16, index_dim 64 .. 256, at most 4096
/// logical blocks a row, index-K rows whose 8-element groups are aligned for vector loads.
/// Host-only; needs no GPU (the device's multiprocessor count only sizes the launch).
bool indexer_is_fused(const spec::ModelConfig& config, const spec::IndexerParams& params,
                      ReadKernel kernel, std::int64_t max_n_valid);

/// Which chunk kernel runs attention (either family): kAuto, the specialised one where
/// attention_is_specialised (and the K and V pointers are 16-byte aligned), else the generic one;
/// kGeneric, the generic one always: the baseline the specialised kernel is measured and tested
/// against. Both give the same bits (canonical) or the same foreign-mode verdicts (fast).
enum class AttentionPath : std::uint8_t { kAuto, kGeneric };

/// SPEC 6: out [Tq, nq, hd] in params.out_dtype. q: [Tq, nq, hd] in the activation dtype.
/// `selection`: [Tq, nkv, topk] logical block ids in any order (-1 unused; distinct and below
/// n_valid), or empty for dense attention over every token t <= p.
spec::HostTensor attention_host(const spec::ModelConfig& config,
                                const spec::AttentionParams& params, const spec::ReadBatch& batch,
                                const spec::HostTensor& q, const spec::LayerCaches& caches,
                                const std::vector<float>& k_scale,
                                const std::vector<float>& v_scale,
                                const std::vector<std::int32_t>& selection, std::int64_t topk,
                                ReadKernel kernel = ReadKernel::kCanonical,
                                AttentionPath path = AttentionPath::kAuto);

/// Whether launch_attention computes this call's chunks through its specialised kernel: head_dim
/// 64 or 128, 1, 2, 4, 8 or 16 query heads per KV head, sparse_block <= 128, a bf16, fp16 or fp8
/// cache whose K and V rows start 16-byte aligned (strides and view offset); the cache dtype,
/// head_dim and group compiled in, q and 16 elements of K per lane in registers, K and V staged
/// at once. Host-only; needs no GPU.
bool attention_is_specialised(const spec::ModelConfig& config, const spec::AttentionParams& params);

/// A batch's query rows on the device (all pointers device memory).
struct DeviceReadBatch {
  const std::int32_t* block_table = nullptr;   ///< [R, max_blocks] physical page per logical page
  const std::int64_t* row_request = nullptr;   ///< [Tq] request of each query row
  const std::int64_t* row_position = nullptr;  ///< [Tq] position p of each query row
  const std::int64_t* seq_lens = nullptr;      ///< [R]; 0 marks a padded request
  std::int64_t num_rows = 0, max_blocks = 0;
};

/// One attention call's device buffers.
struct DeviceAttention {
  /// K's first element (the one KV tensor's for packed and split layouts; a strided view's offset
  /// into its buffer is the caller's, SPEC 3)
  const void* k_cache = nullptr;
  /// V's first element: == k_cache for the packed and split layouts (the kernels offset V by
  /// kv_part); for nhd / hnd as views of one allocation V's own view (kv_part after K), as
  /// cache_views hands it.
  const void* v_cache = nullptr;
  const void* q = nullptr;                  ///< [Tq, nq, hd] activation dtype
  const float* k_scale = nullptr;           ///< [1] or [nkv]
  const float* v_scale = nullptr;           ///< [1] or [nkv]
  const std::int32_t* selection = nullptr;  ///< [Tq, nkv, topk], or null for dense attention
  std::int64_t topk = 0;                    ///< sparse: the selection's width
  std::int64_t slots = 0;      ///< chunks per row: topk (sparse) or the largest n_valid (dense)
  float* workspace = nullptr;  ///< attention_workspace_floats(...) floats
  void* out = nullptr;         ///< [Tq, nq, hd] params.out_dtype
  /// Chunk slots one CUDA block of the decode kernels runs in turn, the next slot's rows in flight
  /// while one computes (canonical and fast families' specialised kernel, the flash family's decode
  /// kernels), forced (tests and benchmarks: every value gives the same bits); clamped to the
  /// kernel's most: 24 canonical and fast, whose runs follow the flattened (row, KV head, slot)
  /// order into the next (row, KV head); 8 flash, of one (row, KV head) (and the call's slots);
  /// 0: the launch's choice.
  int slots_per_block = 0;
};

/// Floats of per-chunk partial results (m, l, o[hd]) that launch_attention needs.
std::size_t attention_workspace_floats(std::int64_t num_rows, std::int64_t num_q_heads,
                                       std::int64_t head_dim, std::int64_t slots);

/// Two launches on `stream` (a cudaStream_t): CUDA blocks per (row, KV head) computing each chunk's
/// (m, l, o) for the group's query heads (one chunk a block, or slots_per_block in turn in the
/// specialised kernel), then one per (row, query head) combining the chunks in ascending order,
/// launched as a programmatic dependent of the first. Throws spec::Unsupported for shapes past
/// the kernels' limits.
void launch_attention(const spec::ModelConfig& config, const spec::AttentionParams& params,
                      const DeviceReadBatch& batch, const DeviceAttention& a, ReadKernel kernel,
                      void* stream);

/// launch_attention through the generic chunk kernel whatever the call (AttentionPath::kGeneric).
void launch_attention_generic(const spec::ModelConfig& config, const spec::AttentionParams& params,
                              const DeviceReadBatch& batch, const DeviceAttention& a,
                              ReadKernel kernel, void* stream);

/// The flash family (attention only): attention in FlashAttention's arithmetic, the oracle's
/// profile bf16_p (spec::profile_facts), judged in foreign mode. One CUDA block per (query row, KV
/// head) runs the row's tokens through 64-token tiles with an online softmax: Q, K and V rounded
/// to bf16, raw scores by fp32 fma, p = ex2.approx(fma(s, c, -m c)) with c = sm_scale * log2(e)
/// and m the running maximum, the row sum L from P in fp32, P rounded to bf16 before P.V, O by
/// fp32 fma with the rescale, out = O * rcp.approx(L). Where flash_is_decode, the decode kernels
/// instead (launch_flash_attention): the same roundings, the products on tensor cores. Same
/// inputs, validation and errors as attention_host (out [Tq, nq, hd] in params.out_dtype).
spec::HostTensor flash_attention_host(
    const spec::ModelConfig& config, const spec::AttentionParams& params,
    const spec::ReadBatch& batch, const spec::HostTensor& q, const spec::LayerCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk);

/// One launch of the flash family on `stream` (a cudaStream_t). Where flash_is_decode and
/// a.workspace is given (attention_workspace_floats of a.slots) and K and V start 16-byte aligned,
/// the decode kernels run: the same arithmetic with Q'K^T and P'V' on tensor cores, a CUDA block
/// per selected block and a combine; otherwise the one-block kernel above (a.workspace unused).
/// Throws spec::Unsupported for shapes past the kernels' limits (head_dim > 256, more than 64
/// query heads per KV head, their shared memory above 200 KiB).
void launch_flash_attention(const spec::ModelConfig& config, const spec::AttentionParams& params,
                            const DeviceReadBatch& batch, const DeviceAttention& a, void* stream);

/// launch_flash_attention through the one-block kernel always: the baseline the decode kernels are
/// measured and tested against.
void launch_flash_attention_generic(const spec::ModelConfig& config,
                                    const spec::AttentionParams& params,
                                    const DeviceReadBatch& batch, const DeviceAttention& a,
                                    void* stream);

/// Whether the flash family's decode kernels can run this call (launch_flash_attention): head_dim
/// 64 or 128, at most 16 query heads per KV head, sparse_block <= 128, a 16- or 8-bit cache whose
/// rows start 16-byte aligned. Host-only; needs no GPU.
bool flash_is_decode(const spec::ModelConfig& config, const spec::AttentionParams& params);

/// One indexer call's device buffers.
struct DeviceIndexer {
  /// The index-K view's first element (SPEC 3: a strided view's offset in; its strides are the
  /// config's spec::index_view), at least 4-byte aligned.
  const void* index_cache = nullptr;
  const void* index_q = nullptr;  ///< [Tq, num_index_heads, index_dim], spec::index_q_dtype
  std::int64_t max_n_valid = 1;   ///< the largest n_valid of any row
  /// [Tq, nkv * spec::selection_lanes, max_n_valid] workspace (under index_group union one row per
  /// index head)
  float* scores = nullptr;
  std::int32_t* ids = nullptr;  ///< [Tq, nkv, spec::selection_width] result (head-major:
                                ///< [nkv, Tq, width])
  /// The output's form: its layout (both families) and the key precision the selection ranks by
  /// (the fast family; the canonical one ranks by exact scores: key_bits 32). The order is the
  /// family's: ascending ids (canonical), best first (fast).
  spec::TopkForm form;
  /// [Tq] counters of the one-launch path (indexer_is_fused): zero before the first call, and
  /// left zero by every call (so one call at a time may use them); null: two launches.
  std::uint32_t* row_done = nullptr;
  /// The one-launch path's shape: {0, 0}, the launch's choice.
  FusedShape fused;
};

/// On `stream`: one launch where indexer_is_fused and ix.row_done is given (CUDA blocks of a row
/// score its logical blocks; the last of them selects), else two: block scores (one CUDA block per
/// (row, logical block), all KV groups), then top-k (one CUDA block per (row, KV head)).
void launch_indexer_topk(const spec::ModelConfig& config, const spec::IndexerParams& params,
                         const DeviceReadBatch& batch, const DeviceIndexer& ix, ReadKernel kernel,
                         void* stream);

/// kvoracle's read kernels as device functions (kvo/gpu/device_calls.hpp), fed from a call's
/// tensors as a user's kernel is: what a CUDA read subject runs on device memory (the GPU tier's
/// resident read path). The indexer: `kernel`'s family in two launches, written in the family's
/// form, the block scores into call.scores where the call has it; attention: `kernel`'s family
/// through `path`. Their scratch (scores, per-chunk partials) is allocated and freed on the call's
/// stream; grids are sized by call.batch.max_n_valid.
DeviceIndexerFunction device_indexer_function(ReadKernel kernel);
DeviceAttentionFunction device_attention_function(ReadKernel kernel,
                                                  AttentionPath path = AttentionPath::kAuto);

}  // namespace kvo::gpu
