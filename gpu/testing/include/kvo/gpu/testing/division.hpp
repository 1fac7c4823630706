#pragma once
/// \file division.hpp
/// An exhaustive check of the premise under div_approx's admissible sets (SPEC 2): the kernels'
/// approximate division (convert.cuh div_full, PTX div.full.f32, what Triton emits for `/`) gives,
/// for every float32 x, a quotient within 2 ulp of the correctly rounded one. Target
/// kvo_gpu_testing. No CUDA types here.

#include <cstdint>
#include <vector>

namespace kvo::gpu::testing {

/// One x where div.full.f32 leaves q's exact bits at an edge the counts below name (bit patterns).
struct DivFullExample {
  std::uint32_t x = 0, q = 0, got = 0;
};

/// Counts over all 2^32 float32 bit patterns x, for one divisor s, of got = div.full.f32(x, s)
/// against q = __fdiv_rn(x, s). Steps are along the float32 line (consecutive floats of one sign
/// one step apart, +0 and -0 both at zero, infinity one step past the largest finite).
struct DivFullCounts {
  /// got differs from q in any bit (the elements where div_approx can pick another code).
  std::int64_t differing = 0;
  /// Outside SPEC 2's window: got of the other sign (zeros included) or more than 2 steps from q.
  std::int64_t outside_window = 0;
  /// Inside the window but not q's bits where q is zero or infinite, or got zero where q is not:
  /// the quotients a rule that keeps zero and infinity exact (and never steps onto zero) misses.
  std::int64_t zero_or_infinity_moved = 0;
  /// q is NaN but got is not the canonical NaN 0x7FFFFFFF (SPEC 2's NaN rule).
  std::int64_t nan_not_canonical = 0;
  /// Up to 8 x of the outside_window and zero_or_infinity_moved kinds.
  std::vector<DivFullExample> examples;
};

/// Runs the check for divisor s (synchronous; spec::FailedToRun on a CUDA error).
DivFullCounts count_div_full(float s);

}  // namespace kvo::gpu::testing

namespace kvo::gpu::testing {

/// The specialised write's two-operation division on bf16 activations (convert.cuh RecipPair),
/// evaluated on the host by the kernel's own code: whether scale s passes the kernel's check
/// (range_ok_s, and recip_pair_exact_at for all 128 bf16 significands)...
bool recip_pair_passes(float s);
/// ... whether the pair divides the significand 1 + j / 128 (j in [0, 128)) exactly ...
bool recip_pair_exact_at(float s, int j);
/// ... the pair's quotient fl(x * hi + fl(x * lo)) ...
float divide_by_recip_pair(float x, float s);
/// ... and whether x's biased exponent is in the pair's range (bf16 x; the kernel tests raw
/// words).
bool in_recip_pair_range(float x);

}  // namespace kvo::gpu::testing
