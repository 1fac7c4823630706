#include "kvo/spec/config.hpp"

#include <cctype>
#include <cmath>
#include <limits>
#include <sstream>

#include "kvo/spec/outcome.hpp"

namespace kvo::spec {
namespace {

constexpr std::size_t kMaxLayers = 100000;

std::string quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

void require(bool ok, std::string_view field, std::int64_t value, std::string_view why) {
  if (!ok) throw InvalidInput(std::string(field), -1, std::to_string(value), std::string(why));
}

}  // namespace

std::vector<LayerKind> parse_layer_mix(std::string_view pattern) {
  if (pattern.empty())
    throw InvalidInput("layers", -1, "\"\"", "a layer mix needs at least one layer");
  std::vector<LayerKind> layers;
  std::size_t i = 0;
  while (i < pattern.size()) {
    const std::size_t start = i;
    std::uint64_t count = 1;
    if (std::isdigit(static_cast<unsigned char>(pattern[i]))) {
      count = 0;
      while (i < pattern.size() && std::isdigit(static_cast<unsigned char>(pattern[i]))) {
        count = count * 10 + static_cast<std::uint64_t>(pattern[i] - '0');
        if (count > kMaxLayers) {
          throw InvalidInput("layers", static_cast<std::int64_t>(start), quoted(pattern),
                             "run length at character " + std::to_string(start) + " exceeds " +
                                 std::to_string(kMaxLayers) + " layers");
        }
        ++i;
      }
      if (count == 0) {
        throw InvalidInput("layers", static_cast<std::int64_t>(start), quoted(pattern),
                           "zero run length at character " + std::to_string(start));
      }
      if (i == pattern.size()) {
        throw InvalidInput("layers", static_cast<std::int64_t>(i), quoted(pattern),
                           "run length at the end of the pattern without a layer letter (D or S)");
      }
    }
    const char c = static_cast<char>(std::toupper(static_cast<unsigned char>(pattern[i])));
    LayerKind kind;
    if (c == 'D') {
      kind = LayerKind::kDense;
    } else if (c == 'S') {
      kind = LayerKind::kSparse;
    } else {
      throw InvalidInput("layers", static_cast<std::int64_t>(i), quoted(pattern),
                         std::string("character ") + std::to_string(i) + " is '" + pattern[i] +
                             "', expected a digit, D (dense) or S (sparse)");
    }
    ++i;
    if (layers.size() + count > kMaxLayers) {
      throw InvalidInput("layers", static_cast<std::int64_t>(start), quoted(pattern),
                         "more than " + std::to_string(kMaxLayers) + " layers");
    }
    layers.insert(layers.end(), count, kind);
  }
  return layers;
}

std::string format_layer_mix(std::span<const LayerKind> layers) {
  std::string out;
  std::size_t i = 0;
  while (i < layers.size()) {
    std::size_t j = i;
    while (j < layers.size() && layers[j] == layers[i]) ++j;
    if (j - i > 1) out += std::to_string(j - i);
    out += layers[i] == LayerKind::kDense ? 'D' : 'S';
    i = j;
  }
  return out;
}

void validate(const ModelConfig& c) {
  const CacheGeometry& g = c.geometry;
  require(g.num_blocks >= 1, "num_blocks", g.num_blocks, "must be >= 1");
  require(g.block_size >= 1, "block_size", g.block_size, "must be >= 1");
  require(g.num_kv_heads >= 1, "num_kv_heads", g.num_kv_heads, "must be >= 1");
  require(g.head_dim >= 8 && g.head_dim % 8 == 0, "head_dim", g.head_dim,
          "must be a positive multiple of 8");
  if (c.layers.empty())
    throw InvalidInput("layers", -1, "\"\"", "a layer mix needs at least one layer");
  bool any_sparse = false;
  for (LayerKind k : c.layers) any_sparse |= k == LayerKind::kSparse;
  if (any_sparse) {
    if (c.index.layout == IndexLayout::kBlockScale) {
      require(g.index_dim >= kScaleGroup && g.index_dim % kScaleGroup == 0, "index_dim",
              g.index_dim, "must be a positive multiple of 128 with the blockscale index layout");
    } else {
      require(g.index_dim >= 8 && g.index_dim % 8 == 0, "index_dim", g.index_dim,
              "must be a positive multiple of 8");
      if (c.index.flat_dtype != DType::kBF16 && c.index.flat_dtype != DType::kFp8E4M3) {
        throw InvalidInput("index_dtype", -1, std::string(name_of(c.index.flat_dtype)),
                           "the flat index-K cache holds bf16 or fp8_e4m3");
      }
    }
  }
  if (c.kv.scale_in_model_dtype && c.kv.scale_mode == ScaleMode::kNone) {
    throw InvalidInput("scale_in_model_dtype", -1, "true",
                       "rounds a scale, but scale mode none applies no scale (set a scale mode)");
  }
  if (c.index.blockscale_scale != BlockScaleFormula::kDivide &&
      c.index.layout != IndexLayout::kBlockScale) {
    throw InvalidInput("blockscale_scale", -1, std::string(name_of(c.index.blockscale_scale)),
                       "applies to the blockscale index layout only (index layout is " +
                           std::string(name_of(c.index.layout)) + ")");
  }
  if (!facts(c.act_dtype).is_activation) {
    throw InvalidInput("act_dtype", -1, std::string(name_of(c.act_dtype)),
                       "activations are f32, bf16 or fp16");
  }
  // Every element offset of the largest buffer must fit in int64 with room for guards; and with
  // int32 slots every slot value must be representable.
  const double elems = static_cast<double>(g.num_blocks) * static_cast<double>(g.block_size) *
                       static_cast<double>(g.num_kv_heads) * static_cast<double>(g.head_dim) * 2.0;
  if (elems > static_cast<double>(std::numeric_limits<std::int64_t>::max() / 8)) {
    throw InvalidInput("num_blocks", -1, std::to_string(g.num_blocks),
                       "cache too large to address");
  }
  if (c.slot_type == SlotType::kI32 &&
      static_cast<double>(g.num_blocks) * static_cast<double>(g.block_size) >
          static_cast<double>(std::numeric_limits<std::int32_t>::max())) {
    throw InvalidInput("num_blocks", -1, std::to_string(g.num_blocks),
                       "num_blocks * block_size exceeds the int32 slot range");
  }
}

void validate_scales(const ModelConfig& c, std::span<const float> scales, std::string_view field) {
  const std::size_t want =
      c.kv.per_head_scale ? static_cast<std::size_t>(c.geometry.num_kv_heads) : 1;
  if (scales.size() != want) {
    throw InvalidInput(std::string(field), -1, std::to_string(scales.size()) + " values",
                       "expected " + std::to_string(want) +
                           (c.kv.per_head_scale ? " (one per KV head)" : " (per tensor)"));
  }
  for (std::size_t i = 0; i < scales.size(); ++i) {
    if (!std::isfinite(scales[i]) || !(scales[i] > 0.0f)) {
      std::ostringstream v;
      v << scales[i];
      throw InvalidInput(std::string(field), static_cast<std::int64_t>(i), v.str(),
                         "a scale must be finite and > 0");
    }
  }
}

std::string describe(const ModelConfig& c) {
  std::ostringstream s;
  const CacheGeometry& g = c.geometry;
  s << "layers=" << format_layer_mix(c.layers) << " blocks=" << g.num_blocks
    << " block_size=" << g.block_size << " nkv=" << g.num_kv_heads << " hd=" << g.head_dim
    << " index_dim=" << g.index_dim << " act=" << name_of(c.act_dtype)
    << " layout=" << name_of(c.layout) << " kv=" << name_of(c.kv.cache_dtype);
  if (is_fp8(c.kv.cache_dtype)) s << " sat=" << name_of(c.kv.saturation);
  s << " scale=" << name_of(c.kv.scale_mode) << (c.kv.per_head_scale ? "/head" : "/tensor");
  if (c.kv.via_model_dtype) s << " via_model_dtype";
  if (c.kv.scale_in_model_dtype) s << " scale_in_model_dtype";
  s << " index=" << name_of(c.index.layout);
  if (c.index.layout == IndexLayout::kFlat) s << ":" << name_of(c.index.flat_dtype);
  if (c.index.layout == IndexLayout::kBlockScale && c.index.ue8m0) s << ":ue8m0";
  if (c.index.blockscale_scale != BlockScaleFormula::kDivide)
    s << ":" << name_of(c.index.blockscale_scale);
  s << " slots=" << name_of(c.slot_type) << "/" << name_of(c.slot_mode);
  if (c.separate_index_slots) s << " index_slots=separate";
  return s.str();
}

}  // namespace kvo::spec
