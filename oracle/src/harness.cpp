// The test harness of the caches: guarded, poisoned allocation, the arena view and the inverse of
// the SPEC 3 offsets.
#include "kvo/oracle/harness.hpp"

#include <array>
#include <sstream>

#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {
namespace {

using spec::BufferKind;
using spec::KvLayout;

/// Axes of a K/V tensor, outermost first, for the inverse. kKvDim is the packed last axis of
/// extent 2*hd (K at d, V at hd + d); kKvAxis is the split layouts' axis of extent 2.

void check_range(std::int64_t v, std::int64_t n, const char* field) {
  if (v < 0 || v >= n) {
    throw spec::InvalidInput(field, -1, std::to_string(v),
                             "outside [0, " + std::to_string(n) + ") for this configuration");
  }
}

}  // namespace

std::string ElementCoord::describe() const {
  std::ostringstream s;
  if (padding) {  // only the outer coordinates resolved
    s << "buffer=" << spec::name_of(buffer) << " padding (no element)";
    if (block >= 0) s << " in block=" << block;
    if (offset >= 0) s << " offset=" << offset;
    if (head >= 0) s << " head=" << head;
    return s.str();
  }
  s << "buffer=" << spec::name_of(buffer) << " block=" << block << " offset=" << offset;
  if (kv >= 0) s << " kv=" << (kv == 0 ? "K" : "V");
  if (head >= 0) s << " head=" << head;
  if (is_scale) {
    s << " scale_group=" << group;
  } else {
    s << " dim=" << dim;
  }
  s << " byte_in_element=" << byte_in_element;
  return s.str();
}

std::int64_t byte_offset(const reference::PagedCacheLayout& layout, const ElementCoord& c) {
  const spec::ModelConfig& config = layout.config();
  const auto& g = config.geometry;
  check_range(c.block, g.num_blocks, "block");
  check_range(c.offset, g.block_size, "offset");
  if (c.buffer == BufferKind::kIndexK) {
    if (c.is_scale) {
      if (config.index.layout != spec::IndexLayout::kBlockScale) {
        throw spec::InvalidInput("scale_group", -1, std::to_string(c.group),
                                 "the flat index layout has no scales");
      }
      check_range(c.group, g.index_dim / spec::kScaleGroup, "scale_group");
      check_range(c.byte_in_element, 4, "byte_in_element");
      return layout.index_scale_byte(c.block, c.offset, c.group) + c.byte_in_element;
    }
    check_range(c.dim, g.index_dim, "dim");
    check_range(c.byte_in_element, layout.element_bytes(c.buffer), "byte_in_element");
    return layout.index_value_byte(c.block, c.offset, c.dim) + c.byte_in_element;
  }
  if (c.kv != 0 && c.kv != 1)
    throw spec::InvalidInput("kv", -1, std::to_string(c.kv), "expected K (0) or V (1)");
  if (layout.kv_buffer(c.kv) != c.buffer) {
    throw spec::InvalidInput("buffer", -1, std::string(spec::name_of(c.buffer)),
                             "layout " + std::string(spec::name_of(config.layout)) + " keeps " +
                                 (c.kv == 0 ? "K" : "V") + " in buffer " +
                                 std::string(spec::name_of(layout.kv_buffer(c.kv))));
  }
  check_range(c.head, g.num_kv_heads, "head");
  check_range(c.dim, g.head_dim, "dim");
  check_range(c.byte_in_element, layout.element_bytes(c.buffer), "byte_in_element");
  return layout.kv_element(c.kv, c.block, c.offset, c.head, c.dim) *
             layout.element_bytes(c.buffer) +
         c.byte_in_element;
}

std::optional<ElementCoord> locate(const reference::PagedCacheLayout& layout, BufferKind buffer,
                                   std::int64_t byte) {
  if (byte < 0 || byte >= layout.buffer_bytes(buffer)) return std::nullopt;
  const spec::ModelConfig& config = layout.config();
  const auto& g = config.geometry;
  ElementCoord c;
  c.buffer = buffer;
  if (buffer == BufferKind::kIndexK) {
    // A strided view (SPEC 3): past the offset, blocks of the view's stride; a remainder no
    // block, token or dim reaches is padding.
    const spec::IndexStrides view = spec::index_view(config);
    const std::int64_t eb = layout.element_bytes(buffer);
    std::int64_t e = byte / eb - view.offset;
    c.padding = e < 0 || e / view.block >= g.num_blocks;
    if (c.padding) return c;
    c.block = e / view.block;
    e -= c.block * view.block;
    if (config.index.layout == spec::IndexLayout::kBlockScale) {
      std::int64_t in_block = e;
      c.padding = in_block >= layout.blockscale_block_bytes();
      if (c.padding) return c;
      const std::int64_t values = g.block_size * g.index_dim;
      if (in_block < values) {
        c.offset = in_block / g.index_dim;
        c.dim = in_block % g.index_dim;
      } else {
        in_block -= values;
        const std::int64_t groups = g.index_dim / spec::kScaleGroup;
        c.is_scale = true;
        c.byte_in_element = in_block % 4;
        c.offset = (in_block / 4) / groups;
        c.group = (in_block / 4) % groups;
      }
      return c;
    }
    const std::int64_t offset = e / view.token;
    e -= offset * view.token;
    c.padding = offset >= g.block_size || e >= g.index_dim;
    if (offset < g.block_size) c.offset = offset;
    if (c.padding) return c;
    c.byte_in_element = byte % eb;
    c.dim = e;
    return c;
  }
  if (layout.kv_buffer(0) != buffer && layout.kv_buffer(1) != buffer) return std::nullopt;
  const std::int64_t eb = layout.element_bytes(buffer);
  c.byte_in_element = byte % eb;
  const spec::LayoutAxes la = spec::kv_axes(config);
  c.kv = buffer == BufferKind::kV ? 1 : 0;
  const auto set = [&](spec::KvAxis axis, std::int64_t i) {
    switch (axis) {
      case spec::KvAxis::kBlock:
        c.block = i;
        break;
      case spec::KvAxis::kToken:
        c.offset = i;
        break;
      case spec::KvAxis::kHead:
        c.head = i;
        break;
      case spec::KvAxis::kKv:
        c.kv = static_cast<int>(i);
        break;
      case spec::KvAxis::kDim:
        c.dim = i;
        break;
    }
  };
  const spec::KvStrides& s = config.kv_strides;
  if (!s.dense()) {
    // A strided view (SPEC 3): peel the axes outermost first; a remainder no axis index reaches
    // is padding, and the coordinates resolved so far say where it lies.
    std::int64_t e = byte / eb - s.offset;
    c.padding = e < 0;
    for (int i = 0; i < la.rank && !c.padding; ++i) {
      const spec::KvAxis axis = la.axes[static_cast<std::size_t>(i)];
      const std::int64_t stride = spec::stride_of(s, axis);
      const std::int64_t index = e / stride;
      c.padding = index >= spec::axis_count(g, axis);
      if (!c.padding) set(axis, index);
      e -= index * stride;
    }
    return c;
  }
  std::int64_t e = byte / eb;
  for (int i = la.rank - 1; i >= 0; --i) {
    const spec::KvAxis axis = la.axes[static_cast<std::size_t>(i)];
    // The outermost axis takes the rest.
    const std::int64_t count = i == 0 ? e + 1 : spec::axis_count(g, axis);
    set(axis, e % count);
    e /= count;
  }
  return c;
}

std::int64_t arena_bytes(const reference::PagedCacheLayout& layout) {
  std::int64_t total = 0;
  for (spec::LayerKind kind : layout.config().layers) {
    for (BufferKind b : layout.buffers(kind)) total += layout.buffer_bytes(b);
  }
  return total;
}

std::int64_t arena_offset(const reference::PagedCacheLayout& layout, const ArenaByte& where) {
  const auto& layers = layout.config().layers;
  check_range(where.layer, static_cast<std::int64_t>(layers.size()), "layer");
  std::int64_t base = 0;
  for (std::int64_t l = 0; l < where.layer; ++l) {
    for (BufferKind b : layout.buffers(layers[static_cast<std::size_t>(l)]))
      base += layout.buffer_bytes(b);
  }
  for (BufferKind b : layout.buffers(layers[static_cast<std::size_t>(where.layer)])) {
    if (b == where.buffer) {
      check_range(where.byte, layout.buffer_bytes(b), "byte");
      return base + where.byte;
    }
    base += layout.buffer_bytes(b);
  }
  throw spec::InvalidInput(
      "buffer", -1, std::string(spec::name_of(where.buffer)),
      "layer " + std::to_string(where.layer) + " has no such buffer in this layout");
}

std::optional<ArenaByte> locate_arena(const reference::PagedCacheLayout& layout,
                                      std::int64_t byte) {
  if (byte < 0) return std::nullopt;
  const auto& layers = layout.config().layers;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    for (BufferKind b : layout.buffers(layers[l])) {
      const std::int64_t n = layout.buffer_bytes(b);
      if (byte < n) return ArenaByte{static_cast<std::int64_t>(l), b, byte};
      byte -= n;
    }
  }
  return std::nullopt;
}

std::uint8_t poison_byte(std::uint64_t salt, std::uint64_t i) { return spec::poison_byte(salt, i); }

std::uint64_t poison_salt(std::int64_t layer, BufferKind buffer) {
  return (static_cast<std::uint64_t>(layer) << 8 | static_cast<std::uint64_t>(buffer)) *
         0xD1B54A32D192ED03ull;
}

spec::LayerCaches make_layer_caches(const reference::PagedCacheLayout& layout, std::int64_t layer,
                                    spec::LayerKind kind, bool lazy, bool hold_guards) {
  spec::LayerCaches caches;
  caches.kind = kind;
  for (BufferKind b : layout.buffers(kind)) {
    spec::CacheBuffer buf;
    buf.kind = b;
    buf.guard_bytes = spec::kGuardBytes;
    const std::int64_t bytes = layout.buffer_bytes(b) + 2 * spec::kGuardBytes;
    buf.storage = lazy ? spec::ByteStorage::lazy(bytes, poison_salt(layer, b))
                       : spec::ByteStorage::poisoned(bytes, poison_salt(layer, b));
    // A lazy buffer's guard bands exist from the start: every writer is judged against them.
    if (hold_guards || !buf.storage.is_lazy()) {
      buf.storage.materialise(0, buf.guard_bytes);
      buf.storage.materialise(buf.storage.size() - buf.guard_bytes, buf.storage.size());
    }
    caches.buffers.push_back(std::move(buf));
  }
  return caches;
}

void materialise_slot(const reference::PagedCacheLayout& layout, spec::LayerCaches& caches,
                      std::int64_t block, std::int64_t offset) {
  const spec::ModelConfig& c = layout.config();
  const spec::CacheGeometry& g = c.geometry;
  for (spec::CacheBuffer& buf : caches.buffers) {
    if (!buf.storage.is_lazy()) continue;
    const std::int64_t at = buf.guard_bytes;
    if (buf.kind == BufferKind::kIndexK) {
      const std::int64_t first = layout.index_value_byte(block, offset, 0);
      const std::int64_t end =
          layout.index_value_byte(block, offset, g.index_dim - 1) + layout.element_bytes(buf.kind);
      buf.storage.materialise(at + first, at + end);
      if (c.index.layout == spec::IndexLayout::kBlockScale) {
        const std::int64_t s0 = layout.index_scale_byte(block, offset, 0);
        buf.storage.materialise(at + s0, at + s0 + 4 * (g.index_dim / 128));
      }
      continue;
    }
    const std::int64_t e = layout.element_bytes(buf.kind);
    for (int kv = 0; kv < 2; ++kv) {
      if (layout.kv_buffer(kv) != buf.kind) continue;
      for (std::int64_t h = 0; h < g.num_kv_heads; ++h) {
        const std::int64_t first = layout.kv_element(kv, block, offset, h, 0) * e;
        buf.storage.materialise(at + first, at + first + g.head_dim * e);
      }
    }
  }
}

std::vector<std::pair<std::int64_t, std::int64_t>> block_byte_ranges(
    const reference::PagedCacheLayout& layout, BufferKind buffer, std::int64_t block) {
  const spec::CacheGeometry& g = layout.config().geometry;
  const std::int64_t e = layout.element_bytes(buffer);
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  if (buffer == BufferKind::kIndexK) {
    std::int64_t end = layout.index_value_byte(block, g.block_size - 1, g.index_dim - 1) + e;
    if (layout.config().index.layout == spec::IndexLayout::kBlockScale) {
      end =
          layout.index_scale_byte(block, g.block_size - 1, g.index_dim / spec::kScaleGroup - 1) + 4;
    }
    out.emplace_back(layout.index_value_byte(block, 0, 0), end);
    return out;
  }
  for (int kv = 0; kv < 2; ++kv) {
    if (layout.kv_buffer(kv) != buffer) continue;
    out.emplace_back(
        layout.kv_element(kv, block, 0, 0, 0) * e,
        (layout.kv_element(kv, block, g.block_size - 1, g.num_kv_heads - 1, g.head_dim - 1) + 1) *
            e);
  }
  return out;
}

void materialise_block(const reference::PagedCacheLayout& layout, spec::LayerCaches& caches,
                       std::int64_t block) {
  for (std::int64_t o = 0; o < layout.config().geometry.block_size; ++o) {
    materialise_slot(layout, caches, block, o);
  }
}

void materialise_write(const reference::PagedCacheLayout& layout, spec::LayerCaches& caches,
                       const spec::LayerWrite& write) {
  const spec::ModelConfig& c = layout.config();
  const std::int64_t bs = c.geometry.block_size;
  const std::int64_t capacity = c.geometry.num_blocks * bs;
  auto touch = [&](const spec::SlotMapping& m) {
    for (std::int64_t slot : m.slots) {
      if (slot < 0 && c.slot_mode == spec::SlotMode::kLegacyWrap) slot += capacity;
      if (slot < 0 || slot >= capacity) continue;
      materialise_slot(layout, caches, slot / bs, slot % bs);
    }
  };
  touch(write.slots);
  if (c.separate_index_slots) touch(write.index_slots);
}

std::vector<spec::LayerCaches> make_model_caches(const reference::PagedCacheLayout& layout) {
  std::vector<spec::LayerCaches> out;
  const auto& layers = layout.config().layers;
  out.reserve(layers.size());
  for (std::size_t l = 0; l < layers.size(); ++l) {
    out.push_back(make_layer_caches(layout, static_cast<std::int64_t>(l), layers[l]));
  }
  return out;
}

}  // namespace kvo::oracle
