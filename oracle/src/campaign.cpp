#include "kvo/oracle/campaign.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <iomanip>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <variant>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/memory_pool.hpp"
#include "kvo/oracle/one_thread.hpp"
#include "kvo/oracle/write_case.hpp"

namespace kvo::oracle {
namespace {

using spec::Outcome;

/// Threads that finish the verdicts judge_on_device leaves without the device (Verdict::finish:
/// a downloaded copy's diff by the admissible sets, ~2 ms, one resident write case in five), so
/// that the main thread, which runs the device, goes on with the next cases.
constexpr int kJudgingThreads = 4;
/// Cases a worker may run ahead of the oldest case not yet consumed, at least (the campaign's
/// `window`).
constexpr std::int64_t kLeastWindow = 32;
/// Cases judged on the main thread and not yet settled at most (their copies and verdicts held).
constexpr std::size_t kMostUnsettled = 64;
/// Cases handed to the device lanes and not yet completed at most, per lane: enough that the
/// light lanes go on while the heavy one judges a huge case (8-9 ms, ~60 light cases' worth).
constexpr std::size_t kMostInLanePerLane = 32;

/// Device lane `i` (CheckOptions::device_lanes): a thread kept for the process, as the read
/// path's side threads are (its CUDA stream, memory pool and staging block serve case after case
/// and campaign after campaign; CUDA may be gone by the time static objects are destroyed).
OneThread& device_lane(std::size_t i) {
  static std::mutex mu;
  static std::array<OneThread*, kMostDeviceLanes> lanes{};
  const std::lock_guard<std::mutex> lock(mu);
  if (lanes.at(i) == nullptr) lanes.at(i) = new OneThread;
  return *lanes.at(i);
}

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::int64_t campaign_jobs(std::int64_t jobs) {
  if (jobs < 0) throw spec::InvalidInput("jobs", -1, std::to_string(jobs), "must be >= 0");
  if (jobs > 0) return jobs;
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::thread::hardware_concurrency()));
}

namespace {

/// Where a scheduler puts a shard's index and the shard count (issue 15: shards on engines people
/// already run). The index is (id - first) / step; a scheduler without a count variable (a
/// Kubernetes Indexed Job: its completions are in the Job's spec only) takes the count from
/// --total-shards or GTEST_TOTAL_SHARDS.
struct ShardSource {
  const char* scheduler;
  const char* id;     ///< the shard's id variable
  const char* count;  ///< the shard count's variable, or nullptr
  const char* first;  ///< the first id's variable (nullptr: ids start at 0)
  const char* step;   ///< the ids' step variable (nullptr: 1)
};
constexpr std::array<ShardSource, 3> kShardSources{{
    {"GoogleTest", "GTEST_SHARD_INDEX", "GTEST_TOTAL_SHARDS", nullptr, nullptr},
    {"a Slurm job array", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN",
     "SLURM_ARRAY_TASK_STEP"},
    {"a Kubernetes Indexed Job", "JOB_COMPLETION_INDEX", nullptr, nullptr, nullptr},
}};

/// The integer in environment variable `name`, if set; InvalidInput naming it when malformed.
std::optional<std::int64_t> env_integer(const char* name) {
  const char* text = name == nullptr ? nullptr : std::getenv(name);
  if (text == nullptr) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (*text == '\0' || end == nullptr || *end != '\0' || errno == ERANGE) {
    throw spec::InvalidInput(name, -1, std::string("\"") + text + "\"", "expected an integer");
  }
  return static_cast<std::int64_t>(v);
}

}  // namespace

void apply_shard_environment(CheckOptions& o, std::optional<std::int64_t> total_flag,
                             std::optional<std::int64_t> index_flag) {
  std::optional<std::int64_t> total = total_flag, index = index_flag;
  std::string from = "--shard-index", count_from = "--total-shards";
  for (const ShardSource& s : kShardSources) {
    const std::optional<std::int64_t> id = env_integer(s.id);
    if (!id) continue;
    const std::int64_t first = env_integer(s.first).value_or(0);
    const std::int64_t step = env_integer(s.step).value_or(1);
    if (step < 1) {
      throw spec::InvalidInput(s.step, -1, std::to_string(step),
                               std::string("must be >= 1 (") + s.scheduler + ")");
    }
    if (*id < first || (*id - first) % step != 0) {
      throw spec::InvalidInput(s.id, -1, std::to_string(*id),
                               "not one of " + std::string(s.scheduler) + "'s ids " +
                                   std::to_string(first) + ", " + std::to_string(first + step) +
                                   ", ...");
    }
    if (!index) index = (*id - first) / step, from = s.id;
    if (!total && s.count != nullptr) {
      total = env_integer(s.count);
      if (total) count_from = s.count;
    }
    if (!total) {
      total = env_integer("GTEST_TOTAL_SHARDS");
      if (total) count_from = "GTEST_TOTAL_SHARDS";
    }
    if (!total) {
      throw spec::InvalidInput(s.id, -1, std::to_string(*id),
                               std::string(s.scheduler) +
                                   " gives the shard's index, not the shard count: pass "
                                   "--total-shards or set GTEST_TOTAL_SHARDS");
    }
    break;
  }
  if (!total && !index) return;  // no shards
  o.total_shards = total.value_or(1);
  o.shard_index = index.value_or(0);
  if (o.total_shards < 1) {
    throw spec::InvalidInput(count_from.c_str(), -1, std::to_string(o.total_shards),
                             "must be >= 1");
  }
  if (o.shard_index < 0 || o.shard_index >= o.total_shards) {
    throw spec::InvalidInput(
        from.c_str(), -1, std::to_string(o.shard_index),
        "must be in [0, " + count_from + " = " + std::to_string(o.total_shards) + ")");
  }
}

std::uint64_t parse_u64(const std::string& text, const char* field) {
  const bool hex = text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
  const std::string digits = text.substr(hex ? 2 : 0);
  // Every character a digit of the base: strtoull alone would take "12ab", " 7", "-1" or text with
  // an embedded NUL (found by fuzz/fuzz_seed.cpp).
  const bool well_formed =
      !digits.empty() && std::all_of(digits.begin(), digits.end(), [hex](char ch) {
        return hex ? std::isxdigit(static_cast<unsigned char>(ch)) != 0
                   : std::isdigit(static_cast<unsigned char>(ch)) != 0;
      });
  errno = 0;
  const unsigned long long v =
      well_formed ? std::strtoull(digits.c_str(), nullptr, hex ? 16 : 10) : 0;
  if (!well_formed || errno == ERANGE) {
    std::string shown;
    for (char ch : text) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02X", static_cast<unsigned char>(ch));
      shown += (ch >= 0x20 && ch < 0x7F) ? std::string(1, ch) : std::string(escaped);
    }
    throw spec::InvalidInput(field, -1, "\"" + shown + "\"",
                             "expected a 64-bit unsigned value, decimal or 0x-hex");
  }
  return static_cast<std::uint64_t>(v);
}

std::string repro_command(const CheckOptions& o, std::uint64_t seed, const std::string& subject,
                          spec::Op op) {
  if (!o.test_rerun.empty()) {
    std::string line = "KVO_CASE_SEED=" + hex64(seed);
    const std::vector<std::size_t>& steps = o.test_reductions;
    if (!steps.empty()) {
      line += std::string(" KVO_CASE_REDUCTIONS=") + std::string(spec::name_of(op));
      for (std::size_t i = 0; i < steps.size(); ++i)
        line += (i == 0 ? ":" : ",") + std::to_string(steps[i]);
    }
    return line + " " + o.test_rerun;
  }
  return "kvoracle check --case-seed " + hex64(seed) + " --subject " + subject + " --ops " +
         std::string(spec::name_of(op)) + driver_of(op).flags(o.overrides);
}

void SubjectSummary::add_failure_class(const std::string& class_name, std::int64_t index,
                                       std::uint64_t seed, std::int64_t cases) {
  auto it = std::find_if(failure_classes.begin(), failure_classes.end(),
                         [&](const FailureClassCount& c) { return c.name == class_name; });
  if (it == failure_classes.end()) {
    failure_classes.push_back({class_name, 0, index, seed});
    it = failure_classes.end() - 1;
  } else if (index >= 0 && (it->first_case < 0 || index < it->first_case)) {
    it->first_case = index;
    it->first_seed = seed;
  }
  it->cases += cases;
}

std::string CheckReport::summary(const std::string& result) const {
  std::ostringstream s;
  char line[256];
  std::snprintf(line, sizeof line,
                "kvoracle check: seed %s, %lld cases in %.2f s, %lld cache bytes compared\n",
                hex64(seed).c_str(), static_cast<long long>(cases_run), seconds,
                static_cast<long long>(bytes_compared));
  s << line;
  std::snprintf(line, sizeof line, "%-24s %-10s %7s %7s %9s %8s %7s %12s\n", "subject", "op",
                "cases", "pass", "mismatch", "invalid", "failed", "unsupported");
  s << line;
  for (const auto& sub : subjects) {
    if (!sub.skipped.empty()) {
      std::snprintf(line, sizeof line, "%-24s %-10s skipped: %s\n", sub.name.c_str(),
                    std::string(spec::name_of(sub.op)).c_str(), sub.skipped.c_str());
    } else {
      std::snprintf(line, sizeof line, "%-24s %-10s %7lld %7lld %9lld %8lld %7lld %12lld\n",
                    sub.name.c_str(), std::string(spec::name_of(sub.op)).c_str(),
                    static_cast<long long>(sub.cases),
                    static_cast<long long>(sub.count(Outcome::kPass)),
                    static_cast<long long>(sub.count(Outcome::kMismatch)),
                    static_cast<long long>(sub.count(Outcome::kInvalidInput)),
                    static_cast<long long>(sub.count(Outcome::kFailedToRun)),
                    static_cast<long long>(sub.count(Outcome::kUnsupported)));
    }
    s << line;
  }
  // SPEC principle 4: what a pass does not cover, said where the pass is.
  for (const auto& sub : subjects) {
    if (sub.blind_spots.empty()) continue;
    s << "\nblind spots of " << sub.name << " (" << spec::name_of(sub.op)
      << "): its declared profile is too loose to catch these planted bugs on some cases (SPEC "
         "principle 4; a pass says nothing about them there):\n";
    for (const auto& [bug, cases] : sub.blind_spots) {
      std::snprintf(line, sizeof line, "%8lld of %lld cases  ", static_cast<long long>(cases),
                    static_cast<long long>(sub.cases));
      s << line << bug << "\n";
    }
  }
  // Every cause, not only the first failure's: a class per line with its count and a case.
  for (const auto& sub : subjects) {
    if (sub.failure_classes.empty()) continue;
    s << "\ncases that did not pass, by class: " << sub.name << " (" << spec::name_of(sub.op)
      << ")\n";
    constexpr std::size_t kMostShown = 12;  // the JSON report has every class
    std::int64_t rest_cases = 0;
    for (std::size_t i = 0; i < sub.failure_classes.size(); ++i) {
      const FailureClassCount& c = sub.failure_classes[i];
      if (i >= kMostShown) {
        rest_cases += c.cases;
        continue;
      }
      std::snprintf(line, sizeof line, "%8lld  ", static_cast<long long>(c.cases));
      s << line << c.name << " (first: case " << c.first_case << ", seed " << hex64(c.first_seed)
        << ")\n";
    }
    if (rest_cases > 0) {
      s << "          and " << sub.failure_classes.size() - kMostShown << " classes more ("
        << rest_cases << " cases: the JSON report lists them)\n";
    }
  }
  for (const auto& sub : subjects) {
    if (!sub.first_failure.empty())
      s << "\nfirst failure of " << sub.name << " (" << spec::name_of(sub.op) << "):\n"
        << sub.first_failure << "\n";
    for (const std::string& f : sub.more_failures)
      s << "\nlater failure of " << sub.name << " (" << spec::name_of(sub.op)
        << "), another shard's first:\n"
        << f << "\n";
  }
  if (tier != ReferenceTier::kCpu || tier_cases > 0) {
    s << "\nreference: the " << spec::name_of(tier) << " tier (" << tier_answerers << ") answered "
      << tier_cases << " cases"
      << (resident_cases > 0 ? " (" + std::to_string(resident_cases) +
                                   " of them on the device: generated, written and compared there)"
                             : std::string())
      << ", the CPU reference " << cpu_cases << "; the tier was judged against the CPU "
      << "reference " << tier_checks
      << " times (an op's answer to a case: the first cases, then one in N, every failure)\n";
  }
  if (resident_cases + resident_checks > 0) {
    char line2[256];
    std::snprintf(
        line2, sizeof line2,
        "resident: %lld cases judged on the device and %lld sampled device answers "
        "checked against the CPU reference in %.2f s%s (%.0f us a case)",
        static_cast<long long>(resident_cases), static_cast<long long>(resident_checks),
        resident_seconds,
        resident_lanes > 1
            ? (" of " + std::to_string(resident_lanes) + " device lanes' time").c_str()
            : "",
        1e6 * resident_seconds /
            static_cast<double>(std::max<std::int64_t>(1, resident_cases + resident_checks)));
    s << line2;
    if (resident_large_requests > 0) {
      s << "; " << resident_large_reused << " of " << resident_large_requests
        << " huge-cache copies on a kept allocation";
    }
    s << "\n";
    if (resident_alone > 0) {
      s << "resident: " << resident_alone << " cases of copies past "
        << resident_alone_bytes / (std::int64_t{1} << 30)
        << " GiB ran on the device alone, every thread's idle device memory given back first\n";
    }
    if (resident_fallbacks > 0) {
      s << "resident: " << resident_fallbacks
        << " cases drawn for the device judged on the host instead (first: "
        << resident_first_fallback << ")\n";
    }
  }
  if (serial_rows && seconds > 0.0) {
    char line3[200];
    std::snprintf(line3, sizeof line3,
                  "time: of %.2f s, the main thread (which runs the GPU, device and Python "
                  "subjects) waited %.2f s for the workers' cases",
                  seconds, waited_seconds);
    s << line3;
    if (tier_busy_seconds > 0.0) {
      std::snprintf(line3, sizeof line3, "; the tier's answerers were busy %.2f s on their thread",
                    tier_busy_seconds);
      s << line3;
    }
    s << "\n";
  }
  if (!tier_disagreement.empty()) {
    s << "\nthe reference tier disagrees with the CPU reference; the campaign stopped:\n"
      << tier_disagreement << "\n";
  }
  s << "result: " << (result.empty() ? std::string(spec::name_of(worst)) : result);
  return s.str();
}

void require_known(const char* field, const char* what, const std::vector<std::string>& given,
                   const std::vector<std::string>& known) {
  for (std::size_t i = 0; i < given.size(); ++i) {
    if (std::find(known.begin(), known.end(), given[i]) != known.end()) continue;
    std::string names;
    for (const auto& n : known) names += (names.empty() ? "" : "|") + n;
    throw spec::InvalidInput(field, static_cast<std::int64_t>(i), given[i],
                             std::string("unknown ") + what + "; known: " + names);
  }
}

Subject& find_subject(SubjectList& subjects, const std::string& name) {
  for (auto& s : subjects) {
    if (s->name() == name) return *s;
  }
  std::vector<std::string> known;
  for (const auto& s : subjects) known.push_back(s->name());
  require_known("subject", "subject", {name}, known);
  throw spec::InvalidInput("subject", -1, name, "unknown subject");  // unreachable
}

std::vector<SubjectOp> select_subject_ops(SubjectList& subjects,
                                          const std::vector<std::string>& names,
                                          const std::vector<spec::Op>& ops) {
  std::vector<std::string> known;
  for (const auto& s : subjects) known.push_back(s->name());
  require_known("subject", "subject", names, known);
  if (ops.empty()) throw spec::InvalidInput("ops", -1, "", "no op selected");
  for (std::size_t i = 0; i < names.size(); ++i) {
    const Subject& s = find_subject(subjects, names[i]);
    if (std::none_of(ops.begin(), ops.end(), [&](spec::Op op) { return s.implements(op); })) {
      throw spec::InvalidInput("subject", static_cast<std::int64_t>(i), names[i],
                               "implements " + implemented_ops(s) + ", none of the ops asked");
    }
  }
  std::vector<SubjectOp> out;
  for (const OpDriver* driver : op_registry()) {
    if (std::find(ops.begin(), ops.end(), driver->op()) == ops.end()) continue;
    for (const auto& s : subjects) {
      const bool selected =
          names.empty() || std::find(names.begin(), names.end(), s->name()) != names.end();
      if (selected && s->implements(driver->op()))
        out.push_back({s.get(), driver->op(), s->unavailable_reason()});
    }
  }
  return out;
}

void require_named_subjects_run(SubjectList& subjects, const std::vector<std::string>& names,
                                const std::vector<spec::Op>& ops) {
  if (names.empty()) return;
  std::string cannot;
  for (const SubjectOp& so : select_subject_ops(subjects, names, ops)) {
    if (so.skipped.empty()) continue;
    cannot += (cannot.empty() ? "" : "; ") + so.subject->name() + " (" +
              std::string(spec::name_of(so.op)) + "): " + so.skipped;
  }
  if (!cannot.empty()) {
    throw spec::FailedToRun("a subject asked for by name cannot run here: " + cannot +
                            " (leave it out of --subject where it cannot run)");
  }
}

Campaign::Campaign(CheckOptions options, SubjectList& subjects) : o_(std::move(options)) {
  if (o_.cases < 1 && !o_.case_seed) {
    throw spec::InvalidInput("cases", -1, std::to_string(o_.cases), "must be >= 1");
  }
  if (o_.total_shards < 1) {
    throw spec::InvalidInput("total_shards", -1, std::to_string(o_.total_shards), "must be >= 1");
  }
  if (o_.shard_index < 0 || o_.shard_index >= o_.total_shards) {
    throw spec::InvalidInput(
        "shard_index", -1, std::to_string(o_.shard_index),
        "must be in [0, total_shards = " + std::to_string(o_.total_shards) + ")");
  }
  check_tier_sample(o_.tier_sample_first, o_.tier_sample_every);
  if (o_.device_lanes < 1 || o_.device_lanes > kMostDeviceLanes) {
    throw spec::InvalidInput("device_lanes", -1, std::to_string(o_.device_lanes),
                             "must be in [1, " + std::to_string(kMostDeviceLanes) + "]");
  }
  if (o_.heavy_lanes < 1 || o_.heavy_lanes > 2) {
    throw spec::InvalidInput("heavy_lanes", -1, std::to_string(o_.heavy_lanes), "must be 1 or 2");
  }
  if (o_.resident_alone_bytes < 0) {
    throw spec::InvalidInput("resident_alone_bytes", -1, std::to_string(o_.resident_alone_bytes),
                             "must be >= 0 (0: half the device's memory)");
  }
  report_.seed = o_.seed;
  report_.total_shards = o_.total_shards;
  report_.shard_index = o_.shard_index;
  for (const SubjectOp& so : select_subject_ops(subjects, o_.subjects, o_.ops)) {
    SubjectSummary sum;
    sum.name = so.subject->name();
    sum.op = so.op;
    sum.skipped = so.skipped;
    report_.subjects.push_back(sum);
    if (sum.skipped.empty()) rows_.push_back({so.subject, so.op, report_.subjects.size() - 1});
  }
  report_.tier = o_.tier;
  if (o_.tier == ReferenceTier::kGpu) {
    std::vector<std::pair<const Subject*, spec::Op>> judged;
    for (const Row& r : rows_) judged.emplace_back(r.subject, r.op);
    tier_ = gpu_tier_answerers(subjects, o_.ops, o_.tier_answerers, judged);
    report_.tier_answerers = tier_.names;
  }
  // Coverage rows: each op that runs, its table's conditions, grouped by op.
  for (const spec::Op op : o_.ops) {
    if (std::none_of(rows_.begin(), rows_.end(), [&](const Row& r) { return r.op == op; }))
      continue;
    for (const CaseCondition& c : driver_of(op).conditions())
      report_.coverage.push_back({op, std::string(c.name), std::string(c.means), 0, 0, -1});
  }
}

std::string CheckReport::coverage_table() const {
  std::ostringstream s;
  s << "coverage: the rare conditions each op's cases reached\n";
  s << std::left << std::setw(10) << "op" << std::setw(28) << "condition" << std::right
    << std::setw(8) << "cases" << std::setw(9) << "reached" << std::setw(8) << "share"
    << std::setw(7) << "first"
    << "  means\n";
  for (const CoverageRow& r : coverage) {
    const double share =
        r.cases > 0 ? static_cast<double>(r.reached) / static_cast<double>(r.cases) : 0.0;
    char pct[16];
    std::snprintf(pct, sizeof pct, "%.1f%%", 100.0 * share);
    s << std::left << std::setw(10) << spec::name_of(r.op) << std::setw(28) << r.condition
      << std::right << std::setw(8) << r.cases << std::setw(9) << r.reached << std::setw(8) << pct
      << std::setw(7) << (r.first_case < 0 ? std::string("never") : std::to_string(r.first_case))
      << "  " << r.means << "\n";
  }
  return s.str();
}

void Campaign::record(const Row& row, const Verdict& v, std::int64_t index, std::uint64_t seed,
                      const std::string& what) {
  SubjectSummary& sum = report_.subjects[row.summary];
  ++sum.cases;
  ++sum.counts[static_cast<int>(v.outcome)];
  report_.bytes_compared += v.bytes_compared;
  report_.worst = spec::worst(report_.worst, v.outcome);
  if (v.outcome != spec::Outcome::kPass) sum.add_failure_class(failure_class_of(v), index, seed);
  for (const std::string& bug : v.blind_spots) ++sum.blind_spots[bug];
  if (v.outcome != spec::Outcome::kPass && v.outcome != spec::Outcome::kUnsupported &&
      sum.first_failure.empty()) {
    std::ostringstream f;
    f << "case " << index << " seed " << hex64(seed) << ": " << what << "\n"
      << v.report << "\nreproduce: " << repro_command(o_, seed, sum.name, sum.op);
    sum.first_failure = f.str();
    sum.failing_seed = seed;
  }
}

CheckReport Campaign::run(const Progress& progress) {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const auto failed = [&] {
    return report_.worst != spec::Outcome::kPass && report_.worst != spec::Outcome::kUnsupported;
  };
  const std::int64_t total = o_.case_seed ? 1 : o_.cases;
  // The first case index at or after `from` that this shard runs (total when none is left).
  const auto next_index = [&](std::int64_t from) {
    while (from < total && !o_.case_seed && from % o_.total_shards != o_.shard_index) ++from;
    return from;
  };
  const auto seed_of = [&](std::int64_t i) {
    return o_.case_seed ? *o_.case_seed : case_seed(o_.seed, static_cast<std::uint64_t>(i));
  };
  // One case's work off the main thread: the case drawn once per case kind (the read ops judge
  // the same case) with the reference's answer, the coverage flags, and the verdicts of the rows
  // whose subjects are concurrent (pure CPU functions), judged in row order on the worker's
  // thread. The other rows (a GPU, a device or a Python subject: not thread-safe) are judged here,
  // on the main thread, one case after another. A case's rows never run on two threads at once,
  // and everything is recorded in case order, so the report is the same for any number of jobs.
  //
  // The tier (CheckOptions::tier): an op the tier answers has its case answered by the tier's
  // answerer, except on a sampled case, which the CPU reference answers and the answerer is
  // judged on, bit for bit (a disagreement: `tier_problem`).
  //
  // The tier's resident path (OpDriver::judge_on_device): an op the tier answers whose judged
  // subjects all write on the device has its case drawn without values on the worker and judged
  // on the device here (answerer and subjects writing device copies, compared there); a subject
  // failing there is judged again on the host against the CPU reference, and a case the device
  // path does not take is answered on the host as above.
  struct CaseWork {
    std::map<std::string_view, std::unique_ptr<PreparedCase>> cases;
    std::set<std::string_view> on_device;  // the case kinds drawn for the device
    bool sampled = false;                  // a case the tier is checked on
    // Per coverage op group, its driver's flags (unset until judged for a case kind judged on the
    // device whose conditions read the device's answer: OpDriver::conditions_before_device).
    std::vector<std::optional<std::vector<bool>>> hits;
    std::vector<std::optional<Verdict>> judged;  // per row: set when judged on the worker
    std::set<std::string_view> tiered;           // the case kinds the tier answered
    std::int64_t checks = 0;                     // the tier judged against the CPU reference
    std::string tier_problem;                    // the first disagreement
    bool alone = false;  // its device part ran alone on the device (CheckReport::resident_alone)
  };
  // The tier's answerer judged on a case the CPU reference answered: "" or the disagreement.
  const auto check_tier = [](const OpDriver& driver, Subject& answerer, PreparedCase& cpu_case) {
    const Verdict v = driver.judge_answerer(answerer, cpu_case);
    if (v.outcome == Outcome::kPass) return std::string();
    return "the " + std::string(spec::name_of(driver.op())) + " answerer " + answerer.name() +
           " disagrees with the CPU reference (" + std::string(spec::name_of(v.outcome)) + ") on " +
           cpu_case.describe() + "\n" + v.report;
  };
  // The case of `seed` answered by `answerer` on the host (the CPU reference where the tier does
  // not take it).
  const auto answer_on_host = [this](const OpDriver& driver, std::uint64_t seed, Subject* answerer,
                                     CaseWork& w) {
    std::unique_ptr<PreparedCase>& c = w.cases[driver.case_kind()];
    c.reset();
    w.on_device.erase(driver.case_kind());
    w.tiered.erase(driver.case_kind());
    try {
      c = driver.prepare(seed, o_.overrides, answerer);
      w.tiered.insert(driver.case_kind());
    } catch (const spec::Unsupported&) {
      // A configuration the tier does not implement: the CPU reference answers the case.
    } catch (const std::exception& e) {
      if (w.tier_problem.empty()) {
        w.tier_problem = "the " + std::string(spec::name_of(driver.op())) + " answerer " +
                         answerer->name() + " failed on " +
                         driver.prepare(seed, o_.overrides)->describe() + ": " + e.what();
      }
    }
    if (!c) c = driver.prepare(seed, o_.overrides);
  };
  // The case kinds judged on the device (OpDriver::runs_on_device): every row of the kind runs
  // there, as the tier's answerer does for each of the kind's ops; each with the op of its first
  // row (whose driver checks the answerer on the sampled cases).
  std::map<std::string_view, spec::Op> resident_kinds;
  if (o_.tier == ReferenceTier::kGpu && o_.tier_resident) {
    for (const Row& row : rows_) {
      const std::string_view kind = driver_of(row.op).case_kind();
      if (resident_kinds.contains(kind)) continue;
      const bool all = std::all_of(rows_.begin(), rows_.end(), [&](const Row& r) {
        const OpDriver& d = driver_of(r.op);
        if (d.case_kind() != kind) return true;
        const Subject* answerer = tier_.answering(r.op);
        return answerer != nullptr && d.runs_on_device(*answerer) && !r.subject->concurrent() &&
               d.runs_on_device(*r.subject);
      });
      if (all) resident_kinds.emplace(kind, row.op);
    }
  }
  // A resident case's copies of its caches (one per writer or reader and layer, several GB each
  // for a huge cache) reused case after case by this thread's device memory pool, not allocated
  // and freed. Room for as many as a case holds at once (a huge write case: every writer's copy
  // of each of its layers); the pool never keeps more than it held at once.
  //
  // Device lanes (CheckOptions::device_lanes): where every subject and answerer of the resident
  // kinds launches statelessly on the stream it is handed, the cases' device work runs on several
  // threads at once, each with its own stream and pool: a case of gigabytes (device_heavy) on a
  // heavy lane (lane 0; with heavy_lanes 2 also lane 1), whose pool keeps the copies, the others
  // on the rest in turn.
  const bool lanes_apply =
      !resident_kinds.empty() && o_.device_lanes > 1 &&
      std::all_of(rows_.begin(), rows_.end(), [&](const Row& r) {
        if (!resident_kinds.contains(driver_of(r.op).case_kind())) return true;
        return r.subject->device_concurrent() && tier_.of(r.op)->device_concurrent();
      });
  const std::size_t lanes = lanes_apply ? static_cast<std::size_t>(o_.device_lanes) : 1;
  report_.resident_lanes = static_cast<std::int64_t>(lanes);
  // Whether a case's device part takes copies of gigabytes (OpDriver::device_heavy): a heavy
  // lane's, whose pool keeps them.
  const auto heavy_case = [&](const CaseWork& w) {
    return std::any_of(resident_kinds.begin(), resident_kinds.end(), [&](const auto& kind_op) {
      const auto c = w.cases.find(kind_op.first);
      return c != w.cases.end() && driver_of(kind_op.second).device_heavy(*c->second);
    });
  };
  // A case whose copies pass half the device's memory runs on the device alone: the cases before
  // it completed and every thread's idle device memory (the lanes' pools, the tier's threads',
  // this one's) given back first, so that whether it fits is decided by its size against the
  // device, never by what other threads happen to hold (a 108 GB case fell back to the host in
  // some runs and not in others, session 36). Its copies are given back after it.
  if (!resident_kinds.empty()) {
    report_.resident_alone_bytes =
        o_.resident_alone_bytes > 0 ? o_.resident_alone_bytes : gpu::device_memory_bytes() / 2;
  }
  std::map<std::string_view, std::size_t> kind_rows;  // per resident kind: its rows
  for (const Row& r : rows_) {
    if (resident_kinds.contains(driver_of(r.op).case_kind()))
      ++kind_rows[driver_of(r.op).case_kind()];
  }
  // The device bytes a case's device part takes at most (one case kind at a time).
  const auto resident_bytes = [&](const CaseWork& w) {
    std::int64_t most = 0;
    for (const auto& [kind, op] : resident_kinds) {
      const auto c = w.cases.find(kind);
      if (c == w.cases.end()) continue;
      // judge_on_device: the answerer's copy and one per row; check_on_device: the answerer's.
      const std::size_t copies = w.on_device.contains(kind) ? 1 + kind_rows[kind]
                                 : w.sampled                ? 1
                                                            : 0;
      if (copies > 0) most = std::max(most, driver_of(op).device_bytes(*c->second, copies));
    }
    return most;
  };
  const auto give_back_idle_memory = [&](bool every_thread) {
    gpu::release_idle_blocks();
    if (lanes > 1) {
      for (std::size_t l = 0; l < (every_thread ? lanes : 1); ++l)
        device_lane(l).post([] { gpu::release_idle_blocks(); }).get();
    }
    if (every_thread) tier_.on_each_thread([] { gpu::release_idle_blocks(); });
  };
  // The copies kept on a thread that judges the heavy cases (a heavy lane, or this one), made and
  // ended there (gpu::KeepLargeBlocks belongs to its thread's pool).
  struct KeptCopies {
    OneThread* on = nullptr;
    std::optional<gpu::KeepLargeBlocks> keep;
    gpu::LargeBlockUse use;
    void run(const std::function<void()>& fn) {
      if (on != nullptr) {
        on->post(fn).get();
      } else {
        fn();
      }
    }
    void end() {
      if (!keep) return;
      run([this] {
        use = keep->use();
        keep.reset();
      });
    }
    ~KeptCopies() { end(); }
  };
  // The lanes that judge the heavy cases: lane 0, and with enough lanes lane 1 too, for the cases
  // of at most half the alone bound (two such cases' copies fit side by side with lane 0's
  // largest), so that two huge cases' launches and waits overlap.
  const std::size_t heavy_lanes = lanes > static_cast<std::size_t>(o_.heavy_lanes)
                                      ? static_cast<std::size_t>(o_.heavy_lanes)
                                      : 1;
  if (!resident_kinds.empty() && o_.host_wait != gpu::HostWait::kAuto &&
      !gpu::set_host_wait(o_.host_wait)) {
    throw spec::FailedToRun("the device refused the host wait policy asked for (--host-wait)");
  }
  std::array<KeptCopies, 2> keep_copies;
  if (!resident_kinds.empty()) {
    for (std::size_t h = 0; h < heavy_lanes; ++h) {
      keep_copies[h].on = lanes > 1 ? &device_lane(h) : nullptr;
      keep_copies[h].run(
          [&, h] { keep_copies[h].keep.emplace((rows_.size() + 1) * kHugeCacheMostLayers); });
    }
  }
  // Coverage: per op group (the rows of report_.coverage that one driver's flags fill), the
  // conditions a case reached, added in case order. A case judged on the device has the
  // conditions that read its answer (OpDriver::conditions_before_device) found after it, on a
  // thread of their own while the next cases run here (the read case's take ~0.4 ms).
  std::vector<std::size_t> group_rows;  // per group: its first row of report_.coverage
  for (std::size_t k = 0; k < report_.coverage.size(); ++k) {
    if (k == 0 || report_.coverage[k - 1].op != report_.coverage[k].op) group_rows.push_back(k);
  }
  std::vector<spec::Op> group_ops;
  for (const std::size_t k : group_rows) group_ops.push_back(report_.coverage[k].op);
  const auto work = [this, &check_tier, &answer_on_host, &resident_kinds, &group_ops](
                        std::uint64_t seed, std::int64_t index) {
    CaseWork w;
    const bool sampled = tier_sampled(index, o_.tier_sample_first, o_.tier_sample_every);
    w.sampled = sampled;
    for (const Row& row : rows_) {
      const OpDriver& driver = driver_of(row.op);
      std::unique_ptr<PreparedCase>& c = w.cases[driver.case_kind()];
      if (c) continue;
      Subject* answerer = driver.answers_through_tier() ? tier_.of(row.op) : nullptr;
      // The answerer judged as a subject of the campaign is judged against the CPU reference's
      // answer on every case, never against its own.
      const bool cpu_answers = sampled || tier_.self_judged.contains(row.op);
      if (answerer != nullptr && !cpu_answers && resident_kinds.contains(driver.case_kind())) {
        c = driver.prepare_for_device(seed, o_.overrides);
        if (c) {
          w.on_device.insert(driver.case_kind());
          w.tiered.insert(driver.case_kind());
          continue;
        }
      }
      if (answerer != nullptr && !cpu_answers) {
        answer_on_host(driver, seed, answerer, w);
        continue;
      }
      c = driver.prepare(seed, o_.overrides);
      // A self-judged answerer is judged as a subject against this answer anyway.
      if (answerer != nullptr && sampled && !tier_.self_judged.contains(row.op)) {
        ++w.checks;
        if (std::string problem = check_tier(driver, *answerer, *c);
            !problem.empty() && w.tier_problem.empty())
          w.tier_problem = std::move(problem);
      }
    }
    for (const spec::Op op : group_ops) {
      const OpDriver& driver = driver_of(op);
      if (w.on_device.contains(driver.case_kind()) && !driver.conditions_before_device()) {
        w.hits.emplace_back();
        continue;
      }
      w.hits.push_back(driver.reached(*w.cases.at(driver.case_kind())));
    }
    w.judged.resize(rows_.size());
    for (std::size_t r = 0; r < rows_.size(); ++r) {
      const OpDriver& driver = driver_of(rows_[r].op);
      PreparedCase& c = *w.cases.at(driver.case_kind());
      if (!rows_[r].subject->concurrent()) {
        // What it throws, judge meets again on the main thread, where it is classified.
        try {
          if (!w.on_device.contains(driver.case_kind()))
            driver.ready_to_judge(*rows_[r].subject, c);
        } catch (...) {
        }
        continue;
      }
      w.judged[r] = driver.judge(*rows_[r].subject, c);
    }
    return w;
  };
  // `jobs` worker threads take the case indices in order and work on them; this thread consumes
  // the results in case order, judging the non-concurrent rows. A worker runs ahead of the oldest
  // unconsumed case by at most `window` cases (memory stays bounded; a slow case does not idle the
  // others). With non-concurrent rows one more worker works ahead while they run here. At most
  // `window` cases are wasted when the campaign stops early.
  const bool serial_rows = std::any_of(rows_.begin(), rows_.end(),
                                       [](const Row& r) { return !r.subject->concurrent(); });
  report_.serial_rows = serial_rows;
  const std::int64_t workers = campaign_jobs(o_.jobs) + (serial_rows ? 1 : 0);
  // Resident cases take the main thread 1-3 ms each, while a sampled case (1 in
  // tier_sample_every) costs a worker the CPU reference's answer and the tier's check, ~0.6 s at
  // 16k-token contexts, hundreds of resident cases' worth: the workers run eight sample intervals
  // ahead, so that it is ready when the main thread gets to it (four were ~0.75 s ahead at 16k,
  // and the main thread waited for them; a deferred case holds its keys, not its values).
  //
  // On the CPU, a case takes 30 ms on average and up to ~0.2 s (default distribution, 2 cores):
  // with two workers and a window of 2 * workers = 4, one slow case filled the window and idled
  // the other worker; kLeastWindow (32) took `bash scripts/campaign.sh` from 31.8-33.6 s to
  // 29.4-29.8 s on 2 cores (session 37), for ~50 MB more held.
  const std::int64_t window =
      resident_kinds.empty()
          ? std::max(2 * workers, kLeastWindow)
          : std::max(2 * workers, 8 * std::max<std::int64_t>(1, o_.tier_sample_every));
  std::mutex mu;
  std::condition_variable changed;
  std::map<std::int64_t, std::variant<CaseWork, std::exception_ptr>> done;  // by case index
  std::int64_t next = next_index(0), taken = 0, consumed = 0;
  bool stop = false;
  const auto worker = [&] {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      changed.wait(lock, [&] { return stop || next >= total || taken - consumed < window; });
      if (stop || next >= total) return;
      const std::int64_t i = next;
      next = next_index(next + 1);
      ++taken;
      lock.unlock();
      std::variant<CaseWork, std::exception_ptr> result;
      try {
        result = work(seed_of(i), i);
      } catch (...) {
        result = std::current_exception();
      }
      lock.lock();
      done.emplace(i, std::move(result));
      changed.notify_all();
    }
  };
  std::vector<std::thread> pool;
  for (std::int64_t t = 0; t < workers; ++t) pool.emplace_back(worker);
  const auto add_hits = [&](std::int64_t i, const CaseWork& w) {
    for (std::size_t g = 0; g < group_rows.size(); ++g) {
      const std::vector<bool>& hit = *w.hits[g];
      for (std::size_t j = 0; j < hit.size(); ++j) {
        CoverageRow& r = report_.coverage[group_rows[g] + j];
        ++r.cases;
        if (!hit[j]) continue;
        ++r.reached;
        if (r.first_case < 0) r.first_case = i;
      }
    }
  };
  const auto find_hits = [group_ops](CaseWork& w) {
    for (std::size_t g = 0; g < group_ops.size(); ++g) {
      if (w.hits[g]) continue;
      const OpDriver& driver = driver_of(group_ops[g]);
      w.hits[g] = driver.reached(*w.cases.at(driver.case_kind()));
    }
  };
  struct PendingHits {
    std::int64_t index = 0;
    std::shared_ptr<CaseWork> work;
    std::future<void> found;
  };
  std::deque<PendingHits> pending_hits;
  std::optional<OneThread> coverage_thread;
  if (!resident_kinds.empty()) coverage_thread.emplace();
  // The pending cases' conditions added, the oldest first: those found (`all`: every one).
  const auto add_pending = [&](bool all) {
    while (!pending_hits.empty()) {
      PendingHits& p = pending_hits.front();
      if (!all && p.found.wait_for(std::chrono::seconds(0)) != std::future_status::ready) break;
      p.found.get();
      add_hits(p.index, *p.work);
      pending_hits.pop_front();
    }
  };
  // Case i's coverage, once this thread is done with the case: added now, or handed to the
  // coverage thread (which then owns the case) and added later, in order.
  const auto cover = [&](std::int64_t i, CaseWork&& w) {
    if (!coverage_thread) {
      find_hits(w);
      add_hits(i, w);
      return;
    }
    auto held = std::make_shared<CaseWork>(std::move(w));
    pending_hits.push_back(
        {i, held, coverage_thread->post([held, &find_hits] { find_hits(*held); })});
    add_pending(pending_hits.size() > static_cast<std::size_t>(window));
  };
  const auto finish = [&] {
    {
      const std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    changed.notify_all();
    for (std::thread& t : pool) t.join();
  };
  // What a case's device part adds to the report, added when the case is settled (a case dropped
  // by a stop adds nothing, however many of them the device lanes had judged).
  struct DeviceCounts {
    std::int64_t checks = 0;     // sampled device answers checked (resident_checks)
    std::int64_t cases = 0;      // case kinds judged there (resident_cases)
    std::int64_t fallbacks = 0;  // case kinds the device did not take (resident_fallbacks)
    std::string first_fallback;  // the first of them: "case i seed s: what it threw"
    double seconds = 0.0;
  };
  // A case judged and not yet settled: its verdicts, some still finishing on the judging threads
  // (Verdict::finish, the admissible-set diff of a copy downloaded from the device).
  struct Unsettled {
    std::int64_t i = 0;
    std::uint64_t seed = 0;
    CaseWork w;
    std::vector<Verdict> verdicts;
    std::set<std::string_view> on_device;         // the case kinds judged on the device
    std::vector<std::future<Verdict>> finishing;  // per row: valid while its verdict finishes
    DeviceCounts device;
  };
  std::deque<Unsettled> unsettled;
  // Before the judging threads: they are joined (their tasks done) before the cases go.
  std::vector<std::unique_ptr<OneThread>> judges;
  if (!resident_kinds.empty()) {
    for (int t = 0; t < kJudgingThreads; ++t) judges.push_back(std::make_unique<OneThread>());
  }
  std::size_t next_judge = 0;
  // Waits for every unsettled verdict still finishing (they read the cases), before the cases go.
  const auto wait_finishing = [&] {
    for (Unsettled& u : unsettled) {
      for (std::future<Verdict>& f : u.finishing) {
        if (f.valid()) f.wait();
      }
    }
  };
  // Case u, its verdicts final: a subject failing against the tier's answer is judged again
  // against the CPU reference's, and the tier checked on that case (the verdict recorded is the
  // CPU reference's); then recorded and covered. False: the tier disagreed, the campaign stops.
  const auto settle = [&](Unsettled& u) {
    const std::int64_t i = u.i;
    const std::uint64_t seed = u.seed;
    CaseWork& w = u.w;
    std::vector<Verdict>& verdicts = u.verdicts;
    report_.resident_checks += u.device.checks;
    report_.resident_cases += u.device.cases;
    report_.resident_seconds += u.device.seconds;
    if (u.device.fallbacks > 0 && report_.resident_fallbacks == 0)
      report_.resident_first_fallback = u.device.first_fallback;
    report_.resident_fallbacks += u.device.fallbacks;
    if (u.w.alone) ++report_.resident_alone;
    // A subject failing against the tier's answer is judged again against the CPU reference's,
    // and the tier checked on that case: the verdict recorded is the CPU reference's.
    std::map<std::string_view, std::unique_ptr<PreparedCase>> cpu_cases;
    for (std::size_t r = 0; r < rows_.size(); ++r) {
      const OpDriver& driver = driver_of(rows_[r].op);
      const Outcome o = verdicts[r].outcome;
      if (!w.tiered.contains(driver.case_kind()) || o == Outcome::kPass ||
          o == Outcome::kUnsupported)
        continue;
      Subject* answerer = tier_.of(rows_[r].op);
      std::unique_ptr<PreparedCase>& cpu = cpu_cases[driver.case_kind()];
      if (!cpu) {
        cpu = driver.prepare(seed, o_.overrides);
        ++w.checks;
        if (std::string problem = check_tier(driver, *answerer, *cpu);
            !problem.empty() && w.tier_problem.empty())
          w.tier_problem = std::move(problem);
      }
      Verdict host = driver.judge(*rows_[r].subject, *cpu);
      // A subject that differs from the answerer on the device but passes on the host: one of
      // the two writers' device runs is not its host run (or the device's generated inputs
      // are not the host's); the resident path's answers are in doubt.
      if (u.on_device.contains(driver.case_kind()) && host.outcome == Outcome::kPass &&
          driver.device_answer_exact(*w.cases.at(driver.case_kind())) && w.tier_problem.empty()) {
        w.tier_problem = "resident path disagrees with the host: " + rows_[r].subject->name() +
                         ", " + verdicts[r].report + ", on the host both it and " +
                         answerer->name() + " equal the CPU reference on " + cpu->describe();
      }
      verdicts[r] = std::move(host);
    }
    report_.tier_checks += w.checks;
    ++(w.tiered.empty() ? report_.cpu_cases : report_.tier_cases);
    if (!w.tier_problem.empty()) {
      // Nothing of this case is recorded: its answers are in doubt.
      report_.tier_disagreement = "case " + std::to_string(i) + " seed " + hex64(seed) + ": the " +
                                  std::string(spec::name_of(report_.tier)) + " tier " +
                                  w.tier_problem;
      report_.worst = Outcome::kFailedToRun;
      cover(i, std::move(w));
      return false;
    }
    for (std::size_t r = 0; r < rows_.size(); ++r) {
      const PreparedCase& c = *w.cases.at(driver_of(rows_[r].op).case_kind());
      record(rows_[r], verdicts[r], i, seed, c.describe());
    }
    cover(i, std::move(w));
    ++report_.cases_run;
    if (progress) progress(report_.cases_run, total);
    return true;
  };
  // Settles the unsettled cases in order while their verdicts are final (`all`: waiting for
  // them); past kMostUnsettled, waits for the oldest. False when the campaign stops: the tier
  // disagreed, or (fail_fast) a failure is recorded, and the later cases are dropped, as a
  // campaign that judged one case at a time would not have run them.
  const auto settle_ready = [&](bool all) {
    while (!unsettled.empty()) {
      Unsettled& u = unsettled.front();
      const bool must = all || unsettled.size() > kMostUnsettled;
      bool ready = true;
      for (std::future<Verdict>& f : u.finishing) {
        if (!f.valid()) continue;
        if (!must && f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
          ready = false;
          break;
        }
      }
      if (!ready) return true;
      for (std::size_t r = 0; r < u.finishing.size(); ++r) {
        if (u.finishing[r].valid()) u.verdicts[r] = u.finishing[r].get();
      }
      if ((o_.fail_fast && failed()) || !settle(u)) {
        wait_finishing();
        unsettled.clear();
        return false;
      }
      unsettled.pop_front();
    }
    return true;
  };
  // The device part of a case: on a sampled case, the answerer's device run of each resident kind
  // checked against the CPU reference's answer (the resident path's trust chain); every case kind
  // drawn for the device judged there (one verdict per row of the kind, in row order). It owns
  // the case while it runs and reads the campaign's fixed tables, never report_ (it runs on a
  // device lane): what it counted comes back, added when the case is settled, in case order.
  struct DeviceJudged {
    DeviceCounts counts;
    std::map<std::string_view, std::vector<Verdict>> verdicts;  // per case kind judged there
  };
  // A kind the device does not take is answered on the host here too (answer_on_host), so that a
  // huge case's host answer runs while its lane, whose pool holds the huge copies, waits.
  const auto judge_device = [this, &resident_kinds, &answer_on_host](
                                std::int64_t i, std::uint64_t seed, CaseWork& w) {
    DeviceJudged d;
    if (!w.sampled && w.on_device.empty()) return d;
    const auto from = std::chrono::steady_clock::now();
    if (w.sampled) {
      for (const auto& [kind, op] : resident_kinds) {
        const OpDriver& driver = driver_of(op);
        ++d.counts.checks;
        PreparedCase& c = *w.cases.at(driver.case_kind());
        std::string problem;
        try {
          problem = driver.check_on_device(c, *tier_.of(op));
        } catch (const std::exception& e) {
          problem = "the " + std::string(spec::name_of(op)) + " answerer " + tier_.of(op)->name() +
                    " failed on the device on " + c.describe() + ": " + e.what();
        }
        if (!problem.empty() && w.tier_problem.empty()) w.tier_problem = std::move(problem);
      }
    }
    for (const std::string_view kind : std::set<std::string_view>(w.on_device)) {
      const auto first = std::find_if(rows_.begin(), rows_.end(), [&](const Row& r) {
        return driver_of(r.op).case_kind() == kind;
      });
      const OpDriver& driver = driver_of(first->op);
      std::vector<OpDriver::DeviceRow> device_rows;
      for (const Row& r : rows_) {
        if (driver_of(r.op).case_kind() == kind) device_rows.push_back({r.op, r.subject});
      }
      try {
        d.verdicts[kind] =
            driver.judge_on_device(*w.cases.at(kind), *tier_.of(first->op), device_rows);
        ++d.counts.cases;
      } catch (const std::exception& e) {
        // Not taken there (spec::Unsupported), or a writer that threw or faulted: the host path
        // judges each writer on its own and says which.
        if (d.counts.fallbacks++ == 0) {
          d.counts.first_fallback =
              "case " + std::to_string(i) + " seed " + hex64(seed) + ": " + e.what();
        }
        // A case that did not fit leaves this thread's pool holding its partial copies (kept for
        // the next huge case): the host answer, on the answerer's thread, needs that memory.
        gpu::release_idle_blocks();
        answer_on_host(driver, seed, tier_.of(first->op), w);
      }
    }
    d.counts.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - from).count();
    return d;
  };
  // Case i after its device part, in case order: the rows not judged on the device or a worker
  // judged here, the verdicts handed on to settle. False when the campaign stops.
  const auto complete = [&](std::int64_t i, std::uint64_t seed, CaseWork&& w, DeviceJudged&& d) {
    std::vector<Verdict> verdicts;
    std::map<std::string_view, std::size_t> device_next;
    for (std::size_t r = 0; r < rows_.size(); ++r) {
      const Row& row = rows_[r];
      const OpDriver& driver = driver_of(row.op);
      PreparedCase& c = *w.cases.at(driver.case_kind());
      if (const auto it = d.verdicts.find(driver.case_kind()); it != d.verdicts.end()) {
        verdicts.push_back(std::move(it->second.at(device_next[driver.case_kind()]++)));
        continue;
      }
      verdicts.push_back(w.judged[r] ? std::move(*w.judged[r]) : driver.judge(*row.subject, c));
    }
    // The verdicts whose judging needs no device (Verdict::finish) finish on the judging
    // threads while this thread goes on with the next cases; the case is settled (judged again
    // where a subject failed, recorded, covered) in case order once they have.
    Unsettled u{i, seed, std::move(w), std::move(verdicts), {}, {}, std::move(d.counts)};
    for (const auto& [kind, verdicts_of_kind] : d.verdicts) u.on_device.insert(kind);
    u.finishing.resize(rows_.size());
    for (std::size_t r = 0; r < rows_.size(); ++r) {
      if (!u.verdicts[r].finish) continue;
      std::function<Verdict()> fn = std::move(u.verdicts[r].finish);
      u.verdicts[r].finish = nullptr;
      if (judges.empty()) {
        u.verdicts[r] = fn();
      } else {
        u.finishing[r] = judges[next_judge++ % judges.size()]->post(std::move(fn));
      }
    }
    unsettled.push_back(std::move(u));
    return settle_ready(false);
  };
  // The cases handed to the lanes, in case order, each with its device part (none: nothing of it
  // runs on the device); completed in that order as the lanes finish them.
  struct InLane {
    std::int64_t i = 0;
    std::uint64_t seed = 0;
    std::shared_ptr<CaseWork> w;
    std::future<DeviceJudged> judged;  // valid: posted to a lane
  };
  std::deque<InLane> in_lanes;
  std::size_t next_light_lane = 0, next_heavy_lane = 0;
  bool stopped = false;  // a case's completion stopped the campaign: the later ones are dropped
  // Completes the front cases while their device parts are done (`all`: waiting for each; past
  // kMostInLanePerLane a lane, waiting for the oldest). False when the campaign stops.
  const auto complete_ready = [&](bool all) {
    while (!stopped && !in_lanes.empty()) {
      InLane& f = in_lanes.front();
      const bool must = all || in_lanes.size() > kMostInLanePerLane * lanes;
      if (!must && f.judged.valid() &&
          f.judged.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
        return true;
      DeviceJudged d = f.judged.valid() ? f.judged.get() : DeviceJudged{};
      const std::int64_t i = f.i;
      const std::uint64_t seed = f.seed;
      std::shared_ptr<CaseWork> w = std::move(f.w);
      in_lanes.pop_front();
      stopped = !complete(i, seed, std::move(*w), std::move(d));
    }
    return !stopped;
  };
  // Waits for every device part still running (they read the cases and this frame), then drops
  // the cases: before the campaign stops or throws.
  const auto drop_in_lanes = [&] {
    for (InLane& f : in_lanes) {
      if (f.judged.valid()) f.judged.wait();
    }
    in_lanes.clear();
  };
  try {
    for (std::int64_t i = next_index(0); i < total; i = next_index(i + 1)) {
      if (o_.time_budget_s > 0.0 && report_.cases_run > 0 && elapsed() > o_.time_budget_s) break;
      if (o_.fail_fast && failed()) break;
      std::variant<CaseWork, std::exception_ptr> result;
      {
        const auto waited_from = std::chrono::steady_clock::now();
        std::unique_lock<std::mutex> lock(mu);
        changed.wait(lock, [&] { return done.contains(i); });
        report_.waited_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - waited_from).count();
        result = std::move(done.at(i));
        done.erase(i);
        ++consumed;
      }
      changed.notify_all();
      if (std::holds_alternative<std::exception_ptr>(result))
        std::rethrow_exception(std::get<std::exception_ptr>(result));
      const std::uint64_t seed = seed_of(i);
      CaseWork& drawn = std::get<CaseWork>(result);
      const std::int64_t device_bytes = resident_bytes(drawn);
      drawn.alone = device_bytes > report_.resident_alone_bytes;
      if (drawn.alone) {
        if (!complete_ready(true)) break;
        give_back_idle_memory(true);
      }
      if (lanes == 1) {
        const bool alone = drawn.alone;
        DeviceJudged d = judge_device(i, seed, drawn);
        const bool go_on = complete(i, seed, std::move(drawn), std::move(d));
        if (alone) give_back_idle_memory(false);
        if (!go_on) break;
        continue;
      }
      auto held = std::make_shared<CaseWork>(std::move(drawn));
      InLane f{i, seed, held, {}};
      if ((held->sampled && !resident_kinds.empty()) || !held->on_device.empty()) {
        // A heavy case on lane 0, or (two heavy lanes, at most half the alone bound) on lanes 0
        // and 1 in turn; the others on the light lanes in turn.
        std::size_t lane_index = 0;
        if (!heavy_case(*held)) {
          lane_index = heavy_lanes + next_light_lane++ % (lanes - heavy_lanes);
        } else if (heavy_lanes > 1 && 2 * device_bytes <= report_.resident_alone_bytes) {
          lane_index = next_heavy_lane++ % heavy_lanes;
        }
        OneThread& lane = device_lane(lane_index);
        f.judged =
            lane.post([i, seed, held, &judge_device] { return judge_device(i, seed, *held); });
      }
      const bool alone = held->alone;
      in_lanes.push_back(std::move(f));
      if (!complete_ready(alone)) break;
      if (alone) give_back_idle_memory(false);
    }
    if (complete_ready(true)) settle_ready(true);
    drop_in_lanes();
    add_pending(true);
  } catch (...) {
    drop_in_lanes();
    wait_finishing();
    finish();
    throw;
  }
  finish();
  report_.seconds = elapsed();
  report_.tier_busy_seconds = tier_.busy_seconds();
  for (KeptCopies& k : keep_copies) {
    k.end();
    report_.resident_large_requests += k.use.requests;
    report_.resident_large_reused += k.use.reused;
  }
  return report_;
}

CheckReport run_check(const CheckOptions& options, SubjectList& subjects,
                      const Progress& progress) {
  return Campaign(options, subjects).run(progress);
}

}  // namespace kvo::oracle
