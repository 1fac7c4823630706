// The production attention launchers (canonical and fast; flash): attention_kernels.cuh without a
// planted bug.
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

void launch_attention_generic(const spec::ModelConfig& config, const spec::AttentionParams& params,
                              const DeviceReadBatch& batch, const DeviceAttention& a,
                              ReadKernel kernel, void* stream) {
  detail::launch_attention_t<detail::ReadBug::kNone, AttentionPath::kGeneric>(config, params, batch,
                                                                              a, kernel, stream);
}

bool attention_is_specialised(const spec::ModelConfig& config,
                              const spec::AttentionParams& params) {
  return detail::attention_decode_applies(config, params);
}

void launch_flash_attention(const spec::ModelConfig& config, const spec::AttentionParams& params,
                            const DeviceReadBatch& batch, const DeviceAttention& a, void* stream) {
  detail::launch_flash_attention_t<spec::AttentionBug::kNone>(config, params, batch, a, stream);
}

void launch_flash_attention_generic(const spec::ModelConfig& config,
                                    const spec::AttentionParams& params,
                                    const DeviceReadBatch& batch, const DeviceAttention& a,
                                    void* stream) {
  detail::launch_flash_attention_t<spec::AttentionBug::kNone, AttentionPath::kGeneric>(
      config, params, batch, a, stream);
}

bool flash_is_decode(const spec::ModelConfig& config, const spec::AttentionParams& params) {
  return detail::flash_decode_applies(config, params);
}

}  // namespace kvo::gpu
