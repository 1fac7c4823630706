// The production indexer launcher: indexer_kernels.cuh without a planted bug.
#include "indexer_kernels.cuh"

namespace kvo::gpu {
namespace detail {

template void dispatch_indexer<true, ReadBug::kNone>(const IndexArgs&, std::int64_t, std::size_t,
                                                     cudaStream_t);
template void dispatch_indexer<false, ReadBug::kNone>(const IndexArgs&, std::int64_t, std::size_t,
                                                      cudaStream_t);

}  // namespace detail

void launch_indexer_topk(const spec::ModelConfig& config, const spec::IndexerParams& params,
                         const DeviceReadBatch& batch, const DeviceIndexer& ix, ReadKernel kernel,
                         void* stream) {
  detail::launch_indexer_topk_t<detail::ReadBug::kNone>(config, params, batch, ix, kernel, stream);
}

}  // namespace kvo::gpu
