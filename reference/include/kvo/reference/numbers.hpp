#pragma once
/// \file numbers.hpp
/// Bit-exact number conversions of SPEC section 2, each format read from its spec::NumberFormat row
/// (fp8_spec.md gives the rules): float32 to and
/// from bf16, fp16, fp8 e4m3 (OCP E4M3FN) and fp8 e5m2, the three saturation modes, the three scale
/// modes, `via_model_dtype`, and the 128-group block scale with and without ue8m0. Integer-only
/// rounding: every narrowing rounds once, to nearest even, directly from the float32 value.

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kvo/spec/config.hpp"
#include "kvo/spec/types.hpp"

namespace kvo::reference {

// Element codes are stored little-endian (SPEC 3), which store_code and load_code do with plain
// copies.
static_assert(std::endian::native == std::endian::little, "kvoracle assumes a little-endian host");

// The codecs every element goes through are defined here, inline: a replay or a campaign calls
// them billions of times.

inline std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
inline float float_of(std::uint32_t bits) { return std::bit_cast<float>(bits); }

namespace detail {

/// `bits` without their `cut` low bits, rounded to nearest even with no branch on the data: half a
/// quantum less one, plus the kept part's low bit, added below the cut (so a tie rounds up from an
/// odd kept part only). A carry out of a mantissa moves into the exponent above it: the next
/// binade, or past the largest finite value to an overflow.
inline std::uint32_t cut_rne(std::uint32_t bits, int cut) {
  return (bits + ((1u << (cut - 1)) - 1u) + ((bits >> cut) & 1u)) >> cut;
}

/// Rounds the 24-bit significand m (implicit bit included) right by `shift` bits, to nearest even.
inline std::uint32_t round_shift_rne(std::uint32_t m, int shift) {
  if (shift <= 0) return m << -shift;
  if (shift >= 25) return 0;  // m < 2^24 <= half: rounds to zero
  const std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  return (rem > half || (rem == half && (q & 1u))) ? q + 1u : q;
}

/// 2^e, exactly (|e| < 126), in a constant expression: std::ldexp is not constexpr in C++20.
constexpr float exp2_exact(int e) {
  float v = 1.0f;
  for (; e > 0; --e) v *= 2.0f;
  for (; e < 0; ++e) v *= 0.5f;
  return v;
}

/// SPEC 2's decoding of a narrow float code of format `f`, as the spec writes it, from the row's
/// fields alone: sign, exponent field e, mantissa m; NaN as the row encodes it; e == 0 a subnormal
/// m * 2^(1 - bias - M), else (2^M + m) * 2^(e - bias - M). small_float_to_f32 looks it up.
constexpr float small_float_value(std::uint32_t code, const spec::NumberFormat& f) {
  const std::uint32_t sign = 1u << (f.bits - 1);
  const std::uint32_t mag = code & (sign - 1u);
  const std::uint32_t e = mag >> f.mantissa_bits;
  const std::uint32_t m = mag & ((1u << f.mantissa_bits) - 1u);
  const std::uint32_t top = (1u << f.exponent_bits) - 1u;
  const float nan = std::bit_cast<float>(0x7FFFFFFFu);
  switch (f.nan) {
    case spec::NanEncoding::kIeee:
      if (e == top) {
        if (m != 0) return nan;
        return std::bit_cast<float>((code & sign) ? 0xFF800000u : 0x7F800000u);
      }
      break;
    case spec::NanEncoding::kAllOnes:
      if (mag == sign - 1u) return nan;
      break;
    case spec::NanEncoding::kNegativeZero:
      if (code == sign) return nan;
      break;
    case spec::NanEncoding::kNone:
      break;
  }
  const float v = e == 0 ? static_cast<float>(m) * exp2_exact(1 - f.bias - f.mantissa_bits)
                         : static_cast<float>((1u << f.mantissa_bits) + m) *
                               exp2_exact(static_cast<int>(e) - f.bias - f.mantissa_bits);
  return (code & sign) ? -v : v;
}

/// The 8-bit formats, in kNumberFormats order: the rows small_float_to_f32 has a table for.
inline constexpr std::size_t kByteFormatCount = [] {
  std::size_t n = 0;
  for (const spec::NumberFormat& f : spec::kNumberFormats) n += f.codec == spec::Codec::kSmallFloat;
  return n;
}();
/// The position of `t` among the 8-bit formats (its table in kByteFormatValues).
constexpr std::size_t byte_format_index(spec::DType t) {
  std::size_t n = 0;
  for (const spec::NumberFormat& f : spec::kNumberFormats) {
    if (f.dtype == t) return n;
    n += f.codec == spec::Codec::kSmallFloat;
  }
  return n;
}

/// Every code of every 8-bit format decoded once, by the formula, at compile time:
/// [byte_format_index(format)][code].
inline constexpr std::array<std::array<float, 256>, kByteFormatCount> kByteFormatValues = [] {
  std::array<std::array<float, 256>, kByteFormatCount> t{};
  for (const spec::NumberFormat& f : spec::kNumberFormats) {
    if (f.codec != spec::Codec::kSmallFloat) continue;
    for (std::uint32_t c = 0; c < 256; ++c)
      t[byte_format_index(f.dtype)][c] = small_float_value(c, f);
  }
  return t;
}();

}  // namespace detail

/// float32 -> bf16 bits, RNE; overflow to infinity through the carry; any NaN -> 0x7FFF.
inline std::uint16_t f32_to_bf16(float x) {
  const std::uint32_t u = bits_of(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
  return static_cast<std::uint16_t>(detail::cut_rne(u, 16));
}
/// bf16 bits -> float32, exact (NaN sign and payload preserved).
inline float bf16_to_f32(std::uint16_t b) { return float_of(static_cast<std::uint32_t>(b) << 16); }

/// float32 -> fp16 bits, RNE with gradual underflow; |x| >= 65520 -> inf; any NaN -> 0x7FFF.
inline std::uint16_t f32_to_f16(float x) {
  const std::uint32_t u = bits_of(x);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  if (a > 0x7F800000u) return 0x7FFF;
  if (a >= 0x477FF000u) return sign | 0x7C00;  // rounds to 65536 or beyond: infinity
  if ((a >> 23) == 0) return sign;             // float32 subnormals are below half of 2^-24
  const int e = static_cast<int>(a >> 23) - 127;
  if (e >= -14) {
    // A normal code: the exponent rebiased (15 for 127), 13 mantissa bits cut; below 65520 no
    // carry reaches the infinity.
    return static_cast<std::uint16_t>(sign | detail::cut_rne(a - (112u << 23), 13));
  }
  // A subnormal code (or zero): the magnitude in quanta 2^-24; a carry to 2^10 is the first normal.
  const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  return static_cast<std::uint16_t>(sign | detail::round_shift_rne(m, -14 - e + 13));
}
/// fp16 bits -> float32, exact; any NaN -> 0x7FFFFFFF.
inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return man != 0 ? float_of(0x7FFFFFFFu) : float_of(sign | 0x7F800000u);
  // A subnormal is man * 2^-24 (exact in float32); a normal keeps its mantissa, exponent rebiased.
  if (exp == 0) return float_of(sign | bits_of(static_cast<float>(man) * 0x1p-24f));
  return float_of(sign | ((exp + 112u) << 23) | (man << 13));
}

/// float32 -> code of the 8-bit (or narrower) format `format`, from its row alone. One RNE
/// rounding from the float32 value; overflow and NaN per `sat` (fp8_spec.md 4a):
///   satfinite: overflow and +-inf -> +-max finite; NaN -> the row's NaN code.
///   nosat:     overflow and +-inf -> +-the row's overflow code (e4m3 NaN, e5m2 inf); NaN -> the
///              row's NaN code.
///   torch:     as nosat, but a NaN input keeps its sign (0xFF for -NaN in e4m3).
/// A zero of a format without -0 (fnuz) is +0.
inline std::uint32_t f32_to_small_float(float x, const spec::NumberFormat& f,
                                        spec::Saturation sat) {
  const int emin = 1 - f.bias;  // exponent of the smallest normal
  const int emax = static_cast<int>(f.max_finite_code >> f.mantissa_bits) - f.bias;
  const std::uint32_t u = bits_of(x);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  const std::uint32_t sign = u >> 31 << (f.bits - 1);
  if (a > 0x7F800000u) return sat == spec::Saturation::kTorch ? (sign | f.nan_code) : f.nan_code;
  std::uint32_t code = 0;
  if (a == 0x7F800000u) {
    code = f.max_finite_code + 1u;  // beyond every finite code: overflow
  } else if ((a >> 23) != 0) {
    const int e = static_cast<int>(a >> 23) - 127;
    if (e > emax + 1) {
      code = f.max_finite_code + 1u;  // twice the largest binade or more: overflow
    } else if (e >= emin) {
      // A normal code: the float32 bits with the exponent rebiased (field e - emin + 1), cut to M
      // mantissa bits; a carry past the largest finite code is an overflow.
      const std::uint32_t rebiased = a - (static_cast<std::uint32_t>(126 + emin) << 23);
      code = detail::cut_rne(rebiased, 23 - f.mantissa_bits);
    } else {
      // A subnormal code (or zero): the magnitude in quanta 2^(emin - M), the code itself; a
      // carry to 2^M is the first normal code.
      const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
      code = detail::round_shift_rne(m, emin - e + 23 - f.mantissa_bits);
    }
  }  // float32 subnormals: code 0 (signed zero)
  if (code > f.max_finite_code) {
    return sign | (sat == spec::Saturation::kSatFinite ? f.max_finite_code : f.overflow_code);
  }
  if (code == 0 && !f.has_negative_zero) return 0;
  return sign | code;
}
inline std::uint32_t f32_to_small_float(float x, spec::DType format, spec::Saturation sat) {
  return f32_to_small_float(x, spec::format_of(format), sat);
}
/// float32 -> fp8 code (an 8-bit format's row).
inline std::uint8_t f32_to_fp8(float x, spec::DType format, spec::Saturation sat) {
  return static_cast<std::uint8_t>(f32_to_small_float(x, format, sat));
}
/// fp8 code -> float32, exact; NaN codes -> 0x7FFFFFFF; infinities keep their sign.
inline float fp8_to_f32(std::uint8_t code, spec::DType format) {
  const std::size_t table = detail::byte_format_index(format);
  if (table >= detail::kByteFormatCount) return float_of(0x7FFFFFFFu);  // not an 8-bit format
  return detail::kByteFormatValues[table][code];
}

/// float32 -> one element of `dtype`, returned as its code in the low bytes (f32 bits, 16-bit or
/// 8-bit code). `sat` applies to fp8 only.
inline std::uint32_t encode(float x, spec::DType dtype, spec::Saturation sat) {
  switch (spec::format_of(dtype).codec) {
    case spec::Codec::kF32:
      return bits_of(x);
    case spec::Codec::kBf16:
      return f32_to_bf16(x);
    case spec::Codec::kF16:
      return f32_to_f16(x);
    case spec::Codec::kSmallFloat:
      return f32_to_small_float(x, dtype, sat);
  }
  return 0;
}
/// The element code of `dtype` -> float32.
inline float decode(std::uint32_t code, spec::DType dtype) {
  switch (spec::format_of(dtype).codec) {
    case spec::Codec::kF32:
      return float_of(code);
    case spec::Codec::kBf16:
      return bf16_to_f32(static_cast<std::uint16_t>(code));
    case spec::Codec::kF16:
      return f16_to_f32(static_cast<std::uint16_t>(code));
    case spec::Codec::kSmallFloat:
      return fp8_to_f32(static_cast<std::uint8_t>(code), dtype);
  }
  return 0.0f;
}
/// Writes the code of `dtype` little-endian into `out` (dtype_bytes(dtype) bytes).
inline void store_code(std::uint32_t code, spec::DType dtype, std::uint8_t* out) {
  switch (spec::dtype_bytes(dtype)) {  // a little-endian host: the code's low bytes, in order
    case 1:
      *out = static_cast<std::uint8_t>(code);
      return;
    case 2: {
      const auto half = static_cast<std::uint16_t>(code);
      std::memcpy(out, &half, sizeof half);
      return;
    }
    default:
      std::memcpy(out, &code, sizeof code);
  }
}
/// Reads a little-endian code of `dtype` from `in`.
inline std::uint32_t load_code(const std::uint8_t* in, spec::DType dtype) {
  switch (spec::dtype_bytes(dtype)) {
    case 1:
      return *in;
    case 2: {
      std::uint16_t half;
      std::memcpy(&half, in, sizeof half);
      return half;
    }
    default: {
      std::uint32_t code;
      std::memcpy(&code, in, sizeof code);
      return code;
    }
  }
}

/// The value of x after narrowing to the activation dtype `act` and widening back (f32: x).
inline float round_to(float x, spec::DType act) {
  return decode(encode(x, act, spec::Saturation::kSatFinite), act);
}

/// The canonical NaN 0x7FFFFFFF that GPU fp32 arithmetic returns for any NaN result (SPEC 2: NaN
/// through arithmetic); any other value unchanged. The reference follows the GPU, not the host.
inline float arithmetic_result(float y) { return std::isnan(y) ? float_of(0x7FFFFFFFu) : y; }

/// The scale as the scaling sees it: s, or (scale_in_model_dtype) s rounded to the activation
/// dtype first.
inline float effective_scale(float s, const spec::KvQuant& q, spec::DType act) {
  return q.scale_in_model_dtype ? round_to(s, act) : s;
}

/// The scaled value that is cast (SPEC 2): divide x / s; mul_recip x * fl(1 / s); none x;
/// div_approx's own pick, the correctly rounded x / s (admissible_kv_codes gives the rest). A NaN
/// result of the arithmetic is the canonical NaN; with none, x keeps its own NaN.
inline float apply_scale(float x, float s, spec::ScaleMode mode) {
  switch (mode) {
    case spec::ScaleMode::kDivide:
    case spec::ScaleMode::kDivApprox:
      return arithmetic_result(x / s);
    case spec::ScaleMode::kMulRecip: {
      const float recip = 1.0f / s;
      return arithmetic_result(x * recip);
    }
    case spec::ScaleMode::kNone:
      return x;
  }
  return x;
}

/// One K or V element: apply the (effective) scale, optionally round to the activation dtype
/// (via_model_dtype), then cast to the cache dtype. Returns the element code.
inline std::uint32_t quantize_kv(float x, float s, const spec::KvQuant& q, spec::DType act) {
  float v = apply_scale(x, effective_scale(s, q, act), q.scale_mode);
  if (q.via_model_dtype) v = round_to(v, act);
  return encode(v, q.cache_dtype, q.saturation);
}

/// Every code SPEC 2 admits for one K or V element: quantize_kv's code alone, or with div_approx
/// the codes of every fp32 y within 2 ulp of the correctly rounded quotient on its side of zero
/// (zero and infinity included; a NaN quotient stays NaN), after via_model_dtype and the cast.
/// Sorted, no duplicates.
std::vector<std::uint32_t> admissible_kv_codes(float x, float s, const spec::KvQuant& q,
                                               spec::DType act);

/// Dequantization of a cache element (SPEC 2): fl(decode(code) * s).
float dequantize(std::uint32_t code, spec::DType dtype, float s);

/// The ue8m0 scale: the smallest power of two >= s by the exponent-bit rule of fp8_spec.md 6
/// (biased exponent + (mantissa != 0)), never exp2(ceil(log2(s))).
float ue8m0_ceil(float s);

/// The 128-group block scale of the index-K cache (SPEC 2): amax = max(max|x|, 1e-4) with NaN
/// elements ignored (fmaxf semantics); s = fl(amax / 448), or fl(amax * fl(1 / 448)) with
/// blockscale_scale mul_recip; with ue8m0, s = ue8m0_ceil(s); q[i] = f32_to_fp8(fl(x[i] / s),
/// e4m3, satfinite). Writes x.size() codes to q; returns s.
float quantize_group_blockscale(std::span<const float> x, const spec::IndexQuant& index,
                                std::span<std::uint8_t> q);

}  // namespace kvo::reference
