// Users' device calls (kvo/gpu/device_calls.hpp, run_device_*): the runners of call_runner.hpp over
// a stager that puts the case on the device (the caches in a DeviceCacheMirror, everything else in
// pooled buffers), calls the user's function once on the call stream, waits, and brings the caches
// and outputs back.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "call_runner.hpp"
#include "kvo/gpu/device_calls.hpp"
#include "kvo/spec/outcome.hpp"
#include "launch.cuh"
#include "staging.cuh"

namespace kvo::gpu {
namespace {

using detail::DeviceBuffer;

class DeviceStager {
 public:
  DeviceTensor input(const spec::HostTensor& t) { return detail::upload_tensor(keep_, t); }
  DeviceTensor input(const void* values, ElementType type, std::vector<std::int64_t> shape) {
    return detail::upload_values(keep_, values, type, std::move(shape));
  }
  DeviceTensor output(ElementType type, std::vector<std::int64_t> shape, std::uint8_t poison) {
    return detail::poisoned_tensor(keep_, type, std::move(shape), poison);
  }
  /// The bytes of a tensor this stager made, found by its pointer.
  void fetch(const DeviceTensor& t, void* dst) const {
    for (const DeviceBuffer& b : keep_) {
      if (b.data() == t.data) {
        b.download(dst, static_cast<std::size_t>(t.numel()) * element_bytes(t.type));
        return;
      }
    }
    throw spec::FailedToRun("internal: fetch of a tensor the call did not stage");
  }
  DeviceKvCaches caches(const spec::ModelConfig& c, const spec::LayerCaches& caches) {
    mirror_ = std::make_unique<DeviceCacheMirror>(c, caches);
    return mirror_->views();
  }
  void download(spec::LayerCaches& caches) const { mirror_->download(caches); }

  /// Calls `fn` once with `call` on the call stream, then waits for the stream and the device. If
  /// `fn` throws, the device is drained first (the call's buffers return to the pool only after
  /// every kernel it launched is done).
  template <class Call>
  void invoke(const std::function<void(const Call&)>& fn, Call& call) const {
    call.stream = detail::call_stream();
    // The staging (copies, and the poison fills on the legacy default stream) must be done before
    // a kernel on the non-blocking call stream starts.
    detail::check_cuda(cudaDeviceSynchronize(), "staging the call");
    try {
      fn(call);
    } catch (...) {
      (void)cudaDeviceSynchronize();
      throw;
    }
    detail::check_cuda(cudaGetLastError(), "the subject's launch");
    detail::check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(call.stream)),
                       "the subject's kernels");
    detail::check_cuda(cudaDeviceSynchronize(), "the subject's kernels (device)");
  }

 private:
  std::unique_ptr<DeviceCacheMirror> mirror_;
  std::vector<DeviceBuffer> keep_;
};

}  // namespace

void run_device_write(const DeviceWriteFunction& fn, const spec::ModelConfig& c,
                      const spec::LayerWrite& w, spec::LayerCaches& caches) {
  DeviceStager s;
  detail::run_write_call(s, fn, c, w, caches);
}

spec::HostTensor run_device_dense(const DeviceDenseFunction& fn, const spec::ModelConfig& c,
                                  const spec::DenseInsert& in, spec::LayerCaches& caches) {
  DeviceStager s;
  return detail::run_dense_call(s, fn, c, in, caches);
}

std::vector<std::int32_t> run_device_indexer(const DeviceIndexerFunction& fn,
                                             const spec::ModelConfig& c,
                                             const spec::IndexerParams& p, const spec::ReadBatch& b,
                                             const spec::HostTensor& index_q,
                                             const spec::LayerCaches& caches) {
  DeviceStager s;
  return detail::run_indexer_call(s, fn, c, p, b, index_q, caches);
}

spec::HostTensor run_device_attention(const DeviceAttentionFunction& fn, const spec::ModelConfig& c,
                                      const spec::AttentionParams& p, const spec::ReadBatch& b,
                                      const spec::HostTensor& q, const spec::LayerCaches& caches,
                                      const std::vector<float>& k_scale,
                                      const std::vector<float>& v_scale,
                                      const std::vector<std::int32_t>& selection,
                                      std::int64_t topk) {
  DeviceStager s;
  return detail::run_attention_call(s, fn, c, p, b, q, caches, k_scale, v_scale, selection, topk);
}

}  // namespace kvo::gpu
