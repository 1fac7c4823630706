// kvo_gpu_testing: the host-memory write with a bug planted in the fused kernel
// (launch_fused_write_t<F> of write_fused.cuh, instantiated here for the planted bugs only).
#include <algorithm>
#include <string>

#include "kvo/gpu/testing/faults.hpp"
#include "kvo/spec/outcome.hpp"
#include "write_fused.cuh"

namespace kvo::gpu::testing {

void write_layer_host_faulty(WriteFault fault, WritePath path, const spec::ModelConfig& config,
                             const spec::LayerWrite& write, spec::LayerCaches& caches) {
  using detail::WriteBug;
  if (path != WritePath::kFused)
    throw spec::Unsupported("planted write bugs live in the fused kernel only");
  detail::FusedLaunch launch = nullptr;
  switch (fault) {
    case WriteFault::kWrapNegativeSlots:
      launch = detail::launch_fused_write_t<WriteBug::kWrapNegativeSlots>;
      break;
    case WriteFault::kOffsetPlusOne:
      launch = detail::launch_fused_write_t<WriteBug::kOffsetPlusOne>;
      break;
    case WriteFault::kSwapHndNhd:
      launch = detail::launch_fused_write_t<WriteBug::kSwapHndNhd>;
      break;
    case WriteFault::kDivApproxOneCodeBeyond:
      launch = detail::launch_fused_write_t<WriteBug::kDivApproxOneCodeBeyond>;
      break;
    case WriteFault::kE4m3IntoE5m2:
      launch = detail::launch_fused_write_t<WriteBug::kE4m3IntoE5m2>;
      break;
    case WriteFault::kTruncDivNegativeSlot:
      launch = detail::launch_fused_write_t<WriteBug::kTruncDivNegativeSlot>;
      break;
    case WriteFault::kStridedAssumedDense:
      launch = detail::launch_fused_write_t<WriteBug::kStridedAssumedDense>;
      break;
    case WriteFault::kPerHeadScaleAsHead0:
      launch = detail::launch_fused_write_t<WriteBug::kPerHeadScaleAsHead0>;
      break;
    case WriteFault::kInt32Offset:
      launch = detail::launch_fused_write_t<WriteBug::kInt32Offset>;
      break;
    case WriteFault::kZeroGroupScale:
      launch = detail::launch_fused_write_t<WriteBug::kZeroGroupScale>;
      break;
    case WriteFault::kMinusOneStopsWrite: {
      spec::LayerWrite cut = write;
      const auto stop = std::find_if(cut.slots.slots.begin(), cut.slots.slots.end(),
                                     [](std::int64_t s) { return s < 0; });
      const auto n = static_cast<std::size_t>(stop - cut.slots.slots.begin());
      cut.slots.slots.resize(n);
      if (cut.index_slots.slots.size() > n) cut.index_slots.slots.resize(n);
      detail::write_layer_host_via(detail::launch_fused_write_t<WriteBug::kNone>, path, config, cut,
                                   caches);
      return;
    }
  }
  if (launch == nullptr) {
    throw spec::InvalidInput("fault", -1, std::to_string(static_cast<int>(fault)),
                             "not a WriteFault");
  }
  detail::write_layer_host_via(launch, path, config, write, caches);
}

}  // namespace kvo::gpu::testing
