#pragma once
/// \file canonical.hpp
/// The canonical float32 arithmetic of SPEC 6.1-6.2 that every bit-exact read-side result is built
/// from: the grouped-fma dot product, the power-of-two tree sum, and the polynomial exp. Each is a
/// fixed sequence of IEEE-754 binary32 operations; a kernel that follows the same sequence gets the
/// same bits.

#include <cstdint>
#include <span>

namespace kvo::reference {

/// SPEC 6.1 tree_sum: pad with +0 to the next power of two m; while m > 1: m /= 2,
/// x[i] = x[i] + x[i + m] for i < m; the result is x[0]. An empty span sums to +0.
float tree_sum(std::span<const float> x);

/// SPEC 6.1 dot over n elements, n % 8 == 0: per 8-element group acc = 0, acc = fma(a[i], b[i],
/// acc) in order; then tree_sum of the n/8 group results.
float canonical_dot(std::span<const float> a, std::span<const float> b);

/// SPEC 6.2 exp2: y = -inf or y < -126 gives +0; y > 127 gives +inf; NaN gives NaN; else
/// n = round-half-even(y), f = y - n (exact), Horner with fma over c7..c0, times 2^n.
float canonical_exp2(float y);
/// SPEC 6.2 exp(x) = exp2(fl(x * L)), L = 0x3FB8AA3B.
float canonical_exp(float x);

/// The constants of SPEC 6.2, for kernels and tests.
inline constexpr std::uint32_t kLog2eBits = 0x3FB8AA3Bu;
inline constexpr std::uint32_t kExp2PolyBits[8] = {0x3F800000u, 0x3F317218u, 0x3E75FDF0u,
                                                   0x3D635847u, 0x3C1D955Bu, 0x3AAEC3FFu,
                                                   0x39218489u, 0x377FE5FEu};

}  // namespace kvo::reference
