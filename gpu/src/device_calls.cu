// Users' device calls (kvo/gpu/device_calls.hpp, run_device_*): the runners of call_runner.hpp over
// a stager that puts the case on the device (the caches in a DeviceCacheMirror, everything else in
// pooled buffers), calls the user's function once on the call stream, waits, and brings the caches
// and outputs back.
#include <algorithm>
#include <cstring>
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

/// The stager of a call over caches resident on the device (run_resident_*): every input and
/// poisoned output packed into one pinned host block and uploaded with one copy on the caches'
/// stream, the function called on that stream, outputs fetched after one wait (a resident read
/// case makes four such calls). The blocks are the calling thread's, reused call after call and
/// grown between calls; what a call finds no room for gets a pooled buffer of its own.
class PackedStager {
 public:
  explicit PackedStager(void* stream) : stream_(static_cast<cudaStream_t>(stream)) {
    Arena& a = arena();
    if (a.wanted > a.capacity) {
      if (a.device != nullptr) cudaFree(a.device);
      if (a.host != nullptr) cudaFreeHost(a.host);
      a.device = nullptr;
      a.host = nullptr;
      a.capacity = 0;
      detail::check_cuda(cudaMalloc(&a.device, a.wanted), "cudaMalloc(resident call block)");
      detail::check_cuda(cudaMallocHost(&a.host, a.wanted), "cudaMallocHost(resident call block)");
      a.capacity = a.wanted;
    }
  }
  DeviceTensor input(const spec::HostTensor& t) {
    return input(t.bytes.data(), element_type_of(t.dtype), t.shape);
  }
  DeviceTensor input(const void* values, ElementType type, std::vector<std::int64_t> shape) {
    const std::size_t bytes = bytes_of(type, shape);
    std::uint8_t* host = nullptr;
    void* device = place(bytes, host);
    if (device == nullptr) return detail::upload_values(keep_, values, type, std::move(shape));
    if (bytes > 0 && values != nullptr) std::memcpy(host, values, bytes);
    return contiguous_tensor(device, type, std::move(shape));
  }
  DeviceTensor output(ElementType type, std::vector<std::int64_t> shape, std::uint8_t poison) {
    const std::size_t bytes = bytes_of(type, shape);
    std::uint8_t* host = nullptr;
    void* device = place(bytes, host);
    if (device == nullptr) {
      legacy_fills_ = true;
      return detail::poisoned_tensor(keep_, type, std::move(shape), poison);
    }
    std::memset(host, poison, bytes);
    return contiguous_tensor(device, type, std::move(shape));
  }
  void fetch(const DeviceTensor& t, void* dst) const {
    const std::size_t bytes = static_cast<std::size_t>(t.numel()) * element_bytes(t.type);
    if (bytes == 0) return;
    detail::check_cuda(cudaMemcpyAsync(dst, t.data, bytes, cudaMemcpyDeviceToHost, stream_),
                       "cudaMemcpyAsync(resident call output)");
    detail::check_cuda(cudaStreamSynchronize(stream_), "the resident call's output");
  }
  /// Calls `fn` once on the stream after the one upload, then waits for the stream and the
  /// device. If `fn` throws, the stream is drained first.
  template <class Call>
  void invoke(const std::function<void(const Call&)>& fn, Call& call) const {
    call.stream = stream_;
    // Buffers of their own were poisoned on the legacy default stream.
    if (legacy_fills_) detail::check_cuda(cudaDeviceSynchronize(), "staging the call");
    if (used_ > 0) {
      detail::check_cuda(
          cudaMemcpyAsync(arena().device, arena().host, used_, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync(resident call inputs)");
    }
    try {
      fn(call);
    } catch (...) {
      (void)cudaStreamSynchronize(stream_);
      throw;
    }
    detail::check_cuda(cudaGetLastError(), "the subject's launch");
    detail::check_cuda(cudaStreamSynchronize(stream_), "the subject's kernels");
    // As device_calls.hpp promises every call: the device waited for too (a kernel the function
    // put on another stream is done before its outputs are read and the block is reused).
    detail::check_cuda(cudaDeviceSynchronize(), "the subject's kernels (device)");
  }

 private:
  struct Arena {
    std::uint8_t* device = nullptr;
    std::uint8_t* host = nullptr;
    std::size_t capacity = 0;
    std::size_t wanted = std::size_t{4} << 20;
  };
  static Arena& arena() {
    thread_local Arena a;  // kept for the thread's life (CUDA may be gone at thread exit)
    return a;
  }
  static std::size_t bytes_of(ElementType type, const std::vector<std::int64_t>& shape) {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return static_cast<std::size_t>(n) * element_bytes(type);
  }
  /// Room for `bytes` in the block (256-byte aligned): its device address, `host` its staging
  /// bytes; null where the block is full (the next call's block is made big enough).
  void* place(std::size_t bytes, std::uint8_t*& host) {
    Arena& a = arena();
    const std::size_t at = used_, end = at + (bytes + 255) / 256 * 256;
    if (end > a.capacity) {
      a.wanted = std::max(a.wanted, 2 * end);
      return nullptr;
    }
    used_ = end;
    host = a.host + at;
    return a.device + at;
  }

  cudaStream_t stream_;
  std::size_t used_ = 0;
  bool legacy_fills_ = false;
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

std::vector<std::int32_t> run_resident_indexer(
    const DeviceIndexerFunction& fn, const spec::ModelConfig& c, const spec::IndexerParams& p,
    const spec::ReadBatch& b, const spec::HostTensor& index_q, const DeviceKvCaches& caches,
    void* stream, std::vector<float>* scores) {
  const detail::QueryRows rows =
      detail::check_indexer_inputs(c, p, b, index_q, spec::LayerKind::kSparse);
  PackedStager s(stream);
  return detail::indexer_call_answer(s, fn, c, p, b, index_q, rows, caches, scores);
}

spec::HostTensor run_resident_attention(
    const DeviceAttentionFunction& fn, const spec::ModelConfig& c, const spec::AttentionParams& p,
    const spec::ReadBatch& b, const spec::HostTensor& q, const DeviceKvCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk, void* stream) {
  const detail::QueryRows rows =
      detail::check_attention_inputs(c, p, b, q, k_scale, v_scale, selection, topk);
  PackedStager s(stream);
  return detail::attention_call_answer(s, fn, c, p, b, q, rows, caches, k_scale, v_scale, selection,
                                       topk);
}

void* calling_thread_stream() { return detail::call_stream(); }

}  // namespace kvo::gpu
