#include "kvo/spec/config.hpp"

#include <array>
#include <cctype>
#include <charconv>
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

/// SPEC 3 strided views: the element type's addresses nest, inner axes first, so no two elements
/// share a byte; kv_part as the layout has it; the body addressable.
void validate_kv_strides(const ModelConfig& c) {
  const KvStrides& s = c.kv_strides;
  const CacheGeometry& g = c.geometry;
  const LayoutAxes la = kv_axes(c);
  const std::string layout(name_of(c.layout));
  require(s.offset >= 0, "kv_strides.offset", s.offset, "must be >= 0");
  require(s.kv_part >= 0, "kv_strides.kv_part", s.kv_part, "must be >= 0");
  if (kv_in_one_tensor(c.layout) && la.axes[static_cast<std::size_t>(la.rank - 2)] == KvAxis::kKv) {
    require(s.kv_part == g.head_dim, "kv_strides.kv_part", s.kv_part,
            "must be head_dim = " + std::to_string(g.head_dim) + ": layout " + layout +
                " keeps K and V as the two halves of one row");
  }
  std::int64_t extent = g.head_dim;  // elements spanned by the axes inside the current one
  for (int i = la.rank - 2; i >= 0; --i) {
    const KvAxis axis = la.axes[static_cast<std::size_t>(i)];
    const std::int64_t stride = stride_of(s, axis);
    const std::string field = "kv_strides." + std::string(name_of(axis));
    require(stride >= extent, field, stride,
            "below " + std::to_string(extent) + ", the extent of the axes inside it in layout " +
                layout + ": two elements would share a byte");
    require(static_cast<double>(stride) * static_cast<double>(axis_count(g, axis)) < 0x1p46, field,
            stride, "the view would span more than 2^46 elements");
    extent += (axis_count(g, axis) - 1) * stride;
  }
}

/// SPEC 3 strided index-K view: flat rows nest inside blocks; blockscale blocks keep their packed
/// layout (token 0) and do not overlap.
void validate_index_strides(const ModelConfig& c) {
  const IndexStrides& s = c.index_strides;
  const CacheGeometry& g = c.geometry;
  const bool block_scale = c.index.layout == IndexLayout::kBlockScale;
  require(s.offset >= 0, "index_strides.offset", s.offset, "must be >= 0");
  std::int64_t extent = g.index_dim;  // elements (bytes) spanned by the axes inside the block's
  if (block_scale) {
    require(s.token == 0, "index_strides.token", s.token,
            "must be 0: a blockscale block's value rows and scales are packed (SPEC 3)");
    extent = blockscale_block_bytes(g);
  } else {
    require(s.token >= extent, "index_strides.token", s.token,
            "below index_dim = " + std::to_string(extent) + ": two elements would share a byte");
    extent += (g.block_size - 1) * s.token;
  }
  require(s.block >= extent, "index_strides.block", s.block,
          "below " + std::to_string(extent) + ", the extent of a block" +
              (block_scale ? " (bytes)" : "") + ": two elements would share a byte");
  require(static_cast<double>(s.block) * static_cast<double>(g.num_blocks) < 0x1p46,
          "index_strides.block", s.block, "the view would span more than 2^46 elements");
}

/// `n` comma-separated integers (strides), or "dense" (all zero).
template <std::size_t N>
std::array<std::int64_t, N> parse_strides(std::string_view text, const std::string& field,
                                          std::string_view names) {
  std::array<std::int64_t, N> v{};
  if (text == "dense") return v;
  const std::string expected =
      "expected dense or " + std::string(names) + " (" + std::to_string(N) + " integers)";
  std::size_t n = 0, at = 0;
  while (true) {
    const std::size_t comma = text.find(',', at);
    const std::string_view part =
        text.substr(at, comma == std::string_view::npos ? text.npos : comma - at);
    std::int64_t x = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), x);
    if (n == v.size() || part.empty() || ec != std::errc() || end != part.data() + part.size())
      throw InvalidInput(field, -1, quoted(text), expected);
    v[n++] = x;
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  if (n != v.size()) throw InvalidInput(field, -1, quoted(text), expected);
  return v;
}

}  // namespace

std::int64_t blockscale_block_bytes(const CacheGeometry& g) {
  return g.block_size * g.index_dim + g.block_size * (g.index_dim / kScaleGroup) * 4;
}

IndexStrides index_view(const ModelConfig& c) {
  if (!c.index_strides.dense()) {
    IndexStrides s = c.index_strides;
    if (c.index.layout == IndexLayout::kBlockScale) s.token = c.geometry.index_dim;
    return s;
  }
  const CacheGeometry& g = c.geometry;
  if (c.index.layout == IndexLayout::kBlockScale) {
    return {blockscale_block_bytes(g), g.index_dim, 0};
  }
  return {g.block_size * g.index_dim, g.index_dim, 0};
}

std::int64_t index_stride_bytes(const ModelConfig& c) {
  if (c.index.layout == IndexLayout::kBlockScale) return 1;
  return static_cast<std::int64_t>(dtype_bytes(c.index.flat_dtype));
}

std::string index_strides_text(const IndexStrides& s) {
  if (s.dense()) return "dense";
  return std::to_string(s.block) + "," + std::to_string(s.token) + "," + std::to_string(s.offset);
}

IndexStrides parse_index_strides(std::string_view text, const std::string& field) {
  const auto v = parse_strides<3>(text, field,
                                  "block,token,offset (flat: elements; blockscale: "
                                  "bytes, token 0)");
  return {v[0], v[1], v[2]};
}

bool kv_in_one_tensor(const ModelConfig& c) {
  return kv_in_one_tensor(c.layout) || c.kv_strides.kv_part != 0;
}

LayoutAxes kv_axes(const ModelConfig& c) {
  LayoutAxes la = layout_axes(c.layout);
  if (kv_in_one_tensor(c.layout) || c.kv_strides.kv_part == 0) return la;
  // nhd / hnd as views of one allocation: [2, <the layout's axes>].
  for (int i = la.rank; i > 0; --i) {
    la.axes[static_cast<std::size_t>(i)] = la.axes[static_cast<std::size_t>(i - 1)];
  }
  la.axes[0] = KvAxis::kKv;
  ++la.rank;
  return la;
}

std::int64_t* stride_field(KvStrides& s, KvAxis axis) {
  switch (axis) {
    case KvAxis::kBlock:
      return &s.block;
    case KvAxis::kToken:
      return &s.token;
    case KvAxis::kHead:
      return &s.head;
    case KvAxis::kKv:
      return &s.kv_part;
    case KvAxis::kDim:
      break;
  }
  return nullptr;
}

std::int64_t stride_of(const KvStrides& s, KvAxis axis) {
  KvStrides copy = s;
  const std::int64_t* field = stride_field(copy, axis);
  return field == nullptr ? 1 : *field;
}

std::int64_t axis_count(const CacheGeometry& g, KvAxis axis) {
  switch (axis) {
    case KvAxis::kBlock:
      return g.num_blocks;
    case KvAxis::kToken:
      return g.block_size;
    case KvAxis::kHead:
      return g.num_kv_heads;
    case KvAxis::kKv:
      return 2;
    case KvAxis::kDim:
      return g.head_dim;
  }
  return 0;
}

std::string kv_strides_text(const KvStrides& s) {
  if (s.dense()) return "dense";
  return std::to_string(s.block) + "," + std::to_string(s.token) + "," + std::to_string(s.head) +
         "," + std::to_string(s.kv_part) + "," + std::to_string(s.offset);
}

KvStrides parse_kv_strides(std::string_view text, const std::string& field) {
  const auto v = parse_strides<5>(text, field, "block,token,head,kv_part,offset (elements)");
  return {v[0], v[1], v[2], v[3], v[4]};
}

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
  if (!format_of(c.act_dtype).is_activation) {
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
  if (!c.kv_strides.dense()) validate_kv_strides(c);
  if (any_sparse && !c.index_strides.dense()) validate_index_strides(c);
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
  if (!c.kv_strides.dense()) s << " kv_strides=" << kv_strides_text(c.kv_strides);
  if (!c.index_strides.dense()) s << " index_strides=" << index_strides_text(c.index_strides);
  return s.str();
}

}  // namespace kvo::spec
