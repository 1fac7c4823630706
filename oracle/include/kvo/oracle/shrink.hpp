#pragma once
/// \file shrink.hpp
/// Shrinking a failing case to a small readable one. Cases are pure functions of (seed, fixed
/// dimensions), so shrinking fixes one dimension at a time to a smaller value (one layer, one
/// token, one request, one KV head, head_dim 8, block size 1, no edge values, ...) and keeps the
/// change when some case under it (the same seed, or one of a few derived seeds) still fails for
/// that subject and op. The result replays with one command.

#include <cstdint>
#include <optional>
#include <string>

#include "kvo/oracle/check.hpp"

namespace kvo::oracle {

struct ShrunkCase {
  std::uint64_t seed = 0;
  CaseOverrides overrides;
  ReadOverrides read_overrides;
  std::string command;  ///< the one-line reproduction
  std::string first_failure;
  int steps = 0;     ///< reductions kept
  int attempts = 0;  ///< cases run while shrinking
};

/// Shrinks case `seed` that fails for `subject` on `op` under `options`' overrides. Returns nothing
/// when the case does not fail to begin with.
std::optional<ShrunkCase> shrink_failure(const CheckOptions& options, std::uint64_t seed,
                                         const std::string& subject, const std::string& op,
                                         std::vector<std::unique_ptr<WriteSubject>>& write_subjects,
                                         std::vector<std::unique_ptr<ReadSubject>>& read_subjects);

}  // namespace kvo::oracle
