// The write-mode axes of mode detection: one row per mode of SPEC 2-3.
#include "kv_modes.hpp"

#include <array>
#include <string>

#include "kvo/spec/types.hpp"

namespace kvo::oracle {
namespace {

using spec::ModelConfig;

/// What the configuration chosen so far says about whether an axis can change a byte of a part.
struct CaseFacts {
  const ModelConfig& config;
  KvPart part;
  bool negative_slots;
  bool sparse_layers;
  bool computed_values;  ///< values cast are computed (the dense insert's k), not the inputs
};

/// One mode: its name, value names, and how a value index reads and writes the configuration and
/// the overrides. Values are listed with the contract's default first.
struct KvModeRow {
  const char* name;
  KvModeScope scope;
  std::vector<std::string> (*values)();
  void (*set)(ModelConfig&, std::size_t);
  void (*pin)(CaseOverrides&, std::size_t);
  std::size_t (*given)(const CaseOverrides&);  ///< the override's index, or kNotGiven
  bool (*matters)(const CaseFacts&);
};

constexpr std::size_t kNotGiven = ~std::size_t{0};

template <class E>
std::vector<std::string> enum_values() {
  std::vector<std::string> v;
  for (const auto& e : spec::EnumInfo<E>::kNames) v.emplace_back(e.name);
  return v;
}
std::vector<std::string> bool_values() { return {"false", "true"}; }

template <class E>
E enum_at(std::size_t i) {
  return spec::EnumInfo<E>::kNames[i].value;
}
template <class E>
std::size_t enum_index(const std::optional<E>& v) {
  if (!v) return kNotGiven;
  for (std::size_t i = 0; i < spec::EnumInfo<E>::kNames.size(); ++i) {
    if (spec::EnumInfo<E>::kNames[i].value == *v) return i;
  }
  return kNotGiven;
}
std::size_t bool_index(const std::optional<bool>& v) { return v ? (*v ? 1 : 0) : kNotGiven; }

bool kv_part(const CaseFacts& f) { return f.part == KvPart::kKvBuffers; }
bool index_part(const CaseFacts& f) { return f.part == KvPart::kIndexBuffer && f.sparse_layers; }

/// The saturation mode reaches the K/V cast and the flat index-K cast (blockscale saturates).
bool fp8_cast(const CaseFacts& f) {
  return kv_part(f) ? spec::is_fp8(f.config.kv.cache_dtype)
                    : index_part(f) && f.config.index.layout == spec::IndexLayout::kFlat &&
                          spec::is_fp8(f.config.index.flat_dtype);
}
/// Rounding to the activation dtype changes nothing for f32 activations, nor for unscaled inputs
/// (already in the activation dtype).
bool value_rounding(const CaseFacts& f) {
  return kv_part(f) && f.config.act_dtype != spec::DType::kF32 &&
         (f.config.kv.scale_mode != spec::ScaleMode::kNone || f.computed_values);
}
bool scale_rounding(const CaseFacts& f) {
  return kv_part(f) && f.config.act_dtype != spec::DType::kF32 &&
         f.config.kv.scale_mode != spec::ScaleMode::kNone;
}
bool blockscale(const CaseFacts& f) {
  return index_part(f) && f.config.index.layout == spec::IndexLayout::kBlockScale;
}

// The table (SPEC 7's list for writes): saturation, scale mode, via_model_dtype,
// scale_in_model_dtype, blockscale scale, ue8m0, slot mode.
const std::array<KvModeRow, 7> kKvModes{{
    {"saturation", KvModeScope::kWriteAndDense, enum_values<spec::Saturation>,
     [](ModelConfig& c, std::size_t v) { c.kv.saturation = enum_at<spec::Saturation>(v); },
     [](CaseOverrides& o, std::size_t v) { o.saturation = enum_at<spec::Saturation>(v); },
     [](const CaseOverrides& o) { return enum_index(o.saturation); }, fp8_cast},
    {"scale_mode", KvModeScope::kWriteAndDense, enum_values<spec::ScaleMode>,
     [](ModelConfig& c, std::size_t v) { c.kv.scale_mode = enum_at<spec::ScaleMode>(v); },
     [](CaseOverrides& o, std::size_t v) { o.scale_mode = enum_at<spec::ScaleMode>(v); },
     [](const CaseOverrides& o) { return enum_index(o.scale_mode); }, kv_part},
    {"via_model_dtype", KvModeScope::kWriteAndDense, bool_values,
     [](ModelConfig& c, std::size_t v) { c.kv.via_model_dtype = v != 0; },
     [](CaseOverrides& o, std::size_t v) { o.via_model_dtype = v != 0; },
     [](const CaseOverrides& o) { return bool_index(o.via_model_dtype); }, value_rounding},
    {"scale_in_model_dtype", KvModeScope::kWriteAndDense, bool_values,
     [](ModelConfig& c, std::size_t v) { c.kv.scale_in_model_dtype = v != 0; },
     [](CaseOverrides& o, std::size_t v) { o.scale_in_model_dtype = v != 0; },
     [](const CaseOverrides& o) { return bool_index(o.scale_in_model_dtype); }, scale_rounding},
    {"blockscale_scale", KvModeScope::kWriteOnly, enum_values<spec::BlockScaleFormula>,
     [](ModelConfig& c, std::size_t v) {
       if (c.index.layout == spec::IndexLayout::kBlockScale)
         c.index.blockscale_scale = enum_at<spec::BlockScaleFormula>(v);
     },
     [](CaseOverrides& o, std::size_t v) {
       o.blockscale_scale = enum_at<spec::BlockScaleFormula>(v);
     },
     [](const CaseOverrides& o) { return enum_index(o.blockscale_scale); }, blockscale},
    {"ue8m0", KvModeScope::kWriteOnly, bool_values,
     [](ModelConfig& c, std::size_t v) { c.index.ue8m0 = v != 0; },
     [](CaseOverrides& o, std::size_t v) { o.ue8m0 = v != 0; },
     [](const CaseOverrides& o) { return bool_index(o.ue8m0); }, blockscale},
    {"slot_mode", KvModeScope::kWriteAndDense, enum_values<spec::SlotMode>,
     [](ModelConfig& c, std::size_t v) { c.slot_mode = enum_at<spec::SlotMode>(v); },
     [](CaseOverrides& o, std::size_t v) { o.slot_mode = enum_at<spec::SlotMode>(v); },
     [](const CaseOverrides& o) { return enum_index(o.slot_mode); },
     [](const CaseFacts& f) { return f.negative_slots && (kv_part(f) || index_part(f)); }},
}};

/// The rows of `op`, in table order.
std::vector<const KvModeRow*> rows_of(spec::Op op) {
  std::vector<const KvModeRow*> rows;
  for (const KvModeRow& r : kKvModes) {
    if (op == spec::Op::kWrite || r.scope == KvModeScope::kWriteAndDense) rows.push_back(&r);
  }
  return rows;
}

}  // namespace

std::vector<ModeAxis> kv_mode_axes(spec::Op op) {
  std::vector<ModeAxis> axes;
  for (const KvModeRow* r : rows_of(op)) axes.push_back(ModeAxis{r->name, r->values()});
  return axes;
}

bool kv_mode_possible(spec::Op op, const ModeChoice& choice) {
  spec::ModelConfig c;
  const auto rows = rows_of(op);
  for (std::size_t a = 0; a < rows.size(); ++a) rows[a]->set(c, choice[a]);
  return !(c.kv.scale_in_model_dtype && c.kv.scale_mode == spec::ScaleMode::kNone);
}

Overrides pin_kv_modes(spec::Op op, const Overrides& overrides, ModeChoice& pinned) {
  Overrides o = overrides;
  pinned.clear();
  for (const KvModeRow* r : rows_of(op)) {
    const std::size_t given = r->given(o.write);
    pinned.push_back(given == kNotGiven ? 0 : given);
    r->pin(o.write, pinned.back());
  }
  return o;
}

spec::ModelConfig with_kv_modes(spec::Op op, spec::ModelConfig config, const ModeChoice& choice) {
  const auto rows = rows_of(op);
  for (std::size_t a = 0; a < rows.size(); ++a) rows[a]->set(config, choice[a]);
  return config;
}

bool in_part(KvPart part, spec::BufferKind buffer) {
  return (buffer == spec::BufferKind::kIndexK) == (part == KvPart::kIndexBuffer);
}

ModeChoice relevant_kv_modes(spec::Op op, KvPart part, const spec::ModelConfig& config,
                             ModeChoice choice, bool negative_slots) {
  const spec::ModelConfig chosen = with_kv_modes(op, config, choice);
  bool sparse = false;
  for (spec::LayerKind k : chosen.layers) sparse |= k == spec::LayerKind::kSparse;
  const CaseFacts facts{chosen, part, negative_slots, sparse && op == spec::Op::kWrite,
                        op == spec::Op::kDense};
  const auto rows = rows_of(op);
  for (std::size_t a = 0; a < rows.size(); ++a) {
    if (!rows[a]->matters(facts)) choice[a] = 0;
  }
  return choice;
}

bool has_negative_slots(const std::vector<const spec::SlotMapping*>& mappings) {
  for (const spec::SlotMapping* m : mappings) {
    for (std::int64_t s : m->slots) {
      if (s < 0) return true;
    }
  }
  return false;
}

}  // namespace kvo::oracle
