// The dense-layer fused insert (dense_insert.cuh): the production launchers, bug-free.
#include "dense_insert.cuh"

#include "kvo/gpu/device_calls.hpp"
#include "kvo/gpu/write.hpp"

namespace kvo::gpu {

void launch_dense_insert(const DeviceDenseCall& call) { detail::launch_dense<false>(call); }

void launch_dense_insert_engine(const DeviceDenseCall& call) { detail::launch_dense<true>(call); }

spec::HostTensor dense_insert_host(const spec::ModelConfig& c, const spec::DenseInsert& in,
                                   spec::LayerCaches& caches) {
  return run_device_dense(launch_dense_insert, c, in, caches);
}

spec::HostTensor dense_insert_engine_host(const spec::ModelConfig& c, const spec::DenseInsert& in,
                                          spec::LayerCaches& caches) {
  return run_device_dense(launch_dense_insert_engine, c, in, caches);
}

}  // namespace kvo::gpu
