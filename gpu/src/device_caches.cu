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

/// The buffers a layer of this kind has, with their body sizes (gpu's own arithmetic of SPEC 3).
struct WantedBuffer {
  spec::BufferKind kind;
  std::int64_t bytes;
};
std::vector<WantedBuffer> wanted_buffers(const spec::ModelConfig& c, spec::LayerKind kind) {
  std::vector<WantedBuffer> want;
  if (spec::kv_in_one_tensor(c.layout)) {
    want.push_back({spec::BufferKind::kKv, kv_buffer_bytes(c)});
  } else {
    want.push_back({spec::BufferKind::kK, kv_buffer_bytes(c)});
    want.push_back({spec::BufferKind::kV, kv_buffer_bytes(c)});
  }
  if (kind == spec::LayerKind::kSparse) {
    want.push_back({spec::BufferKind::kIndexK, index_buffer_bytes(c)});
  }
  return want;
}

void check_buffers(const spec::ModelConfig& c, const spec::LayerCaches& caches) {
  const std::vector<WantedBuffer> want = wanted_buffers(c, caches.kind);
  if (caches.buffers.size() != want.size()) {
    throw spec::InvalidInput("caches", -1, std::to_string(caches.buffers.size()) + " buffers",
                             "a " + std::string(spec::name_of(caches.kind)) + " layer has " +
                                 std::to_string(want.size()));
  }
  for (const WantedBuffer& x : want) {
    const spec::CacheBuffer* b = caches.find(x.kind);
    if (b == nullptr || b->guard_bytes < 0 || b->body_bytes() != x.bytes) {
      throw spec::InvalidInput("caches", -1, std::string(spec::name_of(x.kind)),
                               "missing, or not of " + std::to_string(x.bytes) + " body bytes");
    }
  }
}

/// The K (or one KV) tensor's SPEC 3 shape for each layout, in kLayoutFacts order.
std::vector<std::int64_t> layout_shape(spec::KvLayout layout, const spec::CacheGeometry& g) {
  const std::int64_t nb = g.num_blocks, bs = g.block_size, h = g.num_kv_heads, d = g.head_dim;
  switch (layout) {
    case spec::KvLayout::kNhd:
      return {nb, bs, h, d};
    case spec::KvLayout::kHnd:
      return {nb, h, bs, d};
    case spec::KvLayout::kPackedHnd:
      return {nb, h, bs, 2 * d};
    case spec::KvLayout::kPackedNhd:
      return {nb, bs, h, 2 * d};
    case spec::KvLayout::kSplitNhd:
      return {nb, 2, bs, h, d};
    case spec::KvLayout::kSplitHnd:
      return {nb, 2, h, bs, d};
  }
  return {};
}

DeviceKvCaches make_views(const spec::ModelConfig& c, std::uint8_t* k_body, std::uint8_t* v_body,
                          std::uint8_t* index_body) {
  const spec::CacheGeometry& g = c.geometry;
  const ElementType et = element_type_of(c.kv.cache_dtype);
  const std::int64_t eb = static_cast<std::int64_t>(element_bytes(et));
  const detail::KvStrides st = detail::kv_strides(g, c.layout);
  DeviceKvCaches v;
  v.k_cache = contiguous_tensor(k_body, et, layout_shape(c.layout, g));
  if (v_body != nullptr) v.v_cache = contiguous_tensor(v_body, et, layout_shape(c.layout, g));
  const std::vector<std::int64_t> logical{g.num_blocks, g.block_size, g.num_kv_heads, g.head_dim};
  const std::vector<std::int64_t> strides{st.block, st.token, st.head, 1};
  v.k = {k_body, et, logical, strides};
  v.v = {v_body != nullptr ? v_body : k_body + st.kv_part * eb, et, logical, strides};
  if (index_body != nullptr) {
    if (c.index.layout == spec::IndexLayout::kBlockScale) {
      const std::int64_t block_bytes =
          g.block_size * g.index_dim + g.block_size * (g.index_dim / spec::kScaleGroup) * 4;
      v.index_cache = contiguous_tensor(index_body, ElementType::kU8, {g.num_blocks, block_bytes});
    } else {
      v.index_cache = contiguous_tensor(index_body, element_type_of(c.index.flat_dtype),
                                        {g.num_blocks, g.block_size, g.index_dim});
    }
  }
  return v;
}

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
  check_buffers(c, caches);
  // The margin: one token row of the widest buffer (Triton's truncating // and % turn slot -1 into
  // page 0, offset -1: one token stride before the body, which must land in memory the mirror
  // owns), at least 256 bytes.
  const std::int64_t kv_token_bytes =
      detail::kv_strides(c.geometry, c.layout).token *
      static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
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
  impl_->views = make_views(c, k, static_cast<std::uint8_t*>(body(spec::BufferKind::kV)),
                            static_cast<std::uint8_t*>(body(spec::BufferKind::kIndexK)));
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
