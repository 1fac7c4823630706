// The CUDA write subjects: cuda-fused (one launch per layer) and cuda-unfused (the 12/8-launch
// baseline). Both go through kvo::gpu::write_layer_host, which validates on the host before any
// copy or launch and turns CUDA errors into spec::FailedToRun.
#include <memory>
#include <string>
#include <vector>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/write.hpp"
#include "kvo/oracle/subject.hpp"

namespace kvo::oracle {
namespace {

class CudaWriteSubject final : public WriteSubject {
 public:
  CudaWriteSubject(std::string name, gpu::WritePath path) : name_(std::move(name)), path_(path) {}
  std::string name() const override { return name_; }
  std::string unavailable_reason() const override {
    std::string why;
    if (gpu::device_count(&why) > 0) return {};
    return "no CUDA device answers (" + why + ")";
  }
  void write_layer(const spec::ModelConfig& config, const spec::LayerWrite& write,
                   spec::LayerCaches& caches) override {
    gpu::write_layer_host(path_, config, write, caches);
  }

 private:
  std::string name_;
  gpu::WritePath path_;
};

}  // namespace

/// Declared in subject.cpp, which registers these after the CPU subjects.
std::vector<std::unique_ptr<WriteSubject>> make_cuda_write_subjects() {
  std::vector<std::unique_ptr<WriteSubject>> out;
  out.push_back(std::make_unique<CudaWriteSubject>("cuda-fused", gpu::WritePath::kFused));
  out.push_back(std::make_unique<CudaWriteSubject>("cuda-unfused", gpu::WritePath::kUnfused));
  return out;
}

}  // namespace kvo::oracle
