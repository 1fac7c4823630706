// Users' calls in host memory (kvo/gpu/device_calls.hpp, run_host_*): the same calls as on the
// device (call_runner.hpp), their tensors in host buffers this stager owns. The caches are a copy
// of the guarded host buffers (guard bands around each body, in place), brought back whole.
#include <cstring>
#include <memory>
#include <vector>

#include "call_runner.hpp"
#include "kvo/gpu/device_calls.hpp"

namespace kvo::gpu {
namespace {

class HostStager {
 public:
  DeviceTensor input(const spec::HostTensor& t) {
    return input(t.bytes.data(), element_type_of(t.dtype), t.shape);
  }
  DeviceTensor input(const void* values, ElementType type, std::vector<std::int64_t> shape) {
    DeviceTensor t = contiguous_tensor(nullptr, type, std::move(shape));
    const std::size_t bytes = static_cast<std::size_t>(t.numel()) * element_bytes(type);
    t.data = keep(bytes);
    if (bytes > 0) std::memcpy(t.data, values, bytes);
    return t;
  }
  DeviceTensor output(ElementType type, std::vector<std::int64_t> shape, std::uint8_t poison) {
    DeviceTensor t = contiguous_tensor(nullptr, type, std::move(shape));
    const std::size_t bytes = static_cast<std::size_t>(t.numel()) * element_bytes(type);
    t.data = keep(bytes);
    std::memset(t.data, poison, bytes);
    return t;
  }
  void fetch(const DeviceTensor& t, void* dst) const {
    std::memcpy(dst, t.data, static_cast<std::size_t>(t.numel()) * element_bytes(t.type));
  }
  DeviceKvCaches caches(const spec::ModelConfig& c, const spec::LayerCaches& caches) {
    detail::require_buffers(c, caches);
    work_ = caches;
    auto body = [&](spec::BufferKind k) -> void* {
      spec::CacheBuffer* b = work_.find(k);
      return b == nullptr ? nullptr : b->body();
    };
    const bool one = spec::kv_in_one_tensor(c);
    return cache_views(c, body(one ? spec::BufferKind::kKv : spec::BufferKind::kK),
                       one ? nullptr : body(spec::BufferKind::kV), body(spec::BufferKind::kIndexK));
  }
  void download(spec::LayerCaches& caches) const { caches = work_; }
  template <class Call>
  void invoke(const std::function<void(const Call&)>& fn, Call& call) const {
    fn(call);
  }

 private:
  /// Zeroed storage of `bytes` (at least one byte, so every present tensor has a pointer).
  std::uint8_t* keep(std::size_t bytes) {
    storage_.push_back(std::make_unique<std::uint8_t[]>(bytes == 0 ? 1 : bytes));
    return storage_.back().get();
  }
  std::vector<std::unique_ptr<std::uint8_t[]>> storage_;
  spec::LayerCaches work_;
};

}  // namespace

void run_host_write(const DeviceWriteFunction& fn, const spec::ModelConfig& config,
                    const spec::LayerWrite& write, spec::LayerCaches& caches) {
  HostStager s;
  detail::run_write_call(s, fn, config, write, caches);
}

spec::HostTensor run_host_dense(const DeviceDenseFunction& fn, const spec::ModelConfig& config,
                                const spec::DenseInsert& in, spec::LayerCaches& caches) {
  HostStager s;
  return detail::run_dense_call(s, fn, config, in, caches);
}

std::vector<std::int32_t> run_host_indexer(const DeviceIndexerFunction& fn,
                                           const spec::ModelConfig& config,
                                           const spec::IndexerParams& params,
                                           const spec::ReadBatch& batch,
                                           const spec::HostTensor& index_q,
                                           const spec::LayerCaches& caches) {
  HostStager s;
  return detail::run_indexer_call(s, fn, config, params, batch, index_q, caches);
}

spec::HostTensor run_host_attention(const DeviceAttentionFunction& fn,
                                    const spec::ModelConfig& config,
                                    const spec::AttentionParams& params,
                                    const spec::ReadBatch& batch, const spec::HostTensor& q,
                                    const spec::LayerCaches& caches,
                                    const std::vector<float>& k_scale,
                                    const std::vector<float>& v_scale,
                                    const std::vector<std::int32_t>& selection, std::int64_t topk) {
  HostStager s;
  return detail::run_attention_call(s, fn, config, params, batch, q, caches, k_scale, v_scale,
                                    selection, topk);
}

}  // namespace kvo::gpu
