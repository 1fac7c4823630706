// Exhaustive check of the kernels' division (convert.cuh divide8's per-element rule) against
// __fdiv_rn: for one scale s, every one of the 2^32 float32 bit patterns x.
#include <cuda_runtime.h>

#include "kvo/gpu/write.hpp"
#include "launch.cuh"

namespace kvo::gpu {
namespace detail {
namespace {

/// Counts the x (all 2^32 bit patterns, grid-stride) where the kernels' quotient differs in any
/// bit from __fdiv_rn(x, s). count: one device counter.
__global__ void division_check_kernel(float s, unsigned long long* count) {
  const float r = __fdiv_rn(1.0f, s);
  const bool pow2 = is_pow2_normal(s);
  const bool s_ok = range_ok_s(s);
  unsigned long long bad = 0;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < (std::uint64_t{1} << 32); i += stride) {
    const float x = __uint_as_float(static_cast<std::uint32_t>(i));
    const float want = __fdiv_rn(x, s);
    const float got =
        pow2 ? __fmul_rn(x, r) : (s_ok && range_ok_x(x) ? div_by_recip(x, s, r) : __fdiv_rn(x, s));
    bad += __float_as_uint(want) != __float_as_uint(got) ? 1u : 0u;
  }
  for (int m = 16; m >= 1; m >>= 1) bad += __shfl_xor_sync(0xFFFFFFFFu, bad, m);
  if ((threadIdx.x & 31u) == 0 && bad != 0) atomicAdd(count, bad);
}

}  // namespace
}  // namespace detail

std::int64_t count_division_mismatches(float s) {
  unsigned long long* d = nullptr;
  detail::check_cuda(cudaMalloc(&d, sizeof *d), "cudaMalloc(division check)");
  unsigned long long h = 0;
  cudaError_t err = cudaMemset(d, 0, sizeof *d);
  if (err == cudaSuccess) {
    detail::division_check_kernel<<<detail::sm_count() * 8, 256>>>(s, d);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
  cudaFree(d);
  detail::check_cuda(err, "division check kernel");
  return static_cast<std::int64_t>(h);
}

}  // namespace kvo::gpu
