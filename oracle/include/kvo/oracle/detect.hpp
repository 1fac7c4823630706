#pragma once
/// \file detect.hpp
/// Mode detection (SPEC 7): which of the contract's modes a subject implements. The subject is run
/// once per case, told the pinned modes (the overrides', else the contract's defaults); its answer
/// is then judged under every possible combination of the op's modes (OpDriver::mode_axes). A
/// combination that fails one case is out for the campaign, so after the first few cases only the
/// survivors are judged: detection costs a few campaigns, not the product of the modes. The result
/// is every combination that matched every case, or, when none did, the closest one (most cases
/// matched, then the smallest mismatch) with its first mismatch and the command that shows it.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/op_driver.hpp"
#include "kvo/oracle/subject.hpp"
#include "kvo/spec/op.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {

/// One combination's record over the campaign.
struct ModeCombination {
  ModeChoice choice;
  std::int64_t cases_matched = 0;  ///< before its first mismatch
  std::int64_t mismatch_size = 0;  ///< of that mismatch
  std::optional<std::uint64_t> failed_seed;
  std::string first_mismatch;  ///< the verdict's report of that case
};

/// Mode detection of one subject on one op.
struct DetectResult {
  std::string subject;
  spec::Op op = spec::Op::kWrite;
  std::vector<ModeAxis> axes;
  ModeChoice told;  ///< the pinned modes the subject was run with
  std::int64_t cases_run = 0;
  /// Of them, cases the subject declared unsupported (spec::Unsupported: a configuration it does
  /// not implement, e.g. a strided cache): skipped, judged under no combination.
  std::int64_t cases_unsupported = 0;
  std::string first_unsupported;           ///< the first such case's seed and reason
  std::int64_t combinations = 0;           ///< possible combinations of the axes
  std::int64_t judgements = 0;             ///< answers judged (distinct mode settings per case)
  std::vector<ModeCombination> matched;    ///< matched every case, tightest first
  std::optional<ModeCombination> closest;  ///< when none matched
  spec::Outcome run_outcome = spec::Outcome::kPass;  ///< the subject's own runs
  std::string run_error;
  std::string reproduce;  ///< one-line command for the closest combination's first mismatch

  /// "saturation=satfinite scale_mode=divide ..."
  std::string describe(const ModeChoice& choice) const;
  /// The report `kvoracle check --detect-modes` prints.
  std::string report() const;
  /// kPass when some combination matched every case it answered; kMismatch when none did; the
  /// subject's own failure otherwise; kUnsupported when it answered no case.
  spec::Outcome outcome() const;
};

/// Detects the modes of `subject_name` on every op of options.ops that it implements and that
/// has modes. options.cases cases from options.seed (or the one options.case_seed). Throws
/// InvalidInput for an unknown subject or one that implements none of the ops with modes.
std::vector<DetectResult> detect_modes(const CheckOptions& options, SubjectList& subjects,
                                       const std::string& subject_name);

}  // namespace kvo::oracle
