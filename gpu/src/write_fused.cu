// The production fused layer write: write_fused.cuh without a planted bug.
#include "write_fused.cuh"

namespace kvo::gpu {

int launch_fused_write(const spec::ModelConfig& config, spec::LayerKind kind,
                       const DeviceWriteInputs& in, const DeviceLayerCaches& caches, void* stream,
                       bool pdl) {
  return detail::launch_fused_write_t<detail::WriteBug::kNone>(config, kind, in, caches, stream,
                                                               pdl);
}

int launch_fused_write_generic(const spec::ModelConfig& config, spec::LayerKind kind,
                               const DeviceWriteInputs& in, const DeviceLayerCaches& caches,
                               void* stream, bool pdl) {
  return detail::launch_fused_write_t<detail::WriteBug::kNone, false>(config, kind, in, caches,
                                                                      stream, pdl);
}

bool fused_write_is_specialised(const spec::ModelConfig& config, spec::LayerKind kind) {
  return detail::decode_write_applies(config, kind);
}

}  // namespace kvo::gpu
