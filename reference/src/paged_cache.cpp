#include "kvo/reference/paged_cache.hpp"

#include "kvo/spec/outcome.hpp"

namespace kvo::reference {

using spec::BufferKind;
using spec::KvLayout;

BufferKind kv_buffer(const spec::ModelConfig& c, int kv) {
  if (spec::kv_in_one_tensor(c)) return BufferKind::kKv;
  return kv == 0 ? BufferKind::kK : BufferKind::kV;
}

std::int64_t kv_element(const spec::ModelConfig& c, int kv, std::int64_t b, std::int64_t o,
                        std::int64_t h, std::int64_t d) {
  const std::int64_t bs = c.geometry.block_size;
  const std::int64_t nkv = c.geometry.num_kv_heads;
  const std::int64_t hd = c.geometry.head_dim;
  const spec::KvStrides& s = c.kv_strides;
  if (!s.dense()) return s.offset + b * s.block + o * s.token + h * s.head + kv * s.kv_part + d;
  switch (c.layout) {
    case KvLayout::kNhd:  // [nb, bs, nkv, hd]
      return ((b * bs + o) * nkv + h) * hd + d;
    case KvLayout::kHnd:  // [nb, nkv, bs, hd]
      return ((b * nkv + h) * bs + o) * hd + d;
    case KvLayout::kPackedHnd:  // [nb, nkv, bs, 2*hd], K at d, V at hd + d
      return ((b * nkv + h) * bs + o) * (2 * hd) + kv * hd + d;
    case KvLayout::kPackedNhd:  // [nb, bs, nkv, 2*hd]
      return ((b * bs + o) * nkv + h) * (2 * hd) + kv * hd + d;
    case KvLayout::kSplitNhd:  // [nb, 2, bs, nkv, hd]
      return (((b * 2 + kv) * bs + o) * nkv + h) * hd + d;
    case KvLayout::kSplitHnd:  // [nb, 2, nkv, bs, hd]
      return (((b * 2 + kv) * nkv + h) * bs + o) * hd + d;
  }
  return -1;
}

std::int64_t element_bytes(const spec::ModelConfig& c, BufferKind buffer) {
  if (buffer == BufferKind::kIndexK) return spec::index_stride_bytes(c);
  return static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
}

std::int64_t blockscale_block_bytes(const spec::ModelConfig& c) {
  const auto& g = c.geometry;
  return g.block_size * g.index_dim + g.block_size * (g.index_dim / spec::kScaleGroup) * 4;
}

std::int64_t index_value_byte(const spec::ModelConfig& c, std::int64_t b, std::int64_t o,
                              std::int64_t d) {
  const std::int64_t bs = c.geometry.block_size;
  const std::int64_t idim = c.geometry.index_dim;
  const spec::IndexStrides& s = c.index_strides;  // SPEC 3: a strided view, or dense
  if (c.index.layout == spec::IndexLayout::kBlockScale) {
    const std::int64_t block = s.dense() ? blockscale_block_bytes(c) : s.block;
    return s.offset + b * block + o * idim + d;  // token-major fp8 rows first
  }
  const std::int64_t e = s.dense() ? (b * bs + o) * idim + d  // [nb, bs, index_dim]
                                   : s.offset + b * s.block + o * s.token + d;
  return e * element_bytes(c, BufferKind::kIndexK);
}

std::int64_t index_scale_byte(const spec::ModelConfig& c, std::int64_t b, std::int64_t o,
                              std::int64_t g) {
  const std::int64_t bs = c.geometry.block_size;
  const std::int64_t idim = c.geometry.index_dim;
  const spec::IndexStrides& s = c.index_strides;
  const std::int64_t block = s.dense() ? blockscale_block_bytes(c) : s.block;
  return s.offset + b * block + bs * idim + (o * (idim / spec::kScaleGroup) + g) * 4;
}

PagedCacheLayout::PagedCacheLayout(const spec::ModelConfig& config) : config_(config) {
  spec::validate(config_);
}

std::vector<BufferKind> PagedCacheLayout::buffers(spec::LayerKind kind) const {
  std::vector<BufferKind> out;
  if (spec::kv_in_one_tensor(config_)) {
    out.push_back(BufferKind::kKv);
  } else {
    out.push_back(BufferKind::kK);
    out.push_back(BufferKind::kV);
  }
  if (kind == spec::LayerKind::kSparse) out.push_back(BufferKind::kIndexK);
  return out;
}

std::int64_t PagedCacheLayout::buffer_bytes(BufferKind buffer) const {
  const auto& g = config_.geometry;
  const spec::KvStrides& s = config_.kv_strides;
  if (!s.dense() && buffer != BufferKind::kIndexK) {
    // SPEC 3: the view's outermost axis past its offset (blocks; or K and V of one allocation).
    const spec::KvAxis outer = spec::kv_axes(config_).axes[0];
    return (s.offset + spec::axis_count(g, outer) * spec::stride_of(s, outer)) *
           element_bytes(buffer);
  }
  const std::int64_t per_tensor = g.num_blocks * g.block_size * g.num_kv_heads * g.head_dim;
  switch (buffer) {
    case BufferKind::kK:
    case BufferKind::kV:
      return per_tensor * element_bytes(buffer);
    case BufferKind::kKv:
      return 2 * per_tensor * element_bytes(buffer);
    case BufferKind::kIndexK:
      if (!config_.index_strides.dense()) {  // SPEC 3: the view's blocks past its offset
        return (config_.index_strides.offset + g.num_blocks * config_.index_strides.block) *
               element_bytes(buffer);
      }
      if (config_.index.layout == spec::IndexLayout::kBlockScale)
        return g.num_blocks * blockscale_block_bytes();
      return g.num_blocks * g.block_size * g.index_dim * element_bytes(buffer);
  }
  return 0;
}

void check_layer_caches(const PagedCacheLayout& layout, spec::LayerKind kind,
                        const spec::LayerCaches& caches) {
  if (caches.kind != kind) {
    throw spec::InvalidInput("caches.kind", -1, std::string(spec::name_of(caches.kind)),
                             "the write is for a " + std::string(spec::name_of(kind)) + " layer");
  }
  const std::vector<BufferKind> want = layout.buffers(kind);
  if (caches.buffers.size() != want.size()) {
    throw spec::InvalidInput("caches", -1, std::to_string(caches.buffers.size()) + " buffers",
                             "a " + std::string(spec::name_of(kind)) +
                                 " layer in this layout has " + std::to_string(want.size()));
  }
  for (BufferKind b : want) {
    const spec::CacheBuffer* buf = caches.find(b);
    if (buf == nullptr || buf->guard_bytes < 0 || buf->body_bytes() != layout.buffer_bytes(b)) {
      throw spec::InvalidInput(
          "caches", -1, std::string(spec::name_of(b)),
          "missing, or its body is not " + std::to_string(layout.buffer_bytes(b)) + " bytes");
    }
  }
}

}  // namespace kvo::reference
