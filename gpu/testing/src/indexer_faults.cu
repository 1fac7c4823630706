// kvo_gpu_testing: the host-memory indexer with a bug planted in the fast score kernel or in the
// selection (launch_indexer_topk_t<F> of indexer_kernels.cuh: score bugs instantiated here for the
// fast family only; a selection bug reuses kvo_gpu's score kernels).
#include "indexer_kernels.cuh"
#include "kvo/gpu/testing/faults.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::gpu::testing {

std::vector<std::int32_t> indexer_topk_host_faulty(ReadFault fault, const spec::ModelConfig& config,
                                                   const spec::IndexerParams& params,
                                                   const spec::ReadBatch& batch,
                                                   const spec::HostTensor& index_q,
                                                   const spec::LayerCaches& caches,
                                                   ReadKernel kernel, BlockScores* scores) {
  if (kernel != ReadKernel::kFast && fault != ReadFault::kTiesToHigherId)
    throw spec::Unsupported("planted score and id bugs live in the fast family only");
  const detail::IndexerLaunch launch =
      fault == ReadFault::kIgnoreLocal
          ? detail::launch_indexer_topk_t<detail::ReadBug::kIgnoreLocal>
      : fault == ReadFault::kIdsWrapAt1024
          ? detail::launch_indexer_topk_t<detail::ReadBug::kIdsWrapAt1024>
      : fault == ReadFault::kTiesToHigherId
          ? detail::launch_indexer_topk_t<detail::ReadBug::kTiesToHigherId>
          : launch_indexer_topk;  // attention's bugs: the indexer as in production
  return detail::indexer_topk_host_via(launch, config, params, batch, index_q, caches, kernel, {},
                                       IndexerPath::kTwoLaunch, scores);
}

}  // namespace kvo::gpu::testing
