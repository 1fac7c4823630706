// The specialised attention chunk kernel (attention_decode.cuh): which calls take it, and its 80
// instantiations (family x cache dtype x head_dim x query heads per KV head).
#include "attention_decode.cuh"

#include <algorithm>

#include "call_inputs.hpp"

namespace kvo::gpu::detail {

bool attention_decode_applies(const spec::ModelConfig& c, const spec::AttentionParams& p) {
  const std::int64_t hd = c.geometry.head_dim, nkv = c.geometry.num_kv_heads;
  if (nkv < 1 || p.num_q_heads % nkv != 0) return false;
  const std::int64_t group = p.num_q_heads / nkv;
  return (hd == 64 || hd == 128) &&
         (group == 1 || group == 2 || group == 4 || group == 8 || group == 16) &&
         p.sparse_block >= 1 && p.sparse_block <= kDecodeMaxSbp &&
         c.kv.cache_dtype != spec::DType::kF32 && kv_rows_aligned16(c);
}

bool kv_rows_aligned16(const spec::ModelConfig& c) {
  const std::int64_t eb = spec::dtype_bytes(c.kv.cache_dtype);
  const KvStrides st = kv_strides(c);
  return (st.block * eb) % 16 == 0 && (st.token * eb) % 16 == 0 && (st.head * eb) % 16 == 0 &&
         (st.kv_part * eb) % 16 == 0 && (st.offset * eb) % 16 == 0;
}

namespace {

template <bool kCanonical, int KvDt, int HD, int G>
void run_decode(const AttnArgs& a, std::int64_t rows, cudaStream_t s) {
  const std::size_t smem = DecodeAttnSmem(G, HD, kElemBytes<KvDt>, static_cast<int>(a.sb)).total;
  const auto kernel = attention_decode_chunk_kernel<kCanonical, KvDt, HD, G>;
  allow_smem(kernel, smem);
  // The whole of the multiprocessor's shared memory for kDecodeAttnBlocksPerSm blocks' rows.
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared),
             "cudaFuncSetAttribute(carveout)");
  // Runs of the flattened (row, KV head, slot) order (decode_run_length). Blocks of one (row,
  // KV head) (session 32) left waves part-empty: four slots a block at batch 64 were 1,024 blocks
  // for 396 places (2.6 waves).
  AttnArgs run = a;
  const long long total = static_cast<long long>(rows) * a.g.nkv * a.slots;
  run.per_block =
      decode_run_length(total, sm_count(), kDecodeAttnBlocksPerSm, kDecodeMaxPerBlock, a.per_block);
  const long long blocks = (total + run.per_block - 1) / run.per_block;
  require(blocks <= 0x7FFFFFFF, "attention: more than 2^31 - 1 CUDA blocks of chunk slots");
  kernel<<<static_cast<unsigned>(blocks), kDecodeAttnThreads, smem, s>>>(run, total);
  check_cuda(cudaGetLastError(), "attention_decode_chunk_kernel launch");
  launch_attention_combine<kCanonical>(a, rows, s);
}

template <bool kCanonical, int KvDt, int HD>
void by_group(const AttnArgs& a, std::int64_t rows, cudaStream_t s) {
  switch (a.group) {
    case 1:
      return run_decode<kCanonical, KvDt, HD, 1>(a, rows, s);
    case 2:
      return run_decode<kCanonical, KvDt, HD, 2>(a, rows, s);
    case 4:
      return run_decode<kCanonical, KvDt, HD, 4>(a, rows, s);
    case 8:
      return run_decode<kCanonical, KvDt, HD, 8>(a, rows, s);
    default:
      return run_decode<kCanonical, KvDt, HD, 16>(a, rows, s);
  }
}

template <bool kCanonical, int KvDt>
void by_head_dim(const AttnArgs& a, std::int64_t rows, cudaStream_t s) {
  if (a.g.head_dim == 64) return by_group<kCanonical, KvDt, 64>(a, rows, s);
  by_group<kCanonical, KvDt, 128>(a, rows, s);
}

template <bool kCanonical>
void by_dtype(const AttnArgs& a, std::int64_t rows, cudaStream_t s) {
  switch (a.g.kv_dtype) {
    case kDtBf16:
      return by_head_dim<kCanonical, kDtBf16>(a, rows, s);
    case kDtF16:
      return by_head_dim<kCanonical, kDtF16>(a, rows, s);
    case kDtE4m3:
      return by_head_dim<kCanonical, kDtE4m3>(a, rows, s);
    default:
      return by_head_dim<kCanonical, kDtE5m2>(a, rows, s);
  }
}

}  // namespace

void run_attention_decode(const AttnArgs& a, std::int64_t rows, bool canonical,
                          cudaStream_t stream) {
  if (canonical) return by_dtype<true>(a, rows, stream);
  by_dtype<false>(a, rows, stream);
}

}  // namespace kvo::gpu::detail
