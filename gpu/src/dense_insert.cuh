#pragma once
// The dense-layer fused insert kernel (SPEC 4, vLLM MiniMax-M3 qknorm + rope + insert): ONE launch
// per layer; one warp per (token, head slot), head slots = nq q heads, then nkv k heads, then nkv v
// heads. A lane owns E = hd / 32 contiguous dims.
//
// Canonical order per q/k head vector x (fp32, widened exactly):
//   sq_i = fl(x_i * x_i); ms = fl(tree_sum(sq) / hd), the tree sum of SPEC 6.1 (distance hd/2 down
//   to E across lanes by shuffles, then E/2 down to 1 inside the lane: the same pairs, the same
//   order); r = fl(1 / fl(sqrt(fl(ms + eps)))); y_i = fl(fl(x_i * r) * fl(1 + w_i)); RoPE on pairs
//   (i, i + rot/2), i < rot/2: fma(y_i, c, -fl(y_j * s)), fma(y_j, c, fl(y_i * s)), the partner
//   read from the warp's shared row (pre-rotation values).
// Engine order (kEngine: the arithmetic of vLLM's fused kernel, a foreign subject judged by SPEC
// 4's admissible sets): each lane's E contiguous squares accumulated with fma, an xor butterfly
// over the warp, ms = sum / hd, r = rsqrtf(ms + eps) (approximate), y_i = x_i * r * (1 + w_i), and
// the rope as y_i * c - y_j * s in plain operators (the compiler may contract them). q: rounded to
// the activation dtype into q_out [T, nq, hd]; k (normed, rotated) and v (as is): the SPEC 4 insert
// (scale by the mode with s, or s rounded to the activation dtype under scale_in_model_dtype;
// via_model_dtype; cast) at the slot's page and offset; padding skipped.
#include <cuda_runtime.h>

#include <cstdint>

#include "kvo/gpu/device_calls.hpp"
#include "kvo/spec/outcome.hpp"
#include "launch.cuh"

namespace kvo::gpu::detail {

constexpr int kDenseWarps = 8;

struct DenseParams {
  const void* q;            ///< [>= T, nq, hd] act
  const void* k;            ///< [>= T, nkv, hd] act
  const void* v;            ///< [>= T, nkv, hd] act
  const float* q_w;         ///< [hd]
  const float* k_w;         ///< [hd]
  const float* cos_sin;     ///< [max_pos, rot]
  const std::int64_t* pos;  ///< [T]
  const void* slots;        ///< [T] int32/int64
  const float* k_scale;     ///< [1] or [nkv]
  const float* v_scale;     ///< [1] or [nkv]
  void* q_out;              ///< [T, nq, hd] act
  std::uint8_t* k_cache;    ///< K body (or KV)
  std::uint8_t* v_cache;    ///< V body (or KV + kv_part elements)
  KvStrides st;
  std::int64_t tokens, block_size, capacity;
  std::int32_t nq, nkv, rot;
  float eps;
  bool slots_i64, legacy_wrap, per_head_scale, via_model, scale_in_model;
  bool unit_scale;  ///< dense_fp8_store identity: K and V stored with scale 1
  ScaleMode scale_mode;
  Saturation sat;
};

/// One element cast to the cache dtype C at dst.
template <DType C>
__device__ __forceinline__ void store1(std::uint8_t* dst, float y, Saturation sat) {
  if constexpr (C == DType::kF32) {
    *reinterpret_cast<float*>(dst) = y;
  } else if constexpr (C == DType::kBF16) {
    *reinterpret_cast<unsigned short*>(dst) = __bfloat16_as_ushort(__float2bfloat16_rn(y));
  } else if constexpr (C == DType::kF16) {
    *reinterpret_cast<unsigned short*>(dst) = __half_as_ushort(__float2half_rn(y));
  } else {
    *dst = static_cast<std::uint8_t>(
        sat == Saturation::kSatFinite
            ? static_cast<std::uint32_t>(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, kFp8Kind<C>))
            : fp8_code_soft<C>(y, sat));
  }
}

/// Bugs planted in the dense insert kernel (kvo_gpu_testing's DenseFault; kNone in kvo_gpu), each
/// the twin of a subjects::DenseMutation of the CPU subjects.
enum class DenseBug : std::uint8_t {
  kNone,
  kGptjRope,          ///< pairs (2i, 2i + 1) where NeoX's (i, i + rot/2) is declared
  kNormWithoutOne,    ///< y = x * r * w where Gemma's x * r * (1 + w) is declared
  kEpsOff,            ///< eps times 10 (1e-5 where 1e-6 is declared)
  kFp8StoreUnscaled,  ///< K and V stored with scale 1 whatever the scales say
  kRopeOverTailDims,  ///< the rope over dims [hd - rot, hd) where SPEC 4 rotates [0, rot)
};

template <DType A, DType C, int E, bool kEngine, DenseBug F>
__global__ void __launch_bounds__(kDenseWarps * 32) dense_insert_kernel(const DenseParams p) {
  using Act = typename ActTraits<A>::T;
  constexpr int kHd = 32 * E;
  __shared__ float row[kDenseWarps][kHd];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t slots_per_token = p.nq + 2 * p.nkv;
  const std::int64_t gw = static_cast<std::int64_t>(blockIdx.x) * kDenseWarps + warp;
  if (gw >= p.tokens * slots_per_token) return;  // uniform per warp
  const std::int64_t t = gw / slots_per_token;
  const int j = static_cast<int>(gw - t * slots_per_token);
  const int kind = j < p.nq ? 0 : (j < p.nq + p.nkv ? 1 : 2);  // q, k, v
  const int h = kind == 0 ? j : (kind == 1 ? j - p.nq : j - p.nq - p.nkv);
  const int heads = kind == 0 ? p.nq : p.nkv;
  const Act* src = static_cast<const Act*>(kind == 0 ? p.q : (kind == 1 ? p.k : p.v)) +
                   (t * heads + h) * kHd + lane * E;
  float y[E];
#pragma unroll
  for (int i = 0; i < E; ++i) {
    if constexpr (A == DType::kF32) {
      y[i] = src[i];
    } else if constexpr (A == DType::kBF16) {
      y[i] = __bfloat162float(src[i]);
    } else {
      y[i] = __half2float(src[i]);
    }
  }
  if (kind != 2) {
    const float eps = F == DenseBug::kEpsOff ? p.eps * 10.0f : p.eps;
    float r;
    if constexpr (kEngine) {
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < E; ++i) acc = fmaf(y[i], y[i], acc);
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, off);
      r = rsqrtf(acc / static_cast<float>(kHd) + eps);
    } else {
      float sq[E];
#pragma unroll
      for (int i = 0; i < E; ++i) sq[i] = __fmul_rn(y[i], y[i]);
#pragma unroll
      for (int lanes = 16; lanes >= 1; lanes >>= 1) {  // element distance lanes * E >= E
#pragma unroll
        for (int i = 0; i < E; ++i)
          sq[i] = __fadd_rn(sq[i], __shfl_down_sync(0xFFFFFFFFu, sq[i], lanes));
      }
#pragma unroll
      for (int m = E / 2; m >= 1; m >>= 1) {
#pragma unroll
        for (int i = 0; i < m; ++i) sq[i] = __fadd_rn(sq[i], sq[i + m]);
      }
      const float sum = __shfl_sync(0xFFFFFFFFu, sq[0], 0);
      const float ms = __fdiv_rn(sum, static_cast<float>(kHd));
      r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
    }
    const float* w = kind == 0 ? p.q_w : p.k_w;
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const float one_w = F == DenseBug::kNormWithoutOne ? w[lane * E + i]
                          : kEngine                      ? 1.0f + w[lane * E + i]
                                                         : __fadd_rn(1.0f, w[lane * E + i]);
      y[i] = kEngine ? y[i] * r * one_w : __fmul_rn(__fmul_rn(y[i], r), one_w);
      row[warp][lane * E + i] = y[i];
    }
    __syncwarp();
    const int half = p.rot / 2;
    const float* cs = p.cos_sin + p.pos[t] * p.rot;
    const int first_dim = F == DenseBug::kRopeOverTailDims ? kHd - p.rot : 0;
#pragma unroll
    for (int i = 0; i < E; ++i) {
      // Pair (e, e + half) or (e - half, e) (GPT-J: (e, e ^ 1)): cos and sin of the pair's entry,
      // the partner's pre-rotation value; the first of a pair subtracts, the second adds.
      const int e = lane * E + i, d = e - first_dim;
      if (d < 0 || d >= p.rot) continue;
      const bool gptj = F == DenseBug::kGptjRope;
      const bool first = gptj ? d % 2 == 0 : d < half;
      const int k = gptj ? d / 2 : (first ? d : d - half);
      const float c = cs[k], s = first ? -cs[half + k] : cs[half + k];
      const int partner_dim = gptj ? d ^ 1 : (first ? d + half : d - half);
      const float partner = row[warp][first_dim + partner_dim];
      y[i] = kEngine ? y[i] * c + partner * s : __fmaf_rn(y[i], c, __fmul_rn(partner, s));
    }
  }
  if (kind == 0) {
    Act* out = static_cast<Act*>(p.q_out) + (t * p.nq + h) * kHd + lane * E;
#pragma unroll
    for (int i = 0; i < E; ++i) {
      if constexpr (A == DType::kF32) {
        out[i] = y[i];
      } else if constexpr (A == DType::kBF16) {
        out[i] = __float2bfloat16_rn(y[i]);
      } else {
        out[i] = __float2half_rn(y[i]);
      }
    }
    return;
  }
  std::int64_t slot = p.slots_i64 ? static_cast<const std::int64_t*>(p.slots)[t]
                                  : static_cast<const std::int32_t*>(p.slots)[t];
  if (p.legacy_wrap && slot < 0) slot += p.capacity;
  if (slot < 0) return;
  const std::int64_t page = slot / p.block_size, off = slot - page * p.block_size;
  const float s =
      p.unit_scale || F == DenseBug::kFp8StoreUnscaled
          ? 1.0f
          : effective_scale<A>((kind == 1 ? p.k_scale : p.v_scale)[p.per_head_scale ? h : 0],
                               p.scale_in_model);
  std::uint8_t* cache = kind == 1 ? p.k_cache : p.v_cache;
  const std::int64_t base = page * p.st.block + off * p.st.token + h * p.st.head + lane * E;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    // NaN: the norm and rope arithmetic and the scaling return the GPU's canonical NaN, as SPEC 2
    // says; only scale none hands a V input NaN to the cast as it is.
    float v = scale1(y[i], p.scale_mode, s);
    if (p.via_model) v = round_to_act<A>(v);
    store1<C>(cache + (base + i) * kBytes<C>, v, p.sat);
  }
}

template <DType A, DType C, bool kEngine, DenseBug F>
void launch_e(const DenseParams& p, int e, unsigned blocks, cudaStream_t stream) {
  switch (e) {
    case 1:
      return dense_insert_kernel<A, C, 1, kEngine, F><<<blocks, kDenseWarps * 32, 0, stream>>>(p);
    case 2:
      return dense_insert_kernel<A, C, 2, kEngine, F><<<blocks, kDenseWarps * 32, 0, stream>>>(p);
    case 4:
      return dense_insert_kernel<A, C, 4, kEngine, F><<<blocks, kDenseWarps * 32, 0, stream>>>(p);
    default:
      return dense_insert_kernel<A, C, 8, kEngine, F><<<blocks, kDenseWarps * 32, 0, stream>>>(p);
  }
}

template <DType A, bool kEngine, DenseBug F>
void launch_c(const DenseParams& p, DType cache, int e, unsigned blocks, cudaStream_t stream) {
  with_cache_format(cache, [&]<DType C>() { launch_e<A, C, kEngine, F>(p, e, blocks, stream); });
}

/// The dense insert of one call on its stream: the canonical kernel, or (kEngine) vLLM's
/// arithmetic; F a planted bug (kvo_gpu_testing only).
template <bool kEngine, DenseBug F = DenseBug::kNone>
void launch_dense(const DeviceDenseCall& call) {
  const spec::ModelConfig& c = *call.config;
  const spec::CacheGeometry& g = c.geometry;
  const std::int64_t hd = g.head_dim;
  if (hd != 32 && hd != 64 && hd != 128 && hd != 256) {
    throw spec::Unsupported("the fused dense insert kernel takes head_dim 32, 64, 128 or 256");
  }
  // The kernel reads its inputs row-contiguous; its caches through their views' strides.
  for (const DeviceTensor* t : {&call.q, &call.k, &call.v, &call.q_out}) {
    if (t->strides != contiguous_tensor(nullptr, t->type, t->shape).strides) {
      throw spec::Unsupported("the fused dense insert kernel takes contiguous tensors");
    }
  }
  const std::int64_t tokens = call.slot_mapping.shape.at(0), nq = call.q.shape.at(1);
  DenseParams p{};
  p.q = call.q.data;
  p.k = call.k.data;
  p.v = call.v.data;
  p.q_w = call.q_norm_weight.as<const float>();
  p.k_w = call.k_norm_weight.as<const float>();
  p.cos_sin = call.cos_sin.as<const float>();
  p.pos = call.positions.as<const std::int64_t>();
  p.slots = call.slot_mapping.data;
  p.k_scale = call.k_scale.as<const float>();
  p.v_scale = call.v_scale.as<const float>();
  p.q_out = call.q_out.data;
  p.st = kv_strides(c);
  p.k_cache = call.caches.k.as<std::uint8_t>();  // K, and V, as the layout's logical views
  p.v_cache = call.caches.v.as<std::uint8_t>();
  p.st.kv_part = 0;  // folded into v_cache, with the offset
  p.st.offset = 0;
  p.tokens = tokens;
  p.block_size = g.block_size;
  p.capacity = g.capacity();
  p.nq = static_cast<std::int32_t>(nq);
  p.nkv = static_cast<std::int32_t>(g.num_kv_heads);
  p.rot = static_cast<std::int32_t>(call.rotary_dim);
  p.eps = call.eps;
  p.unit_scale = call.fp8_store == spec::DenseFp8Store::kIdentity;
  p.slots_i64 = call.slot_mapping.type == ElementType::kI64;
  p.legacy_wrap = c.slot_mode == spec::SlotMode::kLegacyWrap;
  p.per_head_scale = c.kv.per_head_scale;
  p.via_model = c.kv.via_model_dtype;
  p.scale_in_model = c.kv.scale_in_model_dtype;
  p.scale_mode = c.kv.scale_mode;
  p.sat = c.kv.saturation;
  if (tokens == 0) return;
  const std::int64_t warps = tokens * (nq + 2 * g.num_kv_heads);
  const auto blocks = static_cast<unsigned>((warps + kDenseWarps - 1) / kDenseWarps);
  const int e = static_cast<int>(hd / 32);
  const auto stream = static_cast<cudaStream_t>(call.stream);
  switch (c.act_dtype) {
    case DType::kF32:
      launch_c<DType::kF32, kEngine, F>(p, c.kv.cache_dtype, e, blocks, stream);
      break;
    case DType::kBF16:
      launch_c<DType::kBF16, kEngine, F>(p, c.kv.cache_dtype, e, blocks, stream);
      break;
    default:
      launch_c<DType::kF16, kEngine, F>(p, c.kv.cache_dtype, e, blocks, stream);
      break;
  }
  check_cuda(cudaGetLastError(), "launch of the dense insert kernel");
}

}  // namespace kvo::gpu::detail
