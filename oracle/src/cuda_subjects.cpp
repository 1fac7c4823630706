// The CUDA write subjects: cuda-fused (one launch per layer) and cuda-unfused (the 12/8-launch
// baseline). Both go through kvo::gpu::write_layer_host, which validates on the host before any
// copy or launch and turns CUDA errors into spec::FailedToRun.
#include <memory>
#include <string>
#include <vector>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/read.hpp"
#include "kvo/gpu/write.hpp"
#include "kvo/oracle/read_subject.hpp"
#include "kvo/oracle/subject.hpp"

namespace kvo::oracle {
namespace {

class CudaWriteSubject final : public WriteSubject {
 public:
  CudaWriteSubject(std::string name, gpu::WritePath path,
                   gpu::FaultInjection fault = gpu::FaultInjection::kNone)
      : name_(std::move(name)), path_(path), fault_(fault) {}
  std::string name() const override { return name_; }
  std::string unavailable_reason() const override {
    std::string why;
    if (gpu::device_count(&why) > 0) return {};
    return "no CUDA device answers (" + why + ")";
  }
  void write_layer(const spec::ModelConfig& config, const spec::LayerWrite& write,
                   spec::LayerCaches& caches) override {
    gpu::write_layer_host(path_, config, write, caches, fault_);
  }

 private:
  std::string name_;
  gpu::WritePath path_;
  gpu::FaultInjection fault_;
};

/// The canonical-order read kernels (kvo/gpu/read.hpp): diffed bit for bit against the reference.
class CudaCanonicalReadSubject final : public ReadSubject {
 public:
  std::string name() const override { return "cuda-canonical"; }
  std::string unavailable_reason() const override {
    std::string why;
    if (gpu::device_count(&why) > 0) return {};
    return "no CUDA device answers (" + why + ")";
  }
  reference::Ordering ordering() const override { return reference::Ordering::kCanonical; }
  std::vector<std::int32_t> indexer(const ReadCase& c) override {
    return gpu::indexer_topk_host(c.config, c.indexer, c.batch, c.index_q, c.caches);
  }
  spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* sel) override {
    return gpu::attention_host(c.config, c.attention, c.batch, c.q, c.caches, c.k_scale, c.v_scale,
                               sel != nullptr ? sel->ids : std::vector<std::int32_t>{},
                               sel != nullptr ? sel->topk : 0);
  }
};

}  // namespace

/// Declared in read_subject.cpp, which registers it after the CPU read subjects.
std::unique_ptr<ReadSubject> make_cuda_read_subject() {
  return std::make_unique<CudaCanonicalReadSubject>();
}

/// Declared in subject.cpp, which registers these after the CPU subjects.
std::vector<std::unique_ptr<WriteSubject>> make_cuda_write_subjects() {
  std::vector<std::unique_ptr<WriteSubject>> out;
  out.push_back(std::make_unique<CudaWriteSubject>("cuda-fused", gpu::WritePath::kFused));
  out.push_back(std::make_unique<CudaWriteSubject>("cuda-unfused", gpu::WritePath::kUnfused));
  return out;
}

/// The fused kernel with a planted bug switched on (for the mutation catalogue, mutants.cpp):
/// fault 1 wraps -1 like torch, 2 writes one offset late, 3 swaps the HND and NHD strides.
std::unique_ptr<WriteSubject> make_cuda_fault_subject(const std::string& name, int fault) {
  const gpu::FaultInjection f = fault == 1   ? gpu::FaultInjection::kWrapNegativeSlots
                                : fault == 2 ? gpu::FaultInjection::kOffsetPlusOne
                                             : gpu::FaultInjection::kSwapHndNhd;
  return std::make_unique<CudaWriteSubject>(name, gpu::WritePath::kFused, f);
}

}  // namespace kvo::oracle
