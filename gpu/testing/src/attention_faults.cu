// kvo_gpu_testing: host-memory attention with a bug planted in the fast family
// (launch_attention_t<F> of attention_kernels.cuh, instantiated here for the fast family only).
#include "attention_kernels.cuh"
#include "kvo/gpu/testing/faults.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::gpu::testing {

spec::HostTensor attention_host_faulty(
    ReadFault fault, const spec::ModelConfig& config, const spec::AttentionParams& params,
    const spec::ReadBatch& batch, const spec::HostTensor& q, const spec::LayerCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk, ReadKernel kernel) {
  if (kernel != ReadKernel::kFast)
    throw spec::Unsupported("planted read bugs live in the fast family only");
  const detail::AttentionLaunch launch =
      fault == ReadFault::kExpNoLog2e
          ? detail::launch_attention_t<detail::ReadBug::kExpNoLog2e>
          : launch_attention;  // kIgnoreLocal: the indexer's bug, attention as in production
  return detail::attention_host_via(launch, config, params, batch, q, caches, k_scale, v_scale,
                                    selection, topk, kernel);
}

}  // namespace kvo::gpu::testing
