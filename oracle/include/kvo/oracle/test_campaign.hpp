#pragma once
/// \file test_campaign.hpp
/// The campaign behind the GoogleTest helper (testing.hpp), with no GoogleTest in it: one campaign
/// over a user's subjects, turned into a verdict a test asserts on. A pass means that every
/// (subject, op) asked for was judged on at least one case and none failed; a subject that could
/// not run here, or declared every case unsupported, is not a pass. The message of a failure is
/// the SPEC 7 report: the campaign's summary, each failing subject's first failure (case seed,
/// first mismatch, reproduce line), the line that replays it inside this test, and the case shrunk
/// to a small one that still fails.

#include <cstdint>
#include <string>

#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/subject.hpp"

namespace kvo::oracle::testing {

/// Environment variables a test run reads, so that a failure replays, or a campaign widens,
/// without recompiling (values decimal or 0x-hex, as parse_u64 reads them).
inline constexpr const char* kCaseSeedVariable = "KVO_CASE_SEED";  ///< run exactly this case
inline constexpr const char* kSeedVariable = "KVO_SEED";           ///< the campaign seed
inline constexpr const char* kCasesVariable = "KVO_CASES";         ///< how many random cases
/// The shrinking steps that turn the test's overrides into a shrunk case's: "OP:i,j,..." (indices
/// into driver_of(OP).reductions(), applied in order), printed with KVO_CASE_SEED by a shrunk
/// failure's reproduce line.
inline constexpr const char* kCaseReductionsVariable = "KVO_CASE_REDUCTIONS";

/// The verdict's name when no failure was found but some (subject, op) asked for was not judged.
inline constexpr const char* kNotJudged = "not judged";

struct TestVerdict {
  bool passed = false;
  std::uint64_t seed = 0;  ///< the campaign seed the run used (after the environment)
  std::string message;     ///< the report: see the file comment; a pass's summary too
  /// "pass", an outcome's name (the worst case's), or kNotJudged.
  std::string outcome;
  /// False when the campaign did not start: its options rejected (outcome invalid-input, the
  /// caller's input named) or its set-up failed (failed-to-run).
  bool ran = true;
};

/// Applies KVO_CASE_SEED, KVO_SEED, KVO_CASES and KVO_CASE_REDUCTIONS (when set) to `options`;
/// InvalidInput naming the variable when one is malformed (KVO_CASES must be >= 1; a reduction
/// index must name one of its op's reductions).
void apply_test_environment(CheckOptions& options);

/// The command that reruns test `test_name` ("Suite.Test"; empty: the whole binary) of this
/// GoogleTest binary: "<this binary> --gtest_filter=Suite.Test".
std::string gtest_rerun(const std::string& test_name);

/// Runs the campaign of `options` (after apply_test_environment) over `subjects` (those named by
/// options.subjects; all when empty) and judges it. Never throws: options the campaign rejects
/// (an unknown subject, inconsistent overrides) become a failed verdict that names them.
/// `rerun` is the command that reruns this test (gtest_rerun; the Python package's pytest line):
/// every reproduce line the report prints reruns it (CheckOptions::test_rerun): a failing case's
/// `KVO_CASE_SEED=S <rerun>`, a shrunk one's with KVO_CASE_REDUCTIONS too.
/// `shrink`: a failing subject's first mismatch is shrunk to a small case that still fails.
TestVerdict run_test_campaign(SubjectList& subjects, CheckOptions options, const std::string& rerun,
                              bool shrink = true);

}  // namespace kvo::oracle::testing
