// The write-mode axes of mode detection: the mode rows of the write dimensions (SPEC 2-3).
#include "kv_modes.hpp"

#include <functional>
#include <string>
#include <type_traits>

#include "kvo/oracle/write_dimensions.hpp"
#include "kvo/spec/types.hpp"

namespace kvo::oracle {
namespace {

using spec::ModelConfig;

/// One mode axis, type-erased from its row of the write dimensions (write_dimensions.hpp): its
/// value names (the contract's default first) and how a value index sets the configuration and
/// the overrides.
struct KvModeRow {
  std::string name;
  ModeScope scope;
  std::vector<std::string> values;
  std::function<void(ModelConfig&, std::size_t)> set;  ///< the configuration admitting it
  std::function<void(CaseOverrides&, std::size_t)> pin;
  std::function<std::size_t(const CaseOverrides&)> given;  ///< the override's index, or kNotGiven
  bool (*reaches)(const ModeFacts&);
};

constexpr std::size_t kNotGiven = ~std::size_t{0};

/// A mode's values: its enum's names in table order, or false/true.
template <class T>
std::vector<T> mode_values() {
  if constexpr (std::is_same_v<T, bool>) {
    return {false, true};
  } else {
    std::vector<T> v;
    for (const auto& e : spec::EnumInfo<T>::kNames) v.push_back(e.value);
    return v;
  }
}

/// The mode rows of the write dimensions, in table order.
const std::vector<KvModeRow>& kv_modes() {
  static const std::vector<KvModeRow> rows = [] {
    std::vector<KvModeRow> out;
    visit_write_dimensions([&](const DimensionInfo& d, auto member, auto set) {
      if constexpr (!std::is_null_pointer_v<decltype(set)>) {
        using T = typename std::remove_reference_t<decltype(CaseOverrides{}.*member)>::value_type;
        if (d.mode == ModeScope::kNotAMode) return;
        if constexpr (std::is_same_v<T, bool> || std::is_enum_v<T>) {
          const std::vector<T> values = mode_values<T>();
          KvModeRow row{std::string(d.name), d.mode, {}, {}, {}, {}, d.reaches};
          for (const T& v : values) row.values.push_back(dimension_text(v));
          const auto admitted = d.admitted;
          row.set = [values, set, admitted](ModelConfig& c, std::size_t i) {
            if (admitted == nullptr || admitted(c)) set(c, values[i]);
          };
          row.pin = [values, member](CaseOverrides& o, std::size_t i) { o.*member = values[i]; };
          row.given = [values, member](const CaseOverrides& o) {
            const auto& v = o.*member;
            if (!v) return kNotGiven;
            for (std::size_t i = 0; i < values.size(); ++i)
              if (values[i] == *v) return i;
            return kNotGiven;
          };
          out.push_back(std::move(row));
        }
      }
    });
    return out;
  }();
  return rows;
}

/// The rows of `op`, in table order.
std::vector<const KvModeRow*> rows_of(spec::Op op) {
  std::vector<const KvModeRow*> rows;
  for (const KvModeRow& r : kv_modes()) {
    if (op == spec::Op::kWrite || r.scope == ModeScope::kWriteAndDense) rows.push_back(&r);
  }
  return rows;
}

}  // namespace

std::vector<ModeAxis> kv_mode_axes(spec::Op op) {
  std::vector<ModeAxis> axes;
  for (const KvModeRow* r : rows_of(op)) axes.push_back(ModeAxis{r->name, r->values});
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
  const ModeFacts facts{chosen, part == KvPart::kKvBuffers, negative_slots,
                        sparse && op == spec::Op::kWrite, op == spec::Op::kDense};
  const auto rows = rows_of(op);
  for (std::size_t a = 0; a < rows.size(); ++a) {
    if (!rows[a]->reaches(facts)) choice[a] = 0;
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
