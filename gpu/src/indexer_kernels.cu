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

namespace {

/// The fused launch's time by its span, in score passes of one CUDA block (kFusedThreads / split
/// tokens) on the busiest multiprocessor: its CUDA blocks run kFusedMinBlocks at a time, and a
/// multiprocessor with r running gets through kSmRate[r] of what it did with three (the score
/// pass is bound by issue and latency: one CUDA block leaves it idle), plus kCtaOverhead passes a
/// CUDA block (q, the shared maxima, the score rows, the counter). Fitted to the span x lanes sweep
/// of session 31 (gpu/results/2026-12-04-session-31.md); bench_read_gpu's x_best_shape checks it
/// against every forced shape in the same run (within 2% of the best at every benchmarked size,
/// session 31).
constexpr double kSmRate[] = {0.0, 0.70, 0.93};  // r <= kFusedMinBlocks
constexpr double kCtaOverhead = 0.5;
double fused_span_cost(std::int64_t rows, std::int64_t max_nv, std::int64_t sb, std::int64_t span,
                       std::int64_t pass_tokens, int sms) {
  constexpr int resident = kFusedMinBlocks;
  const std::int64_t ctas = rows * ((max_nv + span - 1) / span);
  const std::int64_t per_sm = (ctas + sms - 1) / sms;
  const auto passes = static_cast<double>((span * sb + pass_tokens - 1) / pass_tokens);
  const std::int64_t full = per_sm / resident, rest = per_sm % resident;
  const double waves = static_cast<double>(full * resident) / kSmRate[resident] +
                       (rest > 0 ? static_cast<double>(rest) / kSmRate[rest] : 0.0);
  return passes * waves + static_cast<double>(per_sm) * kCtaOverhead;
}

}  // namespace

FusedPlan fused_indexer_plan(const spec::ModelConfig& c, const spec::IndexerParams& p,
                             ReadKernel kernel, std::int64_t rows, std::int64_t max_nv,
                             long long start, int sms, FusedShape forced) {
  const std::int64_t idim = c.geometry.index_dim;
  if (idim < 64 || idim > kMaxHeadDim || idim % 8 != 0) return {};
  const bool block_scale = c.index.layout == spec::IndexLayout::kBlockScale;
  const int eb = block_scale ? 1 : dtype_size(static_cast<int>(c.index.flat_dtype));
  const spec::IndexStrides view = spec::index_view(c);
  const long long unit =
      std::min({copy_unit(idim * eb), copy_unit(view.block * spec::index_stride_bytes(c)),
                copy_unit(view.token * spec::index_stride_bytes(c)), copy_unit(start)});
  // Lanes a token: two unless forced (measured on the H200 in session 31 with each one's best span:
  // two as fast or faster at every benchmarked size, 1k-128k tokens at batch 1 and 16).
  const int split = forced.split == 1 || forced.split == 2 ? forced.split : kFusedSplit;
  const std::int64_t pass_tokens = kFusedThreads / split;
  const std::int64_t span_min = (pass_tokens + p.sparse_block - 1) / p.sparse_block;
  const std::int64_t span_max = std::min<std::int64_t>(kMaxFusedSpan, max_nv);
  std::int64_t span = std::clamp<std::int64_t>(span_min, 1, span_max);
  if (forced.span > 0) {
    span = std::clamp<std::int64_t>(forced.span, 1, span_max);
  } else {
    double best = fused_span_cost(rows, max_nv, p.sparse_block, span, pass_tokens, sms);
    for (std::int64_t s = span + 1; s <= span_max; ++s) {
      const double cost = fused_span_cost(rows, max_nv, p.sparse_block, s, pass_tokens, sms);
      if (cost < best) best = cost, span = s;
    }
  }
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
