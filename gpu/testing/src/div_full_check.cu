// kvo_gpu_testing: div.full.f32 (convert.cuh div_full, the div_approx scaling) against __fdiv_rn
// for all 2^32 float32 x at one divisor, classified by SPEC 2's admissible window.
#include <cuda_runtime.h>

#include "kvo/gpu/testing/division.hpp"
#include "launch.cuh"

namespace kvo::gpu::testing {
namespace {

constexpr int kMaxExamples = 8;

/// Position of a float on the float32 line, +-0 both at 0: consecutive floats of one sign are one
/// apart (infinity one past the largest finite).
__device__ __forceinline__ long long line_position(float f) {
  const std::uint32_t b = __float_as_uint(f);
  const long long m = static_cast<long long>(b & 0x7FFFFFFFu);
  return (b >> 31) != 0u ? -m : m;
}

/// counts: [4] device counters in DivFullCounts order, then the example count; examples:
/// [kMaxExamples][3] (x, q, got). Grid-stride over every bit pattern.
__global__ void div_full_check_kernel(float s, unsigned long long* counts,
                                      std::uint32_t* examples) {
  unsigned long long c[4] = {0, 0, 0, 0};
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < (std::uint64_t{1} << 32); i += stride) {
    const float x = __uint_as_float(static_cast<std::uint32_t>(i));
    const float q = __fdiv_rn(x, s);
    const float got = detail::div_full(x, s);
    if (__float_as_uint(got) == __float_as_uint(q)) continue;
    ++c[0];
    if (isnan(q)) {
      if (__float_as_uint(got) != 0x7FFFFFFFu) ++c[3];
      continue;
    }
    const long long d = line_position(got) - line_position(q);
    const bool inside = !isnan(got) && signbit(got) == signbit(q) && d >= -2 && d <= 2;
    const bool edge = q == 0.0f || isinf(q) || got == 0.0f;
    if (inside && !edge) continue;
    ++c[inside ? 2 : 1];
    const auto k = static_cast<int>(atomicAdd(counts + 4, 1ull));
    if (k < kMaxExamples) {
      examples[3 * k] = static_cast<std::uint32_t>(i);
      examples[3 * k + 1] = __float_as_uint(q);
      examples[3 * k + 2] = __float_as_uint(got);
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    for (int m = 16; m >= 1; m >>= 1) c[k] += __shfl_xor_sync(0xFFFFFFFFu, c[k], m);
    if ((threadIdx.x & 31u) == 0 && c[k] != 0) atomicAdd(counts + k, c[k]);
  }
}

}  // namespace

DivFullCounts count_div_full(float s) {
  void* d = nullptr;
  constexpr std::size_t kCountBytes = 5 * sizeof(unsigned long long);
  constexpr std::size_t kBytes = kCountBytes + 3 * kMaxExamples * sizeof(std::uint32_t);
  detail::check_cuda(cudaMalloc(&d, kBytes), "cudaMalloc(div.full check)");
  unsigned long long h[5] = {0, 0, 0, 0, 0};
  std::uint32_t ex[3 * kMaxExamples] = {};
  auto* counts = static_cast<unsigned long long*>(d);
  auto* examples = reinterpret_cast<std::uint32_t*>(static_cast<char*>(d) + kCountBytes);
  cudaError_t err = cudaMemset(d, 0, kBytes);
  if (err == cudaSuccess) {
    div_full_check_kernel<<<detail::sm_count() * 8, 256>>>(s, counts, examples);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpy(h, counts, sizeof h, cudaMemcpyDeviceToHost);
  if (err == cudaSuccess) err = cudaMemcpy(ex, examples, sizeof ex, cudaMemcpyDeviceToHost);
  cudaFree(d);
  detail::check_cuda(err, "div.full check kernel");
  DivFullCounts out;
  out.differing = static_cast<std::int64_t>(h[0]);
  out.outside_window = static_cast<std::int64_t>(h[1]);
  out.zero_or_infinity_moved = static_cast<std::int64_t>(h[2]);
  out.nan_not_canonical = static_cast<std::int64_t>(h[3]);
  for (unsigned long long k = 0; k < h[4] && k < kMaxExamples; ++k)
    out.examples.push_back({ex[3 * k], ex[3 * k + 1], ex[3 * k + 2]});
  return out;
}

}  // namespace kvo::gpu::testing
