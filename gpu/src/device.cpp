// What every build of kvo_gpu has, with or without CUDA: whether a device answers, the element
// types of device tensors, and (built without CUDA) the device API's entry points, which report
// that they cannot run.
#include <array>
#include <string_view>
#include <utility>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/device_caches.hpp"
#include "kvo/gpu/device_calls.hpp"
#include "kvo/gpu/memory_pool.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::gpu {
namespace {

struct ElementFacts {
  ElementType type;
  std::string_view name;
  std::size_t bytes;
};
/// One row per ElementType, in enum order (the value dtypes first, in spec::DType order).
constexpr std::array<ElementFacts, 8> kElementFacts{{{ElementType::kF32, "f32", 4},
                                                     {ElementType::kBF16, "bf16", 2},
                                                     {ElementType::kF16, "fp16", 2},
                                                     {ElementType::kFp8E4M3, "fp8_e4m3", 1},
                                                     {ElementType::kFp8E5M2, "fp8_e5m2", 1},
                                                     {ElementType::kI32, "i32", 4},
                                                     {ElementType::kI64, "i64", 8},
                                                     {ElementType::kU8, "u8", 1}}};
static_assert(static_cast<std::size_t>(ElementType::kFp8E5M2) ==
              static_cast<std::size_t>(spec::DType::kFp8E5M2));

}  // namespace

std::string_view name_of(ElementType t) { return kElementFacts[static_cast<std::size_t>(t)].name; }
std::size_t element_bytes(ElementType t) {
  return kElementFacts[static_cast<std::size_t>(t)].bytes;
}
ElementType element_type_of(spec::DType t) { return static_cast<ElementType>(t); }

std::int64_t DeviceTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

DeviceTensor contiguous_tensor(void* data, ElementType type, std::vector<std::int64_t> shape) {
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return {data, type, std::move(shape), std::move(strides)};
}

#ifdef KVO_HAVE_CUDA
int cuda_device_count(std::string* why);
std::string cuda_device_description();
std::int64_t cuda_device_memory_bytes();
bool cuda_set_host_wait(int policy);
bool built_with_cuda() { return true; }
int device_count(std::string* why) { return cuda_device_count(why); }
std::string device_description() { return cuda_device_description(); }
std::int64_t device_memory_bytes() { return cuda_device_memory_bytes(); }
bool set_host_wait(HostWait wait) { return cuda_set_host_wait(static_cast<int>(wait)); }
#else
bool built_with_cuda() { return false; }
int device_count(std::string* why) {
  if (why != nullptr) *why = "built without CUDA";
  return 0;
}
std::string device_description() { return {}; }
std::int64_t device_memory_bytes() { return 0; }
bool set_host_wait(HostWait) { return false; }

namespace {
[[noreturn]] void no_cuda() { throw spec::FailedToRun("kvoracle was built without CUDA"); }
}  // namespace

void release_idle_blocks() {}
KeepLargeBlocks::KeepLargeBlocks(std::size_t) : before_(0) {}
KeepLargeBlocks::~KeepLargeBlocks() = default;
LargeBlockUse KeepLargeBlocks::use() const { return {}; }

struct DeviceCacheMirror::Impl {};
DeviceCacheMirror::DeviceCacheMirror(const spec::ModelConfig&, const spec::LayerCaches&,
                                     std::vector<PendingPoison>*,
                                     const std::vector<spec::BufferKind>&) {
  no_cuda();
}
DeviceCacheMirror::~DeviceCacheMirror() = default;
const DeviceKvCaches& DeviceCacheMirror::views() const { no_cuda(); }
void* DeviceCacheMirror::body(spec::BufferKind) const { no_cuda(); }
void DeviceCacheMirror::download(spec::LayerCaches&) const { no_cuda(); }

void run_device_write(const DeviceWriteFunction&, const spec::ModelConfig&, const spec::LayerWrite&,
                      spec::LayerCaches&) {
  no_cuda();
}
spec::HostTensor run_device_dense(const DeviceDenseFunction&, const spec::ModelConfig&,
                                  const spec::DenseInsert&, spec::LayerCaches&) {
  no_cuda();
}
std::vector<std::int32_t> run_device_indexer(const DeviceIndexerFunction&, const spec::ModelConfig&,
                                             const spec::IndexerParams&, const spec::ReadBatch&,
                                             const spec::HostTensor&, const spec::LayerCaches&) {
  no_cuda();
}
spec::HostTensor run_device_attention(const DeviceAttentionFunction&, const spec::ModelConfig&,
                                      const spec::AttentionParams&, const spec::ReadBatch&,
                                      const spec::HostTensor&, const spec::LayerCaches&,
                                      const std::vector<float>&, const std::vector<float>&,
                                      const std::vector<std::int32_t>&, std::int64_t) {
  no_cuda();
}
std::vector<std::int32_t> run_resident_indexer(const DeviceIndexerFunction&,
                                               const spec::ModelConfig&, const spec::IndexerParams&,
                                               const spec::ReadBatch&, const spec::HostTensor&,
                                               const DeviceKvCaches&, void*, std::vector<float>*) {
  no_cuda();
}
spec::HostTensor run_resident_attention(const DeviceAttentionFunction&, const spec::ModelConfig&,
                                        const spec::AttentionParams&, const spec::ReadBatch&,
                                        const spec::HostTensor&, const DeviceKvCaches&,
                                        const std::vector<float>&, const std::vector<float>&,
                                        const std::vector<std::int32_t>&, std::int64_t, void*) {
  no_cuda();
}
void* calling_thread_stream() { return nullptr; }
#endif

}  // namespace kvo::gpu
