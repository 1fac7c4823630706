#pragma once
/// \file convert.cuh
/// Device-side number conversions of SPEC 2 (fp8_spec.md sections 2-4), written for the kernels
/// with CUDA's own intrinsics: loads of 8 activation elements widened to fp32 (exact), the scale
/// (IEEE __fdiv_rn / __fmul_rn, no contraction; div_approx's div.full.f32), the optional rounding
/// to the activation dtype, and the single RNE cast to the cache dtype under each saturation mode.
/// Nothing here is shared with reference/ (SPEC principle 3).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "call_inputs.hpp"
#include "kvo/spec/types.hpp"
#include "number_formats.cuh"

namespace kvo::gpu::detail {

using spec::DType;
using spec::Saturation;
using spec::ScaleMode;

/// Elements one thread moves per item: 16 bytes of bf16/fp16 source, 32 of f32.
inline constexpr int kVec = 8;

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

/// IEEE binary32 operations, round to nearest even, on the device and the host alike (the host runs
/// the rules below in CPU tests).
__host__ __device__ __forceinline__ std::uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  std::uint32_t b;
  __builtin_memcpy(&b, &x, 4);
  return b;
#endif
}
__host__ __device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;  // IEEE binary32, round to nearest even (no contraction: a lone product)
#endif
}
__host__ __device__ __forceinline__ float fma_rn(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}
__host__ __device__ __forceinline__ float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// True for a normal power of two: its reciprocal 2^-k is exact (subnormal at worst), so
/// fl(x / s) == fl(x * fl(1 / s)) for every x (the same real number, rounded once).
__host__ __device__ __forceinline__ bool is_pow2_normal(float s) {
  const std::uint32_t b = float_bits(s) & 0x7FFFFFFFu;
  return (b & 0x7FFFFFu) == 0u && (b >> 23) >= 1u && (b >> 23) <= 254u;
}

/// fl(x / s) from r = fl(1 / s) without a division: q0 = fl(x * r), then two exact-residual
/// corrections q' = fma(fma(-s, q, x), r, q) (Markstein: with a correctly rounded reciprocal and q
/// within 1 ulp of x / s, the corrected q' is the correctly rounded quotient; the first correction
/// brings q0 within 1 ulp). Valid when no intermediate leaves the normal range: the caller checks
/// s in [2^-20, 2^21) (range_ok_s) and every |x| in [2^-100, 2^100) (range_ok_x), and falls back to
/// __fdiv_rn otherwise (zeros, subnormals, huge values, inf, NaN). Verified against __fdiv_rn for
/// all 2^32 x at many s by the GPU test FastDivision.ExhaustiveAgainstFdivRn.
__host__ __device__ __forceinline__ float div_by_recip(float x, float s, float r) {
  const float q0 = mul_rn(x, r);
  const float q1 = fma_rn(fma_rn(-s, q0, x), r, q0);
  return fma_rn(fma_rn(-s, q1, x), r, q1);
}
__host__ __device__ __forceinline__ bool range_ok_s(float s) {
  const std::uint32_t e = (float_bits(s) >> 23) & 0xFFu;
  return e >= 127u - 20u && e <= 127u + 20u;
}
__device__ __forceinline__ bool range_ok_x(float x) {
  const std::uint32_t e = (__float_as_uint(x) >> 23) & 0xFFu;
  return e - (127u - 100u) < 200u;  // biased exponent in [27, 226]
}

/// __fdiv_rn(x, s) out of line, for the kernels' rare paths (an operand outside div_by_recip's
/// range): inlined, each of an item's eight is a fast path and a call, code a launch carries (and
/// fetches) for nothing on the common path.
inline __device__ __noinline__ float fdiv_rn_cold(float x, float s) { return __fdiv_rn(x, s); }

/// fl(x_i / s) for 8 elements (divide8_by: with r = fl(1 / s) given, for a caller whose s serves
/// many items): by multiply (s a power of two), by the reciprocal with corrections (every operand
/// in range), else by __fdiv_rn. A NaN x goes through __fdiv_rn or a multiply and comes out as the
/// GPU's canonical NaN 0x7FFFFFFF, which is SPEC 2's NaN through arithmetic. divide8_by_x_ok takes
/// the x half of the range check as given (x_ok: range_ok_x of every x_i), for a caller that
/// decides it from its raw input (bf16_words_in_range).
__device__ __forceinline__ void divide8_by_x_ok(const float (&x)[kVec], float (&y)[kVec], float s,
                                                float r, bool x_ok) {
  if (is_pow2_normal(s)) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[i] = __fmul_rn(x[i], r);
    return;
  }
  if (x_ok && range_ok_s(s)) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[i] = div_by_recip(x[i], s, r);
    return;
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) y[i] = fdiv_rn_cold(x[i], s);
}
__device__ __forceinline__ void divide8_by(const float (&x)[kVec], float (&y)[kVec], float s,
                                           float r) {
  bool x_ok = true;
#pragma unroll
  for (int i = 0; i < kVec; ++i) x_ok = x_ok && range_ok_x(x[i]);
  divide8_by_x_ok(x, y, s, r, x_ok);
}

/// Whether every one of an item's 8 raw bf16 values (16 bytes, before widening) has a biased
/// exponent in [kLo, kHi], two values a 32-bit operation: with its sign cleared a bf16 half a is
/// below 0x8000, so a + (0x8000 - bound) sets the half's bit 15 exactly when a >= bound, with no
/// carry into the other half; a bf16's biased exponent is its fp32 value's, so [kLo, kHi] is a in
/// [kLo << 7, (kHi + 1) << 7).
template <std::uint32_t kLo, std::uint32_t kHi>
__device__ __forceinline__ bool bf16_words_in_exponents(const uint4& w) {
  static_assert(kLo >= 1u && kLo <= kHi && kHi <= 254u);
  constexpr std::uint32_t kAbs = 0x7FFF7FFFu, kBit15 = 0x80008000u;
  constexpr std::uint32_t kGeHigh = (0x8000u - ((kHi + 1u) << 7)) * 0x10001u;  // in each half
  constexpr std::uint32_t kGeLow = (0x8000u - (kLo << 7)) * 0x10001u;
  std::uint32_t bad = 0;
  for (const std::uint32_t u : {w.x, w.y, w.z, w.w}) {
    const std::uint32_t a = u & kAbs;
    bad |= (a + kGeHigh) | ~(a + kGeLow);
  }
  return (bad & kBit15) == 0u;
}
/// range_ok_x of all 8 bf16 values of a raw item (biased exponents [27, 226]). Checked against
/// range_ok_x for every 32-bit word by FastDivision.Bf16RangeCheckExhaustive.
__device__ __forceinline__ bool bf16_words_in_range(const uint4& w) {
  return bf16_words_in_exponents<27u, 226u>(w);
}

// ---------------------------------------------------------------------------------------------
// The division by a block's own scale in two operations an element (the specialised write's
// divide mode, bf16 activations). Host and device: the host runs the same rule in the CPU test
// that proves it (SpecialisedDivision.*), the device in the kernel and the GPU tests.

/// 1 / s in two floats: hi = fl(1 / s) (the caller's correctly rounded reciprocal) and
/// lo = fl(fl(1 - s * hi) * hi) (the residual 1 - s * hi is exact in one fma), so hi + lo is 1 / s
/// to about 2^-47 relative.
struct RecipPair {
  float hi = 1.0f, lo = 0.0f;
};
__host__ __device__ __forceinline__ RecipPair recip_pair(float s, float hi) {
  return {hi, mul_rn(fma_rn(-s, hi, 1.0f), hi)};
}
/// q = fl(x * hi + fl(x * lo)): within about 2^-46 relative of x / s before its one rounding, so it
/// is fl(x / s) unless x / s lies that close to a midpoint of two floats. That cannot be excluded
/// for a scale in general, so a caller uses it only for a scale that recip_pair_trial passes at
/// every bf16 significand, and only for bf16 x whose biased exponent is in
/// [kPairExponentLo, kPairExponentHi] (bf16_words_in_exponents): there every intermediate is a
/// normal float for every s in range_ok_s (|lo| >= 2^-69 there, as s * hi != 1 is a multiple of
/// 2^-48 off 1 unless s is a power of two, where lo = 0), so x = m * 2^k gives exactly 2^k times
/// m's quotient, and the sign flips every term alike: the 128 significands m decide every x.
__host__ __device__ __forceinline__ float div_by_recip_pair(float x, RecipPair p) {
  return fma_rn(x, p.hi, mul_rn(x, p.lo));
}
inline constexpr std::uint32_t kPairExponentLo = 71u;   // |x| >= 2^-56: |x * lo| >= 2^-125
inline constexpr std::uint32_t kPairExponentHi = 226u;  // |x| < 2^100, as range_ok_x
/// The bf16 significands, 1 + j / 128 for j in [0, 128).
inline constexpr int kBf16Significands = 128;

/// Whether the pair divides the bf16 significand m = 1 + j / 128 exactly as div_by_recip(m, s, r)
/// (r = fl(1 / s); fl(m / s) for s in range_ok_s).
__host__ __device__ __forceinline__ bool recip_pair_exact_at(float s, float r, RecipPair p, int j) {
  const float m = 1.0f + static_cast<float>(j) * (1.0f / kBf16Significands);  // exact
  return float_bits(div_by_recip_pair(m, p)) == float_bits(div_by_recip(m, s, r));
}
/// One trial of a scale's check: s in range_ok_s, not a power of two (where one multiply by r is
/// exact and cheaper), and its pair (hi = r = fl(1 / s)) exact at the bf16 significand
/// 1 + j / 128. A scale passes when all 128 trials do.
__host__ __device__ __forceinline__ bool recip_pair_trial(float s, int j) {
  const float r = div_rn(1.0f, s);
  return range_ok_s(s) && !is_pow2_normal(s) && recip_pair_exact_at(s, r, recip_pair(s, r), j);
}

/// fl(x_i / s) for one bf16 item (raw: its 16 bytes; x: them widened), r = fl(1 / s): by the
/// RecipPair where pair_ok (every recip_pair_trial of s passed) and every value's exponent is in
/// the pair's range, else divide8_by_x_ok.
__device__ __forceinline__ void divide8_bf16(const uint4& raw, const float (&x)[kVec],
                                             float (&y)[kVec], float s, float r, bool pair_ok) {
  if (pair_ok && bf16_words_in_exponents<kPairExponentLo, kPairExponentHi>(raw)) {
    const RecipPair pair = recip_pair(s, r);
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[i] = div_by_recip_pair(x[i], pair);
    return;
  }
  divide8_by_x_ok(x, y, s, r, bf16_words_in_range(raw));
}
__device__ __forceinline__ void divide8(const float (&x)[kVec], float (&y)[kVec], float s) {
  divide8_by(x, y, s, __fdiv_rn(1.0f, s));
}

/// The approximate fp32 division Triton emits for `/` on fp32 operands: PTX div.full.f32 (full
/// range, within 2 ulp, not IEEE; SPEC 2's div_approx, judged by admissible sets). Deliberately
/// not __fdividef (div.approx.f32, wrong for |s| > 2^126), not __fdiv_rn and not divide8's
/// corrected reciprocal, which are all correctly rounded or differently approximate.
__device__ __forceinline__ float div_full(float x, float s) {
  float q;
  asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(x), "f"(s));
  return q;
}

/// The scale as the scaling sees it (SPEC 2 scale_in_model_dtype): s, or s rounded to the
/// activation dtype A (RNE) and widened back, as torch's type promotion of a 0-dim or Python-float
/// scale does before `x / s`. Applied once per scale, before any mode's arithmetic.
template <DType A>
__device__ __forceinline__ float effective_scale(float s, bool scale_in_model) {
  return scale_in_model ? round_to_act<A>(s) : s;
}

/// One element scaled by SPEC 2's mode with the effective scale s: divide fl(x / s) (__fdiv_rn),
/// mul_recip fl(x * fl(1 / s)), div_approx div.full.f32, none x. A NaN out of the arithmetic is
/// the GPU's canonical NaN; with none, x (and its NaN sign) passes as it is.
__device__ __forceinline__ float scale1(float x, ScaleMode mode, float s) {
  switch (mode) {
    case ScaleMode::kDivide:
      return __fdiv_rn(x, s);
    case ScaleMode::kMulRecip:
      return __fmul_rn(x, __fdiv_rn(1.0f, s));
    case ScaleMode::kDivApprox:
      return div_full(x, s);
    case ScaleMode::kNone:
      break;
  }
  return x;
}

/// The scaled values of SPEC 2 for 8 elements of one head, then (via_model_dtype) the rounding to
/// the activation dtype A. s is the effective scale (effective_scale). Correctly rounded
/// intrinsics, no contraction, except div_approx's div.full.f32; the mode is branched on once per
/// 8 elements.
/// - divide: divide8 (a power of two by multiply, else the corrected reciprocal or __fdiv_rn).
/// - div_approx: div.full.f32 on every element, never divide8's exact paths.
/// - NaN: whatever the GPU's arithmetic gives (the canonical NaN 0x7FFFFFFF, sign dropped), which
///   is what SPEC 2 and the reference say; with none the input NaN reaches the cast unchanged (the
///   torch saturation mode then keeps its sign: fp8_code_soft).
template <DType A>
__device__ __forceinline__ void scale8(const float (&x)[kVec], float (&y)[kVec], ScaleMode mode,
                                       float s, bool via_model) {
  switch (mode) {
    case ScaleMode::kNone:
#pragma unroll
      for (int i = 0; i < kVec; ++i) y[i] = x[i];
      break;
    case ScaleMode::kDivide:
      divide8(x, y, s);
      break;
    case ScaleMode::kMulRecip: {
      const float r = __fdiv_rn(1.0f, s);
#pragma unroll
      for (int i = 0; i < kVec; ++i) y[i] = __fmul_rn(x[i], r);
      break;
    }
    case ScaleMode::kDivApprox:
#pragma unroll
      for (int i = 0; i < kVec; ++i) y[i] = div_full(x[i], s);
      break;
  }
  if (via_model) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[i] = round_to_act<A>(y[i]);
  }
}

/// One fp8 code without saturation (nosat, torch) through CUDA's software conversion; kept out of
/// line so that the hot (satfinite) path of every kernel stays short. torch is nosat except that a
/// NaN input keeps its sign (0xFF for -NaN), where CUDA gives 0x7F for every NaN.
template <DType C>
__device__ __noinline__ std::uint32_t fp8_code_soft(float x, Saturation sat) {
  std::uint32_t q = static_cast<std::uint32_t>(__nv_cvt_float_to_fp8(x, __NV_NOSAT, kFp8Kind<C>));
  if (sat == Saturation::kTorch && isnan(x) && signbit(x)) q = 0xFFu;
  return q;
}

/// Two satfinite fp8 codes packed little-endian (low byte = a) by the paired hardware conversion
/// (cvt.rn.satfinite.e4m3x2.f32, direct from f32, verified equal to the single conversion).
template <DType C>
__device__ __forceinline__ std::uint32_t fp8_pair_satfinite(float a, float b) {
  return static_cast<std::uint32_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kFp8Kind<C>));
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
    std::uint32_t w[2];
    if (sat == Saturation::kSatFinite) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        w[i] = fp8_pair_satfinite<C>(y[4 * i], y[4 * i + 1]) |
               (fp8_pair_satfinite<C>(y[4 * i + 2], y[4 * i + 3]) << 16);
      }
    } else {
      w[0] = w[1] = 0;
      for (int i = 0; i < kVec; ++i) w[i / 4] |= fp8_code_soft<C>(y[i], sat) << (8 * (i % 4));
    }
    *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
  }
}

/// Eight satfinite e4m3 codes stored as two 4-byte words (the blockscale value rows are only
/// 4-byte aligned when bs * (index_dim / 128) is odd).
__device__ __forceinline__ void store8_e4m3_words(std::uint8_t* dst, const float (&y)[kVec]) {
  const std::uint32_t w0 = fp8_pair_satfinite<DType::kFp8E4M3>(y[0], y[1]) |
                           (fp8_pair_satfinite<DType::kFp8E4M3>(y[2], y[3]) << 16);
  const std::uint32_t w1 = fp8_pair_satfinite<DType::kFp8E4M3>(y[4], y[5]) |
                           (fp8_pair_satfinite<DType::kFp8E4M3>(y[6], y[7]) << 16);
  reinterpret_cast<std::uint32_t*>(dst)[0] = w0;
  reinterpret_cast<std::uint32_t*>(dst)[1] = w1;
}

/// The ue8m0 scale: the smallest power of two >= s by the exponent-bit rule (biased exponent +
/// (mantissa != 0)), never exp2(ceil(log2(s))) (fp8_spec.md 6).
__device__ __forceinline__ float ue8m0_ceil(float s) {
  const std::uint32_t u = __float_as_uint(s);
  return __uint_as_float((((u >> 23) & 0xFFu) + ((u & 0x7FFFFFu) != 0u ? 1u : 0u)) << 23);
}

/// The index-K block scale of one 128-group (SPEC 2): amax floored at 1e-4, then fl(amax / 448)
/// (vLLM, TensorRT-LLM) or fl(amax * fl(1 / 448)) (blockscale_scale mul_recip: SGLang, DeepSeek's
/// reference), then (ue8m0) rounded up to a power of two.
/// fl(amax / 448) takes div_by_recip's path (448 is in its range; so is every floored amax below
/// 2^100), __fdiv_rn only past it: no division on the path every group takes (FastDivision.
/// BlockScaleExhaustiveAgainstFdivRn checks every amax).
/// `floor` false: without the amax floor (a planted bug: an all-zero group gets scale 0).
__device__ __forceinline__ float blockscale_scale(float amax, bool mul_recip, bool ue8m0,
                                                  bool floor = true) {
  constexpr float kRecip = 1.0f / spec::kFp8E4M3Max;  // fl(1 / 448), rounded by the compiler
  if (floor) amax = fmaxf(amax, spec::kBlockScaleAmaxFloor);
  float s;
  if (mul_recip) {
    s = __fmul_rn(amax, kRecip);
  } else if (range_ok_x(amax)) {
    s = div_by_recip(amax, spec::kFp8E4M3Max, kRecip);
  } else {
    s = fdiv_rn_cold(amax, spec::kFp8E4M3Max);
  }
  if (ue8m0) s = ue8m0_ceil(s);
  return s;
}

/// fl(1 / s) for a ue8m0 block scale s: a normal power of two 2^k (k <= 127: 2^-k by its exponent
/// bits, subnormal 2^-127 for k = 127) or +inf (amax infinite: 0, and x * 0 == fl(x / inf) bit
/// for bit: a signed zero for finite x, NaN for infinite or NaN x).
__device__ __forceinline__ float recip_ue8m0(float s) {
  const std::uint32_t e = __float_as_uint(s) >> 23;  // s > 0: the biased exponent
  if (e >= 255u) return 0.0f;
  return e == 254u ? __uint_as_float(0x00400000u) : __uint_as_float((254u - e) << 23);
}

/// fl(x_i / s) for the 8 elements of one block-scale group: by the exact reciprocal's multiply
/// when s is a ue8m0 scale (recip_ue8m0: no division), else divide8.
__device__ __forceinline__ void divide8_by_block_scale(const float (&x)[kVec], float (&y)[kVec],
                                                       float s, bool ue8m0) {
  if (ue8m0) {
    const float r = recip_ue8m0(s);
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[i] = __fmul_rn(x[i], r);
    return;
  }
  divide8(x, y, s);
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

}  // namespace kvo::gpu::detail
