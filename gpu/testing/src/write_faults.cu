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
  // Each fault planted in the kernel: its launcher's instantiation.
  struct Planted {
    WriteFault fault;
    detail::FusedLaunch launch;
  };
  static constexpr Planted kPlanted[] = {
      {WriteFault::kWrapNegativeSlots, detail::launch_fused_write_t<WriteBug::kWrapNegativeSlots>},
      {WriteFault::kOffsetPlusOne, detail::launch_fused_write_t<WriteBug::kOffsetPlusOne>},
      {WriteFault::kSwapHndNhd, detail::launch_fused_write_t<WriteBug::kSwapHndNhd>},
      {WriteFault::kDivApproxOneCodeBeyond,
       detail::launch_fused_write_t<WriteBug::kDivApproxOneCodeBeyond>},
      {WriteFault::kE4m3IntoE5m2, detail::launch_fused_write_t<WriteBug::kE4m3IntoE5m2>},
      {WriteFault::kTruncDivNegativeSlot,
       detail::launch_fused_write_t<WriteBug::kTruncDivNegativeSlot>},
      {WriteFault::kStridedAssumedDense,
       detail::launch_fused_write_t<WriteBug::kStridedAssumedDense>},
      {WriteFault::kPerHeadScaleAsHead0,
       detail::launch_fused_write_t<WriteBug::kPerHeadScaleAsHead0>},
      {WriteFault::kInt32Offset, detail::launch_fused_write_t<WriteBug::kInt32Offset>},
      {WriteFault::kZeroGroupScale, detail::launch_fused_write_t<WriteBug::kZeroGroupScale>},
      {WriteFault::kFp8FlushToZero, detail::launch_fused_write_t<WriteBug::kFp8FlushToZero>},
      {WriteFault::kRoundHalfAway, detail::launch_fused_write_t<WriteBug::kRoundHalfAway>},
      {WriteFault::kVectorTailOverrun, detail::launch_fused_write_t<WriteBug::kVectorTailOverrun>},
      {WriteFault::kTornWrapRace, detail::launch_fused_write_t<WriteBug::kTornWrapRace>},
  };
  if (fault == WriteFault::kMinusOneStopsWrite) {
    // A bug of the host's token loop: the mapping cut at its first -1, production's kernel.
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
  detail::FusedLaunch launch = nullptr;
  for (const Planted& p : kPlanted) {
    if (p.fault == fault) launch = p.launch;
  }
  if (launch == nullptr) {
    throw spec::InvalidInput("fault", -1, std::to_string(static_cast<int>(fault)),
                             "not a WriteFault");
  }
  // The torn race is the kernel's own: the colliding mapping reaches it unresolved.
  detail::write_layer_host_via(launch, path, config, write, caches,
                               fault != WriteFault::kTornWrapRace);
}

}  // namespace kvo::gpu::testing
