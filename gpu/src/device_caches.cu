// The device mirror of a layer's guarded caches (kvo/gpu/device_caches.hpp): one allocation,
//   [margin | buffer 0 (guard, body, guard) | pad | buffer 1 ... | margin]
// every byte outside the buffers poisoned, so that a write past the guard bands shows too.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kvo/gpu/device_caches.hpp"
#include "kvo/gpu/write.hpp"
#include "kvo/spec/outcome.hpp"
#include "launch.cuh"
#include "staging.cuh"

namespace kvo::gpu {
namespace {

using detail::DeviceBuffer;

/// The poison of every mirror byte outside the buffers.
constexpr std::uint8_t kMarginPoison = 0x5A;

std::size_t round_up(std::size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

struct DeviceCacheMirror::Impl {
  DeviceBuffer memory;
  std::vector<std::size_t> offsets;  ///< where each buffer's storage starts in `memory`
  std::vector<spec::BufferKind> kinds;
  std::vector<std::uint8_t*> bodies;
  DeviceKvCaches views;
};

DeviceCacheMirror::DeviceCacheMirror(const spec::ModelConfig& c, const spec::LayerCaches& caches)
    : impl_(std::make_unique<Impl>()) {
  spec::validate(c);
  detail::require_buffers(c, caches);
  // The margin: one token row of the widest buffer (Triton's truncating // and % turn slot -1 into
  // page 0, offset -1: one token stride before the body, which must land in memory the mirror
  // owns), at least 256 bytes.
  const std::int64_t kv_token_bytes =
      detail::kv_strides(c).token * static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  const std::int64_t index_token_bytes =
      c.geometry.index_dim * (c.index.layout == spec::IndexLayout::kFlat
                                  ? static_cast<std::int64_t>(spec::dtype_bytes(c.index.flat_dtype))
                                  : 1);
  const std::size_t margin =
      round_up(static_cast<std::size_t>(std::max<std::int64_t>(kv_token_bytes, index_token_bytes)));
  std::size_t total = margin;
  for (const spec::CacheBuffer& b : caches.buffers) {
    impl_->offsets.push_back(total);
    impl_->kinds.push_back(b.kind);
    total += round_up(b.storage.size());
  }
  total += margin;
  impl_->memory = DeviceBuffer(total);
  impl_->memory.fill(kMarginPoison);
  std::uint8_t* base = impl_->memory.data();
  for (std::size_t i = 0; i < caches.buffers.size(); ++i) {
    const spec::CacheBuffer& b = caches.buffers[i];
    detail::check_cuda(cudaMemcpy(base + impl_->offsets[i], b.storage.data(), b.storage.size(),
                                  cudaMemcpyHostToDevice),
                       "cudaMemcpy(cache to device)");
    impl_->bodies.push_back(base + impl_->offsets[i] + b.guard_bytes);
  }
  auto* k = static_cast<std::uint8_t*>(body(spec::BufferKind::kK));
  if (k == nullptr) k = static_cast<std::uint8_t*>(body(spec::BufferKind::kKv));
  impl_->views = cache_views(c, k, body(spec::BufferKind::kV), body(spec::BufferKind::kIndexK));
}

DeviceCacheMirror::~DeviceCacheMirror() = default;

const DeviceKvCaches& DeviceCacheMirror::views() const { return impl_->views; }

void* DeviceCacheMirror::body(spec::BufferKind kind) const {
  for (std::size_t i = 0; i < impl_->kinds.size(); ++i) {
    if (impl_->kinds[i] == kind) return impl_->bodies[i];
  }
  return nullptr;
}

void DeviceCacheMirror::download(spec::LayerCaches& caches) const {
  std::vector<std::uint8_t> all(impl_->memory.size());
  impl_->memory.download(all.data(), all.size());
  std::size_t at = 0;  // the next byte that belongs to no buffer
  // A changed margin byte is named by its offset from the nearest buffer's body (SPEC 7
  // coordinates: a negative body offset lies before the buffer, one past its size after it).
  auto check_margin = [&](std::size_t end, std::size_t next) {
    for (; at < end; ++at) {
      if (all[at] == kMarginPoison) continue;
      const bool before = next < caches.buffers.size();
      const std::size_t i = before ? next : next - 1;
      const spec::CacheBuffer& b = caches.buffers[i];
      const auto body_start = static_cast<std::int64_t>(impl_->offsets[i]) + b.guard_bytes;
      char value[8];
      std::snprintf(value, sizeof value, "0x%02X", all[at]);
      throw spec::FailedToRun("wrote outside every cache buffer and its guard bands: " +
                              std::string(spec::name_of(b.kind)) + " body byte " +
                              std::to_string(static_cast<std::int64_t>(at) - body_start) + " (" +
                              (before ? "before its leading" : "after its trailing") +
                              " guard band of " + std::to_string(b.guard_bytes) + " bytes) holds " +
                              value + ", not the poison 0x5A");
    }
  };
  for (std::size_t i = 0; i < caches.buffers.size(); ++i) {
    spec::CacheBuffer& b = caches.buffers[i];
    check_margin(impl_->offsets[i], i);
    std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(impl_->offsets[i]), b.storage.size(),
                b.storage.begin());
    at = impl_->offsets[i] + b.storage.size();
  }
  check_margin(all.size(), caches.buffers.size());
}

}  // namespace kvo::gpu
