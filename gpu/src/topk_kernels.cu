// The indexer's block top-k selection (topk.cuh), instantiated for the indexer's batch rows.
#include "topk.cuh"

namespace kvo::gpu::detail {

void launch_batch_topk(const TopkArgs& a, long long rows, const BatchNValid& nv, bool canonical,
                       cudaStream_t s) {
  launch_topk(a, rows, nv, canonical, s);
}

}  // namespace kvo::gpu::detail
