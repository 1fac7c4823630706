// The unfused baseline: the pre-fusion path as engines ran it (torch ops), per tensor K, V and
// index-K in order:
//   op 1  block_idx = slot_mapping // block_size          (floor division, in the slot dtype)
//   op 2  offset    = slot_mapping %  block_size          (floor remainder, in the slot dtype)
//   op 3  (block_idx, offset).long()                      (index cast; strict mode masks slot < 0,
//                                                          legacy_wrap counts a negative block
//                                                          index from the end, as torch does)
//   op 4  cache_view[block_idx, offset] = values.to(cache dtype)   (the scatter, index_put)
// 12 launches on a sparse layer, 8 on a dense one. The scatter quantizes with the same canonical
// order as the fused kernel (convert.cuh), so the bytes are identical (div_approx included: both
// paths use the same div.full.f32 instruction).
#include <cuda_runtime.h>

#include "kvo/spec/outcome.hpp"
#include "launch.cuh"

namespace kvo::gpu {
namespace detail {
namespace {

/// Marks a masked row in the int64 offset vector (a real offset is always in [0, bs)).
constexpr std::int64_t kMasked = -1;

__device__ __forceinline__ std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  const std::int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/// op 1: out[t] = slots[t] // bs. slots, out: [T] of S.
template <class S>
__global__ void __launch_bounds__(kThreads)
    slot_div_kernel(const S* slots, S* out, std::int64_t n, std::int64_t bs) {
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t < n) out[t] = static_cast<S>(floor_div(slots[t], bs));
}

/// op 2: out[t] = slots[t] % bs (floor semantics, in [0, bs)). slots, out: [T] of S.
template <class S>
__global__ void __launch_bounds__(kThreads)
    slot_mod_kernel(const S* slots, S* out, std::int64_t n, std::int64_t bs) {
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t < n) {
    const std::int64_t a = slots[t];
    out[t] = static_cast<S>(a - floor_div(a, bs) * bs);
  }
}

/// op 3: block64[t], offset64[t] = long(block[t]), long(offset[t]); strict mode marks padding rows
/// (slot < 0) kMasked; legacy_wrap maps a negative block index to block + num_blocks.
/// slots, block, offset: [T] of S; block64, offset64: [T] int64.
template <class S>
__global__ void __launch_bounds__(kThreads)
    index_cast_kernel(const S* slots, const S* block, const S* offset, std::int64_t* block64,
                      std::int64_t* offset64, std::int64_t n, std::int64_t num_blocks, bool wrap) {
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= n) return;
  const std::int64_t b = block[t];
  if (!wrap && slots[t] < 0) {
    block64[t] = 0;
    offset64[t] = kMasked;
    return;
  }
  block64[t] = b < 0 ? b + num_blocks : b;
  offset64[t] = offset[t];
}

/// op 4 for K or V: one thread per 8 elements of one (token, head). src: [>= T, nkv, hd] act;
/// dst: the cache view [nb, bs, nkv, hd] with strides st (elements); scale: [1] or [nkv].
template <DType A, DType C>
__global__ void __launch_bounds__(kThreads)
    kv_scatter_kernel(const FusedParams p, const std::int64_t* block64,
                      const std::int64_t* offset64, const void* src, void* dst,
                      const float* scale) {
  using Act = typename ActTraits<A>::T;
  const std::int64_t row_items = p.row_items.div;
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= p.num_tokens * row_items) return;
  const std::int64_t t = j / row_items;
  const auto c = static_cast<std::uint32_t>(j - t * row_items);
  const std::int64_t o = offset64[t];
  if (o == kMasked) return;
  const std::uint32_t h = p.head_items.quo(c);
  const std::uint32_t d8 = c - h * p.head_items.div;
  float x[kVec];
  load8<A>(static_cast<const Act*>(src) + t * p.nkv * p.hd + c * kVec, x);
  float y[kVec];
  scale8<A>(x, y, p.scale_mode,
            effective_scale<A>(scale[p.per_head_scale ? h : 0], p.scale_in_model), p.via_model);
  const std::int64_t e = block64[t] * p.st.block + o * p.st.token + h * p.st.head + d8 * kVec;
  store8<C>(static_cast<std::uint8_t*>(dst) + e * kBytes<C>, y, p.sat);
}

/// op 4 for a flat index-K cache [nb, bs, idim]: one thread per 8 elements. src: [>= T, idim].
template <DType A>
__global__ void __launch_bounds__(kThreads)
    index_flat_scatter_kernel(const FusedParams p, const std::int64_t* block64,
                              const std::int64_t* offset64) {
  using Act = typename ActTraits<A>::T;
  const std::int64_t items = p.idim / kVec;
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= p.num_tokens * items) return;
  const std::int64_t t = j / items;
  const std::int64_t c = j - t * items;
  const std::int64_t o = offset64[t];
  if (o == kMasked) return;
  float x[kVec];
  load8<A>(static_cast<const Act*>(p.index_k) + t * p.idim + c * kVec, x);
  const std::int64_t e = block64[t] * p.index_block + o * p.index_token + c * kVec;
  if (p.index_mode == IndexMode::kFlatBf16) {
    store8<DType::kBF16>(p.index_cache + e * 2, x, p.sat);
  } else {
    store8<DType::kFp8E4M3>(p.index_cache + e, x, p.sat);
  }
}

/// op 4 for a blockscale index-K cache: the per-row group quantization as part of the scatter (as
/// the engine's quant-and-cache op): 16 threads per 128-group. The grid covers whole warps only
/// (T * groups * 16 is a multiple of 16; inactive half warps still join the shuffles).
template <DType A>
__global__ void __launch_bounds__(kThreads)
    index_blockscale_scatter_kernel(const FusedParams p, const std::int64_t* block64,
                                    const std::int64_t* offset64) {
  using Act = typename ActTraits<A>::T;
  const std::int64_t gi = (static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 16;
  const std::uint32_t lane16 = threadIdx.x & 15u;
  const bool active = gi < p.num_tokens * p.groups;
  std::int64_t t = 0, g = 0;
  float x[kVec];
  float amax = 0.0f;
  if (active) {
    t = gi / p.groups;
    g = gi - t * p.groups;
    load8<A>(
        static_cast<const Act*>(p.index_k) + t * p.idim + g * spec::kScaleGroup + lane16 * kVec, x);
#pragma unroll
    for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, fabsf(x[i]));
  }
#pragma unroll
  for (int m = 8; m >= 1; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, m));
  if (!active) return;
  const std::int64_t o = offset64[t];
  if (o == kMasked) return;
  const float s = blockscale_scale(amax, p.blockscale_mul_recip, p.ue8m0);
  float y[kVec];
  divide8(x, y, s);
  const std::int64_t block_start = block64[t] * p.index_block;
  store8_e4m3_words(
      p.index_cache + block_start + o * p.idim + g * spec::kScaleGroup + lane16 * kVec, y);
  if (lane16 == 0) {
    *reinterpret_cast<float*>(p.index_cache + block_start + p.block_size * p.idim +
                              (o * p.groups + g) * 4) = s;
  }
}

unsigned blocks_for(std::int64_t threads) {
  const std::int64_t b = (threads + kThreads - 1) / kThreads;
  if (b > 0x7FFFFFFF) throw spec::Unsupported("more than 2^31 - 1 thread blocks");
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

/// Ops 1-3 for one tensor; `tensor` picks its scratch vectors.
template <class S>
void launch_index_ops(const FusedParams& p, const void* slots, UnfusedWorkspace& ws, int tensor,
                      std::int64_t num_blocks, cudaStream_t stream) {
  const std::int64_t n = p.num_tokens;
  const auto* sl = static_cast<const S*>(slots);
  auto* blk = reinterpret_cast<S*>(ws.vec(tensor, 0));
  auto* off = reinterpret_cast<S*>(ws.vec(tensor, 1));
  slot_div_kernel<S><<<blocks_for(n), kThreads, 0, stream>>>(sl, blk, n, p.block_size);
  slot_mod_kernel<S><<<blocks_for(n), kThreads, 0, stream>>>(sl, off, n, p.block_size);
  index_cast_kernel<S><<<blocks_for(n), kThreads, 0, stream>>>(
      sl, blk, off, ws.vec(tensor, 2), ws.vec(tensor, 3), n, num_blocks, p.legacy_wrap);
}

template <DType A, DType C>
void launch_kv_scatter(const FusedParams& p, int kv, UnfusedWorkspace& ws, cudaStream_t stream) {
  kv_scatter_kernel<A, C><<<blocks_for(p.num_tokens * p.row_items.div), kThreads, 0, stream>>>(
      p, ws.vec(kv, 2), ws.vec(kv, 3), kv == 0 ? p.k : p.v, kv == 0 ? p.k_cache : p.v_cache,
      kv == 0 ? p.k_scale : p.v_scale);
}

template <DType A>
void launch_kv_scatter_for_act(const FusedParams& p, DType cache, int kv, UnfusedWorkspace& ws,
                               cudaStream_t stream) {
  with_cache_format(cache, [&]<DType C>() { launch_kv_scatter<A, C>(p, kv, ws, stream); });
}

template <DType A>
void launch_all(const FusedParams& p, const spec::ModelConfig& c, UnfusedWorkspace& ws,
                cudaStream_t stream) {
  const std::int64_t nb = c.geometry.num_blocks;
  for (int kv = 0; kv < 2; ++kv) {
    if (p.slots_i64) {
      launch_index_ops<std::int64_t>(p, p.slots, ws, kv, nb, stream);
    } else {
      launch_index_ops<std::int32_t>(p, p.slots, ws, kv, nb, stream);
    }
    launch_kv_scatter_for_act<A>(p, c.kv.cache_dtype, kv, ws, stream);
  }
  if (p.index_mode == IndexMode::kNone) return;
  if (p.slots_i64) {
    launch_index_ops<std::int64_t>(p, p.index_slots, ws, 2, nb, stream);
  } else {
    launch_index_ops<std::int32_t>(p, p.index_slots, ws, 2, nb, stream);
  }
  if (p.index_mode == IndexMode::kBlockScale) {
    index_blockscale_scatter_kernel<A>
        <<<blocks_for(p.num_tokens * p.groups * 16), kThreads, 0, stream>>>(p, ws.vec(2, 2),
                                                                            ws.vec(2, 3));
  } else {
    index_flat_scatter_kernel<A>
        <<<blocks_for(p.num_tokens * (p.idim / kVec)), kThreads, 0, stream>>>(p, ws.vec(2, 2),
                                                                              ws.vec(2, 3));
  }
}

}  // namespace
}  // namespace detail

int launch_unfused_write(const spec::ModelConfig& config, spec::LayerKind kind,
                         const DeviceWriteInputs& in, const DeviceLayerCaches& caches,
                         UnfusedWorkspace& workspace, void* stream) {
  using namespace detail;
  const FusedParams p = make_params(config, kind, in, caches);
  if (p.num_tokens == 0) return 0;
  if (p.num_tokens > workspace.max_tokens()) {
    throw spec::InvalidInput(
        "num_tokens", -1, std::to_string(p.num_tokens),
        "exceeds the unfused workspace (" + std::to_string(workspace.max_tokens()) + " tokens)");
  }
  const auto s = static_cast<cudaStream_t>(stream);
  switch (config.act_dtype) {
    case DType::kF32:
      launch_all<DType::kF32>(p, config, workspace, s);
      break;
    case DType::kBF16:
      launch_all<DType::kBF16>(p, config, workspace, s);
      break;
    case DType::kF16:
      launch_all<DType::kF16>(p, config, workspace, s);
      break;
    default:
      throw spec::InvalidInput("act_dtype", -1, std::string(spec::name_of(config.act_dtype)),
                               "activations are f32, bf16 or fp16");
  }
  check_cuda(cudaGetLastError(), "launch of the unfused write kernels");
  return kind == spec::LayerKind::kSparse ? 12 : 8;
}

}  // namespace kvo::gpu
