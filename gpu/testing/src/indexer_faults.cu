// kvo_gpu_testing: the host-memory indexer with a bug planted in the fast score kernel
// (launch_indexer_topk_t<F> of indexer_kernels.cuh, instantiated here for the fast family only).
#include "indexer_kernels.cuh"
#include "kvo/gpu/testing/faults.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::gpu::testing {

std::vector<std::int32_t> indexer_topk_host_faulty(ReadFault fault, const spec::ModelConfig& config,
                                                   const spec::IndexerParams& params,
                                                   const spec::ReadBatch& batch,
                                                   const spec::HostTensor& index_q,
                                                   const spec::LayerCaches& caches,
                                                   ReadKernel kernel) {
  if (kernel != ReadKernel::kFast)
    throw spec::Unsupported("planted read bugs live in the fast family only");
  const detail::IndexerLaunch launch =
      fault == ReadFault::kIgnoreLocal
          ? detail::launch_indexer_topk_t<detail::ReadBug::kIgnoreLocal>
      : fault == ReadFault::kIdsWrapAt1024
          ? detail::launch_indexer_topk_t<detail::ReadBug::kIdsWrapAt1024>
          : launch_indexer_topk;  // attention's bugs: the indexer as in production
  return detail::indexer_topk_host_via(launch, config, params, batch, index_q, caches, kernel);
}

}  // namespace kvo::gpu::testing
