#include "kvo/oracle/shrink.hpp"

#include "kvo/reference/generator.hpp"

namespace kvo::oracle {
namespace {

/// Seeds tried under a candidate reduction: the failing one, then a few derived from it.
constexpr int kSeedsPerCandidate = 12;

}  // namespace

std::optional<ShrunkCase> shrink_failure(const CheckOptions& base, std::uint64_t seed,
                                         const std::string& subject, spec::Op op,
                                         SubjectList& subjects) {
  ShrunkCase cur;
  cur.seed = seed;
  cur.overrides = base.overrides;
  // Runs one case; the first failure text when it does not pass. Overrides that make a case
  // impossible (e.g. more tokens than a fixed cache holds) count as "does not fail".
  auto fails = [&](std::uint64_t s, const Overrides& o, std::string* failure) {
    CheckOptions one;
    one.case_seed = s;
    one.overrides = o;
    one.subjects = {subject};
    one.ops = {op};
    ++cur.attempts;
    try {
      const CheckReport rep = run_check(one, subjects);
      if (rep.worst == spec::Outcome::kPass || rep.worst == spec::Outcome::kUnsupported)
        return false;
      for (const auto& sum : rep.subjects) {
        if (!sum.first_failure.empty() && failure != nullptr) *failure = sum.first_failure;
      }
      return true;
    } catch (const spec::InvalidInput&) {
      return false;
    }
  };
  if (!fails(seed, cur.overrides, &cur.first_failure)) return std::nullopt;
  for (const Reduction& reduction : driver_of(op).reductions()) {
    Overrides o = cur.overrides;
    if (!reduction.apply(o)) continue;
    for (int k = 0; k < kSeedsPerCandidate; ++k) {
      const std::uint64_t s =
          k == 0 ? cur.seed : reference::mix64(cur.seed + static_cast<std::uint64_t>(k));
      std::string failure;
      if (fails(s, o, &failure)) {
        cur.seed = s;
        cur.overrides = o;
        cur.first_failure = failure;
        ++cur.steps;
        break;
      }
    }
  }
  CheckOptions shown;
  shown.overrides = cur.overrides;
  cur.command = repro_command(shown, cur.seed, subject, op);
  return cur;
}

}  // namespace kvo::oracle
