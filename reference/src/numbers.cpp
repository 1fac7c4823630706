#include "kvo/reference/numbers.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

namespace kvo::reference {
namespace {

using spec::DType;
using spec::Saturation;

constexpr std::uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr std::uint32_t kInfBits = 0x7F800000u;

/// Rounds the 24-bit significand m (implicit bit included) right by `shift` bits, to nearest even.
std::uint32_t round_shift_rne(std::uint32_t m, int shift) {
  if (shift <= 0) return m << -shift;
  if (shift >= 25) return 0;  // m < 2^24 <= half: rounds to zero
  const std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  return (rem > half || (rem == half && (q & 1u))) ? q + 1u : q;
}

/// An fp8 format: mantissa bits, minimum normal exponent, largest finite magnitude code.
struct Fp8Format {
  int mantissa_bits;
  int emin;
  std::uint8_t max_finite;    ///< 0x7E (448) or 0x7B (57344)
  std::uint8_t nosat_result;  ///< magnitude code of an overflow without saturation: NaN or inf
};
constexpr Fp8Format kE4M3{3, -6, 0x7E, 0x7F};
constexpr Fp8Format kE5M2{2, -14, 0x7B, 0x7C};

const Fp8Format& fp8_format(DType t) { return t == DType::kFp8E5M2 ? kE5M2 : kE4M3; }

}  // namespace

std::uint16_t f32_to_f16(float x) {
  const std::uint32_t u = bits_of(x);
  const std::uint32_t a = u & kAbsMask;
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  if (a > kInfBits) return 0x7FFF;
  if (a >= 0x477FF000u) return sign | 0x7C00;  // rounds to 65536 or beyond: infinity
  if ((a >> 23) == 0) return sign;             // float32 subnormals are below half of 2^-24
  const int e = static_cast<int>(a >> 23) - 127;
  const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const int target = e < -14 ? -14 : e;  // fp16 subnormals share the quantum of the first binade
  const std::uint32_t q = round_shift_rne(m, target - e + 13);
  return static_cast<std::uint16_t>(sign | ((static_cast<std::uint32_t>(target + 14) << 10) + q));
}

namespace {

/// SPEC 2's decoding of an fp16 code, as the spec writes it; f16_to_f32 looks its results up.
float f16_value(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const int exp = (h >> 10) & 0x1F;
  const std::uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return man ? float_of(0x7FFFFFFFu) : float_of(sign | kInfBits);
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -24)
                             : std::ldexp(static_cast<float>(man | 0x400u), exp - 25);
  return float_of(sign | bits_of(mag));
}

}  // namespace

float f16_to_f32(std::uint16_t h) {
  // Every code decoded once, by the formula (a replay decodes millions a step).
  static const std::vector<float> kValues = [] {
    std::vector<float> t(65536);
    for (std::uint32_t c = 0; c < t.size(); ++c) t[c] = f16_value(static_cast<std::uint16_t>(c));
    return t;
  }();
  return kValues[h];
}

std::uint8_t f32_to_fp8(float x, DType format, Saturation sat) {
  const Fp8Format& f = fp8_format(format);
  const std::uint32_t u = bits_of(x);
  const std::uint32_t a = u & kAbsMask;
  const std::uint8_t sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  if (a > kInfBits) return sat == Saturation::kTorch ? (sign | 0x7F) : 0x7F;
  std::uint32_t code = 0;
  if (a == kInfBits) {
    code = 0x100;  // beyond every finite code: overflow
  } else if ((a >> 23) != 0) {
    const int e = static_cast<int>(a >> 23) - 127;
    if (e > 16) {
      code = 0x100;  // above 2^16 > 57344: overflow in both formats
    } else {
      const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
      const int target = e < f.emin ? f.emin : e;
      const std::uint32_t q = round_shift_rne(m, target - e + 23 - f.mantissa_bits);
      // q is the magnitude in quanta 2^(target - M); the code of the first binade and of the
      // subnormals is q itself, and a carry out of the mantissa moves to the next binade.
      code = (static_cast<std::uint32_t>(target - f.emin) << f.mantissa_bits) + q;
    }
  }  // float32 subnormals: code 0 (signed zero)
  if (code > f.max_finite) {
    return sign | (sat == Saturation::kSatFinite ? f.max_finite : f.nosat_result);
  }
  return static_cast<std::uint8_t>(sign | code);
}

namespace {

/// SPEC 2's decoding of an fp8 code, as the spec writes it; fp8_to_f32 looks its results up.
float fp8_value(std::uint8_t code, DType format) {
  const bool negative = (code & 0x80u) != 0;
  float mag;
  if (format == DType::kFp8E4M3) {
    if ((code & 0x7Fu) == 0x7Fu) return float_of(0x7FFFFFFFu);
    const int e = (code >> 3) & 0xF;
    const int m = code & 0x7;
    mag = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                 : std::ldexp(static_cast<float>(8 + m), e - 10);
  } else {
    const int e = (code >> 2) & 0x1F;
    const int m = code & 0x3;
    if (e == 0x1F) {
      if (m != 0) return float_of(0x7FFFFFFFu);
      mag = float_of(kInfBits);
    } else {
      mag = e == 0 ? std::ldexp(static_cast<float>(m), -16)
                   : std::ldexp(static_cast<float>(4 + m), e - 17);
    }
  }
  return negative ? -mag : mag;
}

}  // namespace

float fp8_to_f32(std::uint8_t code, DType format) {
  // Every code of both formats decoded once, by the formula: [e4m3, e5m2][code].
  static const std::array<std::array<float, 256>, 2> kValues = [] {
    std::array<std::array<float, 256>, 2> t{};
    for (std::uint32_t c = 0; c < 256; ++c) {
      t[0][c] = fp8_value(static_cast<std::uint8_t>(c), DType::kFp8E4M3);
      t[1][c] = fp8_value(static_cast<std::uint8_t>(c), DType::kFp8E5M2);
    }
    return t;
  }();
  return kValues[format == DType::kFp8E4M3 ? 0 : 1][code];
}

std::vector<std::uint32_t> admissible_kv_codes(float x, float s, const spec::KvQuant& q,
                                               DType act) {
  std::vector<std::uint32_t> codes{quantize_kv(x, s, q, act)};
  if (q.scale_mode != spec::ScaleMode::kDivApprox) return codes;
  const float exact = apply_scale(x, effective_scale(s, q, act), q.scale_mode);
  if (std::isnan(exact)) return codes;  // NaN is NaN in every division
  // The fp32 values within 2 ulp of the quotient, on its own side of zero: toward zero down to a
  // zero of the same sign, away from zero up to the infinity (an approximate division moves a
  // quotient off zero or infinity too: div.full.f32 does, on the H200).
  const float toward_zero = std::copysign(0.0f, exact);
  const float away = std::copysign(std::numeric_limits<float>::infinity(), exact);
  for (const float direction : {toward_zero, away}) {
    float y = exact;
    for (int step = 0; step < 2 && y != direction; ++step) {
      y = std::nextafter(y, direction);
      const float v = q.via_model_dtype ? round_to(y, act) : y;
      codes.push_back(encode(v, q.cache_dtype, q.saturation));
    }
  }
  std::sort(codes.begin(), codes.end());
  codes.erase(std::unique(codes.begin(), codes.end()), codes.end());
  return codes;
}

float dequantize(std::uint32_t code, DType dtype, float s) {
  const float x = decode(code, dtype);
  return x * s;
}

float ue8m0_ceil(float s) {
  const std::uint32_t u = bits_of(s);
  const std::uint32_t exponent = (u >> 23) & 0xFFu;
  const std::uint32_t mantissa = u & 0x7FFFFFu;
  return float_of((exponent + (mantissa != 0 ? 1u : 0u)) << 23);
}

float quantize_group_blockscale(std::span<const float> x, const spec::IndexQuant& index,
                                std::span<std::uint8_t> q) {
  float amax = spec::kBlockScaleAmaxFloor;
  for (float v : x) {
    // fmaxf semantics (CUDA): every NaN element is ignored. Not std::fmax: glibc's returns NaN for
    // a signalling NaN operand (IEEE 754-2008 maxNum), which would make the scale 0. A comparison
    // is false for any NaN, and amax >= 1e-4 leaves no signed-zero case.
    const float a = std::fabs(v);
    if (a > amax) amax = a;
  }
  float s = amax / spec::kFp8E4M3Max;
  switch (index.blockscale_scale) {
    case spec::BlockScaleFormula::kDivide:
      break;
    case spec::BlockScaleFormula::kMulRecip: {
      const float recip = 1.0f / spec::kFp8E4M3Max;
      s = amax * recip;
      break;
    }
  }
  if (index.ue8m0) s = ue8m0_ceil(s);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float scaled = arithmetic_result(x[i] / s);
    q[i] = f32_to_fp8(scaled, DType::kFp8E4M3, Saturation::kSatFinite);
  }
  return s;
}

}  // namespace kvo::reference
