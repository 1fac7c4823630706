#include "kvo/oracle/campaign.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <iomanip>
#include <map>
#include <sstream>

namespace kvo::oracle {
namespace {

using spec::Outcome;

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

void apply_shard_environment(CheckOptions& o) {
  const char* total = std::getenv("GTEST_TOTAL_SHARDS");
  const char* index = std::getenv("GTEST_SHARD_INDEX");
  if (total == nullptr || index == nullptr) return;
  auto parse = [](const char* text, const char* field) {
    char* end = nullptr;
    const long long v = std::strtoll(text, &end, 10);
    if (*text == '\0' || end == nullptr || *end != '\0') {
      throw spec::InvalidInput(field, -1, std::string("\"") + text + "\"", "expected an integer");
    }
    return static_cast<std::int64_t>(v);
  };
  o.total_shards = parse(total, "GTEST_TOTAL_SHARDS");
  o.shard_index = parse(index, "GTEST_SHARD_INDEX");
  if (o.total_shards < 1 || o.shard_index < 0 || o.shard_index >= o.total_shards) {
    throw spec::InvalidInput(
        "GTEST_SHARD_INDEX", -1, std::to_string(o.shard_index),
        "must be in [0, GTEST_TOTAL_SHARDS = " + std::to_string(o.total_shards) + ")");
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
  return "kvoracle check --case-seed " + hex64(seed) + " --subject " + subject + " --ops " +
         std::string(spec::name_of(op)) + driver_of(op).flags(o.overrides);
}

std::string CheckReport::summary() const {
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
  for (const auto& sub : subjects) {
    if (!sub.first_failure.empty())
      s << "\nfirst failure of " << sub.name << " (" << spec::name_of(sub.op) << "):\n"
        << sub.first_failure << "\n";
  }
  s << "result: " << spec::name_of(worst);
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
  report_.seed = o_.seed;
  for (const SubjectOp& so : select_subject_ops(subjects, o_.subjects, o_.ops)) {
    SubjectSummary sum;
    sum.name = so.subject->name();
    sum.op = so.op;
    sum.skipped = so.skipped;
    report_.subjects.push_back(sum);
    if (sum.skipped.empty()) rows_.push_back({so.subject, so.op, report_.subjects.size() - 1});
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
  // One prepared case per case kind (the read ops judge the same case). Drawing a case and the
  // reference's answer depend on nothing a subject does, so the next case is prepared on a second
  // thread while this one's subjects run here, one after another in row order (a subject need not
  // be thread-safe). At most one prepared case is wasted when the campaign stops early.
  using Prepared = std::map<std::string_view, std::unique_ptr<PreparedCase>>;
  const auto prepare = [this](std::uint64_t seed) {
    Prepared cases;
    for (const Row& row : rows_) {
      const OpDriver& driver = driver_of(row.op);
      std::unique_ptr<PreparedCase>& c = cases[driver.case_kind()];
      if (!c) c = driver.prepare(seed, o_.overrides);
    }
    return cases;
  };
  const auto launch = [&](std::int64_t i) {
    return std::async(std::launch::async, prepare, seed_of(i));
  };
  std::int64_t i = next_index(0);
  std::future<Prepared> ahead;
  if (i < total) ahead = launch(i);
  while (i < total) {
    if (o_.time_budget_s > 0.0 && report_.cases_run > 0 && elapsed() > o_.time_budget_s) break;
    if (o_.fail_fast && failed()) break;
    const Prepared cases = ahead.get();
    const std::int64_t next = next_index(i + 1);
    if (next < total) ahead = launch(next);
    const std::uint64_t seed = seed_of(i);
    for (CoverageRow& cov : report_.coverage) {
      // Once per op and case (reached() returns the op's flags; cov rows are grouped by op).
      if (&cov != &report_.coverage.front() && (&cov - 1)->op == cov.op) continue;
      const OpDriver& driver = driver_of(cov.op);
      const std::vector<bool> hit = driver.reached(*cases.at(driver.case_kind()));
      for (std::size_t k = 0; k < hit.size(); ++k) {
        CoverageRow& r = (&cov)[k];
        ++r.cases;
        if (!hit[k]) continue;
        ++r.reached;
        if (r.first_case < 0) r.first_case = i;
      }
    }
    for (const Row& row : rows_) {
      const OpDriver& driver = driver_of(row.op);
      PreparedCase& c = *cases.at(driver.case_kind());
      record(row, driver.judge(*row.subject, c), i, seed, c.describe());
    }
    ++report_.cases_run;
    if (progress) progress(report_.cases_run, total);
    i = next;
  }
  if (ahead.valid()) ahead.wait();
  report_.seconds = elapsed();
  return report_;
}

CheckReport run_check(const CheckOptions& options, SubjectList& subjects,
                      const Progress& progress) {
  return Campaign(options, subjects).run(progress);
}

}  // namespace kvo::oracle
