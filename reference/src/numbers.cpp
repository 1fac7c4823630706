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
  const std::uint32_t q = detail::round_shift_rne(m, target - e + 13);
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
