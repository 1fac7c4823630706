#include "kvo/oracle/check.hpp"

#include <chrono>
#include <cstdio>
#include <sstream>

#include "kvo/oracle/cache_diff.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"

namespace kvo::oracle {
namespace {

using spec::Outcome;

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(v));
  return buf;
}

/// Runs one subject over every layer of a case; returns the outcome and fills the diff or error.
Outcome run_subject(WriteSubject& subject, const WriteCase& wc,
                    const reference::PagedCacheLayout& layout,
                    const std::vector<spec::LayerCaches>& expected, CacheDiff& diff,
                    std::string& error) {
  std::vector<spec::LayerCaches> actual = reference::make_model_caches(layout);
  try {
    for (std::size_t l = 0; l < wc.writes.size(); ++l)
      subject.write_layer(wc.config, wc.writes[l], actual[l]);
  } catch (const spec::InvalidInput& e) {
    error = std::string("rejected a valid case: ") + e.what();
    return Outcome::kInvalidInput;
  } catch (const spec::Unsupported& e) {
    error = std::string("unsupported: ") + e.what();
    return Outcome::kUnsupported;
  } catch (const std::exception& e) {
    error = std::string("failed to run: ") + e.what();
    return Outcome::kFailedToRun;
  }
  for (std::size_t l = 0; l < wc.writes.size(); ++l) {
    diff.merge(diff_layer_caches(layout, static_cast<std::int64_t>(l), expected[l], actual[l],
                                 &wc.writes[l]));
  }
  return diff.equal() ? Outcome::kPass : Outcome::kMismatch;
}

}  // namespace

std::string repro_command(const CheckOptions& o, std::uint64_t seed, const std::string& subject) {
  return "kvoracle check --case-seed " + hex64(seed) + " --subject " + subject +
         o.overrides.to_flags();
}

std::string CheckReport::summary() const {
  std::ostringstream s;
  char line[256];
  std::snprintf(line, sizeof line,
                "kvoracle check: seed %s, %lld cases in %.2f s, %lld bytes compared\n",
                hex64(seed).c_str(), static_cast<long long>(cases_run), seconds,
                static_cast<long long>(bytes_compared));
  s << line;
  std::snprintf(line, sizeof line, "%-24s %8s %8s %9s %8s %8s %12s\n", "subject", "cases", "pass",
                "mismatch", "invalid", "failed", "unsupported");
  s << line;
  for (const auto& sub : subjects) {
    if (!sub.skipped.empty()) {
      std::snprintf(line, sizeof line, "%-24s skipped: %s\n", sub.name.c_str(),
                    sub.skipped.c_str());
    } else {
      std::snprintf(line, sizeof line, "%-24s %8lld %8lld %9lld %8lld %8lld %12lld\n",
                    sub.name.c_str(), static_cast<long long>(sub.cases),
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
      s << "\nfirst failure of " << sub.name << ":\n" << sub.first_failure << "\n";
  }
  s << "result: " << spec::name_of(worst);
  return s.str();
}

CheckReport run_check(const CheckOptions& o, std::vector<std::unique_ptr<WriteSubject>>& all,
                      const std::function<void(std::int64_t, std::int64_t)>& progress) {
  for (std::size_t i = 0; i < o.subjects.size(); ++i) {
    bool known = false;
    for (const auto& s : all) known |= s->name() == o.subjects[i];
    if (!known) {
      std::string names;
      for (const auto& s : all) names += (names.empty() ? "" : "|") + s->name();
      throw spec::InvalidInput("subject", static_cast<std::int64_t>(i), o.subjects[i],
                               "unknown subject; known: " + names);
    }
  }
  if (o.cases < 1 && !o.case_seed)
    throw spec::InvalidInput("cases", -1, std::to_string(o.cases), "must be >= 1");

  CheckReport report;
  report.seed = o.seed;
  std::vector<WriteSubject*> running;
  for (const auto& s : all) {
    bool selected = o.subjects.empty();
    for (const auto& name : o.subjects) selected |= s->name() == name;
    if (!selected) continue;
    SubjectSummary sum;
    sum.name = s->name();
    sum.skipped = s->unavailable_reason();
    if (sum.skipped.empty()) running.push_back(s.get());
    report.subjects.push_back(sum);
  }
  auto summary_of = [&](const WriteSubject* s) -> SubjectSummary& {
    for (auto& sum : report.subjects)
      if (sum.name == s->name()) return sum;
    return report.subjects.front();
  };

  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const std::int64_t total = o.case_seed ? 1 : o.cases;
  for (std::int64_t i = 0; i < total; ++i) {
    if (o.time_budget_s > 0.0 && i > 0 && elapsed() > o.time_budget_s) break;
    const std::uint64_t seed =
        o.case_seed ? *o.case_seed : case_seed(o.seed, static_cast<std::uint64_t>(i));
    const WriteCase wc = make_write_case(seed, o.overrides);
    const reference::PagedCacheLayout layout(wc.config);
    std::vector<spec::LayerCaches> expected = reference::make_model_caches(layout);
    for (std::size_t l = 0; l < wc.writes.size(); ++l)
      reference::write_layer(wc.config, wc.writes[l], expected[l]);

    for (WriteSubject* s : running) {
      CacheDiff diff;
      std::string error;
      const Outcome outcome = run_subject(*s, wc, layout, expected, diff, error);
      SubjectSummary& sum = summary_of(s);
      ++sum.cases;
      ++sum.counts[static_cast<int>(outcome)];
      report.bytes_compared += diff.compared_bytes;
      report.worst = spec::worst(report.worst, outcome);
      if (outcome != Outcome::kPass && outcome != Outcome::kUnsupported &&
          sum.first_failure.empty()) {
        std::ostringstream f;
        f << "case " << i << " seed " << hex64(seed) << ": " << wc.describe() << "\n"
          << (outcome == Outcome::kMismatch ? diff.report() : error)
          << "\nreproduce: " << repro_command(o, seed, s->name());
        sum.first_failure = f.str();
      }
    }
    ++report.cases_run;
    if (progress) progress(report.cases_run, total);
  }
  report.seconds = elapsed();
  return report;
}

}  // namespace kvo::oracle
