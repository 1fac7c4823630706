#pragma once
/// \file harness.hpp
/// The test harness around the SPEC 3 caches (moved here from reference/, which is the SPEC and
/// nothing else): buffers allocated with guard bands and poisoned with a known pattern, the
/// model-wide arena view of `kvoracle layout`, and the inverse of the layout offsets (`locate`),
/// with which the cache diff names what lives at a differing byte.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::oracle {

/// What lives at one byte of a layer's buffer. Fields that do not apply are -1.
struct ElementCoord {
  spec::BufferKind buffer = spec::BufferKind::kK;
  std::int64_t block = -1;
  std::int64_t offset = -1;  ///< token offset within the block
  std::int64_t head = -1;    ///< KV head (K/V buffers)
  std::int64_t dim = -1;     ///< element within the head (K/V) or the index row (index-K)
  int kv = -1;               ///< 0 K, 1 V for K/V buffers
  bool is_scale = false;     ///< a blockscale fp32 scale rather than an fp8 value
  std::int64_t group = -1;   ///< scale group (blockscale scales)
  std::int64_t byte_in_element = 0;
  /// A strided view's padding byte (SPEC 3): no element's; the coordinates resolved before the
  /// axis it falls outside of say where it lies.
  bool padding = false;

  std::string describe() const;
};

/// Byte offset of an element coordinate in its buffer (the layout's SPEC 3 offsets); throws
/// InvalidInput for a coordinate outside the geometry or not of that buffer.
std::int64_t byte_offset(const reference::PagedCacheLayout& layout, const ElementCoord& c);
/// The inverse: what lives at `byte` of `buffer`; nothing past the end.
std::optional<ElementCoord> locate(const reference::PagedCacheLayout& layout,
                                   spec::BufferKind buffer, std::int64_t byte);

/// One byte of the model-wide arena: all layers' buffers back to back, layer-major, no guards.
struct ArenaByte {
  std::int64_t layer = 0;
  spec::BufferKind buffer = spec::BufferKind::kK;
  std::int64_t byte = 0;  ///< within the buffer body
};
std::int64_t arena_bytes(const reference::PagedCacheLayout& layout);
std::int64_t arena_offset(const reference::PagedCacheLayout& layout, const ArenaByte& where);
std::optional<ArenaByte> locate_arena(const reference::PagedCacheLayout& layout, std::int64_t byte);

/// The poison byte at storage index i of a buffer poisoned with `salt` (a fixed hash, so a missed
/// or stray write shows whatever the written value is, with probability 255/256 per byte).
std::uint8_t poison_byte(std::uint64_t salt, std::uint64_t i);
/// The salt of one buffer of one layer.
std::uint64_t poison_salt(std::int64_t layer, spec::BufferKind buffer);

/// A layer's buffers, allocated with guard bands (spec::kGuardBytes) and poisoned. A buffer of
/// spec::kLazyStorageBytes or more is lazy (a huge cache, spec::ByteStorage): its guard bands are
/// materialised, its body only where `materialise_*` below says a case touches it; every other
/// byte means its poison. `lazy`: every buffer lazy, whatever its size (host caches that hold only
/// the pages a replay resident on the device brings back); `hold_guards` false leaves a lazy
/// buffer's guard bands unheld too (a case judged on the device: nothing to upload, the device
/// poisons every byte itself).
spec::LayerCaches make_layer_caches(const reference::PagedCacheLayout& layout, std::int64_t layer,
                                    spec::LayerKind kind, bool lazy = false,
                                    bool hold_guards = true);

/// Materialises the bytes of slot (block, offset) in every buffer of `caches`: each K/V head row,
/// the index-K row and its blockscale scales. Nothing to do for dense storage.
void materialise_slot(const reference::PagedCacheLayout& layout, spec::LayerCaches& caches,
                      std::int64_t block, std::int64_t offset);
/// The body bytes [begin, end) that block `block`'s elements of `buffer` span (padding between
/// them included): one range per K/V part the buffer holds, or the index-K block's values and
/// scales. In every layout and view (SPEC 3) a block's elements lie between its first and last.
std::vector<std::pair<std::int64_t, std::int64_t>> block_byte_ranges(
    const reference::PagedCacheLayout& layout, spec::BufferKind buffer, std::int64_t block);
/// Every slot of `block`.
void materialise_block(const reference::PagedCacheLayout& layout, spec::LayerCaches& caches,
                       std::int64_t block);
/// The slots a write call stores to: its slot mappings' non-negative slots, and in legacy_wrap
/// the negative ones where they wrap (SPEC 3). Call before the reference or a subject writes.
void materialise_write(const reference::PagedCacheLayout& layout, spec::LayerCaches& caches,
                       const spec::LayerWrite& write);

/// Every layer of the model's mix.
std::vector<spec::LayerCaches> make_model_caches(const reference::PagedCacheLayout& layout);

}  // namespace kvo::oracle
