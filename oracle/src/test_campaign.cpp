#include "kvo/oracle/test_campaign.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <sstream>
#include <system_error>
#include <vector>

#include "kvo/oracle/shrink.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle::testing {
namespace {

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(v));
  return buf;
}

/// This process's executable, for the replay line; a placeholder where /proc is not there.
bool failed(spec::Outcome o) {
  return o != spec::Outcome::kPass && o != spec::Outcome::kUnsupported;
}

/// KVO_CASE_REDUCTIONS ("OP:i,j,..."): each named reduction of OP's driver applied in order.
void apply_reductions(const std::string& text, Overrides& overrides) {
  const auto bad = [&](const std::string& why) {
    throw spec::InvalidInput(kCaseReductionsVariable, -1, text, why);
  };
  const std::size_t colon = text.find(':');
  if (colon == std::string::npos) bad("expected OP:i,j,... (e.g. write:0,4)");
  const std::optional<spec::Op> op = spec::parse_enum<spec::Op>(text.substr(0, colon));
  if (!op) bad("unknown op; known: " + spec::enum_choices<spec::Op>());
  const std::vector<Reduction> reductions = driver_of(*op).reductions();
  std::stringstream list(text.substr(colon + 1));
  for (std::string item; std::getline(list, item, ',');) {
    const std::uint64_t i = parse_u64(item, kCaseReductionsVariable);
    if (i >= reductions.size()) {
      bad("reduction " + item + " is not one of the " + std::to_string(reductions.size()) +
          " of op " + std::string(spec::name_of(*op)));
    }
    if (!reductions[i].apply(overrides)) {
      bad("reduction " + item + " (" + reductions[i].what + ") sets what the test fixes already");
    }
  }
}

}  // namespace

std::string gtest_rerun(const std::string& test_name) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::string command = ec || p.empty() ? "<test binary>" : p.string();
  if (!test_name.empty()) command += " --gtest_filter=" + test_name;
  return command;
}

void apply_test_environment(CheckOptions& o) {
  if (const char* v = std::getenv(kCaseSeedVariable)) o.case_seed = parse_u64(v, kCaseSeedVariable);
  if (const char* v = std::getenv(kSeedVariable)) o.seed = parse_u64(v, kSeedVariable);
  if (const char* v = std::getenv(kCasesVariable)) {
    const std::uint64_t cases = parse_u64(v, kCasesVariable);
    if (cases < 1 || cases > static_cast<std::uint64_t>(INT64_MAX)) {
      throw spec::InvalidInput(kCasesVariable, -1, v, "must be in [1, 2^63)");
    }
    o.cases = static_cast<std::int64_t>(cases);
  }
  if (const char* v = std::getenv(kCaseReductionsVariable)) apply_reductions(v, o.overrides);
}

TestVerdict run_test_campaign(SubjectList& subjects, CheckOptions options, const std::string& rerun,
                              bool shrink) {
  TestVerdict v;
  v.seed = options.seed;
  CheckReport report;
  try {
    apply_test_environment(options);
    options.test_rerun = rerun;
    v.seed = options.seed;
    report = run_check(options, subjects);
  } catch (const spec::InvalidInput& e) {
    // Options or an environment variable the campaign rejects: the caller's input, named.
    v.message = std::string("kvoracle: the campaign did not run: ") + e.what();
    v.outcome = std::string(spec::name_of(spec::Outcome::kInvalidInput));
    v.ran = false;
    return v;
  } catch (const std::exception& e) {
    v.message = std::string("kvoracle: the campaign did not run: ") + e.what();
    v.outcome = std::string(spec::name_of(spec::Outcome::kFailedToRun));
    v.ran = false;
    return v;
  }

  // Why this run is not a pass although no case failed: a pair that never ran, or whose every
  // case was unsupported, judged nothing.
  std::ostringstream unjudged;
  for (const SubjectSummary& s : report.subjects) {
    const std::string pair = s.name + " (" + std::string(spec::name_of(s.op)) + ")";
    if (!s.skipped.empty()) {
      unjudged << "not judged: " << pair << " did not run here: " << s.skipped
               << " (skip the test where it cannot run, e.g. GTEST_SKIP() without a GPU)\n";
    } else if (s.count(spec::Outcome::kPass) == 0 && s.first_failure.empty()) {
      unjudged << "not judged: " << pair << ": ";
      if (s.cases == 0) {
        unjudged << "no case ran\n";
      } else {
        unjudged << "it declared all " << s.cases
                 << " cases unsupported (fix the overrides to what it implements)\n";
      }
    }
  }
  if (report.subjects.empty()) unjudged << "not judged: no subject implements the ops asked\n";
  v.passed = !failed(report.worst) && unjudged.str().empty();
  v.outcome = failed(report.worst)     ? std::string(spec::name_of(report.worst))
              : unjudged.str().empty() ? std::string(spec::name_of(spec::Outcome::kPass))
                                       : std::string(kNotJudged);

  std::ostringstream m;
  if (failed(report.worst)) {
    m << "kvoracle: " << spec::name_of(report.worst) << " (campaign seed " << hex64(report.seed)
      << ")\n";
  }
  // A run that judged nothing is no pass: its summary says so where it gives the result.
  m << report.summary(v.outcome == kNotJudged ? kNotJudged : "") << "\n" << unjudged.str();
  for (const SubjectSummary& s : report.subjects) {
    if (!s.failing_seed) continue;
    m << "\nreproduce in this test (" << s.name << ", " << spec::name_of(s.op)
      << "): " << repro_command(options, *s.failing_seed, s.name, s.op) << "\n";
    // As `kvoracle check` does: the case shrunk to a small one that still fails.
    if (!shrink || s.count(spec::Outcome::kMismatch) == 0) continue;
    try {
      const auto shrunk = shrink_failure(options, *s.failing_seed, s.name, s.op, subjects);
      if (shrunk) {
        m << "\nshrunk failure of " << s.name << " (" << spec::name_of(s.op) << ", "
          << shrunk->steps << " reductions kept, " << shrunk->attempts << " cases run):\n"
          << shrunk->first_failure << "\n";
      }
    } catch (const std::exception& e) {
      m << "(shrinking stopped: " << e.what() << ")\n";
    }
  }
  v.message = m.str();
  return v;
}

}  // namespace kvo::oracle::testing
