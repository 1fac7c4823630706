#pragma once
/// \file paged_cache.hpp
/// The paged-cache model of SPEC 3: which buffers a layer has, their sizes, and the offset of every
/// (block, offset, head, dim) in each layout, one formula per layout; and the check that a layer's
/// caches have those buffers. How the test harness allocates, poisons and guards buffers, and the
/// inverse of these offsets, live in the oracle (kvo/oracle/harness.hpp).

#include <cstdint>
#include <vector>

#include "kvo/spec/config.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::reference {

/// The SPEC 3 offsets as functions of a valid configuration (spec::validate), for code that reads
/// a few elements without building a PagedCacheLayout; the layout's members of the same names are
/// these.
/// The buffer that holds K (kv = 0) or V (kv = 1).
spec::BufferKind kv_buffer(const spec::ModelConfig& config, int kv);
/// Element offset of K or V (b, o, h, d) inside kv_buffer(kv): the layout's formula, or a strided
/// view's (spec::KvStrides).
std::int64_t kv_element(const spec::ModelConfig& config, int kv, std::int64_t b, std::int64_t o,
                        std::int64_t h, std::int64_t d);
/// Element size of a buffer's values (index-K blockscale: 1, its scales being 4).
std::int64_t element_bytes(const spec::ModelConfig& config, spec::BufferKind buffer);
/// Bytes of one blockscale block: bs*index_dim values then bs*(index_dim/128) fp32 scales.
std::int64_t blockscale_block_bytes(const spec::ModelConfig& config);
/// Byte offset of index-K element d of slot (b, o): flat or blockscale value byte, in the dense
/// layout or a strided view (spec::IndexStrides).
std::int64_t index_value_byte(const spec::ModelConfig& config, std::int64_t b, std::int64_t o,
                              std::int64_t d);
/// Byte offset of the fp32 scale of group g of slot (b, o) (blockscale only).
std::int64_t index_scale_byte(const spec::ModelConfig& config, std::int64_t b, std::int64_t o,
                              std::int64_t g);

/// Layout arithmetic for one model configuration, validated once. Offsets are the formulas of
/// SPEC 3, one per layout.
class PagedCacheLayout {
 public:
  explicit PagedCacheLayout(const spec::ModelConfig& config);

  const spec::ModelConfig& config() const { return config_; }

  /// The buffers of a layer of this kind, in storage order: K, V (or KV), then index-K if sparse.
  std::vector<spec::BufferKind> buffers(spec::LayerKind kind) const;
  /// Body size of a buffer in bytes.
  std::int64_t buffer_bytes(spec::BufferKind buffer) const;
  std::int64_t element_bytes(spec::BufferKind buffer) const {
    return reference::element_bytes(config_, buffer);
  }
  spec::BufferKind kv_buffer(int kv) const { return reference::kv_buffer(config_, kv); }
  std::int64_t kv_element(int kv, std::int64_t b, std::int64_t o, std::int64_t h,
                          std::int64_t d) const {
    return reference::kv_element(config_, kv, b, o, h, d);
  }
  std::int64_t index_value_byte(std::int64_t b, std::int64_t o, std::int64_t d) const {
    return reference::index_value_byte(config_, b, o, d);
  }
  std::int64_t index_scale_byte(std::int64_t b, std::int64_t o, std::int64_t g) const {
    return reference::index_scale_byte(config_, b, o, g);
  }
  std::int64_t blockscale_block_bytes() const { return reference::blockscale_block_bytes(config_); }

 private:
  spec::ModelConfig config_;
};

/// Throws InvalidInput unless `caches` holds exactly the buffers of a `kind` layer, each of its
/// size.
void check_layer_caches(const PagedCacheLayout& layout, spec::LayerKind kind,
                        const spec::LayerCaches& caches);

}  // namespace kvo::reference
