// The production attention launcher: attention_kernels.cuh without a planted bug.
#include "attention_kernels.cuh"

namespace kvo::gpu {

std::size_t attention_workspace_floats(std::int64_t num_rows, std::int64_t num_q_heads,
                                       std::int64_t head_dim, std::int64_t slots) {
  return static_cast<std::size_t>(num_rows * num_q_heads * slots * (head_dim + 2));
}

void launch_attention(const spec::ModelConfig& config, const spec::AttentionParams& params,
                      const DeviceReadBatch& batch, const DeviceAttention& a, ReadKernel kernel,
                      void* stream) {
  detail::launch_attention_t<detail::ReadBug::kNone>(config, params, batch, a, kernel, stream);
}

}  // namespace kvo::gpu
