// The production indexer launcher: indexer_kernels.cuh without a planted bug.
#include "indexer_kernels.cuh"

namespace kvo::gpu {
namespace detail {

template void dispatch_indexer<true, ReadBug::kNone>(const IndexArgs&, std::int64_t, std::size_t,
                                                     cudaStream_t);
template void dispatch_indexer<false, ReadBug::kNone>(const IndexArgs&, std::int64_t, std::size_t,
                                                      cudaStream_t);
template void dispatch_fused_indexer<true, ReadBug::kNone>(const IndexArgs&, std::int64_t,
                                                           std::size_t, cudaStream_t);
template void dispatch_fused_indexer<false, ReadBug::kNone>(const IndexArgs&, std::int64_t,
                                                            std::size_t, cudaStream_t);

FusedPlan fused_indexer_plan(const spec::ModelConfig& c, const spec::IndexerParams& p,
                             ReadKernel kernel, std::int64_t rows, std::int64_t max_nv,
                             long long start, int sms, int forced_split) {
  const std::int64_t idim = c.geometry.index_dim;
  if (idim < 64 || idim > kMaxHeadDim || idim % 8 != 0) return {};
  const bool block_scale = c.index.layout == spec::IndexLayout::kBlockScale;
  const int eb = block_scale ? 1 : dtype_size(static_cast<int>(c.index.flat_dtype));
  const spec::IndexStrides view = spec::index_view(c);
  const long long unit =
      std::min({copy_unit(idim * eb), copy_unit(view.block * spec::index_stride_bytes(c)),
                copy_unit(view.token * spec::index_stride_bytes(c)), copy_unit(start)});
  const std::int64_t total = rows * max_nv;
  sms = std::max(sms, 1);
  // Lanes a token: one (four heads' chains a thread) from kSplitOneTokens tokens over the batch,
  // two below, where the score pass is too short to fill the device with one (measured on the
  // H200, session 30: the better of the two at every benchmarked size but 64k tokens at batch 16,
  // within 0.4% there).
  const int split = forced_split == 1 || forced_split == 2      ? forced_split
                    : total * p.sparse_block >= kSplitOneTokens ? 1
                                                                : kFusedSplit;
  const std::int64_t pass_tokens = kFusedThreads / split;
  std::int64_t span = std::max<std::int64_t>((pass_tokens + p.sparse_block - 1) / p.sparse_block,
                                             (total + 4 * sms - 1) / (4 * sms));
  span = std::clamp<std::int64_t>(span, 1, std::min<std::int64_t>(kMaxFusedSpan, max_nv));
  const std::size_t smem =
      FusedSmem(static_cast<int>(p.num_index_heads), static_cast<int>(idim), static_cast<int>(span))
          .total;
  if (!fused_indexer_applies(spec::selection_lanes(p, c.geometry.num_kv_heads),
                             kernel == ReadKernel::kCanonical,
                             p.neg_inf == spec::IndexNegInf::kDrop, max_nv, p.topk, 8 * eb,
                             static_cast<int>(unit), smem)) {
    return {};
  }
  return {static_cast<int>(span), split, smem};
}

}  // namespace detail

void launch_indexer_topk(const spec::ModelConfig& config, const spec::IndexerParams& params,
                         const DeviceReadBatch& batch, const DeviceIndexer& ix, ReadKernel kernel,
                         void* stream) {
  detail::launch_indexer_topk_t<detail::ReadBug::kNone>(config, params, batch, ix, kernel, stream);
}

}  // namespace kvo::gpu
