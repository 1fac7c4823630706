// Exhaustive check of the kernels' division (convert.cuh divide8's per-element rule) against
// __fdiv_rn: for one scale s, every one of the 2^32 float32 bit patterns x.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "kvo/gpu/write.hpp"
#include "launch.cuh"
#include "write_decode.cuh"

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

/// count_block_scale_mismatches's kernel: amax = every non-negative bit pattern, grid-stride.
__global__ void block_scale_check_kernel(bool ue8m0, unsigned long long* count) {
  const float kEdges[10] = {0.0f,
                            -0.0f,
                            __int_as_float(0x7F800000),  // +inf
                            __int_as_float(0xFF800000),  // -inf
                            __int_as_float(0x7FC00000),  // NaN
                            1.0f,
                            __int_as_float(0x7F7FFFFF),  // the largest float
                            __int_as_float(0x00000001),  // the smallest subnormal
                            -3.0f,
                            448.0f};
  unsigned long long bad = 0;
  const std::uint32_t stride = gridDim.x * blockDim.x;
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < 0x80000000u; i += stride) {
    const float amax = __uint_as_float(i);
    float want = __fdiv_rn(fmaxf(amax, spec::kBlockScaleAmaxFloor), spec::kFp8E4M3Max);
    if (ue8m0) want = ue8m0_ceil(want);
    const float got = blockscale_scale(amax, false, ue8m0);
    bad += __float_as_uint(want) != __float_as_uint(got) ? 1u : 0u;
    // The mul_recip formula: fl(amax * fl(1 / 448)), the reciprocal by __fdiv_rn here.
    float want_mul =
        __fmul_rn(fmaxf(amax, spec::kBlockScaleAmaxFloor), __fdiv_rn(1.0f, spec::kFp8E4M3Max));
    if (ue8m0) want_mul = ue8m0_ceil(want_mul);
    bad +=
        __float_as_uint(want_mul) != __float_as_uint(blockscale_scale(amax, true, ue8m0)) ? 1u : 0u;
    if (ue8m0) {
      float x[kVec], y[kVec];
      for (int j = 0; j < 12; j += kVec) {
        for (int k = 0; k < kVec; ++k) {
          const int n = j + k;
          x[k] = n == 0 ? amax : (n == 1 ? -amax : kEdges[(n - 2) % 10]);
        }
        divide8_by_block_scale(x, y, got, true);
        for (int k = 0; k < kVec; ++k)
          bad += __float_as_uint(y[k]) != __float_as_uint(__fdiv_rn(x[k], got)) ? 1u : 0u;
      }
    }
  }
  for (int m = 16; m >= 1; m >>= 1) bad += __shfl_xor_sync(0xFFFFFFFFu, bad, m);
  if ((threadIdx.x & 31u) == 0 && bad != 0) atomicAdd(count, bad);
}

/// count_bf16_range_mismatches's kernel: every 32-bit word u (two bf16 values), in each of an
/// item's four word positions (the other three 1.0): bf16_words_in_range against range_ok_x of
/// both widened values, and the pair's range test against their biased exponents.
__global__ void bf16_range_check_kernel(unsigned long long* count) {
  constexpr std::uint32_t kOnes = 0x3F803F80u;  // two bf16 1.0: in range
  unsigned long long bad = 0;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < (std::uint64_t{1} << 32); i += stride) {
    const auto u = static_cast<std::uint32_t>(i);
    const float lo = __uint_as_float(u << 16), hi = __uint_as_float(u & 0xFFFF0000u);
    const bool want = range_ok_x(lo) && range_ok_x(hi);
    const auto in_pair_range = [](float f) {
      const std::uint32_t e = (__float_as_uint(f) >> 23) & 0xFFu;
      return e >= kPairExponentLo && e <= kPairExponentHi;
    };
    const bool want_pair = in_pair_range(lo) && in_pair_range(hi);
    for (int at = 0; at < 4; ++at) {
      const uint4 w = make_uint4(at == 0 ? u : kOnes, at == 1 ? u : kOnes, at == 2 ? u : kOnes,
                                 at == 3 ? u : kOnes);
      bad += bf16_words_in_range(w) != want ? 1u : 0u;
      bad += bf16_words_in_exponents<kPairExponentLo, kPairExponentHi>(w) != want_pair ? 1u : 0u;
    }
  }
  for (int m = 16; m >= 1; m >>= 1) bad += __shfl_xor_sync(0xFFFFFFFFu, bad, m);
  if ((threadIdx.x & 31u) == 0 && bad != 0) atomicAdd(count, bad);
}

/// count_recip_pair_mismatches's kernel, one warp a block: lane l holds scale (b + l % 4) mod n
/// (four groups of eight lanes, interleaved), and on odd blocks only lanes 0-19 take part (a
/// partial warp, as the last K/V warp of a layer). Each taking lane runs the specialised write's
/// check (warp_recip_pair_exact), records its answer (passed: [n]), and then divides its share of
/// every bf16 x (the 2^16 patterns, 8 consecutive an item) by its scale with divide8_bf16 and that
/// answer, against __fdiv_rn.
__global__ void recip_pair_check_kernel(const float* scales, int n, int* passed,
                                        unsigned long long* count) {
  const std::uint32_t lane = threadIdx.x & 31u;
  const std::uint32_t lanes = (blockIdx.x & 1u) != 0 ? 0x000FFFFFu : 0xFFFFFFFFu;
  if (((lanes >> lane) & 1u) == 0u) return;
  const int mine = static_cast<int>((blockIdx.x + lane % 4u) % static_cast<std::uint32_t>(n));
  const float s = scales[mine];
  const float r = __fdiv_rn(1.0f, s);
  const bool pair_ok = warp_recip_pair_exact(s, r, lanes);
  if (lane < 4u) passed[mine] = pair_ok ? 1 : 0;
  unsigned long long bad = 0;
  for (std::uint32_t item = lane / 4u; item < 0x10000u / kVec; item += 8u) {
    const std::uint32_t x0 = item * kVec;  // bf16 patterns x0 .. x0 + 7
    const uint4 raw = make_uint4(x0 | (x0 + 1) << 16, (x0 + 2) | (x0 + 3) << 16,
                                 (x0 + 4) | (x0 + 5) << 16, (x0 + 6) | (x0 + 7) << 16);
    float x[kVec], y[kVec];
    for (int i = 0; i < kVec; ++i) x[i] = __uint_as_float((x0 + i) << 16);
    divide8_bf16(raw, x, y, s, r, pair_ok);
    for (int i = 0; i < kVec; ++i)
      bad += __float_as_uint(y[i]) != __float_as_uint(__fdiv_rn(x[i], s)) ? 1u : 0u;
  }
  if (bad != 0) atomicAdd(count, bad);
}

}  // namespace

/// Runs one of the check kernels above, `kernel(args..., counter)` on 8 blocks of 256 threads a
/// multiprocessor, and returns its count; `what` names it in errors.
template <class... Args, class... Params>
std::int64_t count_on_device(const char* what, void (*kernel)(Params...), Args... args) {
  unsigned long long* d = nullptr;
  check_cuda(cudaMalloc(&d, sizeof *d), what);
  unsigned long long h = 0;
  cudaError_t err = cudaMemset(d, 0, sizeof *d);
  if (err == cudaSuccess) {
    kernel<<<sm_count() * 8, 256>>>(args..., d);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
  cudaFree(d);
  check_cuda(err, what);
  return static_cast<std::int64_t>(h);
}

}  // namespace detail

std::int64_t count_division_mismatches(float s) {
  return detail::count_on_device("division check kernel", detail::division_check_kernel, s);
}

std::int64_t count_block_scale_mismatches(bool ue8m0) {
  return detail::count_on_device("block scale check kernel", detail::block_scale_check_kernel,
                                 ue8m0);
}

std::int64_t count_bf16_range_mismatches() {
  return detail::count_on_device("bf16 range check kernel", detail::bf16_range_check_kernel);
}

std::int64_t count_recip_pair_mismatches(const std::vector<float>& scales,
                                         std::vector<bool>* passed) {
  const char* what = "recip pair check kernel";
  if (scales.empty() || scales.size() > 4096)
    throw spec::InvalidInput("scales", -1, std::to_string(scales.size()) + " scales",
                             "the recip pair check takes 1 to 4096 scales");
  const std::size_t n = scales.size();
  void* d = nullptr;
  const std::size_t bytes = sizeof(unsigned long long) + n * (sizeof(float) + sizeof(int));
  detail::check_cuda(cudaMalloc(&d, bytes), what);
  auto* count = static_cast<unsigned long long*>(d);
  auto* dscales = reinterpret_cast<float*>(count + 1);
  auto* dpassed = reinterpret_cast<int*>(dscales + n);
  unsigned long long h = 0;
  std::vector<int> hpassed(n, 0);
  cudaError_t err = cudaMemset(d, 0, bytes);
  if (err == cudaSuccess)
    err = cudaMemcpy(dscales, scales.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  if (err == cudaSuccess) {
    // Two blocks a scale at least (one whole warp, one partial), so every scale is answered.
    const unsigned blocks = static_cast<unsigned>(2 * n + 2);
    detail::recip_pair_check_kernel<<<blocks, 32>>>(dscales, static_cast<int>(n), dpassed, count);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpy(&h, count, sizeof h, cudaMemcpyDeviceToHost);
  if (err == cudaSuccess)
    err = cudaMemcpy(hpassed.data(), dpassed, n * sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  detail::check_cuda(err, what);
  if (passed != nullptr) {
    passed->assign(n, false);
    for (std::size_t i = 0; i < n; ++i) (*passed)[i] = hpassed[i] != 0;
  }
  return static_cast<std::int64_t>(h);
}

}  // namespace kvo::gpu
