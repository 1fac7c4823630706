// The reference write: SPEC section 4, read line by line.
#include "kvo/reference/layer_write.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::reference {
namespace {

using spec::BufferKind;

/// SPEC 3: slot < 0 is padding (nothing written), unless legacy_wrap, where it indexes from the end
/// as torch does (-1 is the last slot of the last block). Returns -1 for "write nothing".
std::int64_t target_slot(std::int64_t slot, std::int64_t capacity, spec::SlotMode mode) {
  if (slot >= 0) return slot;
  return mode == spec::SlotMode::kLegacyWrap ? slot + capacity : -1;
}

spec::CacheBuffer& buffer(spec::LayerCaches& caches, BufferKind kind) {
  spec::CacheBuffer* b = caches.find(kind);
  if (b == nullptr) {
    throw spec::InvalidInput("caches", -1, std::string(spec::name_of(kind)),
                             "the layer has no such buffer");
  }
  return *b;
}

}  // namespace

spec::HostTensor cast_tensor(const spec::HostTensor& t, spec::DType dtype) {
  spec::HostTensor out;
  out.dtype = dtype;
  out.shape = t.shape;
  const std::size_t eb = spec::dtype_bytes(dtype);
  out.bytes.resize(static_cast<std::size_t>(t.numel()) * eb);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    store_code(encode(source_value(t, i), dtype, spec::Saturation::kSatFinite), dtype,
               &out.bytes[static_cast<std::size_t>(i) * eb]);
  }
  return out;
}

const std::uint32_t* unscaled_kv_codes(spec::DType src, const spec::KvQuant& q, spec::DType act) {
  if (q.scale_mode != spec::ScaleMode::kNone || spec::dtype_bytes(src) != 2) return nullptr;
  using Key = std::tuple<spec::DType, spec::DType, spec::DType, spec::Saturation, bool>;
  static std::mutex mutex;
  static std::map<Key, std::vector<std::uint32_t>> tables;  // nodes stay put: pointers stay valid
  const std::lock_guard<std::mutex> lock(mutex);
  std::vector<std::uint32_t>& table =
      tables[Key{src, act, q.cache_dtype, q.saturation, q.via_model_dtype}];
  if (table.empty()) {
    table.resize(std::size_t{1} << 16);
    for (std::uint32_t c = 0; c < table.size(); ++c)
      table[c] = quantize_kv(decode(c, src), 1.0f, q, act);
  }
  return table.data();
}

void write_layer(const spec::ModelConfig& config, const spec::LayerWrite& w,
                 spec::LayerCaches& caches) {
  spec::validate_write(config, w);
  const PagedCacheLayout layout(config);
  check_layer_caches(layout, w.kind, caches);
  const spec::CacheGeometry& g = config.geometry;
  const auto num_tokens = static_cast<std::int64_t>(w.slots.slots.size());
  const spec::DType kv_dtype = config.kv.cache_dtype;
  const auto kv_bytes = static_cast<std::int64_t>(spec::dtype_bytes(kv_dtype));

  for (std::int64_t t = 0; t < num_tokens; ++t) {
    // K and V: each element quantized on its own and stored at the layout's offset.
    const std::int64_t slot =
        target_slot(w.slots.slots[static_cast<std::size_t>(t)], g.capacity(), config.slot_mode);
    if (slot >= 0) {
      const std::int64_t b = slot / g.block_size;
      const std::int64_t o = slot % g.block_size;
      for (int kv = 0; kv < 2; ++kv) {
        const spec::HostTensor& src = kv == 0 ? w.k : w.v;
        const std::vector<float>& scales = kv == 0 ? w.k_scale : w.v_scale;
        const std::uint32_t* table = unscaled_kv_codes(src.dtype, config.kv, config.act_dtype);
        std::uint8_t* dst = buffer(caches, layout.kv_buffer(kv)).body();
        for (std::int64_t h = 0; h < g.num_kv_heads; ++h) {
          const float s = scales[config.kv.per_head_scale ? static_cast<std::size_t>(h) : 0];
          // SPEC 3: d is the innermost, contiguous dimension of every layout and strided view,
          // so element d of the head row is kv_element(kv, b, o, h, 0) + d.
          std::uint8_t* row = dst + layout.kv_element(kv, b, o, h, 0) * kv_bytes;
          store_kv_codes(src, (t * g.num_kv_heads + h) * g.head_dim, g.head_dim, s, config.kv,
                         config.act_dtype, table, row);
        }
      }
    }
    if (w.kind != spec::LayerKind::kSparse) continue;

    // Index-K: through the index slot mapping when the model has one.
    const std::int64_t raw_index_slot = config.separate_index_slots
                                            ? w.index_slots.slots[static_cast<std::size_t>(t)]
                                            : w.slots.slots[static_cast<std::size_t>(t)];
    const std::int64_t islot = target_slot(raw_index_slot, g.capacity(), config.slot_mode);
    if (islot < 0) continue;
    const std::int64_t b = islot / g.block_size;
    const std::int64_t o = islot % g.block_size;
    std::uint8_t* dst = buffer(caches, BufferKind::kIndexK).body();
    // SPEC 3: d is the innermost, contiguous term of an index-K value's offset in both layouts, so
    // value d of the row is at index_value_byte(b, o, 0) + d elements.
    std::uint8_t* row = dst + layout.index_value_byte(b, o, 0);
    if (config.index.layout == spec::IndexLayout::kFlat) {
      const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(config.index.flat_dtype));
      for (std::int64_t d = 0; d < g.index_dim; ++d) {
        const float x = source_value(w.index_k, t * g.index_dim + d);
        const std::uint32_t code = encode(x, config.index.flat_dtype, config.kv.saturation);
        store_code(code, config.index.flat_dtype, row + d * eb);
      }
    } else {
      // Block scale: per token and per 128-element group, one fp32 scale and 128 fp8 codes.
      std::vector<float> group(static_cast<std::size_t>(spec::kScaleGroup));
      std::vector<std::uint8_t> codes(static_cast<std::size_t>(spec::kScaleGroup));
      for (std::int64_t gi = 0; gi < g.index_dim / spec::kScaleGroup; ++gi) {
        for (std::int64_t i = 0; i < spec::kScaleGroup; ++i) {
          group[static_cast<std::size_t>(i)] =
              source_value(w.index_k, t * g.index_dim + gi * spec::kScaleGroup + i);
        }
        const float s = quantize_group_blockscale(group, config.index, codes);
        std::copy(codes.begin(), codes.end(), row + gi * spec::kScaleGroup);
        store_code(bits_of(s), spec::DType::kF32, dst + layout.index_scale_byte(b, o, gi));
      }
    }
  }
}

bool admits_several(const spec::ModelConfig& config, const spec::LayerWrite& w) {
  if (config.kv.scale_mode == spec::ScaleMode::kDivApprox) return true;
  if (config.slot_mode != spec::SlotMode::kLegacyWrap) return false;
  // A race needs two tokens of one mapping on one slot, which only a wrapped slot can make.
  const std::int64_t cap = config.geometry.capacity();
  for (const spec::SlotMapping* m : {&w.slots, &w.index_slots}) {
    std::vector<bool> used(static_cast<std::size_t>(cap), false);
    for (std::int64_t raw : m->slots) {
      const std::int64_t slot = target_slot(raw, cap, config.slot_mode);
      if (slot < 0) continue;
      if (used[static_cast<std::size_t>(slot)]) return true;
      used[static_cast<std::size_t>(slot)] = true;
    }
  }
  return false;
}

std::vector<std::uint32_t> admissible_codes(const spec::ModelConfig& config,
                                            const spec::LayerWrite& w, const CacheElement& e) {
  const spec::CacheGeometry& g = config.geometry;
  const std::int64_t slot = e.block * g.block_size + e.offset;
  const bool index = e.buffer == BufferKind::kIndexK;
  if (index && w.kind != spec::LayerKind::kSparse) return {};
  const spec::SlotMapping& m = index && config.separate_index_slots ? w.index_slots : w.slots;
  std::vector<std::uint32_t> codes;
  // SPEC 3: every token that lands on the slot is a possible writer (a legacy-wrap race keeps any
  // one of them, element by element); SPEC 2: each writer's code may be any of its admissible ones.
  for (std::size_t t = 0; t < m.slots.size(); ++t) {
    if (target_slot(m.slots[t], g.capacity(), config.slot_mode) != slot) continue;
    const auto ti = static_cast<std::int64_t>(t);
    if (!index) {
      const spec::HostTensor& src = e.kv == 0 ? w.k : w.v;
      const std::vector<float>& scales = e.kv == 0 ? w.k_scale : w.v_scale;
      const float s = scales[config.kv.per_head_scale ? static_cast<std::size_t>(e.head) : 0];
      const float x = source_value(src, (ti * g.num_kv_heads + e.head) * g.head_dim + e.dim);
      for (std::uint32_t c : admissible_kv_codes(x, s, config.kv, config.act_dtype))
        codes.push_back(c);
    } else if (config.index.layout == spec::IndexLayout::kFlat) {
      codes.push_back(encode(source_value(w.index_k, ti * g.index_dim + e.dim),
                             config.index.flat_dtype, config.kv.saturation));
    } else {
      const std::int64_t gi = e.is_scale ? e.group : e.dim / spec::kScaleGroup;
      std::vector<float> group(static_cast<std::size_t>(spec::kScaleGroup));
      std::vector<std::uint8_t> q(static_cast<std::size_t>(spec::kScaleGroup));
      for (std::int64_t i = 0; i < spec::kScaleGroup; ++i) {
        group[static_cast<std::size_t>(i)] =
            source_value(w.index_k, ti * g.index_dim + gi * spec::kScaleGroup + i);
      }
      const float s = quantize_group_blockscale(group, config.index, q);
      codes.push_back(e.is_scale ? bits_of(s)
                                 : q[static_cast<std::size_t>(e.dim % spec::kScaleGroup)]);
    }
  }
  std::sort(codes.begin(), codes.end());
  codes.erase(std::unique(codes.begin(), codes.end()), codes.end());
  return codes;
}

}  // namespace kvo::reference
