// kvo_gpu_testing: the host-memory dense insert with a bug planted in its kernel (launch_dense of
// dense_insert.cuh, instantiated here with each DenseBug).
#include "dense_insert.cuh"
#include "kvo/gpu/device_calls.hpp"
#include "kvo/gpu/testing/faults.hpp"

namespace kvo::gpu::testing {
namespace {

template <detail::DenseBug F>
DeviceDenseFunction launcher(bool engine) {
  return engine ? DeviceDenseFunction(detail::launch_dense<true, F>)
                : DeviceDenseFunction(detail::launch_dense<false, F>);
}

/// One table: each DenseFault's kernel bug.
DeviceDenseFunction faulty_launcher(DenseFault fault, bool engine) {
  using detail::DenseBug;
  switch (fault) {
    case DenseFault::kGptjRope:
      return launcher<DenseBug::kGptjRope>(engine);
    case DenseFault::kNormWithoutOne:
      return launcher<DenseBug::kNormWithoutOne>(engine);
    case DenseFault::kEpsOff:
      return launcher<DenseBug::kEpsOff>(engine);
    case DenseFault::kFp8StoreUnscaled:
      return launcher<DenseBug::kFp8StoreUnscaled>(engine);
    case DenseFault::kRopeOverTailDims:
      break;
  }
  return launcher<DenseBug::kRopeOverTailDims>(engine);
}

}  // namespace

spec::HostTensor dense_insert_host_faulty(DenseFault fault, bool engine,
                                          const spec::ModelConfig& config,
                                          const spec::DenseInsert& in, spec::LayerCaches& caches) {
  return run_device_dense(faulty_launcher(fault, engine), config, in, caches);
}

}  // namespace kvo::gpu::testing
