// The flash family's decode kernels (flash_decode.cuh): which calls take them, and their eight
// instantiations (cache dtype x head_dim).
#include "flash_decode.cuh"

#include <algorithm>

namespace kvo::gpu::detail {

bool flash_decode_applies(const spec::ModelConfig& c, const spec::AttentionParams& p) {
  const std::int64_t hd = c.geometry.head_dim, nkv = c.geometry.num_kv_heads;
  if (nkv < 1 || p.num_q_heads % nkv != 0) return false;
  const std::int64_t group = p.num_q_heads / nkv;
  return (hd == 64 || hd == 128) && group >= 1 && group <= kFlashDecodeHeads &&
         p.sparse_block >= 1 && p.sparse_block <= kFlashDecodeTokens &&
         c.kv.cache_dtype != spec::DType::kF32 && kv_rows_aligned16(c);
}

namespace {

/// Slots a CUDA block runs (1 .. kFlashDecodeMaxPerBlock): the forced count where given, else the
/// least modelled time, waves x (slots a block + 1), where waves = ceil(blocks / the blocks the
/// device holds at once) and the + 1 is a block's start (its first slot's rows, which nothing
/// overlaps). Fitted on the H200 at batch 16, 64 and 128 of the benchmark (bench_read_gpu, 16
/// slots): 4, 6 and 8 slots a block, within 3% of the best measured.
int slots_per_block(std::int64_t rows, std::int64_t nkv, std::int64_t slots, int forced) {
  if (forced > 0) return std::min(forced, kFlashDecodeMaxPerBlock);
  const std::int64_t resident = static_cast<std::int64_t>(sm_count()) * kFlashDecodeBlocksPerSm;
  int best = 1;
  double best_cost = 0.0;
  for (int per = 1; per <= kFlashDecodeMaxPerBlock; ++per) {
    const std::int64_t per_pair = (slots + per - 1) / per;        // blocks a (row, KV head)
    const std::int64_t runs = (slots + per_pair - 1) / per_pair;  // slots the longest block runs
    const std::int64_t waves = (rows * nkv * per_pair + resident - 1) / resident;
    const double cost = static_cast<double>(waves) * static_cast<double>(runs + 1);
    if (per == 1 || cost < best_cost) best = static_cast<int>(runs), best_cost = cost;
  }
  return best;
}

template <int KvDt, int HD>
void run(const AttnArgs& a, std::int64_t rows, cudaStream_t s) {
  const std::size_t smem = FlashDecodeSmem(HD, kElemBytes<KvDt>).total;
  const auto kernel = flash_decode_kernel<KvDt, HD>;
  allow_smem(kernel, smem);
  // The whole of the multiprocessor's shared memory for three blocks' rows.
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared),
             "cudaFuncSetAttribute(carveout)");
  const int per = slots_per_block(rows, a.g.nkv, a.slots, a.per_block);
  kernel<<<dim3(static_cast<unsigned>((a.slots + per - 1) / per), static_cast<unsigned>(a.g.nkv),
                static_cast<unsigned>(rows)),
           kFlashDecodeThreads, smem, s>>>(a, per);
  check_cuda(cudaGetLastError(), "flash_decode_kernel launch");
  flash_decode_combine_kernel<HD>
      <<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(a.nq)), HD, 0, s>>>(a);
  check_cuda(cudaGetLastError(), "flash_decode_combine_kernel launch");
}

template <int KvDt>
void by_head_dim(const AttnArgs& a, std::int64_t rows, cudaStream_t s) {
  if (a.g.head_dim == 64) return run<KvDt, 64>(a, rows, s);
  run<KvDt, 128>(a, rows, s);
}

}  // namespace

void run_flash_decode(const AttnArgs& a, std::int64_t rows, cudaStream_t stream) {
  switch (a.g.kv_dtype) {
    case kDtBf16:
      return by_head_dim<kDtBf16>(a, rows, stream);
    case kDtF16:
      return by_head_dim<kDtF16>(a, rows, stream);
    case kDtE4m3:
      return by_head_dim<kDtE4m3>(a, rows, stream);
    default:
      return by_head_dim<kDtE5m2>(a, rows, stream);
  }
}

}  // namespace kvo::gpu::detail
