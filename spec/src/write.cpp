#include "kvo/spec/write.hpp"

#include <limits>
#include <unordered_map>

#include "kvo/spec/outcome.hpp"

namespace kvo::spec {
namespace {

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void check_tensor(const HostTensor& t, std::string_view field, DType dtype,
                  const std::vector<std::int64_t>& want_tail, std::int64_t min_rows) {
  const std::string f(field);
  if (t.dtype != dtype) {
    throw InvalidInput(f + ".dtype", -1, std::string(name_of(t.dtype)),
                       "expected the activation dtype " + std::string(name_of(dtype)));
  }
  if (t.shape.size() != want_tail.size() + 1) {
    throw InvalidInput(f + ".shape", -1, shape_string(t.shape),
                       "expected " + std::to_string(want_tail.size() + 1) + " dimensions");
  }
  for (std::size_t i = 0; i < want_tail.size(); ++i) {
    if (t.shape[i + 1] != want_tail[i]) {
      throw InvalidInput(
          f + ".shape", static_cast<std::int64_t>(i + 1), std::to_string(t.shape[i + 1]),
          "expected " + std::to_string(want_tail[i]) + " (shape " + shape_string(t.shape) + ")");
    }
  }
  if (t.shape[0] < min_rows) {
    throw InvalidInput(
        f + ".shape", 0, std::to_string(t.shape[0]),
        "fewer source rows than the " + std::to_string(min_rows) + " tokens of the slot mapping");
  }
  const std::int64_t want_bytes = t.numel() * static_cast<std::int64_t>(dtype_bytes(dtype));
  if (static_cast<std::int64_t>(t.bytes.size()) != want_bytes) {
    throw InvalidInput(
        f + ".bytes", -1, std::to_string(t.bytes.size()),
        "expected " + std::to_string(want_bytes) + " bytes for shape " + shape_string(t.shape));
  }
}

}  // namespace

void validate_slots(const SlotMapping& m, std::int64_t capacity, SlotMode mode,
                    std::string_view field) {
  const std::string f(field);
  std::unordered_map<std::int64_t, std::size_t> first_use;
  first_use.reserve(m.slots.size());
  for (std::size_t t = 0; t < m.slots.size(); ++t) {
    const std::int64_t s = m.slots[t];
    const auto ti = static_cast<std::int64_t>(t);
    if (m.type == SlotType::kI32 && (s < std::numeric_limits<std::int32_t>::min() ||
                                     s > std::numeric_limits<std::int32_t>::max())) {
      throw InvalidInput(f, ti, std::to_string(s), "does not fit the int32 slot type");
    }
    if (s >= capacity) {
      throw InvalidInput(f, ti, std::to_string(s),
                         "out of range: the cache has " + std::to_string(capacity) +
                             " slots (num_blocks * block_size)");
    }
    if (s < 0) {
      if (mode == SlotMode::kLegacyWrap && s < -capacity) {
        throw InvalidInput(f, ti, std::to_string(s),
                           "below -" + std::to_string(capacity) + ": torch indexing would raise");
      }
      continue;  // padding, or a wrapped slot whose collisions are last-writer-wins
    }
    const auto [it, inserted] = first_use.emplace(s, t);
    if (!inserted) {
      throw InvalidInput(f, ti, std::to_string(s),
                         "duplicate slot: token " + std::to_string(it->second) +
                             " writes it too, and the GPU write order is undefined");
    }
  }
}

void validate_write(const ModelConfig& c, const LayerWrite& w) {
  validate(c);
  const CacheGeometry& g = c.geometry;
  const auto tokens = static_cast<std::int64_t>(w.slots.slots.size());
  if (w.slots.type != c.slot_type) {
    throw InvalidInput("slot_mapping.type", -1, std::string(name_of(w.slots.type)),
                       "the model's slot type is " + std::string(name_of(c.slot_type)));
  }
  check_tensor(w.k, "k", c.act_dtype, {g.num_kv_heads, g.head_dim}, tokens);
  check_tensor(w.v, "v", c.act_dtype, {g.num_kv_heads, g.head_dim}, tokens);
  validate_scales(c, w.k_scale, "k_scale");
  validate_scales(c, w.v_scale, "v_scale");
  validate_slots(w.slots, g.capacity(), c.slot_mode, "slot_mapping");
  if (w.kind == LayerKind::kSparse) {
    check_tensor(w.index_k, "index_k", c.act_dtype, {g.index_dim}, tokens);
    if (c.separate_index_slots) {
      if (static_cast<std::int64_t>(w.index_slots.slots.size()) != tokens) {
        throw InvalidInput("index_slot_mapping", -1,
                           std::to_string(w.index_slots.slots.size()) + " slots",
                           "expected one per token (" + std::to_string(tokens) + ")");
      }
      if (w.index_slots.type != c.slot_type) {
        throw InvalidInput("index_slot_mapping.type", -1, std::string(name_of(w.index_slots.type)),
                           "the model's slot type is " + std::string(name_of(c.slot_type)));
      }
      validate_slots(w.index_slots, g.capacity(), c.slot_mode, "index_slot_mapping");
    }
  } else if (!w.index_k.bytes.empty()) {
    throw InvalidInput("index_k", -1, "a tensor", "a dense layer writes no index-K");
  }
}

}  // namespace kvo::spec
