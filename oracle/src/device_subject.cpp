// Device and host-call subjects (device_subject.hpp): a function subject whose functions run the
// user's call functions through kvo::gpu's runners of one memory (staging, the call, the copy
// back).
#include "kvo/oracle/device_subject.hpp"

#include <utility>
#include <vector>

#include "kvo/gpu/device.hpp"

namespace kvo::oracle {

std::string device_unavailable_reason() {
  std::string why;
  if (gpu::device_count(&why) > 0) return {};
  return "no CUDA device answers (" + why + ")";
}

namespace {

/// The runners of one memory (kvo/gpu/device_calls.hpp).
struct Runners {
  decltype(&gpu::run_device_write) write;
  decltype(&gpu::run_device_dense) dense;
  decltype(&gpu::run_device_indexer) indexer;
  decltype(&gpu::run_device_attention) attention;
};
constexpr Runners kDeviceRunners{gpu::run_device_write, gpu::run_device_dense,
                                 gpu::run_device_indexer, gpu::run_device_attention};
constexpr Runners kHostRunners{gpu::run_host_write, gpu::run_host_dense, gpu::run_host_indexer,
                               gpu::run_host_attention};

SubjectFunctions call_functions(DeviceSubjectFunctions d, const Runners& run) {
  SubjectFunctions f;
  if (d.write) {
    f.write = [fn = std::move(d.write), run](const spec::ModelConfig& c, const spec::LayerWrite& w,
                                             spec::LayerCaches& caches) {
      run.write(fn, c, w, caches);
    };
  }
  if (d.dense) {
    f.dense = [fn = std::move(d.dense), run](
                  const spec::ModelConfig& c, const spec::DenseInsert& in,
                  spec::LayerCaches& caches) { return run.dense(fn, c, in, caches); };
  }
  if (d.indexer) {
    f.indexer = [fn = std::move(d.indexer), run](const ReadCase& c) {
      return run.indexer(fn, c.config, c.indexer, c.batch, c.index_q, c.caches);
    };
  }
  if (d.attention) {
    f.attention = [fn = std::move(d.attention), run](const ReadCase& c,
                                                     const reference::TopkSelection* sel) {
      return run.attention(fn, c.config, c.attention, c.batch, c.q, c.caches, c.k_scale, c.v_scale,
                           sel != nullptr ? sel->ids : std::vector<std::int32_t>{},
                           sel != nullptr ? sel->topk : 0);
    };
  }
  f.ordering = d.ordering;
  f.topk_form = d.topk_form;
  f.attention_profile = d.attention_profile;
  return f;
}

}  // namespace

std::unique_ptr<Subject> make_device_subject(std::string name, DeviceSubjectFunctions d) {
  DeviceWriteFn device_write = d.write;
  DeviceIndexerFn device_indexer = d.indexer;
  DeviceAttentionFn device_attention = d.attention;
  const bool device_concurrent = d.device_concurrent;
  SubjectFunctions f = call_functions(std::move(d), kDeviceRunners);
  f.device_write = std::move(device_write);
  f.device_indexer = std::move(device_indexer);
  f.device_attention = std::move(device_attention);
  f.unavailable_reason = device_unavailable_reason;
  f.device_concurrent = device_concurrent;
  return make_function_subject(std::move(name), std::move(f));
}

std::unique_ptr<Subject> make_host_call_subject(std::string name, DeviceSubjectFunctions d) {
  return make_function_subject(std::move(name), call_functions(std::move(d), kHostRunners));
}

}  // namespace kvo::oracle
