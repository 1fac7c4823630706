// The user's KV-cache write in CUDA (my_cuda_kernels.hpp): one thread per (token, head, dim).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "my_cuda_kernels.hpp"

namespace my {
namespace {

template <bool kWrapPadding>
__global__ void write_kernel(KvWriteCuda a) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= a.tokens * a.heads * a.head_dim) return;
  const std::int64_t t = i / (a.heads * a.head_dim), h = i / a.head_dim % a.heads,
                     d = i % a.head_dim;
  std::int64_t slot = a.slots_i64 ? static_cast<const std::int64_t*>(a.slots)[t]
                                  : static_cast<const std::int32_t*>(a.slots)[t];
  if (kWrapPadding && slot < 0) slot += a.num_blocks * a.block_size;  // the planted bug
  if (slot < 0) return;                                               // padding
  const std::int64_t at = slot / a.block_size * a.block_stride +
                          slot % a.block_size * a.token_stride + h * a.head_stride + d;
  const std::int64_t s = a.per_head_scale ? h : 0;
  const float k = __bfloat162float(__ushort_as_bfloat16(a.k[i])) / a.k_scale[s];
  const float v = __bfloat162float(__ushort_as_bfloat16(a.v[i])) / a.v_scale[s];
  if (a.fp8) {
    static_cast<__nv_fp8_storage_t*>(a.k_cache)[at] =
        __nv_cvt_float_to_fp8(k, __NV_SATFINITE, __NV_E4M3);
    static_cast<__nv_fp8_storage_t*>(a.v_cache)[at] =
        __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  } else {
    static_cast<__nv_bfloat16*>(a.k_cache)[at] = __float2bfloat16_rn(k);
    static_cast<__nv_bfloat16*>(a.v_cache)[at] = __float2bfloat16_rn(v);
  }
}

template <bool kWrapPadding>
void launch(const KvWriteCuda& a) {
  const std::int64_t n = a.tokens * a.heads * a.head_dim;
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>((n + 255) / 256);
  write_kernel<kWrapPadding><<<blocks, 256, 0, static_cast<cudaStream_t>(a.stream)>>>(a);
}

}  // namespace

void write_kv_cache_cuda(const KvWriteCuda& args) { launch<false>(args); }
void write_kv_cache_cuda_planted_bug(const KvWriteCuda& args) { launch<true>(args); }

}  // namespace my
