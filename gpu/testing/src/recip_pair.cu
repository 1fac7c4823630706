// kvo_gpu_testing: the specialised write's two-operation division (convert.cuh RecipPair) on the
// host, by the same __host__ __device__ code the kernel runs, for the CPU test that proves it.
#include "convert.cuh"
#include "kvo/gpu/testing/division.hpp"

namespace kvo::gpu::testing {

namespace {
detail::RecipPair pair_of(float s) { return detail::recip_pair(s, detail::div_rn(1.0f, s)); }
}  // namespace

bool recip_pair_passes(float s) {
  for (int j = 0; j < detail::kBf16Significands; ++j)
    if (!detail::recip_pair_trial(s, j)) return false;
  return true;
}

bool recip_pair_exact_at(float s, int j) {
  return detail::recip_pair_exact_at(s, detail::div_rn(1.0f, s), pair_of(s), j);
}

float divide_by_recip_pair(float x, float s) { return detail::div_by_recip_pair(x, pair_of(s)); }

bool in_recip_pair_range(float x) {
  const std::uint32_t e = (detail::float_bits(x) >> 23) & 0xFFu;
  return e >= detail::kPairExponentLo && e <= detail::kPairExponentHi;
}

}  // namespace kvo::gpu::testing
