#pragma once
// Internal to the oracle: each op's driver, defined in its own source (op_<name>.cpp) and listed
// once in op_registry.cpp; and the reductions the drivers build their shrinking from.

#include <optional>
#include <sstream>
#include <utility>

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

/// A reduction that sets `field` of the overrides' `part` to `value`.
template <class Part, class T>
Reduction set_override(std::string what, Part Overrides::*part, std::optional<T> Part::*field,
                       T value) {
  return {std::move(what), [part, field, value](Overrides& o) {
            std::optional<T>& f = (o.*part).*field;
            if (f && *f == value) return false;
            f = value;
            return true;
          }};
}

}  // namespace kvo::oracle
