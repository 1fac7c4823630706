#pragma once
/// \file convert.cuh
/// Device-side number conversions of SPEC 2 (fp8_spec.md sections 2-4), written for the kernels
/// with CUDA's own intrinsics: loads of 8 activation elements widened to fp32 (exact), the scale
/// (IEEE __fdiv_rn / __fmul_rn, no contraction), the optional rounding to the activation dtype,
/// and the single RNE cast to the cache dtype under each saturation mode. Nothing here is shared
/// with reference/ (SPEC principle 3).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kvo/spec/types.hpp"

namespace kvo::gpu::detail {

using spec::DType;
using spec::Saturation;
using spec::ScaleMode;

/// Elements one thread moves per item: 16 bytes of bf16/fp16 source, 32 of f32.
inline constexpr int kVec = 8;

/// Bytes of one element of dtype D.
template <DType D>
inline constexpr std::int64_t kBytes = D == DType::kF32
                                           ? 4
                                           : (D == DType::kBF16 || D == DType::kF16 ? 2 : 1);

/// Activation element types, as C++ types for templates.
template <DType A>
struct ActTraits;
template <>
struct ActTraits<DType::kF32> {
  using T = float;
};
template <>
struct ActTraits<DType::kBF16> {
  using T = __nv_bfloat16;
};
template <>
struct ActTraits<DType::kF16> {
  using T = __half;
};

/// Loads 8 consecutive activation elements at `src` (16-byte aligned) widened to fp32. bf16 and
/// fp16 widening is exact; fp16 NaN becomes 0x7FFFFFFF (cvt.f32.f16), bf16 keeps its bits.
template <DType A>
__device__ __forceinline__ void load8(const void* src, float (&x)[kVec]) {
  if constexpr (A == DType::kF32) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(src));
    const float4 b = __ldg(reinterpret_cast<const float4*>(src) + 1);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
    x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(src));
    const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (A == DType::kBF16) {
        x[2 * i] = __uint_as_float(w[i] << 16);
        x[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
      } else {
        x[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] & 0xFFFFu)));
        x[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] >> 16)));
      }
    }
  }
}

/// The raw source of one item, loaded before its destination is known (so the load overlaps the
/// slot lookup): 16 bytes for 16-bit activations, 32 for f32.
template <DType A>
struct RawItem {
  uint4 a;
  uint4 b;  ///< f32 only
};

template <DType A>
__device__ __forceinline__ void load_raw(const void* src, RawItem<A>& r) {
  r.a = __ldg(reinterpret_cast<const uint4*>(src));
  if constexpr (A == DType::kF32) r.b = __ldg(reinterpret_cast<const uint4*>(src) + 1);
}

template <DType A>
__device__ __forceinline__ void widen(const RawItem<A>& r, float (&x)[kVec]) {
  if constexpr (A == DType::kF32) {
    x[0] = __uint_as_float(r.a.x), x[1] = __uint_as_float(r.a.y);
    x[2] = __uint_as_float(r.a.z), x[3] = __uint_as_float(r.a.w);
    x[4] = __uint_as_float(r.b.x), x[5] = __uint_as_float(r.b.y);
    x[6] = __uint_as_float(r.b.z), x[7] = __uint_as_float(r.b.w);
  } else {
    const std::uint32_t w[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (A == DType::kBF16) {
        x[2 * i] = __uint_as_float(w[i] << 16);
        x[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
      } else {
        x[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] & 0xFFFFu)));
        x[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] >> 16)));
      }
    }
  }
}

/// x rounded to the activation dtype and widened back (via_model_dtype). NaN becomes the
/// canonical NaN of that dtype (bf16 0x7FFF, fp16 0x7FFF), as on the CPU.
template <DType A>
__device__ __forceinline__ float round_to_act(float x) {
  if constexpr (A == DType::kBF16) {
    return __bfloat162float(__float2bfloat16_rn(x));
  } else if constexpr (A == DType::kF16) {
    return __half2float(__float2half_rn(x));
  } else {
    return x;
  }
}

/// The scaled value of SPEC 2: divide fl(x / s); mul_recip fl(x * r) with r = fl(1 / s) computed
/// by the caller; none x. Correctly rounded intrinsics: no approximate division, no contraction.
/// s is finite and > 0 (validated), so only a NaN x gives a NaN. The GPU's arithmetic returns the
/// canonical NaN 0x7FFFFFFF (sign dropped) where the CPU reference (x86/Arm) propagates the input
/// NaN, quieted, sign kept; the sign is visible in the torch saturation mode (0xFF for -NaN) and in
/// f32 caches, so a NaN passes through as the CPU's quieted input.
__device__ __forceinline__ float apply_scale(float x, ScaleMode mode, float s, float r) {
  if (mode != ScaleMode::kNone && isnan(x))
    return __uint_as_float(__float_as_uint(x) | 0x00400000u);
  if (mode == ScaleMode::kDivide) return __fdiv_rn(x, s);
  if (mode == ScaleMode::kMulRecip) return __fmul_rn(x, r);
  return x;
}

/// fp8 interpretation of CUDA's interpretation enum for a cache dtype.
template <DType C>
inline constexpr __nv_fp8_interpretation_t kFp8Kind = C == DType::kFp8E5M2 ? __NV_E5M2 : __NV_E4M3;

/// One fp8 code under a saturation mode (fp8_spec.md 4a). satfinite and nosat are CUDA's own
/// conversions; torch is nosat except that a NaN input keeps its sign (0xFF for -NaN), where
/// CUDA gives 0x7F for every NaN.
template <DType C>
__device__ __forceinline__ std::uint32_t fp8_code(float x, Saturation sat) {
  if (sat == Saturation::kSatFinite) {
    return static_cast<std::uint32_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, kFp8Kind<C>));
  }
  std::uint32_t q = static_cast<std::uint32_t>(__nv_cvt_float_to_fp8(x, __NV_NOSAT, kFp8Kind<C>));
  if (sat == Saturation::kTorch && isnan(x) && signbit(x)) q = 0xFFu;
  return q;
}

/// Two fp8 codes packed little-endian (low byte = a). satfinite uses the paired hardware
/// conversion (cvt.rn.satfinite.e4m3x2.f32, direct from f32, verified equal to the single one).
template <DType C>
__device__ __forceinline__ std::uint32_t fp8_pair(float a, float b, Saturation sat) {
  if (sat == Saturation::kSatFinite) {
    return static_cast<std::uint32_t>(
        __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kFp8Kind<C>));
  }
  return fp8_code<C>(a, sat) | (fp8_code<C>(b, sat) << 8);
}

/// Eight fp32 values cast to the cache dtype C and stored at `dst` (aligned to 8 elements of C:
/// one 8-byte store for fp8, one 16-byte store for 16-bit types, two for f32).
template <DType C>
__device__ __forceinline__ void store8(void* dst, const float (&y)[kVec], Saturation sat) {
  if constexpr (C == DType::kF32) {
    float4* d = reinterpret_cast<float4*>(dst);
    d[0] = make_float4(y[0], y[1], y[2], y[3]);
    d[1] = make_float4(y[4], y[5], y[6], y[7]);
  } else if constexpr (C == DType::kBF16 || C == DType::kF16) {
    std::uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      std::uint32_t lo, hi;
      if constexpr (C == DType::kBF16) {
        lo = __bfloat16_as_ushort(__float2bfloat16_rn(y[2 * i]));
        hi = __bfloat16_as_ushort(__float2bfloat16_rn(y[2 * i + 1]));
      } else {
        lo = __half_as_ushort(__float2half_rn(y[2 * i]));
        hi = __half_as_ushort(__float2half_rn(y[2 * i + 1]));
      }
      w[i] = lo | (hi << 16);
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    const std::uint32_t w0 = fp8_pair<C>(y[0], y[1], sat) | (fp8_pair<C>(y[2], y[3], sat) << 16);
    const std::uint32_t w1 = fp8_pair<C>(y[4], y[5], sat) | (fp8_pair<C>(y[6], y[7], sat) << 16);
    *reinterpret_cast<uint2*>(dst) = make_uint2(w0, w1);
  }
}

/// Eight satfinite e4m3 codes stored as two 4-byte words (the blockscale value rows are only
/// 4-byte aligned when bs * (index_dim / 128) is odd).
__device__ __forceinline__ void store8_e4m3_words(std::uint8_t* dst, const float (&y)[kVec]) {
  const std::uint32_t w0 = fp8_pair<DType::kFp8E4M3>(y[0], y[1], Saturation::kSatFinite) |
                           (fp8_pair<DType::kFp8E4M3>(y[2], y[3], Saturation::kSatFinite) << 16);
  const std::uint32_t w1 = fp8_pair<DType::kFp8E4M3>(y[4], y[5], Saturation::kSatFinite) |
                           (fp8_pair<DType::kFp8E4M3>(y[6], y[7], Saturation::kSatFinite) << 16);
  reinterpret_cast<std::uint32_t*>(dst)[0] = w0;
  reinterpret_cast<std::uint32_t*>(dst)[1] = w1;
}

/// The ue8m0 scale: the smallest power of two >= s by the exponent-bit rule (biased exponent +
/// (mantissa != 0)), never exp2(ceil(log2(s))) (fp8_spec.md 6).
__device__ __forceinline__ float ue8m0_ceil(float s) {
  const std::uint32_t u = __float_as_uint(s);
  return __uint_as_float((((u >> 23) & 0xFFu) + ((u & 0x7FFFFFu) != 0u ? 1u : 0u)) << 23);
}

/// Quotient by a fixed divisor through a multiply-high (Granlund-Montgomery, as CUTLASS's
/// FastDivmod): exact for dividends below 2^31. Built on the host by make_fast_div.
struct FastDiv {
  std::uint32_t div = 1, mul = 0, shr = 0;
  __device__ __forceinline__ std::uint32_t quo(std::uint32_t n) const {
    return div == 1 ? n : (__umulhi(n, mul) >> shr);
  }
};

inline FastDiv make_fast_div(std::uint32_t d) {
  FastDiv f;
  f.div = d;
  if (d == 1) return f;
  std::uint32_t log2 = 0;
  while ((1ull << log2) < d) ++log2;  // ceil(log2(d))
  const std::uint32_t p = 31 + log2;
  f.mul = static_cast<std::uint32_t>(((1ull << p) + d - 1) / d);
  f.shr = p - 32;
  return f;
}

/// Element strides of a K/V cache view: element(b, o, h, kv, d) = b*block + o*token + h*head +
/// kv*kv_part + d (kv_part 0 when K and V are separate tensors). The innermost dim is contiguous.
struct KvStrides {
  std::int64_t block = 0, token = 0, head = 0, kv_part = 0;
};

}  // namespace kvo::gpu::detail
