#pragma once
/// \file config.hpp
/// Plain configuration of a model's caches and of one layer's write call (SPEC 2-4), and the one
/// validator of each. Shared by the reference, the GPU launchers and the CLI; nothing here computes
/// an address or a value.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvo/spec/types.hpp"

namespace kvo::spec {

/// Paged-cache geometry (SPEC 3). index_dim is used by sparse layers only.
struct CacheGeometry {
  std::int64_t num_blocks = 64;
  std::int64_t block_size = 16;  ///< page size, any integer >= 1
  std::int64_t num_kv_heads = 4;
  std::int64_t head_dim = 128;
  std::int64_t index_dim = 128;
  std::int64_t capacity() const { return num_blocks * block_size; }
};

/// How K and V values become cache elements (SPEC 2).
struct KvQuant {
  DType cache_dtype = DType::kBF16;
  Saturation saturation = Saturation::kSatFinite;  ///< fp8 caches only
  ScaleMode scale_mode = ScaleMode::kNone;
  bool per_head_scale = false;   ///< scales are [nkv] instead of [1]
  bool via_model_dtype = false;  ///< round the scaled value to the activation dtype first
  /// Round the scale itself to the activation dtype before scaling (torch's type promotion of a
  /// 0-dim or Python-float scale); needs a scale mode other than none.
  bool scale_in_model_dtype = false;
};

/// How index-K values become cache elements (SPEC 2-3).
struct IndexQuant {
  IndexLayout layout = IndexLayout::kFlat;
  DType flat_dtype = DType::kBF16;  ///< kFlat: bf16 or fp8 e4m3 (no scale)
  bool ue8m0 = false;               ///< kBlockScale: round the scale up to a power of two
  /// kBlockScale: s = amax / 448 or amax * fl(1 / 448); anything but kDivide needs kBlockScale.
  BlockScaleFormula blockscale_scale = BlockScaleFormula::kDivide;
};

/// SPEC 3 strided views of the K/V caches, in elements. All zero: the layout's dense tensors.
/// Otherwise every buffer of K/V (K and V, or the one KV tensor) is a view that puts element
/// (b, o, h, kv, d) at offset + b*block + o*token + h*head + kv*kv_part + d, and its body is
/// offset + (count x stride) of its outermost axis (kv_axes) elements; every other byte is
/// padding, which a write leaves untouched and a read never uses. kv_part is V's place in the
/// one-tensor layouts (packed: hd, the second half of the row; split: the [nb, 2, ...] axis). In
/// nhd and hnd it is 0 for separate K and V tensors, or V's distance from K when both are views of
/// one allocation ([2, nb, ...] as vLLM allocates it: kv_part at least K's whole extent). `offset`
/// puts the view at a sub-range of a larger pool.
struct KvStrides {
  std::int64_t block = 0, token = 0, head = 0, kv_part = 0, offset = 0;
  bool dense() const {
    return block == 0 && token == 0 && head == 0 && kv_part == 0 && offset == 0;
  }
  bool operator==(const KvStrides&) const = default;
};

/// The member of `strides` that holds `axis`'s stride (kDim, always 1: none).
std::int64_t* stride_field(KvStrides& strides, KvAxis axis);
/// The stride of `axis` (kDim: 1).
std::int64_t stride_of(const KvStrides& strides, KvAxis axis);
/// The number of indices along `axis`: num_blocks, block_size, num_kv_heads, 2 (K and V), head_dim.
std::int64_t axis_count(const CacheGeometry& geometry, KvAxis axis);
/// "block,token,head,kv_part,offset" (kvoracle --kv-strides, case-file metadata); "dense" for the
/// dense view. parse_kv_strides throws InvalidInput naming `field` on anything else.
std::string kv_strides_text(const KvStrides& strides);
KvStrides parse_kv_strides(std::string_view text, const std::string& field);

/// SPEC 3 strided view of the index-K cache; all zero: the layout's dense tensor. flat
/// ([nb, bs, index_dim]): element (b, o, d) at offset + b*block + o*token + d, in elements of the
/// flat dtype. blockscale: block b's bytes (its bs*index_dim values, then its scales, packed as
/// SPEC 3 lays them out) start at byte offset + b*block, and token is 0. The body is offset +
/// nb*block elements (bytes); every other byte is padding. vLLM's hybrid allocator hands layers
/// such views of one page pool.
struct IndexStrides {
  std::int64_t block = 0, token = 0, offset = 0;
  bool dense() const { return block == 0 && token == 0 && offset == 0; }
  bool operator==(const IndexStrides&) const = default;
};

/// "block,token,offset" (kvoracle --index-strides, case-file metadata); "dense" for the dense
/// view. parse_index_strides throws InvalidInput naming `field` on anything else.
std::string index_strides_text(const IndexStrides& strides);
IndexStrides parse_index_strides(std::string_view text, const std::string& field);

/// Everything that fixes the bytes a model's cache writes produce, apart from the inputs.
struct ModelConfig {
  std::vector<LayerKind> layers;  ///< the layer mix, e.g. parse_layer_mix("3D57S")
  CacheGeometry geometry;
  DType act_dtype = DType::kBF16;
  KvLayout layout = KvLayout::kNhd;
  KvQuant kv;
  IndexQuant index;
  SlotMode slot_mode = SlotMode::kStrict;
  SlotType slot_type = SlotType::kI64;
  bool separate_index_slots = false;  ///< index-K written through its own slot mapping (vLLM M3)
  KvStrides kv_strides;               ///< SPEC 3 strided K/V views; dense by default
  IndexStrides index_strides;         ///< SPEC 3 strided index-K view; dense by default
};

/// The index-K view's strides with the dense ones filled in: flat: elements; blockscale: bytes
/// (token: index_dim, the value rows' stride inside a block).
IndexStrides index_view(const ModelConfig& config);
/// Bytes of one blockscale block (SPEC 3): bs*index_dim fp8 values, then bs*(index_dim/128) fp32
/// scales.
std::int64_t blockscale_block_bytes(const CacheGeometry& geometry);
/// Bytes of one unit of the index-K strides: 1 for blockscale, else the flat dtype's size.
std::int64_t index_stride_bytes(const ModelConfig& config);

/// Whether K and V live in one buffer (BufferKind::kKv): the one-tensor layouts (packed, split),
/// and nhd / hnd given as views of one allocation (a strided view with kv_part != 0: V kv_part
/// elements after K, vLLM's [2, nb, ...]).
bool kv_in_one_tensor(const ModelConfig& config);
/// The axes of the K/V buffer, outermost first: the layout's (kLayoutAxes), with kKv outermost
/// for nhd / hnd as views of one allocation.
LayoutAxes kv_axes(const ModelConfig& config);

/// The MiniMax-M3-like default mix: 60 layers, the first 3 dense.
inline constexpr std::string_view kDefaultLayerMix = "3D57S";

/// Parses a layer mix: a run-length pattern ("3D57S") or one letter per layer ("DDDSSS"); D dense,
/// S sparse, case-insensitive. Throws InvalidInput naming the character position on a malformed
/// pattern, an empty one, or one of more than 100000 layers.
std::vector<LayerKind> parse_layer_mix(std::string_view pattern);

/// The run-length spelling of a mix ("3D57S").
std::string format_layer_mix(std::span<const LayerKind> layers);

/// Throws InvalidInput naming the first inconsistent field: non-positive sizes, head_dim not a
/// multiple of 8, index_dim not a multiple of 128 with blockscale (of 8 otherwise), a
/// non-activation act_dtype, a flat index dtype other than bf16/fp8_e4m3, an empty layer mix, a
/// cache too large to address with the slot type, strided views whose elements would share a byte
/// (kv_strides.<axis>: each stride at least the extent of the axes inside it; index_strides.<axis>
/// likewise, token 0 with blockscale).
void validate(const ModelConfig& config);

/// Throws InvalidInput unless every scale is finite and > 0 and there is one (or, per head, nkv).
void validate_scales(const ModelConfig& config, std::span<const float> scales,
                     std::string_view field);

/// Short one-line description of a configuration, for reports ("layout=nhd kv=fp8_e4m3 ...").
std::string describe(const ModelConfig& config);

}  // namespace kvo::spec
