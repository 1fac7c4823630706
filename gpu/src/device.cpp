// What every build of kvo_gpu has, with or without CUDA: whether a device answers, the element
// types of device tensors, and (built without CUDA) the device API's entry points, which report
// that they cannot run.
#include <array>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/device_caches.hpp"
#include "kvo/gpu/device_calls.hpp"
#include "kvo/gpu/memory_pool.hpp"
#include "kvo/gpu/read.hpp"
#include "kvo/gpu/resident.hpp"
#include "kvo/gpu/write.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::gpu {
namespace {

/// An element type: a value format (its name and bytes are its spec::NumberFormat row's) or an
/// integer type of its own.
struct ElementFacts {
  ElementType type;
  std::optional<spec::DType> format;
  std::string_view integer_name;
  std::size_t integer_bytes;
};
/// One row per ElementType, in enum order (checked below).
constexpr std::array<ElementFacts, 8> kElementFacts{
    {{ElementType::kF32, spec::DType::kF32, {}, 0},
     {ElementType::kBF16, spec::DType::kBF16, {}, 0},
     {ElementType::kF16, spec::DType::kF16, {}, 0},
     {ElementType::kFp8E4M3, spec::DType::kFp8E4M3, {}, 0},
     {ElementType::kFp8E5M2, spec::DType::kFp8E5M2, {}, 0},
     {ElementType::kI32, std::nullopt, "i32", 4},
     {ElementType::kI64, std::nullopt, "i64", 8},
     {ElementType::kU8, std::nullopt, "u8", 1}}};
static_assert([] {
  for (std::size_t i = 0; i < kElementFacts.size(); ++i)
    if (static_cast<std::size_t>(kElementFacts[i].type) != i) return false;
  return true;
}());
const ElementFacts& facts_of(ElementType t) { return kElementFacts[static_cast<std::size_t>(t)]; }

}  // namespace

std::string_view name_of(ElementType t) {
  const ElementFacts& f = facts_of(t);
  return f.format ? spec::name_of(*f.format) : f.integer_name;
}
std::size_t element_bytes(ElementType t) {
  const ElementFacts& f = facts_of(t);
  return f.format ? spec::dtype_bytes(*f.format) : f.integer_bytes;
}
ElementType element_type_of(spec::DType t) {
  for (const ElementFacts& f : kElementFacts)
    if (f.format == t) return f.type;
  throw std::logic_error("no device element type for the format " + std::string(spec::name_of(t)));
}

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

// kvoracle's own kernels as device functions: without CUDA there are none to run.
DeviceWriteFunction device_write_function(WritePath) {
  return [](const DeviceWriteCall&) { no_cuda(); };
}
DeviceIndexerFunction device_indexer_function(ReadKernel) {
  return [](const DeviceIndexerCall&) { no_cuda(); };
}
DeviceAttentionFunction device_attention_function(ReadKernel, AttentionPath) {
  return [](const DeviceAttentionCall&) { no_cuda(); };
}

// Replay's resident path holds PagesInFlight only after a ResidentReplay exists, which a build
// without CUDA never makes; the symbols still have to link.
struct PagesInFlight::State {};
PagesInFlight::~PagesInFlight() = default;
std::int64_t PagesInFlight::bytes() const { no_cuda(); }
void PagesInFlight::store(std::size_t, spec::LayerCaches&) const { no_cuda(); }
bool PagesInFlight::same_as(std::size_t, const spec::LayerCaches&) const { no_cuda(); }
#endif

}  // namespace kvo::gpu
