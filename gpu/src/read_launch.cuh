#pragma once
/// \file read_launch.cuh
/// What the read kernel families share (attention_kernels.cuh, indexer_kernels.cuh, topk.cuh):
/// their limits, the batch view every kernel reads, shared-memory carving, row staging into shared
/// memory, the host glue of a launch (geometry, limits, the shared-memory attribute), and the
/// host-memory paths of read_host.cu with the launcher as a parameter (so that kvo_gpu_testing
/// runs them over its planted-bug launchers).
///
/// Planted bugs (ReadBug) are template parameters of the launch templates; kvo_gpu instantiates
/// ReadBug::kNone only, kvo_gpu_testing (gpu/testing/) the others.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvo/gpu/read.hpp"
#include "launch.cuh"
#include "read_common.cuh"

namespace kvo::gpu::detail {

/// A bug planted in the read kernels (kvo_gpu_testing's ReadFault); kNone in production. All but
/// kTiesToHigherId live in the fast family; that one in the canonical selection.
enum class ReadBug : std::uint8_t {
  kNone,
  kIgnoreLocal,     ///< indexer: the local (current) block is not forced
  kExpNoLog2e,      ///< attention: exp2(s) where exp2(s * log2(e)) is meant (a base-2 softmax)
  kIdsWrapAt1024,   ///< top-k: ids stored in 10 bits (a short path applied past 1024 blocks)
  kTiesToHigherId,  ///< top-k: an exact tie won by the higher block id (TopkArgs::tie_xor 0)
};

inline constexpr int kReadThreads = 256;   // attention chunk kernel: 8 warps
inline constexpr int kScoreThreads = 512;  // indexer score kernel: 16 warps, half the latency
inline constexpr int kMaxHeadDim = 256;    // 32 dot lanes of 8
inline constexpr int kMaxTopk = 2048;  // DeepSeek-V3.2's index_topk (2048 tokens, 1-token blocks)
// A selection row handed to attention: the union of two index heads' top-k (index_group union: a
// row topk * lanes wide) and the masked columns an engine pads it with (-1, ids past n_valid;
// SPEC 6), e.g. a row rounded up to a tile.
inline constexpr int kMaxSelectionWidth = 2 * kMaxTopk + 64;
inline constexpr std::size_t kMaxSmem = 200 * 1024;
inline constexpr int kStageBytes = 32 * 1024;  // staged K (and as much V) token rows per chunk tile

/// What every read kernel reads of the layer and the batch.
struct BatchView {
  ReadGeom g;
  const int* table;           // [R, max_blocks]
  const long long* row_req;   // [Tq]
  const long long* row_pos;   // [Tq]
  const long long* seq_lens;  // [R]
};

/// Hands out 16-byte-aligned sections of a shared-memory block, in order (byte offsets).
struct SmemCarver {
  std::size_t at = 0;
  __host__ __device__ std::size_t take(std::size_t bytes) {
    const std::size_t o = at;
    at += (bytes + 15) / 16 * 16;
    return o;
  }
};

/// Stages rows i0 .. i0 + n - 1 of a chunk into dst [n][row_bytes] with asynchronous copies;
/// off[i] is the byte offset of row i in `cache`. Every thread of the block takes part.
__device__ inline void stage_rows(unsigned char* dst, const unsigned char* cache,
                                  const long long* off, int i0, int n, int row_bytes, int unit) {
  const int units = row_bytes / unit;
  if ((units & (units - 1)) == 0) {  // the usual case: no division
    const int shift = __ffs(units) - 1;
    for (int e = threadIdx.x; e < n * units; e += blockDim.x) {
      const int i = e >> shift, u = e & (units - 1);
      cp_async(dst + i * row_bytes + u * unit, cache + off[i0 + i] + u * unit, unit);
    }
    return;
  }
  for (int e = threadIdx.x; e < n * units; e += blockDim.x) {
    const int i = e / units, u = e % units;
    cp_async(dst + i * row_bytes + u * unit, cache + off[i0 + i] + u * unit, unit);
  }
}

/// The kernels' view of a layer's geometry and of a batch on the device.
ReadGeom make_geom(const spec::ModelConfig& c, std::int64_t max_blocks);
BatchView batch_view(const spec::ModelConfig& c, const DeviceReadBatch& b);

/// Throws spec::Unsupported(what) unless ok.
void require(bool ok, const std::string& what);

/// Raises a kernel's dynamic shared memory limit to at least `bytes` (above 48 KiB, static shared
/// memory included, a launch fails without it), never lowering it. The limit is the process's and
/// host threads launch side by side (the GPU tier's answerer and a judged subject, each on its own
/// thread): a thread setting a smaller limit between another's setting and its launch failed that
/// launch (cudaErrorInvalidValue). A higher limit changes no launch: each asks its own bytes.
void raise_smem_limit(const void* kernel, std::size_t bytes);
template <class K>
void allow_smem(K kernel, std::size_t bytes) {
  raise_smem_limit(reinterpret_cast<const void*>(kernel), bytes);
}

inline constexpr int kMaxFusedSpan = 64;  // the fused launch's logical blocks a CUDA block, at most

/// The fused indexer launch's plan for a call (indexer_fused.cuh; host): its logical blocks per
/// CUDA block and shared memory, or span 0 where fused_indexer_applies refuses the call. `start`:
/// the index-K view's first element's address (only its alignment matters); `sms`: the device's
/// multiprocessors; `forced` (DeviceIndexer::fused): lanes a token and span forced where nonzero.
/// The plan's span: the one of least modelled time (fused_span_cost, indexer_kernels.cu), at least
/// a CUDA block of threads' worth of tokens each.
struct FusedPlan {
  int span = 0;
  int split = 1;  // lanes a token (IndexArgs::split)
  std::size_t smem = 0;
};
FusedPlan fused_indexer_plan(const spec::ModelConfig& c, const spec::IndexerParams& p,
                             ReadKernel kernel, std::int64_t rows, std::int64_t max_nv,
                             long long start, int sms, FusedShape forced = {});

/// The public launchers' signatures (kvo/gpu/read.hpp), and the host-memory paths of read_host.cu
/// over any launcher of that signature (`scores`: where the indexer's block scores go, when
/// wanted; `slots_per_block`: DeviceAttention::slots_per_block).
using IndexerLaunch = void (*)(const spec::ModelConfig&, const spec::IndexerParams&,
                               const DeviceReadBatch&, const DeviceIndexer&, ReadKernel, void*);
using AttentionLaunch = void (*)(const spec::ModelConfig&, const spec::AttentionParams&,
                                 const DeviceReadBatch&, const DeviceAttention&, ReadKernel, void*);

std::vector<std::int32_t> indexer_topk_host_via(
    IndexerLaunch launch, const spec::ModelConfig& config, const spec::IndexerParams& params,
    const spec::ReadBatch& batch, const spec::HostTensor& index_q, const spec::LayerCaches& caches,
    ReadKernel kernel, const spec::TopkForm& form = {}, IndexerPath path = IndexerPath::kTwoLaunch,
    BlockScores* scores = nullptr, FusedShape shape = {});

spec::HostTensor attention_host_via(AttentionLaunch launch, const spec::ModelConfig& config,
                                    const spec::AttentionParams& params,
                                    const spec::ReadBatch& batch, const spec::HostTensor& q,
                                    const spec::LayerCaches& caches,
                                    const std::vector<float>& k_scale,
                                    const std::vector<float>& v_scale,
                                    const std::vector<std::int32_t>& selection, std::int64_t topk,
                                    ReadKernel kernel, int slots_per_block = 0);

/// The flash family's launcher signature (launch_flash_attention), and its host-memory path.
using FlashLaunch = void (*)(const spec::ModelConfig&, const spec::AttentionParams&,
                             const DeviceReadBatch&, const DeviceAttention&, void*);

spec::HostTensor flash_attention_host_via(
    FlashLaunch launch, const spec::ModelConfig& config, const spec::AttentionParams& params,
    const spec::ReadBatch& batch, const spec::HostTensor& q, const spec::LayerCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk, int slots_per_block = 0);

}  // namespace kvo::gpu::detail
