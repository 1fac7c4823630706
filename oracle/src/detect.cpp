// Mode detection (SPEC 7): one run of the subject per case, its answer judged under every
// combination of the op's modes that is still alive.
#include "kvo/oracle/detect.hpp"

#include <algorithm>
#include <chrono>
#include <sstream>

#include "kvo/oracle/write_case.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {
namespace {

/// Every possible combination of the axes, the first axis most significant, so the contract's
/// defaults and the tightest values (each axis's first) come first.
std::vector<ModeCombination> enumerate(const OpDriver& driver, const std::vector<ModeAxis>& axes) {
  std::vector<ModeCombination> all;
  ModeChoice c(axes.size(), 0);
  while (true) {
    if (driver.possible(c)) all.push_back(ModeCombination{c, 0, 0, std::nullopt, {}});
    std::size_t a = axes.size();
    while (a > 0) {
      --a;
      if (++c[a] < axes[a].values.size()) break;
      c[a] = 0;
      if (a == 0) return all;
    }
    if (axes.empty()) return all;
  }
}

std::string hex_seed(std::uint64_t seed) {
  std::ostringstream s;
  s << "0x" << std::hex << std::uppercase << seed;
  return s.str();
}

DetectResult detect_op(const CheckOptions& options, Subject& subject, const OpDriver& driver) {
  DetectResult r;
  r.subject = subject.name();
  r.op = driver.op();
  r.axes = driver.mode_axes();
  const Overrides pinned = driver.pin_modes(options.overrides, r.told);
  std::vector<ModeCombination> all = enumerate(driver, r.axes);
  r.combinations = static_cast<std::int64_t>(all.size());
  if (const std::string why = subject.unavailable_reason(); !why.empty()) {
    r.run_outcome = spec::Outcome::kUnsupported;
    r.run_error = "not available here: " + why;
    return r;
  }
  std::vector<std::size_t> alive(all.size());
  for (std::size_t i = 0; i < alive.size(); ++i) alive[i] = i;
  const auto start = std::chrono::steady_clock::now();
  const std::int64_t cases = options.case_seed ? 1 : options.cases;
  for (std::int64_t i = 0; i < cases && !alive.empty(); ++i) {
    if (options.time_budget_s > 0.0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
            options.time_budget_s) {
      break;
    }
    const std::uint64_t seed = options.case_seed
                                   ? *options.case_seed
                                   : case_seed(options.seed, static_cast<std::uint64_t>(i));
    const std::unique_ptr<PreparedCase> pc = driver.prepare(seed, pinned);
    const std::unique_ptr<CapturedAnswer> answer = driver.capture(subject, *pc);
    ++r.cases_run;
    if (answer->run_outcome == spec::Outcome::kUnsupported) {
      if (r.cases_unsupported++ == 0)
        r.first_unsupported = "case " + hex_seed(seed) + ": " + answer->run_error;
      continue;
    }
    if (answer->run_outcome != spec::Outcome::kPass) {
      r.run_outcome = answer->run_outcome;
      r.run_error = "case " + hex_seed(seed) + ": " + answer->run_error;
      return r;
    }
    std::vector<std::size_t> next;
    for (const std::size_t idx : alive) {
      const Verdict v = answer->judge_under(all[idx].choice);
      ++r.judgements;
      if (v.outcome == spec::Outcome::kPass) {
        ++all[idx].cases_matched;
        next.push_back(idx);
      } else {
        all[idx].mismatch_size = v.mismatch_size;
        all[idx].failed_seed = seed;
        all[idx].first_mismatch = v.report;
      }
    }
    if (next.empty()) {
      // Every survivor fell on this case: the closest is the smallest of those mismatches.
      const auto best = std::min_element(alive.begin(), alive.end(), [&](auto a, auto b) {
        return all[a].mismatch_size < all[b].mismatch_size;
      });
      r.closest = all[*best];
      CheckOptions one = options;
      one.case_seed = seed;
      r.reproduce = repro_command(one, seed, r.subject, r.op) + " --detect-modes";
    }
    alive = std::move(next);
  }
  if (r.cases_unsupported == r.cases_run && r.cases_run > 0) {
    r.run_outcome = spec::Outcome::kUnsupported;
    r.run_error = "every case: " + r.first_unsupported;
    return r;
  }
  for (const std::size_t idx : alive) r.matched.push_back(all[idx]);
  return r;
}

}  // namespace

std::string DetectResult::describe(const ModeChoice& choice) const {
  std::string out;
  for (std::size_t a = 0; a < axes.size() && a < choice.size(); ++a) {
    if (!out.empty()) out += ' ';
    out += axes[a].name + "=" + axes[a].values[choice[a]];
  }
  return out;
}

spec::Outcome DetectResult::outcome() const {
  if (run_outcome != spec::Outcome::kPass) return run_outcome;
  return matched.empty() ? spec::Outcome::kMismatch : spec::Outcome::kPass;
}

std::string DetectResult::report() const {
  std::ostringstream s;
  s << "mode detection: subject " << subject << ", op " << spec::name_of(op) << ": " << cases_run
    << " cases, " << combinations << " possible combinations of " << axes.size() << " modes, "
    << judgements << " judgements (" << (cases_run * combinations) << " without pruning)\n";
  s << "  told:    " << describe(told) << "\n";
  if (cases_unsupported > 0 && run_outcome == spec::Outcome::kPass) {
    s << "  skipped: " << cases_unsupported << " case" << (cases_unsupported == 1 ? "" : "s")
      << " the subject does not implement (first: " << first_unsupported << ")\n";
  }
  if (run_outcome != spec::Outcome::kPass) {
    s << "  " << spec::name_of(run_outcome) << ": " << run_error << "\n";
    return s.str();
  }
  if (!matched.empty()) {
    s << "  matched on every case: " << matched.size() << " combination"
      << (matched.size() == 1 ? "" : "s") << " (tightest first)\n";
    constexpr std::size_t kShown = 8;
    for (std::size_t i = 0; i < std::min(kShown, matched.size()); ++i)
      s << "    " << describe(matched[i].choice) << "\n";
    if (matched.size() > kShown) s << "    ... and " << matched.size() - kShown << " more\n";
    // Per mode, the values some matching combination has: one value means the cases decided it.
    s << "  per mode:";
    for (std::size_t a = 0; a < axes.size(); ++a) {
      std::vector<bool> seen(axes[a].values.size(), false);
      for (const ModeCombination& m : matched) seen[m.choice[a]] = true;
      std::string values;
      for (std::size_t v = 0; v < seen.size(); ++v) {
        if (seen[v]) values += (values.empty() ? "" : "|") + axes[a].values[v];
      }
      const auto n = std::count(seen.begin(), seen.end(), true);
      s << " " << axes[a].name << "=" << values
        << (n > 1
                ? (n == static_cast<long>(seen.size()) ? " (every value matched)" : " (undecided)")
                : "");
    }
    s << "\n";
    return s.str();
  }
  s << "  no combination matched every case\n";
  if (closest) {
    s << "  closest: " << describe(closest->choice) << "\n    matched " << closest->cases_matched
      << " cases, then case " << hex_seed(*closest->failed_seed) << " (" << closest->mismatch_size
      << " off):\n    " << closest->first_mismatch << "\n";
    s << "  reproduce: " << reproduce << "\n";
  }
  return s.str();
}

std::vector<DetectResult> detect_modes(const CheckOptions& options, SubjectList& subjects,
                                       const std::string& subject_name) {
  Subject& subject = find_subject(subjects, subject_name);
  std::vector<DetectResult> results;
  std::string with_modes;
  for (const spec::Op op : options.ops) {
    const OpDriver& driver = driver_of(op);
    if (driver.mode_axes().empty()) continue;
    with_modes += (with_modes.empty() ? "" : ",") + std::string(spec::name_of(op));
    if (!subject.implements(op)) continue;
    results.push_back(detect_op(options, subject, driver));
  }
  if (results.empty()) {
    throw spec::InvalidInput("subject", -1, subject_name,
                             "implements none of the ops asked that have modes to detect (" +
                                 (with_modes.empty() ? std::string("none") : with_modes) +
                                 "); it implements " + implemented_ops(subject));
  }
  return results;
}

}  // namespace kvo::oracle
