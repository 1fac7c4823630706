#pragma once
/// \file check.hpp
/// The property campaign behind `kvoracle check`: N random cases from a printed seed. Op `write`: a
/// write case through the reference and every selected write subject over every layer of its mix,
/// diffed byte for byte. Ops `indexer` and `attention`: a read case through every selected read
/// subject, diffed exactly (canonical subjects) or against the float64 truth, tie-aware (foreign
/// ones). Failures keep the case seed and a one-line command that replays exactly that case.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvo/oracle/dense_case.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/read_subject.hpp"
#include "kvo/oracle/subject.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {

struct CheckOptions {
  std::uint64_t seed = 0x6B766F72ull;      ///< campaign seed
  std::int64_t cases = 200;                ///< random cases
  std::optional<std::uint64_t> case_seed;  ///< run exactly this one case instead
  double time_budget_s = 0.0;              ///< stop drawing new cases after this long (0: none)
  CaseOverrides overrides;
  ReadOverrides read_overrides;       ///< read-side dimensions (shared ones come from overrides)
  std::vector<std::string> subjects;  ///< names; empty = every available subject
  std::vector<std::string> ops{"write", "indexer", "attention", "dense"};
  /// Sharding (GoogleTest's convention): case i runs when i % total_shards == shard_index.
  std::int64_t total_shards = 1, shard_index = 0;
  bool fail_fast = false;  ///< stop at the first case that does not pass
};

/// The read-side dimensions of a campaign: the read overrides, with the dimensions shared with the
/// write side (--block-size, --head-dim, --num-kv-heads, --index-dim, --kv-dtype, --layout,
/// --index-layout) taken from the write overrides where the read ones leave them open.
ReadOverrides effective_read_overrides(const CheckOptions& options);

/// Reads GTEST_TOTAL_SHARDS and GTEST_SHARD_INDEX into the options (when both are set); throws
/// InvalidInput when either is malformed or the index is out of range.
void apply_shard_environment(CheckOptions& options);

/// The ops `kvoracle check --ops` takes.
inline const std::vector<std::string> kCheckOps{"write", "indexer", "attention", "dense"};

/// Throws InvalidInput naming `field`[i] = the first entry of `given` that is not in `known`
/// ("unknown <what>; known: a|b|c").
void require_known(const char* field, const char* what, const std::vector<std::string>& given,
                   const std::vector<std::string>& known);

struct SubjectSummary {
  std::string name;
  std::string op;       ///< write, indexer or attention
  std::string skipped;  ///< non-empty: not run, and why
  std::int64_t cases = 0;
  std::int64_t counts[5] = {0, 0, 0, 0, 0};   ///< per spec::Outcome
  std::string first_failure;                  ///< full report of the first non-pass case
  std::optional<std::uint64_t> failing_seed;  ///< the seed of that case

  std::int64_t count(spec::Outcome o) const { return counts[static_cast<int>(o)]; }
};

struct CheckReport {
  std::uint64_t seed = 0;
  std::int64_t cases_run = 0;
  std::int64_t bytes_compared = 0;
  double seconds = 0.0;
  std::vector<SubjectSummary> subjects;
  spec::Outcome worst = spec::Outcome::kPass;

  /// The one-screen summary printed by the CLI.
  std::string summary() const;
};

/// The one-line command that replays case `case_seed` of `op` with the same overrides and subject.
std::string repro_command(const CheckOptions& options, std::uint64_t case_seed,
                          const std::string& subject, const std::string& op);

using Progress = std::function<void(std::int64_t, std::int64_t)>;

/// Runs the campaign over the write and read subjects (selected by options.subjects; an unknown
/// name or op is InvalidInput). `progress(done, total)` is called after each case when given.
CheckReport run_check(const CheckOptions& options,
                      std::vector<std::unique_ptr<WriteSubject>>& write_subjects,
                      std::vector<std::unique_ptr<ReadSubject>>& read_subjects,
                      const Progress& progress = {});

/// Also the dense-insert subjects (op `dense`).
CheckReport run_check(const CheckOptions& options,
                      std::vector<std::unique_ptr<WriteSubject>>& write_subjects,
                      std::vector<std::unique_ptr<ReadSubject>>& read_subjects,
                      std::vector<std::unique_ptr<DenseSubject>>& dense_subjects,
                      const Progress& progress = {});

/// The write subjects only.
CheckReport run_check(const CheckOptions& options,
                      std::vector<std::unique_ptr<WriteSubject>>& subjects,
                      const Progress& progress = {});

}  // namespace kvo::oracle
