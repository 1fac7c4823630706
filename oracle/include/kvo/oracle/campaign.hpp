#pragma once
/// \file campaign.hpp
/// The one campaign: subjects x ops over cases from a printed seed, behind `kvoracle check`, the
/// mutation score, shrinking and explain. Each case is drawn and answered by the reference once per
/// case kind (op_driver.hpp) and judged against every selected subject that implements the op;
/// recording, sharding, fail-fast, the time budget and the reports (summary, JUnit, JSON) live here
/// once. Failures keep the case seed and a one-line command that replays exactly that case.

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kvo/gpu/device.hpp"
#include "kvo/oracle/op_driver.hpp"
#include "kvo/oracle/reference_tier.hpp"
#include "kvo/oracle/subject.hpp"
#include "kvo/spec/op.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {

/// The most device lanes a campaign takes (CheckOptions::device_lanes).
inline constexpr std::int64_t kMostDeviceLanes = 16;

struct CheckOptions {
  std::uint64_t seed = 0x6B766F72ull;      ///< campaign seed
  std::int64_t cases = 200;                ///< random cases
  std::optional<std::uint64_t> case_seed;  ///< run exactly this one case instead
  double time_budget_s = 0.0;              ///< stop drawing new cases after this long (0: none)
  Overrides overrides;
  std::vector<std::string> subjects;  ///< names; empty = every available subject
  std::vector<spec::Op> ops = all_ops();
  /// Sharding (GoogleTest's convention): case i runs when i % total_shards == shard_index.
  std::int64_t total_shards = 1, shard_index = 0;
  bool fail_fast = false;  ///< stop at the first case that does not pass
  /// Cases worked on at once (0: one per hardware thread): drawn, answered by the reference and
  /// judged by the concurrent subjects (Subject::concurrent) on worker threads; the report is the
  /// same for any number.
  std::int64_t jobs = 0;
  /// Who answers the cases (issue 15): the CPU reference, or the GPU tier (the canonical CUDA
  /// writes, kGpuTierAnswerers) checked against the CPU reference on the first
  /// `tier_sample_first` cases, then one in `tier_sample_every`, and every case where a subject
  /// fails (judged again against the CPU reference's answer); a disagreement stops the campaign,
  /// failed to run.
  ReferenceTier tier = ReferenceTier::kCpu;
  std::int64_t tier_sample_first = 8, tier_sample_every = 64;
  /// The tier's resident path (OpDriver::judge_on_device): an op whose judged subjects all write
  /// on the device, as its answerer does, has its cases generated, written and compared on the
  /// device; false (`kvoracle check --staged`) stages every case through the host.
  bool tier_resident = true;
  /// Host threads that judge the resident path's cases at once, each with its own CUDA stream and
  /// memory pool (a case is a chain of small launches and waits that leaves the GPU mostly idle):
  /// the cases of gigabytes (OpDriver::device_heavy) on the first, the others on the rest in
  /// turn; verdicts recorded in case order, so the report is the same for any number. Used only
  /// where every device subject and answerer is Subject::device_concurrent; 1: the main thread
  /// judges them, one after another. At most kMostDeviceLanes.
  std::int64_t device_lanes = 8;
  /// A resident case whose device copies (OpDriver::device_bytes) pass this many bytes runs on
  /// the device alone, every thread's idle device memory given back first; 0: half the device's
  /// memory (a test lowers it so that its cases of a few GB run alone).
  std::int64_t resident_alone_bytes = 0;
  /// The lanes that judge the cases of gigabytes: 1 (lane 0 alone), or 2 (lanes 0 and 1, lane 1
  /// taking those of at most half resident_alone_bytes, so that two such cases' launches and
  /// waits overlap while their copies fit side by side). Used where more lanes than that run.
  std::int64_t heavy_lanes = 1;
  /// How every host thread of the process waits for the device while the lanes judge
  /// (gpu::HostWait; kAuto: as CUDA chooses); set for the process, before the first case.
  gpu::HostWait host_wait = gpu::HostWait::kAuto;
  /// The tier's answerers by op, in place of kGpuTierAnswerers' subjects (a test plants a
  /// divergent one); each must implement its op and be available.
  std::map<spec::Op, Subject*> tier_answerers;
  /// Set by a test (testing::run_test_campaign): the command that reruns it. Every reproduce line
  /// then reruns the test with the case's variables (test_campaign.hpp), since the command line
  /// replays only its own subjects; empty: the `kvoracle check` line.
  std::string test_rerun;
  /// With test_rerun: the shrinking steps (OpDriver::reductions indices, in order) that made these
  /// overrides from the test's own, printed as KVO_CASE_REDUCTIONS so that the line replays them.
  std::vector<std::size_t> test_reductions;
};

/// The number of jobs `jobs` asks for: itself when positive, one per hardware thread for 0 (at
/// least 1); InvalidInput naming "jobs" when negative.
std::int64_t campaign_jobs(std::int64_t jobs);

/// The campaign's shard (GoogleTest's convention: case i runs when i % total == index): the flags'
/// values when given, else the first scheduler's variables that are set: GTEST_SHARD_INDEX and
/// GTEST_TOTAL_SHARDS; a Slurm job array's SLURM_ARRAY_TASK_ID (less SLURM_ARRAY_TASK_MIN, over
/// SLURM_ARRAY_TASK_STEP) of SLURM_ARRAY_TASK_COUNT; a Kubernetes Indexed Job's
/// JOB_COMPLETION_INDEX, its count from the flag or GTEST_TOTAL_SHARDS. Nothing set: no change.
/// InvalidInput names the variable (or flag) when one is malformed, out of range, or a count is
/// missing.
void apply_shard_environment(CheckOptions& options,
                             std::optional<std::int64_t> total_flag = std::nullopt,
                             std::optional<std::int64_t> index_flag = std::nullopt);

/// A 64-bit seed as a user writes it, decimal or 0x-hex, every character a digit of its base (the
/// one rule for the command line's seeds and the test helper's KVO_* variables); anything else,
/// or a value past 2^64 - 1, is InvalidInput naming `field`.
std::uint64_t parse_u64(const std::string& text, const char* field);

/// Throws InvalidInput naming `field`[i] = the first entry of `given` that is not in `known`
/// ("unknown <what>; known: a|b|c").
void require_known(const char* field, const char* what, const std::vector<std::string>& given,
                   const std::vector<std::string>& known);

/// One subject on one op: what a campaign or a replay judges. `skipped` says why it cannot run
/// here (empty when it can).
struct SubjectOp {
  Subject* subject = nullptr;
  spec::Op op = spec::Op::kWrite;
  std::string skipped;
};

/// The pairs a run judges: for each op of `ops` in registry order, each subject (selected by
/// `names`; empty selects all) that implements it, in list order. An unknown name, or a named
/// subject that implements none of `ops`, is InvalidInput (otherwise a run would pass without
/// having judged it).
std::vector<SubjectOp> select_subject_ops(SubjectList& subjects,
                                          const std::vector<std::string>& names,
                                          const std::vector<spec::Op>& ops);

/// Throws spec::FailedToRun, naming each pair and why, when a subject named in `names` cannot run
/// here (Subject::unavailable_reason) for an op of `ops`: a command that names its subjects judges
/// every one of them or fails to run, never passes having judged fewer. Nothing named: nothing to
/// require (every available subject runs, the others are listed as skipped).
void require_named_subjects_run(SubjectList& subjects, const std::vector<std::string>& names,
                                const std::vector<spec::Op>& ops);

/// The cases of one subject on one op that did not pass for one reason (failure_class_of): how
/// many, and the first of them (campaign index and case seed), so that every cause of a
/// campaign's failures is seen and can be replayed, not only the first failure's.
struct FailureClassCount {
  std::string name;  ///< "mismatch: a write into a guard band", "failed-to-run: ...", ...
  std::int64_t cases = 0;
  std::int64_t first_case = -1;
  std::uint64_t first_seed = 0;
};

/// One row of the summary: a subject on an op.
struct SubjectSummary {
  std::string name;
  spec::Op op = spec::Op::kWrite;
  std::string skipped;  ///< non-empty: not run, and why
  std::int64_t cases = 0;
  std::int64_t counts[5] = {0, 0, 0, 0, 0};   ///< per spec::Outcome
  std::string first_failure;                  ///< full report of the first non-pass case
  std::optional<std::uint64_t> failing_seed;  ///< the seed of that case
  /// A merged report's later failures (kvoracle report merge): the first failure of each other
  /// shard that failed, in case order.
  std::vector<std::string> more_failures;
  /// Every case that did not pass, by class, in the order the classes first came up (mismatches,
  /// failures to run, invalid input and unsupported cases alike).
  std::vector<FailureClassCount> failure_classes;
  /// SPEC principle 4: per planted bug class the subject's declared profile cannot see, the cases
  /// where it could not (Verdict::blind_spots), whatever their outcome.
  std::map<std::string, std::int64_t> blind_spots;

  std::int64_t count(spec::Outcome o) const { return counts[static_cast<int>(o)]; }
  /// Counts `cases` cases under class `name`, the first of them case `index` (seed `seed`).
  void add_failure_class(const std::string& name, std::int64_t index, std::uint64_t seed,
                         std::int64_t cases = 1);
};

/// How often a campaign's cases reached one rare condition of an op (CaseCondition).
struct CoverageRow {
  spec::Op op = spec::Op::kWrite;
  std::string condition, means;
  std::int64_t cases = 0;        ///< the op's cases drawn
  std::int64_t reached = 0;      ///< of them, those that reached the condition
  std::int64_t first_case = -1;  ///< campaign index of the first case that did (-1: none)
};

struct CheckReport {
  std::uint64_t seed = 0;
  std::int64_t total_shards = 1, shard_index = 0;  ///< the shard run (a merged report: 1, 0)
  std::int64_t cases_run = 0;
  std::int64_t bytes_compared = 0;
  double seconds = 0.0;
  std::vector<SubjectSummary> subjects;
  spec::Outcome worst = spec::Outcome::kPass;
  /// Per op run and condition of its table, how often the campaign's cases reached it.
  std::vector<CoverageRow> coverage;
  /// The reference tier: its name, the answerer of each op it answers ("write: cuda-fused"),
  /// the cases whose answers it gave, the cases the CPU reference answered, the cases on which
  /// the tier was checked against the CPU reference, and a disagreement (empty: none).
  ReferenceTier tier = ReferenceTier::kCpu;
  std::string tier_answerers;
  std::int64_t tier_cases = 0, cpu_cases = 0, tier_checks = 0;
  /// Of the tier's cases, those judged on the device (OpDriver::judge_on_device); the sampled
  /// cases whose answerer's device run was checked against the CPU reference
  /// (OpDriver::check_on_device); the seconds both took (the summary says them).
  std::int64_t resident_cases = 0, resident_checks = 0;
  double resident_seconds = 0.0;
  /// The device lanes that judged them (CheckOptions::device_lanes where it applied, else 1); with
  /// several, resident_seconds adds up the lanes' busy time. Summary only.
  std::int64_t resident_lanes = 1;
  /// The device allocations past 1 GiB the resident cases asked for (a huge cache's copies), and
  /// how many a block kept from an earlier case served (gpu::KeepLargeBlocks). Summary only.
  std::int64_t resident_large_requests = 0, resident_large_reused = 0;
  /// The cases drawn for the device that its path did not take (judge_on_device threw: a
  /// configuration a writer does not take there, a copy that does not fit), judged on the host
  /// instead, and the first of them with what was thrown. Summary only.
  std::int64_t resident_fallbacks = 0;
  std::string resident_first_fallback;
  /// The cases whose device copies (OpDriver::device_bytes) passed resident_alone_bytes
  /// (CheckOptions::resident_alone_bytes): each ran on the device alone, the other lanes idle and
  /// every thread's idle device memory given back first. Summary only.
  std::int64_t resident_alone = 0, resident_alone_bytes = 0;
  std::string tier_disagreement;
  /// Where a campaign's time goes when the main thread judges subjects that are not concurrent
  /// (GPU, device, Python): its seconds waiting for the workers' cases, and the seconds the tier's
  /// answerers were busy answering (on their own threads). Timings, in the summary only.
  double waited_seconds = 0.0, tier_busy_seconds = 0.0;
  bool serial_rows = false;  ///< some subject is judged on the main thread

  /// The one-screen summary printed by the CLI. Its last line is "result: " and `result`, or the
  /// worst outcome's name when `result` is empty (a test that judged nothing says "not judged").
  std::string summary(const std::string& result = {}) const;
  /// The coverage table (`kvoracle check --coverage`): per op and condition, the cases that reached
  /// it, their share and the first; conditions never reached are marked.
  std::string coverage_table() const;
};

/// The one-line command that replays case `case_seed` of `op` with the same overrides and subject:
/// `kvoracle check --case-seed S --subject NAME --ops OP <flags>`, or in a test (test_rerun set)
/// `KVO_CASE_SEED=S [KVO_CASE_REDUCTIONS=OP:i,j] <test_rerun>` (options.test_reductions).
std::string repro_command(const CheckOptions& options, std::uint64_t case_seed,
                          const std::string& subject, spec::Op op);

using Progress = std::function<void(std::int64_t, std::int64_t)>;

/// A campaign over `subjects` (selected by options.subjects; an unknown name, or a named subject
/// that implements none of the ops asked, is InvalidInput). One row per (op, subject that
/// implements it), in registry order then subject order; an unavailable subject's rows are
/// skipped with the reason.
class Campaign {
 public:
  Campaign(CheckOptions options, SubjectList& subjects);
  /// Runs every case; `progress(done, total)` after each.
  CheckReport run(const Progress& progress = {});

 private:
  struct Row {
    Subject* subject;
    spec::Op op;
    std::size_t summary;  ///< index into report_.subjects
  };
  void record(const Row& row, const Verdict& verdict, std::int64_t index, std::uint64_t seed,
              const std::string& what);

  CheckOptions o_;
  std::vector<Row> rows_;
  CheckReport report_;
  TierAnswerers tier_;  ///< the GPU tier's answerers (none in the CPU tier)
};

/// Campaign(options, subjects).run(progress).
CheckReport run_check(const CheckOptions& options, SubjectList& subjects,
                      const Progress& progress = {});

/// The subject of that name in the list; InvalidInput naming the known ones when there is none.
Subject& find_subject(SubjectList& subjects, const std::string& name);

}  // namespace kvo::oracle
