#pragma once
/// \file shrink.hpp
/// Shrinking a failing case to a small readable one. Cases are pure functions of (seed, fixed
/// dimensions), so shrinking applies the op driver's reductions one at a time (one layer, one
/// token, one request, one KV head, small head_dim, pages of 1, no edge values, ...) and keeps a
/// reduction when some case under it (the same seed, or one of a few derived seeds) still fails
/// for that subject and op in the same class (failure_class_of: the same kind of first mismatch,
/// the same cause of a failure to run). A reduction never touches a dimension or mode the caller
/// fixed (an override, an adapter's declared modes): the shrunk case is one the subject claims to
/// implement, so a correct kernel passes it. Derived seeds skip the huge-cache theme, and a
/// failing huge-cache case is first moved to a small one where that still fails. The result
/// replays with one command.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvo/oracle/campaign.hpp"

namespace kvo::oracle {

struct ShrunkCase {
  std::uint64_t seed = 0;
  Overrides overrides;
  std::string command;  ///< the one-line reproduction
  std::string first_failure;
  std::string failure_class;      ///< the class it fails in, as the original case did
  std::vector<std::size_t> kept;  ///< the OpDriver::reductions indices kept, in order
  int steps = 0;                  ///< reductions kept (and a move to a small cache)
  int attempts = 0;               ///< cases run while shrinking
};

/// Shrinks case `seed` that fails for `subject` on `op` under `options`' overrides. Returns nothing
/// when the case does not fail to begin with.
std::optional<ShrunkCase> shrink_failure(const CheckOptions& options, std::uint64_t seed,
                                         const std::string& subject, spec::Op op,
                                         SubjectList& subjects);

}  // namespace kvo::oracle
