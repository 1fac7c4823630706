#include "kvo/reference/canonical.hpp"

#include <cmath>
#include <vector>

#include "kvo/reference/numbers.hpp"

namespace kvo::reference {

float tree_sum(std::span<const float> x) {
  std::size_t m = 1;
  while (m < x.size()) m *= 2;
  std::vector<float> v(m, 0.0f);  // padded with +0
  for (std::size_t i = 0; i < x.size(); ++i) v[i] = x[i];
  while (m > 1) {
    m /= 2;
    for (std::size_t i = 0; i < m; ++i) v[i] = v[i] + v[i + m];
  }
  return v[0];
}

float canonical_dot(std::span<const float> a, std::span<const float> b) {
  const std::size_t groups = a.size() / 8;
  std::vector<float> partial(groups);
  for (std::size_t g = 0; g < groups; ++g) {
    float acc = 0.0f;
    for (std::size_t i = 8 * g; i < 8 * g + 8; ++i) acc = std::fma(a[i], b[i], acc);
    partial[g] = acc;
  }
  return tree_sum(partial);
}

float canonical_exp2(float y) {
  if (std::isnan(y)) return y;
  if (y < -126.0f) return 0.0f;  // -inf included
  if (y > 127.0f) return float_of(0x7F800000u);
  const float n = std::nearbyint(y);  // the default rounding mode: half to even
  const float f = y - n;              // exact: |f| <= 1/2 and y, n share the binade's grid
  float p = float_of(kExp2PolyBits[7]);
  for (int k = 6; k >= 0; --k) p = std::fma(p, f, float_of(kExp2PolyBits[k]));
  const int e = static_cast<int>(n);  // in [-126, 127]: 2^e is a normal float
  return p * float_of(static_cast<std::uint32_t>(e + 127) << 23);
}

float canonical_exp(float x) { return canonical_exp2(x * float_of(kLog2eBits)); }

}  // namespace kvo::reference
