#include "kvo/reference/numbers.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvo::reference {
using spec::DType;

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
    q[i] = f32_to_fp8(scaled, DType::kFp8E4M3, spec::Saturation::kSatFinite);
  }
  return s;
}

}  // namespace kvo::reference
