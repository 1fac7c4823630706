#pragma once
// The user's CUDA kernels, as their own project declares them: device pointers, strides and a
// stream, no kvoracle type anywhere. The CUDA twins of my_kernels.hpp's CPU stand-ins; the test
// (test_my_cuda_kernels.cpp) adapts kvoracle's device calls to these signatures.

#include <cstdint>

namespace my {

/// vLLM's reshape_and_cache in CUDA: T tokens of K and V ([T, heads, head_dim] bf16, rows
/// contiguous) into paged caches of bf16 or fp8 e4m3 (satfinite) elements, each value divided by
/// its head's scale first. The caches are addressed through strides (elements), so one kernel
/// serves every layout: element (block b, offset o, head h, dim d) at b * block_stride + o *
/// token_stride + h * head_stride + d. slots[t] < 0 is padding: nothing written.
struct KvWriteCuda {
  const std::uint16_t* k;
  const std::uint16_t* v;
  const void* slots;  // [T] int32 or int64
  bool slots_i64;
  std::int64_t tokens, heads, head_dim, block_size, num_blocks;
  const float* k_scale;  // [1], or [heads] when per_head_scale
  const float* v_scale;
  bool per_head_scale;
  bool fp8;
  void* k_cache;
  void* v_cache;
  std::int64_t block_stride, token_stride, head_stride;
  void* stream;  // cudaStream_t
};
void write_kv_cache_cuda(const KvWriteCuda& args);
/// The same with a planted bug: a padding slot (-1) wraps to the cache's last slot, as torch
/// indexing does (the vllm#43810 class).
void write_kv_cache_cuda_planted_bug(const KvWriteCuda& args);

/// Sparse attention in float32 over bf16 paged caches (strided as above): each query row attends,
/// for each KV head, to the tokens (up to its own position) of the logical blocks selected for it,
/// with an online softmax; one CUDA block per (row, query head), a thread per dim. A row that sees
/// no token outputs +0.
struct SparseAttentionCuda {
  const std::uint16_t* q;  // [rows, q_heads, head_dim] bf16
  const std::uint16_t* k_cache;
  const std::uint16_t* v_cache;
  std::int64_t block_stride, token_stride, head_stride;
  const std::int32_t* block_table;  // [requests, max_blocks]
  std::int64_t max_blocks;
  const std::int64_t* seq_lens;      // [requests]; 0: a padded request (its rows output +0)
  const std::int64_t* row_request;   // [rows]
  const std::int64_t* row_position;  // [rows]
  std::int64_t rows;
  const std::int32_t* selected;  // [rows, kv_heads, topk] logical blocks, -1 unused; null: all
  std::int64_t topk, sparse_block;
  std::int64_t q_heads, kv_heads, head_dim, block_size;
  float sm_scale;
  void* out;  // [rows, q_heads, head_dim] f32, or bf16 when out_bf16
  bool out_bf16;
  void* stream;
};
void sparse_attention_cuda(const SparseAttentionCuda& args);
/// The same with a planted bug: the causal mask off by one (a row does not see its own token).
void sparse_attention_cuda_planted_bug(const SparseAttentionCuda& args);

}  // namespace my
