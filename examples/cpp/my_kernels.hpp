#pragma once
// The user's kernels, as their own project declares them: raw pointers and sizes, no kvoracle type
// anywhere. CPU stand-ins for CUDA kernels (a loop where a kernel has a thread per element); the
// test (test_my_kernels.cpp) adapts kvoracle's cases to these signatures and judges them.

#include <cstdint>

namespace my {

std::uint16_t float_to_bf16(float x);  // round to nearest even; NaN -> 0x7FFF
float bf16_to_float(std::uint16_t b);

/// vLLM's reshape_and_cache in miniature: T tokens of K and V ([T, heads, head_dim] bf16) into NHD
/// caches ([slots, heads, head_dim]) of bf16 or fp8 e4m3 (satfinite) elements, each value divided
/// by its head's scale first. slots[t] < 0 is padding: nothing written.
struct KvWrite {
  const std::uint16_t* k;
  const std::uint16_t* v;
  const std::int64_t* slots;
  std::int64_t tokens, heads, head_dim;
  const float* k_scale;  // [1], or [heads] when per_head_scale
  const float* v_scale;
  bool per_head_scale;
  bool fp8;  // e4m3 elements (1 byte), else bf16 (2 bytes)
  void* k_cache;
  void* v_cache;
};
void write_kv_cache(const KvWrite& args);
/// The same with a planted bug: bf16 elements rounded toward zero (the high half of the float).
void write_kv_cache_planted_bug(const KvWrite& args);

/// Sparse attention in float32 over bf16 NHD paged caches: each query row attends, for each KV
/// head, to the tokens (up to its own position) of the logical blocks selected for it; a naive
/// softmax in its own order (foreign: judged against the float64 truth with a bound).
struct SparseAttention {
  const std::uint16_t* q;  // [rows, q_heads, head_dim] bf16
  const std::uint16_t* k_cache;
  const std::uint16_t* v_cache;  // [blocks * block_size, kv_heads, head_dim] bf16
  const std::int32_t* block_table;
  std::int64_t max_blocks;  // [requests, max_blocks] physical blocks
  const std::int64_t* seq_lens;
  const std::int64_t* query_start_loc;  // [requests + 1]
  std::int64_t requests;
  const std::int32_t* selected;  // [rows, kv_heads, topk] logical blocks, -1 unused; null: all
  std::int64_t topk, sparse_block;
  std::int64_t q_heads, kv_heads, head_dim, block_size;
  float sm_scale;
  float* out;  // [rows, q_heads, head_dim]
};
void sparse_attention(const SparseAttention& args);
/// The same with a planted bug: the causal mask off by one (a row does not see its own token).
void sparse_attention_planted_bug(const SparseAttention& args);

}  // namespace my
