#pragma once
// Internal to the oracle: each op's driver, defined in its own source (op_<name>.cpp) and listed
// once in op_registry.cpp; and the reductions the drivers build their shrinking from.

#include <array>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kvo/oracle/op_driver.hpp"

namespace kvo::oracle {

const OpDriver& write_driver();
const OpDriver& dense_driver();
const OpDriver& indexer_driver();
const OpDriver& attention_driver();

/// Runs `subject_run(actual, verdict)` (returning an Outcome) on a copy of `poisoned`, classifying
/// what it throws (run_guarded); the caches it wrote are kept in `keep` when given.
template <class Caches, class Fn>
Verdict run_on_copy(const Caches& poisoned, Caches* keep, Fn&& subject_run) {
  Verdict v;
  Caches actual = poisoned;
  v.outcome = run_guarded([&] { return subject_run(actual, v); }, v.report);
  if (keep != nullptr) *keep = std::move(actual);
  return v;
}

/// The first lines of an explanation: the case (seed and sizes), the subject with how it is judged,
/// and the op.
inline void explain_header(std::ostringstream& s, const PreparedCase& c, const Subject& subject,
                           spec::Op op) {
  s << "case seed 0x" << std::hex << c.seed() << std::dec << ": " << c.describe() << "\nsubject "
    << subject.name() << " ("
    << (subject.ordering() == spec::Ordering::kCanonical ? "canonical: exact"
                                                         : "foreign: bounded, tie-aware")
    << "), op " << spec::name_of(op) << "\n";
}

/// Appends the verdict to an explanation: its diff, or why the subject did not complete. True when
/// the subject ran (pass or mismatch), so that the details of its answer may follow.
inline bool explain_verdict(std::ostringstream& s, const Verdict& v) {
  const bool ran = v.outcome == spec::Outcome::kPass || v.outcome == spec::Outcome::kMismatch;
  if (!ran) s << "the subject did not complete: ";
  s << v.report << "\n";
  return ran;
}

/// A reduction that sets `field` of the overrides' `part` to `value`, unless the field is set
/// already (the caller fixed it, or an earlier reduction did: shrinking never changes either).
template <class Part, class T>
Reduction set_override(std::string what, Part Overrides::*part, std::optional<T> Part::*field,
                       T value) {
  return {std::move(what), [part, field, value](Overrides& o) {
            std::optional<T>& f = (o.*part).*field;
            if (f) return false;
            f = value;
            return true;
          }};
}

// Case files (case_tensors.hpp): the pieces the drivers share. Defined in case_codec.cpp.

/// "input.layer.3." : the prefix of layer `l`'s tensors of one part (input, cache, expected.cache).
std::string layer_prefix(const char* part, std::size_t l);

/// A write call's tensors under `prefix`: k, v [rows, nkv, hd] (act dtype), index_k [rows,
/// index_dim] on sparse layers, slot_mapping [T] (slot type), index_slot_mapping [T] on sparse
/// layers with separate index slots, k_scale, v_scale [1 or nkv] F32.
void put_layer_write(TensorWriter& out, const std::string& prefix, const spec::ModelConfig& config,
                     const spec::LayerWrite& w);
/// The same back, validated (spec::validate_write; its errors name the tensor under `prefix`).
spec::LayerWrite take_layer_write(TensorReader& in, const std::string& prefix,
                                  const spec::ModelConfig& config, spec::LayerKind kind,
                                  std::int64_t rows, std::int64_t tokens);

/// Runs `validate` and renames the field of the InvalidInput it throws to `prefix` + field, so
/// an inconsistent input names the file's tensor.
template <class Fn>
void validate_as(const std::string& prefix, Fn&& validate) {
  try {
    validate();
  } catch (const spec::InvalidInput& e) {
    // e.what() is "invalid input: <field>[i] = <value>: <why>"; the file's name replaces the field.
    const std::string what = e.what();
    throw spec::InvalidInput("tensor '" + prefix + e.field() + "'", e.index(), e.value(),
                             what.substr(what.find(": ", what.find(" = ")) + 2));
  }
}

/// Coverage (issue 14) from a driver's one table of rare conditions, rows {CaseCondition info;
/// bool (*reached)(const Case&)}: OpDriver::conditions() and reached() over the rows `keep` admits.
struct EveryRow {
  template <class Row>
  constexpr bool operator()(const Row&) const {
    return true;
  }
};
template <class Row, std::size_t N, class Keep = EveryRow>
std::vector<CaseCondition> table_conditions(const std::array<Row, N>& table, Keep keep = {}) {
  std::vector<CaseCondition> out;
  for (const Row& row : table)
    if (keep(row)) out.push_back(row.info);
  return out;
}
template <class Row, std::size_t N, class Case, class Keep = EveryRow>
std::vector<bool> table_reached(const std::array<Row, N>& table, const Case& c, Keep keep = {}) {
  std::vector<bool> out;
  for (const Row& row : table)
    if (keep(row)) out.push_back(row.reached(c));
  return out;
}

/// A result's tensors by name (copied, so a subject built from them owns its answer).
std::map<std::string, std::vector<std::uint8_t>> tensors_by_name(const TensorSet& result);

/// Stored `expected.<name>` against the reference's answer `computed` (require_reference_answer).
void check_expected(TensorReader& in, const std::string& name, TensorDType dtype,
                    const std::vector<std::int64_t>& shape,
                    const std::vector<std::uint8_t>& computed);

/// Each buffer of `computed` against the stored `expected.` + `prefix` + buffer name.
void check_expected_caches(TensorReader& in, const std::string& prefix,
                           const spec::LayerCaches& computed);

/// Copies the result's `prefix` + buffer name tensors into `caches`' buffers.
void fill_caches(const std::map<std::string, std::vector<std::uint8_t>>& result,
                 const std::string& prefix, spec::LayerCaches& caches);

/// A mode-detection axis whose values are E's names, in its table's order (the contract's default
/// first).
template <class E>
ModeAxis names_axis(const char* name) {
  ModeAxis axis{name, {}};
  for (const auto& entry : spec::EnumInfo<E>::kNames) axis.values.emplace_back(entry.name);
  return axis;
}

}  // namespace kvo::oracle
