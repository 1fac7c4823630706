// The CUDA subjects. Writes: cuda-fused (one launch per layer) and cuda-unfused (the 12/8-launch
// baseline), through kvo::gpu::write_layer_host. Reads: cuda-canonical and cuda-fast, through
// kvo::gpu's read host API. Both validate on the host before any copy or launch and turn CUDA
// errors into spec::FailedToRun.
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

/// Empty when a CUDA device answers, else why not.
std::string no_device_reason() {
  std::string why;
  if (gpu::device_count(&why) > 0) return {};
  return "no CUDA device answers (" + why + ")";
}

class CudaWriteSubject final : public WriteSubject {
 public:
  CudaWriteSubject(std::string name, gpu::WritePath path,
                   gpu::FaultInjection fault = gpu::FaultInjection::kNone)
      : name_(std::move(name)), path_(path), fault_(fault) {}
  std::string name() const override { return name_; }
  std::string unavailable_reason() const override { return no_device_reason(); }
  void write_layer(const spec::ModelConfig& config, const spec::LayerWrite& write,
                   spec::LayerCaches& caches) override {
    gpu::write_layer_host(path_, config, write, caches, fault_);
  }

 private:
  std::string name_;
  gpu::WritePath path_;
  gpu::FaultInjection fault_;
};

/// The read kernels of kvo/gpu/read.hpp. cuda-canonical is diffed bit for bit against the
/// reference; cuda-fast (its own order, ids by descending score) against the float64 truth and the
/// tie-aware top-k rules; `fault` plants a bug in the fast family.
class CudaReadSubject final : public ReadSubject {
 public:
  CudaReadSubject(std::string name, gpu::ReadKernel kernel,
                  gpu::ReadFault fault = gpu::ReadFault::kNone)
      : name_(std::move(name)), kernel_(kernel), fault_(fault) {}
  std::string name() const override { return name_; }
  std::string unavailable_reason() const override { return no_device_reason(); }
  reference::Ordering ordering() const override {
    return kernel_ == gpu::ReadKernel::kCanonical ? reference::Ordering::kCanonical
                                                  : reference::Ordering::kForeign;
  }
  TopkOrder topk_order() const override {
    return kernel_ == gpu::ReadKernel::kCanonical ? TopkOrder::kAscendingIds
                                                  : TopkOrder::kDescendingScore;
  }
  std::vector<std::int32_t> indexer(const ReadCase& c) override {
    return gpu::indexer_topk_host(c.config, c.indexer, c.batch, c.index_q, c.caches, kernel_,
                                  fault_);
  }
  spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* sel) override {
    return gpu::attention_host(c.config, c.attention, c.batch, c.q, c.caches, c.k_scale, c.v_scale,
                               sel != nullptr ? sel->ids : std::vector<std::int32_t>{},
                               sel != nullptr ? sel->topk : 0, kernel_, fault_);
  }

 private:
  std::string name_;
  gpu::ReadKernel kernel_;
  gpu::ReadFault fault_;
};

}  // namespace

/// Declared in read_subject.cpp, which registers these after the CPU read subjects.
std::vector<std::unique_ptr<ReadSubject>> make_cuda_read_subjects() {
  std::vector<std::unique_ptr<ReadSubject>> out;
  out.push_back(std::make_unique<CudaReadSubject>("cuda-canonical", gpu::ReadKernel::kCanonical));
  out.push_back(std::make_unique<CudaReadSubject>("cuda-fast", gpu::ReadKernel::kFast));
  return out;
}

/// The fast read kernels with a planted bug (for the mutation catalogue, mutants.cpp): fault 1
/// leaves the local block unforced, 2 drops log2(e) from the softmax's exp2.
std::unique_ptr<ReadSubject> make_cuda_read_fault_subject(const std::string& name, int fault) {
  return std::make_unique<CudaReadSubject>(
      name, gpu::ReadKernel::kFast,
      fault == 1 ? gpu::ReadFault::kIgnoreLocal : gpu::ReadFault::kExpNoLog2e);
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
