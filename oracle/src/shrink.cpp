#include "kvo/oracle/shrink.hpp"

#include "kvo/oracle/write_case.hpp"
#include "kvo/reference/generator.hpp"

namespace kvo::oracle {
namespace {

/// Seeds tried under a candidate reduction: the failing one, then a few derived from it.
constexpr int kSeedsPerCandidate = 12;

/// The k-th seed derived from `seed` (k >= 1) whose case is not of the huge-cache theme: a shrunk
/// case is one a user can debug, and a cache of gigabytes is kept only where the bug needs it.
std::uint64_t derived_seed(std::uint64_t seed, int k) {
  std::uint64_t s = seed;
  for (int found = 0, i = 1; found < k; ++i) {
    s = reference::mix64(seed + static_cast<std::uint64_t>(i));
    if (theme_slot(s) != kThemeHugeCache) ++found;
  }
  return s;
}

}  // namespace

std::optional<ShrunkCase> shrink_failure(const CheckOptions& base, std::uint64_t seed,
                                         const std::string& subject, spec::Op op,
                                         SubjectList& subjects) {
  ShrunkCase cur;
  cur.seed = seed;
  cur.overrides = base.overrides;
  std::string failure_class;  // the class the shrunk case must keep failing in
  // Runs one case; true when it fails in `failure_class` (any class while that is unset), its
  // report in `failure`. Overrides that make a case impossible (e.g. more tokens than a fixed
  // cache holds) count as "does not fail".
  // `steps`: the reductions that made `o` (the case's reproduce line in a test names them).
  auto fails = [&](std::uint64_t s, const Overrides& o, const std::vector<std::size_t>& steps,
                   std::string* failure) {
    CheckOptions one;
    one.case_seed = s;
    one.overrides = o;
    one.test_rerun = base.test_rerun;
    one.test_reductions = steps;
    one.subjects = {subject};
    one.ops = {op};
    ++cur.attempts;
    try {
      const CheckReport rep = run_check(one, subjects);
      if (rep.worst == spec::Outcome::kPass || rep.worst == spec::Outcome::kUnsupported)
        return false;
      for (const auto& sum : rep.subjects) {
        if (sum.failure_classes.empty()) continue;
        const std::string& got = sum.failure_classes.front().name;
        if (!failure_class.empty() && got != failure_class) return false;
        failure_class = got;
        if (failure != nullptr) *failure = sum.first_failure;
        return true;
      }
      return false;
    } catch (const spec::InvalidInput&) {
      return false;
    }
  };
  if (!fails(seed, cur.overrides, {}, &cur.first_failure)) return std::nullopt;
  // A small cache first: the same overrides on another seed, where the failing case has a huge one.
  if (theme_slot(seed) == kThemeHugeCache) {
    for (int k = 1; k <= kSeedsPerCandidate; ++k) {
      const std::uint64_t s = derived_seed(seed, k);
      std::string failure;
      if (fails(s, cur.overrides, {}, &failure)) {
        cur.seed = s;
        cur.first_failure = failure;
        ++cur.steps;
        break;
      }
    }
  }
  const std::vector<Reduction> reductions = driver_of(op).reductions();
  for (std::size_t r = 0; r < reductions.size(); ++r) {
    Overrides o = cur.overrides;
    // A reduction never changes what the caller fixed, nor what an earlier one set.
    if (!reductions[r].apply(o)) continue;
    std::vector<std::size_t> steps = cur.kept;
    steps.push_back(r);
    for (int k = 0; k < kSeedsPerCandidate; ++k) {
      const std::uint64_t s = k == 0 ? cur.seed : derived_seed(cur.seed, k);
      std::string failure;
      if (fails(s, o, steps, &failure)) {
        cur.seed = s;
        cur.overrides = o;
        cur.first_failure = failure;
        cur.kept = steps;
        ++cur.steps;
        break;
      }
    }
  }
  CheckOptions shown;
  shown.overrides = cur.overrides;
  shown.test_rerun = base.test_rerun;
  shown.test_reductions = cur.kept;
  cur.failure_class = failure_class;
  // The same line the shrunk case's report ends in (run_check above, with the same options).
  cur.command = repro_command(shown, cur.seed, subject, op);
  return cur;
}

}  // namespace kvo::oracle
