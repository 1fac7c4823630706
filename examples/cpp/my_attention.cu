// The user's sparse attention in CUDA (my_cuda_kernels.hpp): one block per (row, query head), a
// thread per dim; per token a block-wide dot product, then an online softmax update.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "my_cuda_kernels.hpp"

namespace my {
namespace {

constexpr int kThreads = 256;  // head_dim <= 256

__device__ float bf16(std::uint16_t b) { return __bfloat162float(__ushort_as_bfloat16(b)); }

template <bool kHideOwnToken>
__global__ void attention_kernel(SparseAttentionCuda a) {
  __shared__ float partial[kThreads];
  const std::int64_t row = blockIdx.x / a.q_heads, qh = blockIdx.x % a.q_heads;
  const std::int64_t g = qh / (a.q_heads / a.kv_heads);
  const int d = static_cast<int>(threadIdx.x);
  const bool lane = d < a.head_dim;
  const float q = lane ? bf16(a.q[(row * a.q_heads + qh) * a.head_dim + d]) : 0.0f;
  const std::int64_t p = a.row_position[row];
  const std::int32_t* table = a.block_table + a.row_request[row] * a.max_blocks;
  const std::int64_t n_valid = p / a.sparse_block + 1;
  const bool padded = a.seq_lens[a.row_request[row]] == 0;
  const std::int64_t chunks = padded ? 0 : a.selected != nullptr ? a.topk : n_valid;
  float m = -INFINITY, l = 0.0f, o = 0.0f;
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t j =
        a.selected != nullptr ? a.selected[(row * a.kv_heads + g) * a.topk + c] : c;
    if (j < 0 || j >= n_valid) continue;
    for (std::int64_t t = j * a.sparse_block; t < (j + 1) * a.sparse_block; ++t) {
      if (kHideOwnToken ? t >= p : t > p) break;  // the planted bug hides t == p
      const std::int64_t at = table[t / a.block_size] * a.block_stride +
                              t % a.block_size * a.token_stride + g * a.head_stride + d;
      partial[d] = lane ? q * bf16(a.k_cache[at]) : 0.0f;
      __syncthreads();
      for (int s = kThreads / 2; s > 0; s /= 2) {
        if (d < s) partial[d] += partial[d + s];
        __syncthreads();
      }
      const float score = partial[0] * a.sm_scale;
      __syncthreads();
      const float m_new = fmaxf(m, score);
      const float rescale = expf(m - m_new), w = expf(score - m_new);
      l = l * rescale + w;
      o = o * rescale + (lane ? w * bf16(a.v_cache[at]) : 0.0f);
      m = m_new;
    }
  }
  if (!lane) return;
  const float y = l > 0.0f ? o / l : 0.0f;  // no token seen: +0
  const std::int64_t out = (row * a.q_heads + qh) * a.head_dim + d;
  if (a.out_bf16) {
    static_cast<__nv_bfloat16*>(a.out)[out] = __float2bfloat16_rn(y);
  } else {
    static_cast<float*>(a.out)[out] = y;
  }
}

template <bool kHideOwnToken>
void launch(const SparseAttentionCuda& a) {
  if (a.rows == 0) return;
  attention_kernel<kHideOwnToken><<<static_cast<unsigned>(a.rows * a.q_heads), kThreads, 0,
                                    static_cast<cudaStream_t>(a.stream)>>>(a);
}

}  // namespace

void sparse_attention_cuda(const SparseAttentionCuda& args) { launch<false>(args); }
void sparse_attention_cuda_planted_bug(const SparseAttentionCuda& args) { launch<true>(args); }

}  // namespace my
