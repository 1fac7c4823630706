#include "kvo/reference/canonical.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <vector>

#include "kvo/reference/numbers.hpp"

// KVO_FMA_CLONES: a function built twice on x86-64 with GCC or Clang, for CPUs with FMA and for
// the rest (target_clones: the loader picks one); elsewhere once.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVO_FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define KVO_FMA_CLONES
#endif

namespace kvo::reference {

namespace {

/// tree_sum over v[0, n), in place: v has room for the next power of two m >= n, [n, m) padded
/// with +0 here.
float tree_sum_in_place(float* v, std::size_t n) {
  std::size_t m = std::bit_ceil(n);  // 1 for n = 0: the sum of nothing is the padding's +0
  std::fill(v + n, v + m, 0.0f);
  while (m > 1) {
    m /= 2;
    for (std::size_t i = 0; i < m; ++i) v[i] = v[i] + v[i + m];
  }
  return v[0];
}

/// The groups of 8 whose results canonical_dot keeps on the stack (4,096 elements, past every head
/// and index dim a case draws): a 16k-token read case takes it millions of times, each of which
/// allocated two vectors.
constexpr std::size_t kStackGroups = 512;

}  // namespace

float tree_sum(std::span<const float> x) {
  std::vector<float> v(std::bit_ceil(x.size()));
  std::copy(x.begin(), x.end(), v.begin());
  return tree_sum_in_place(v.data(), x.size());
}

// On x86-64 a second copy of the function is built for CPUs with FMA (chosen when the program
// loads): there std::fma is one instruction, not a call into libm. Both round each fma once, as
// IEEE-754 requires, so both give the same bits (and -ffp-contract=off keeps the compiler from
// fusing anything else).
KVO_FMA_CLONES float canonical_dot(std::span<const float> a, std::span<const float> b) {
  const std::size_t groups = a.size() / 8;
  std::array<float, kStackGroups> on_stack;
  std::vector<float> on_heap;
  float* partial = on_stack.data();
  if (std::bit_ceil(groups) > kStackGroups) {
    on_heap.resize(std::bit_ceil(groups));
    partial = on_heap.data();
  }
  for (std::size_t g = 0; g < groups; ++g) {
    float acc = 0.0f;
    for (std::size_t i = 8 * g; i < 8 * g + 8; ++i) acc = std::fma(a[i], b[i], acc);
    partial[g] = acc;
  }
  return tree_sum_in_place(partial, groups);
}

KVO_FMA_CLONES float canonical_exp2(float y) {
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
