// The device mirror of a layer's guarded caches (kvo/gpu/device_caches.hpp): one allocation,
//   [margin | buffer 0 (guard, body, guard) | pad | buffer 1 ... | margin]
// every byte outside the buffers poisoned, so that a write past the guard bands shows too.
#include <algorithm>
#include <cstdio>
#include <span>
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

constexpr std::int64_t kPage = spec::ByteStorage::kPageBytes;

/// p[i] = spec::poison_byte(salt, i) for i < n; p 8-byte aligned ([n] bytes).
__global__ void poison_kernel(std::uint8_t* p, std::uint64_t n, std::uint64_t salt) {
  const std::uint64_t words = n / 8;
  for (std::uint64_t w = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
       w <= words; w += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    if (w < words) {
      reinterpret_cast<std::uint64_t*>(p)[w] = spec::poison_word(salt, w);
    } else {
      for (std::uint64_t i = 8 * w; i < n; ++i) p[i] = spec::poison_byte(salt, i);
    }
  }
}

/// changed[q] = 1 where page q of a lazy buffer ([n] bytes at p), not materialised on the host
/// (materialised[q] == 0), holds a byte other than its poison: a stray write. One block per page.
__global__ void stray_pages_kernel(const std::uint8_t* p, std::uint64_t n, std::uint64_t salt,
                                   const std::uint8_t* materialised, std::uint8_t* changed,
                                   std::uint64_t pages) {
  for (std::uint64_t q = blockIdx.x; q < pages; q += gridDim.x) {
    if (materialised[q]) continue;
    const std::uint64_t begin = q * kPage, end = begin + kPage < n ? begin + kPage : n;
    bool differs = false;
    for (std::uint64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      differs |= p[i] != spec::poison_byte(salt, i);
    }
    if (__syncthreads_or(differs) && threadIdx.x == 0) changed[q] = 1;
  }
}

/// Puts a lazy buffer on the device: every byte poisoned there, then the host's pages copied over
/// (a huge buffer costs its size in device memory but only its touched pages in transfers).
void upload_lazy(std::uint8_t* dst, const spec::ByteStorage& s) {
  const auto n = static_cast<std::uint64_t>(s.size());
  poison_kernel<<<1024, 256>>>(dst, n, s.salt());
  detail::check_cuda(cudaGetLastError(), "poison_kernel");
  for (const spec::ByteRange& r : s.materialised()) {
    detail::check_cuda(
        cudaMemcpy(dst + r.first, s.data() + r.first, static_cast<std::size_t>(r.second - r.first),
                   cudaMemcpyHostToDevice),
        "cudaMemcpy(cache pages to device)");
  }
}

/// Brings a lazy buffer back: its materialised pages, and every other page the kernel changed
/// (found on the device against the poison, downloaded whole and stored: the diff then shows the
/// stray bytes exactly, zeros included).
void download_lazy(const std::uint8_t* src, spec::ByteStorage& s) {
  const std::vector<spec::ByteRange> held = s.materialised();
  for (const spec::ByteRange& r : held) {
    detail::check_cuda(
        cudaMemcpy(s.data() + r.first, src + r.first, static_cast<std::size_t>(r.second - r.first),
                   cudaMemcpyDeviceToHost),
        "cudaMemcpy(cache pages to host)");
  }
  const auto pages = static_cast<std::uint64_t>((s.size() + kPage - 1) / kPage);
  std::vector<std::uint8_t> flags(pages, 0);
  for (const spec::ByteRange& r : held) {
    for (std::int64_t q = r.first / kPage; q * kPage < r.second; ++q) {
      flags[static_cast<std::size_t>(q)] = 1;
    }
  }
  const DeviceBuffer materialised(flags);
  const DeviceBuffer changed(pages);
  changed.fill(0);
  stray_pages_kernel<<<4096, 256>>>(src, static_cast<std::uint64_t>(s.size()), s.salt(),
                                    materialised.data(), changed.data(), pages);
  detail::check_cuda(cudaGetLastError(), "stray_pages_kernel");
  changed.download(flags.data(), flags.size());
  std::vector<std::uint8_t> page(static_cast<std::size_t>(kPage));
  for (std::uint64_t q = 0; q < pages; ++q) {
    if (!flags[q]) continue;
    const auto at = static_cast<std::int64_t>(q) * kPage;
    const auto n = static_cast<std::size_t>(std::min(kPage, s.size() - at));
    detail::check_cuda(cudaMemcpy(page.data(), src + at, n, cudaMemcpyDeviceToHost),
                       "cudaMemcpy(stray page to host)");
    s.store(at, std::span<const std::uint8_t>(page.data(), n));
  }
}

/// Where a mirror puts each buffer: [margin | buffer 0 | pad | buffer 1 ... | margin].
struct MirrorPlacement {
  std::vector<std::size_t> offsets;  ///< each buffer's storage in the allocation
  std::size_t total = 0;             ///< the allocation's bytes
};

MirrorPlacement place_buffers(const spec::ModelConfig& c, const spec::LayerCaches& caches) {
  // The margin: one token row of the widest buffer (Triton's truncating // and % turn slot -1 into
  // page 0, offset -1: one token stride before the body, which must land in memory the mirror
  // owns), at least 256 bytes.
  const std::int64_t kv_token_bytes =
      detail::kv_strides(c).token * static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  const std::int64_t index_token_bytes = spec::index_view(c).token * spec::index_stride_bytes(c);
  const std::size_t margin =
      round_up(static_cast<std::size_t>(std::max<std::int64_t>(kv_token_bytes, index_token_bytes)));
  MirrorPlacement p;
  p.total = margin;
  for (const spec::CacheBuffer& b : caches.buffers) {
    p.offsets.push_back(p.total);
    p.total += round_up(static_cast<std::size_t>(b.storage.size()));
  }
  p.total += margin;
  return p;
}

}  // namespace

struct DeviceCacheMirror::Impl {
  DeviceBuffer memory;
  std::vector<std::size_t> offsets;  ///< where each buffer's storage starts in `memory`
  std::vector<std::int64_t> sizes;   ///< each buffer's storage bytes
  std::vector<spec::BufferKind> kinds;
  std::vector<std::uint8_t*> bodies;
  DeviceKvCaches views;
};

DeviceCacheMirror::DeviceCacheMirror(const spec::ModelConfig& c, const spec::LayerCaches& caches,
                                     std::vector<PendingPoison>* pending,
                                     const std::vector<spec::BufferKind>& uploaded)
    : impl_(std::make_unique<Impl>()) {
  spec::validate(c);
  detail::require_buffers(c, caches);
  MirrorPlacement placement = place_buffers(c, caches);
  const std::size_t total = placement.total;
  impl_->offsets = std::move(placement.offsets);
  for (const spec::CacheBuffer& b : caches.buffers) {
    impl_->kinds.push_back(b.kind);
    impl_->sizes.push_back(b.storage.size());
  }
  impl_->memory = DeviceBuffer(total);
  std::uint8_t* base = impl_->memory.data();
  // The margin poison everywhere but over the buffers, which their own poison or bytes cover
  // next (a huge buffer is not written twice).
  std::size_t at = 0;
  for (std::size_t i = 0; i <= caches.buffers.size(); ++i) {
    const std::size_t next = i < caches.buffers.size() ? impl_->offsets[i] : total;
    if (pending != nullptr) {
      pending->push_back(
          {base + at, static_cast<std::int64_t>(next - at), 0, kMarginPoison, false});
    } else {
      detail::check_cuda(cudaMemset(base + at, kMarginPoison, next - at), "cudaMemset(margins)");
    }
    if (i < caches.buffers.size())
      at = next + static_cast<std::size_t>(caches.buffers[i].storage.size());
  }
  for (std::size_t i = 0; i < caches.buffers.size(); ++i) {
    const spec::CacheBuffer& b = caches.buffers[i];
    if (!uploaded.empty() &&
        std::find(uploaded.begin(), uploaded.end(), b.kind) == uploaded.end()) {
      detail::check_cuda(cudaMemset(base + impl_->offsets[i], kMarginPoison,
                                    static_cast<std::size_t>(b.storage.size())),
                         "cudaMemset(a buffer not read)");
    } else if (pending != nullptr && b.storage.nothing_held()) {
      pending->push_back({base + impl_->offsets[i], b.storage.size(), b.storage.salt(), 0, true});
    } else if (b.storage.is_lazy()) {
      upload_lazy(base + impl_->offsets[i], b.storage);
    } else {
      detail::check_cuda(
          cudaMemcpy(base + impl_->offsets[i], b.storage.data(),
                     static_cast<std::size_t>(b.storage.size()), cudaMemcpyHostToDevice),
          "cudaMemcpy(cache to device)");
    }
    impl_->bodies.push_back(base + impl_->offsets[i] + b.guard_bytes);
  }
  auto* k = static_cast<std::uint8_t*>(body(spec::BufferKind::kK));
  if (k == nullptr) k = static_cast<std::uint8_t*>(body(spec::BufferKind::kKv));
  impl_->views = cache_views(c, k, body(spec::BufferKind::kV), body(spec::BufferKind::kIndexK));
}

DeviceCacheMirror::~DeviceCacheMirror() = default;

const DeviceKvCaches& DeviceCacheMirror::views() const { return impl_->views; }

std::size_t DeviceCacheMirror::buffer_count() const { return impl_->offsets.size(); }
std::uint8_t* DeviceCacheMirror::storage(std::size_t i) const {
  return impl_->memory.data() + impl_->offsets.at(i);
}
std::int64_t DeviceCacheMirror::storage_bytes(std::size_t i) const { return impl_->sizes.at(i); }
std::uint8_t* DeviceCacheMirror::allocation() const { return impl_->memory.data(); }
std::int64_t DeviceCacheMirror::allocation_bytes() const {
  return static_cast<std::int64_t>(impl_->memory.size());
}
std::int64_t DeviceCacheMirror::device_bytes(const spec::ModelConfig& config,
                                             const spec::LayerCaches& caches) {
  return static_cast<std::int64_t>(detail::pool_block_bytes(place_buffers(config, caches).total));
}

void* DeviceCacheMirror::body(spec::BufferKind kind) const {
  for (std::size_t i = 0; i < impl_->kinds.size(); ++i) {
    if (impl_->kinds[i] == kind) return impl_->bodies[i];
  }
  return nullptr;
}

void DeviceCacheMirror::download(spec::LayerCaches& caches) const {
  const std::uint8_t* base = impl_->memory.data();
  // The bytes that belong to no buffer: the margins and the pads between buffers, each downloaded
  // and checked against the margin poison. A changed byte is named by its offset from the nearest
  // buffer's body (SPEC 7 coordinates: a negative body offset lies before the buffer, one past its
  // size after it).
  auto check_gap = [&](std::size_t begin, std::size_t end, std::size_t next) {
    std::vector<std::uint8_t> gap(end - begin);
    detail::check_cuda(cudaMemcpy(gap.data(), base + begin, gap.size(), cudaMemcpyDeviceToHost),
                       "cudaMemcpy(cache margin to host)");
    for (std::size_t k = 0; k < gap.size(); ++k) {
      if (gap[k] == kMarginPoison) continue;
      const std::size_t at = begin + k;
      const bool before = next < caches.buffers.size();
      const std::size_t i = before ? next : next - 1;
      const spec::CacheBuffer& b = caches.buffers[i];
      const auto body_start = static_cast<std::int64_t>(impl_->offsets[i]) + b.guard_bytes;
      char value[8];
      std::snprintf(value, sizeof value, "0x%02X", gap[k]);
      throw spec::WroteOutside("wrote outside every cache buffer and its guard bands: " +
                               std::string(spec::name_of(b.kind)) + " body byte " +
                               std::to_string(static_cast<std::int64_t>(at) - body_start) + " (" +
                               (before ? "before its leading" : "after its trailing") +
                               " guard band of " + std::to_string(b.guard_bytes) +
                               " bytes) holds " + value + ", not the poison 0x5A");
    }
  };
  std::size_t at = 0;  // the next byte that belongs to no buffer
  for (std::size_t i = 0; i < caches.buffers.size(); ++i) {
    spec::CacheBuffer& b = caches.buffers[i];
    check_gap(at, impl_->offsets[i], i);
    const std::uint8_t* src = base + impl_->offsets[i];
    if (b.storage.is_lazy()) {
      download_lazy(src, b.storage);
    } else {
      detail::check_cuda(
          cudaMemcpy(b.storage.data(), src, static_cast<std::size_t>(b.storage.size()),
                     cudaMemcpyDeviceToHost),
          "cudaMemcpy(cache to host)");
    }
    at = impl_->offsets[i] + static_cast<std::size_t>(b.storage.size());
  }
  check_gap(at, impl_->memory.size(), caches.buffers.size());
}

}  // namespace kvo::gpu
