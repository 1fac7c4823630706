// The user's KV-cache write (my_kernels.hpp): a CPU loop over (token, head, dim).
#include <algorithm>
#include <bit>
#include <cmath>

#include "my_kernels.hpp"

namespace my {
namespace {

std::uint8_t float_to_e4m3(float x) {  // satfinite: beyond 448 -> 448; NaN -> 0x7F
  if (std::isnan(x)) return 0x7F;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::min(std::fabs(x), 448.0f);
  const int e = a < 0x1p-6f ? -6 : std::ilogb(a);  // binade; subnormals share 2^-6's quantum
  const int q = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - e)));  // 3 bits, ties to even
  return static_cast<std::uint8_t>(sign | (((e + 6) << 3) + q));         // q = 16 carries over
}

void write(const KvWrite& a, bool truncate_bf16) {
  auto store = [&](void* cache, std::int64_t at, float y) {
    if (a.fp8) {
      static_cast<std::uint8_t*>(cache)[at] = float_to_e4m3(y);
    } else {
      static_cast<std::uint16_t*>(cache)[at] =
          truncate_bf16 ? static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(y) >> 16)
                        : float_to_bf16(y);
    }
  };
  for (std::int64_t t = 0; t < a.tokens; ++t) {
    const std::int64_t slot = a.slots[t];
    if (slot < 0) continue;  // padding
    for (std::int64_t h = 0; h < a.heads; ++h) {
      const std::int64_t s = a.per_head_scale ? h : 0;
      for (std::int64_t d = 0; d < a.head_dim; ++d) {
        const std::int64_t src = (t * a.heads + h) * a.head_dim + d;
        const std::int64_t dst = (slot * a.heads + h) * a.head_dim + d;  // NHD
        store(a.k_cache, dst, bf16_to_float(a.k[src]) / a.k_scale[s]);
        store(a.v_cache, dst, bf16_to_float(a.v[src]) / a.v_scale[s]);
      }
    }
  }
}

}  // namespace

std::uint16_t float_to_bf16(float x) {
  if (std::isnan(x)) return 0x7FFF;
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float bf16_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

void write_kv_cache(const KvWrite& args) { write(args, false); }
void write_kv_cache_planted_bug(const KvWrite& args) { write(args, true); }

}  // namespace my
