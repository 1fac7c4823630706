// Device subjects (device_subject.hpp): a function subject whose functions run the user's device
// functions through kvo::gpu's runners (staging, the call, the copy back).
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

std::unique_ptr<Subject> make_device_subject(std::string name, DeviceSubjectFunctions d) {
  SubjectFunctions f;
  if (d.write) {
    f.write = [fn = std::move(d.write)](const spec::ModelConfig& c, const spec::LayerWrite& w,
                                        spec::LayerCaches& caches) {
      gpu::run_device_write(fn, c, w, caches);
    };
  }
  if (d.dense) {
    f.dense = [fn = std::move(d.dense)](const spec::ModelConfig& c, const spec::DenseInsert& in,
                                        spec::LayerCaches& caches) {
      return gpu::run_device_dense(fn, c, in, caches);
    };
  }
  if (d.indexer) {
    f.indexer = [fn = std::move(d.indexer)](const ReadCase& c) {
      return gpu::run_device_indexer(fn, c.config, c.indexer, c.batch, c.index_q, c.caches);
    };
  }
  if (d.attention) {
    f.attention = [fn = std::move(d.attention)](const ReadCase& c,
                                                const reference::TopkSelection* sel) {
      return gpu::run_device_attention(
          fn, c.config, c.attention, c.batch, c.q, c.caches, c.k_scale, c.v_scale,
          sel != nullptr ? sel->ids : std::vector<std::int32_t>{}, sel != nullptr ? sel->topk : 0);
    };
  }
  f.ordering = d.ordering;
  f.topk_order = d.topk_order;
  f.attention_profile = d.attention_profile;
  f.unavailable_reason = device_unavailable_reason;
  return make_function_subject(std::move(name), std::move(f));
}

}  // namespace kvo::oracle
