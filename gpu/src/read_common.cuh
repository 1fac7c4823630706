#pragma once
/// \file read_common.cuh
/// What the read kernels share: the layer geometry, element decoding (exact: every cache dtype's
/// value is a float32), SPEC 3 offsets, the canonical exp of SPEC 6.2, the fast hardware exp2 and
/// reciprocal, bf16 rounding, and the dot engine that both the indexer and attention use.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kvo::gpu::detail {

/// Plain description of a layer's caches for the read kernels. Dtypes and layouts are the
/// spec::DType and spec::KvLayout values.
struct ReadGeom {
  long long num_blocks, block_size, nkv, head_dim, index_dim, max_blocks;
  int kv_dtype, act_dtype, index_layout, index_dtype;  ///< the layout is in the strides below
  int scale_none, per_head_scale;
  /// The K/V caches' element strides (SPEC 3: the layout's dense ones, or a strided view's; the
  /// cache pointers are the views' first elements): detail::kv_strides.
  long long s_block, s_token, s_head, s_kv;
};

/// spec::DType values, for templates.
enum DtCode : int { kDtF32 = 0, kDtBf16 = 1, kDtF16 = 2, kDtE4m3 = 3, kDtE5m2 = 4 };

__host__ __device__ constexpr int dtype_size(int dt) {
  return dt == kDtF32 ? 4 : dt <= kDtF16 ? 2 : 1;
}

__device__ inline unsigned load_le(const unsigned char* p, int bytes) {
  unsigned v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<unsigned>(p[i]) << (8 * i);
  return v;
}

/// fp8 code -> float through the hardware fp8 -> f16 conversion, exact for every finite code
/// (both fp8 formats are subsets of f16); NaN codes give a NaN, which every later float32
/// operation turns into the canonical 0x7FFFFFFF, as the reference's does.
template <int Dt>
__device__ inline float2 fp8x2_value(unsigned short two_codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes),
                                                   Dt == kDtE4m3 ? __NV_E4M3 : __NV_E5M2);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

/// Eight consecutive elements of dtype Dt as stored: kWords 32-bit words (f32 8, 16-bit dtypes
/// 4, fp8 2), loaded by load_raw8 (one or two vector loads) and widened by convert8, so that a
/// kernel can have a row's loads in flight before any of its arithmetic.
template <int Dt>
struct Raw8 {
  static constexpr int kWords = dtype_size(Dt) * 2;
  unsigned w[kWords];
};

/// Raw8 at p (16-byte aligned for 16-bit dtypes and f32, 8 for fp8).
template <int Dt>
__device__ inline Raw8<Dt> load_raw8(const unsigned char* p) {
  Raw8<Dt> r;
  if constexpr (Raw8<Dt>::kWords == 2) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    r.w[0] = u.x, r.w[1] = u.y;
  } else {
#pragma unroll
    for (int v = 0; v < Raw8<Dt>::kWords / 4; ++v) {
      const uint4 u = reinterpret_cast<const uint4*>(p)[v];
      r.w[4 * v] = u.x, r.w[4 * v + 1] = u.y, r.w[4 * v + 2] = u.z, r.w[4 * v + 3] = u.w;
    }
  }
  return r;
}

/// The eight values of a Raw8 (exact: every dtype here widens to float exactly).
template <int Dt>
__device__ inline void convert8(const Raw8<Dt>& r, float (&x)[8]) {
  if constexpr (Dt == kDtF32) {
    for (int i = 0; i < 8; ++i) x[i] = __uint_as_float(r.w[i]);
  } else if constexpr (Dt == kDtBf16 || Dt == kDtF16) {
    for (int i = 0; i < 4; ++i) {
      if constexpr (Dt == kDtBf16) {
        x[2 * i] = __uint_as_float(r.w[i] << 16);
        x[2 * i + 1] = __uint_as_float(r.w[i] & 0xFFFF0000u);
      } else {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&r.w[i]));
        x[2 * i] = f.x, x[2 * i + 1] = f.y;
      }
    }
  } else {
    for (int i = 0; i < 2; ++i) {
      const float2 lo = fp8x2_value<Dt>(static_cast<unsigned short>(r.w[i] & 0xFFFFu));
      const float2 hi = fp8x2_value<Dt>(static_cast<unsigned short>(r.w[i] >> 16));
      x[4 * i] = lo.x, x[4 * i + 1] = lo.y, x[4 * i + 2] = hi.x, x[4 * i + 3] = hi.y;
    }
  }
}

/// Eight consecutive elements of dtype Dt at p (aligned as load_raw8 needs).
template <int Dt>
__device__ inline void load8(const unsigned char* p, float (&x)[8]) {
  convert8<Dt>(load_raw8<Dt>(p), x);
}

/// load8, then each element times `scale` (rounded) when `scaled`: a dequantized cache row piece.
template <int Dt>
__device__ inline void load8_scaled(const unsigned char* p, bool scaled, float scale,
                                    float (&x)[8]) {
  load8<Dt>(p, x);
  if (scaled)
    for (float& v : x) v = __fmul_rn(v, scale);
}

/// Two consecutive elements of dtype Dt at p (aligned to their size).
template <int Dt>
__device__ inline float2 load2(const unsigned char* p) {
  if constexpr (Dt == kDtF32) {
    return *reinterpret_cast<const float2*>(p);
  } else if constexpr (Dt == kDtBf16) {
    const unsigned w = *reinterpret_cast<const unsigned*>(p);
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
  } else if constexpr (Dt == kDtF16) {
    return __half22float2(*reinterpret_cast<const __half2*>(p));
  } else {
    return fp8x2_value<Dt>(*reinterpret_cast<const unsigned short*>(p));
  }
}

/// One element of dtype Dt at p.
template <int Dt>
__device__ inline float load1(const unsigned char* p) {
  if constexpr (Dt == kDtF32) {
    return *reinterpret_cast<const float*>(p);
  } else if constexpr (Dt == kDtBf16) {
    return __uint_as_float(static_cast<unsigned>(*reinterpret_cast<const unsigned short*>(p))
                           << 16);
  } else if constexpr (Dt == kDtF16) {
    return __half2float(*reinterpret_cast<const __half*>(p));
  } else {
    return fp8x2_value<Dt>(*p).x;
  }
}

/// One element of runtime dtype dt (activations: f32, bf16, fp16; e4m3 for fp8 index-Q).
__device__ inline float load_act(const unsigned char* p, int dt) {
  switch (dt) {
    case kDtF32:
      return __uint_as_float(load_le(p, 4));
    case kDtBf16:
      return __uint_as_float(load_le(p, 2) << 16);
    case kDtE4m3:  // fp8 index-Q (SPEC 5), read unscaled
      return load1<kDtE4m3>(p);
    default:
      return __half2float(__ushort_as_half(static_cast<unsigned short>(load_le(p, 2))));
  }
}

/// SPEC 3 element offset of K (kv 0) or V (kv 1) through the caches' strides (kv_part 0 where K and
/// V are separate tensors). Dims are innermost and contiguous in every layout and view, so a
/// token's head row starts at d = 0.
__device__ inline long long kv_offset(const ReadGeom& g, int kv, long long b, long long o,
                                      long long h, long long d) {
  return b * g.s_block + o * g.s_token + h * g.s_head + kv * g.s_kv + d;
}

/// SPEC 6.2 exp2 and exp, with the spec's polynomial (never the special-function unit).
__device__ inline float canonical_exp2(float y) {
  if (isnan(y)) return y;
  if (y < -126.0f) return 0.0f;
  if (y > 127.0f) return __uint_as_float(0x7F800000u);
  const float n = rintf(y);  // round half to even
  const float f = __fsub_rn(y, n);
  float p = __uint_as_float(0x377FE5FEu);
  p = __fmaf_rn(p, f, __uint_as_float(0x39218489u));
  p = __fmaf_rn(p, f, __uint_as_float(0x3AAEC3FFu));
  p = __fmaf_rn(p, f, __uint_as_float(0x3C1D955Bu));
  p = __fmaf_rn(p, f, __uint_as_float(0x3D635847u));
  p = __fmaf_rn(p, f, __uint_as_float(0x3E75FDF0u));
  p = __fmaf_rn(p, f, __uint_as_float(0x3F317218u));
  p = __fmaf_rn(p, f, __uint_as_float(0x3F800000u));
  return __fmul_rn(p, __uint_as_float(static_cast<unsigned>(static_cast<int>(n) + 127) << 23));
}
__device__ inline float canonical_exp(float x) {
  return canonical_exp2(__fmul_rn(x, __uint_as_float(0x3FB8AA3Bu)));
}

/// The special-function unit's 2^x (about 2 ulp, subnormals flushed): the fast family's exp.
__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// The special-function unit's 1 / x (within 1 ulp, subnormals flushed): the flash family's
/// final normalisation, as FlashAttention compiled with --use_fast_math does it.
__device__ inline float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// x rounded to bf16 (round to nearest even) and widened back: the flash family's operands and P.
__device__ inline float bf16_value(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

constexpr float kLog2e = 1.4426950408889634f;

/// The dot engine. A dot over n = 8G elements runs on L = next power of two >= G lanes of one
/// warp (a "segment"); lane i < G holds group i's 8 K elements in k and reads the query's from q.
/// Canonical (SPEC 6.1): acc = fma chain over the group's 8 elements in order, then the tree sum
/// over the G group results (padded with +0 to L) as shuffle-downs by L/2, ..., 1: the result is
/// in lane 0 of the segment. Fast: two interleaved accumulators per group and an xor butterfly
/// (another association); every lane gets the result. All 32 lanes must call it.
/// segment_dots computes NH dots of the same K rows with NH query rows at once: independent
/// chains, so that their latencies overlap.
/// One group's dot: q8 [8] (16-byte aligned) with k [8]. Canonical: the fma chain in order from +0;
/// fast: two interleaved accumulators, then their sum.
template <bool kCanonical>
__device__ inline float group_dot(const float* q8, const float (&k)[8]) {
  const float4 q0 = reinterpret_cast<const float4*>(q8)[0];
  const float4 q1 = reinterpret_cast<const float4*>(q8)[1];
  const float qv[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
  if constexpr (kCanonical) {
    float acc = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc = __fmaf_rn(qv[e], k[e], acc);
    return acc;
  } else {
    float even = 0.0f, odd = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      even = fmaf(qv[e], k[e], even);
      odd = fmaf(qv[e + 1], k[e + 1], odd);
    }
    return even + odd;
  }
}

template <bool kCanonical, int L, int NH>
__device__ inline void segment_dots(const float* const (&q)[NH], const float (&k)[8], int lane_in,
                                    int groups, float (&out)[NH]) {
  float acc[NH];
#pragma unroll
  for (int h = 0; h < NH; ++h)
    acc[h] = lane_in < groups ? group_dot<kCanonical>(q[h] + 8 * lane_in, k) : 0.0f;
  if constexpr (kCanonical) {
#pragma unroll
    for (int off = L / 2; off > 0; off /= 2) {
#pragma unroll
      for (int h = 0; h < NH; ++h)
        acc[h] = __fadd_rn(acc[h], __shfl_down_sync(0xFFFFFFFFu, acc[h], off, L));
    }
  } else {
#pragma unroll
    for (int off = 1; off < L; off *= 2) {
#pragma unroll
      for (int h = 0; h < NH; ++h) acc[h] += __shfl_xor_sync(0xFFFFFFFFu, acc[h], off, L);
    }
  }
#pragma unroll
  for (int h = 0; h < NH; ++h) out[h] = acc[h];
}

/// The dots of heads h0 .. h0 + 3 with q_base [heads][dim]; past the last head the last head's row
/// stands in, and the caller ignores those results.
template <bool kCanonical, int L>
__device__ inline void four_head_dots(const float* q_base, int h0, int heads, int dim,
                                      const float (&k)[8], int lane_in, int groups, float (&d)[4]) {
  const float* qs[4];
  for (int u = 0; u < 4; ++u) qs[u] = q_base + (h0 + u < heads ? h0 + u : heads - 1) * dim;
  segment_dots<kCanonical, L, 4>(qs, k, lane_in, groups, d);
}

/// `>` maximum over a warp (NaN never wins; the initial value is each lane's running maximum).
__device__ inline float warp_max(float m) {
  for (int off = 16; off > 0; off /= 2) {
    const float o = __shfl_xor_sync(0xFFFFFFFFu, m, off);
    if (o > m) m = o;
  }
  return m;
}

/// Asynchronous global -> shared copy of 16, 8 or 4 bytes (both addresses aligned to it).
__device__ inline void cp_async(void* dst_shared, const void* src, int bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst_shared));
  if (bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
  } else if (bytes == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(s), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(src) : "memory");
  }
}
__device__ inline void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

/// The largest of 16, 8, 4 dividing `bytes`: the copy unit of rows of that size.
__host__ __device__ inline int copy_unit(long long bytes) {
  return bytes % 16 == 0 ? 16 : bytes % 8 == 0 ? 8 : 4;
}

__host__ __device__ inline int next_pow2(long long n) {
  int m = 1;
  while (m < n) m *= 2;
  return m;
}

}  // namespace kvo::gpu::detail
