#pragma once
/// \file paged_cache.hpp
/// The paged-cache model of SPEC 3: which buffers a layer has, their sizes, the element offset of
/// every (block, offset, head, dim) in each layout, its inverse, the model-wide arena view used by
/// `kvoracle layout`, and the poisoned, guarded allocation every write starts from.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvo/spec/config.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::reference {

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

  std::string describe() const;
};

/// Layout arithmetic for one model configuration. Offsets are the formulas of SPEC 3, one per
/// layout.
class PagedCacheLayout {
 public:
  explicit PagedCacheLayout(const spec::ModelConfig& config);

  const spec::ModelConfig& config() const { return config_; }

  /// The buffers of a layer of this kind, in storage order: K, V (or KV), then index-K if sparse.
  std::vector<spec::BufferKind> buffers(spec::LayerKind kind) const;
  /// Body size of a buffer in bytes.
  std::int64_t buffer_bytes(spec::BufferKind buffer) const;
  /// Element size of a buffer's values (index-K blockscale: 1, its scales being 4).
  std::int64_t element_bytes(spec::BufferKind buffer) const;

  /// The buffer that holds K (kv = 0) or V (kv = 1).
  spec::BufferKind kv_buffer(int kv) const;
  /// Element offset of K or V (b, o, h, d) inside kv_buffer(kv).
  std::int64_t kv_element(int kv, std::int64_t b, std::int64_t o, std::int64_t h,
                          std::int64_t d) const;
  /// Byte offset of index-K element d of slot (b, o): flat or blockscale value byte.
  std::int64_t index_value_byte(std::int64_t b, std::int64_t o, std::int64_t d) const;
  /// Byte offset of the fp32 scale of group g of slot (b, o) (blockscale only).
  std::int64_t index_scale_byte(std::int64_t b, std::int64_t o, std::int64_t g) const;
  /// Bytes of one blockscale block: bs*index_dim values then bs*(index_dim/128) fp32 scales.
  std::int64_t blockscale_block_bytes() const;

  /// Byte offset of an element coordinate in its buffer; throws InvalidInput for a coordinate
  /// outside the geometry or not of that buffer.
  std::int64_t byte_offset(const ElementCoord& c) const;
  /// The inverse: what lives at `byte` of `buffer`; nothing past the end.
  std::optional<ElementCoord> locate(spec::BufferKind buffer, std::int64_t byte) const;

 private:
  spec::ModelConfig config_;
};

/// One byte of the model-wide arena: all layers' buffers back to back, layer-major, no guards.
struct ArenaByte {
  std::int64_t layer = 0;
  spec::BufferKind buffer = spec::BufferKind::kK;
  std::int64_t byte = 0;  ///< within the buffer body
};
std::int64_t arena_bytes(const PagedCacheLayout& layout);
std::int64_t arena_offset(const PagedCacheLayout& layout, const ArenaByte& where);
std::optional<ArenaByte> locate_arena(const PagedCacheLayout& layout, std::int64_t byte);

/// The poison byte at storage index i of a buffer poisoned with `salt` (a fixed hash, so a missed
/// or stray write shows whatever the written value is, with probability 255/256 per byte).
std::uint8_t poison_byte(std::uint64_t salt, std::uint64_t i);
/// The salt of one buffer of one layer.
std::uint64_t poison_salt(std::int64_t layer, spec::BufferKind buffer);

/// A layer's buffers, allocated with guard bands and poisoned.
spec::LayerCaches make_layer_caches(const PagedCacheLayout& layout, std::int64_t layer,
                                    spec::LayerKind kind);
/// Throws InvalidInput unless `caches` holds exactly the buffers of a `kind` layer, each of its
/// size.
void check_layer_caches(const PagedCacheLayout& layout, spec::LayerKind kind,
                        const spec::LayerCaches& caches);

/// Every layer of the model's mix.
std::vector<spec::LayerCaches> make_model_caches(const PagedCacheLayout& layout);

}  // namespace kvo::reference
