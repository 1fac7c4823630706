#pragma once
/// \file mutants.hpp
/// The mutation score: a catalogue of planted bugs modelled on real ones (anchors_kvcache.md 6),
/// each a subject that can be switched on, and the campaign that measures how many cases each needs
/// before the oracle kills it. A mutant that survives is a hole in the oracle.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvo/oracle/campaign.hpp"

namespace kvo::oracle {

struct Mutant {
  std::string name;
  spec::Op op = spec::Op::kWrite;
  std::string models;  ///< the real bug it models
  /// The conditions under which the bug shows (kvoracle mutants --targeted, explain); the mutation
  /// score runs the default distribution, which must reach them on its own.
  Overrides overrides;
  std::function<std::unique_ptr<Subject>()> make;
};

/// Every catalogued mutant in a fixed order: the CPU ones (write, read, dense), then (built with
/// CUDA) bugs planted in the CUDA kernels.
const std::vector<Mutant>& mutant_catalogue();

struct MutantResult {
  std::string name;
  spec::Op op = spec::Op::kWrite;
  std::string models;
  bool killed = false;
  std::int64_t cases = 0;  ///< cases run: the one that killed it, or all of them
  /// Over MutantRun::seeds campaign seeds (the first being the run's seed): on how many it was
  /// killed within max_cases, and the median and largest cases-to-kill (max_cases + 1 for a seed
  /// that did not kill it).
  std::int64_t seeds_killed = 0, seeds = 0;
  double median_cases = 0.0;
  std::int64_t worst_cases = 0;
  std::string first_failure;
  std::string skipped;  ///< non-empty: not run here (e.g. a CUDA mutant without a GPU), and why
};

/// Appends to the subject lists the catalogued mutants among `names`, so that a mutant can be named
/// wherever a subject can (`kvoracle check --subject minus-one-wraps`, `kvoracle explain`).
void add_named_mutants(const std::vector<std::string>& names, SubjectList& subjects);

struct MutantRun {
  std::uint64_t seed = 0x6D757461;
  std::int64_t max_cases = 200;
  std::vector<std::string> names;  ///< empty: every mutant
  std::int64_t seeds = 1;          ///< campaign seeds for the median cases-to-kill
  bool targeted = false;           ///< each mutant's own overrides, not the default distribution
  /// Mutants run at once (0: one per hardware thread): a concurrent mutant (Subject::concurrent)
  /// on a worker thread, one campaign job each; the others on the calling thread, one after
  /// another. The results are the same for any number.
  std::int64_t jobs = 0;
};

/// Runs each mutant (all, or those named) under the default case distribution (or, targeted, its
/// own conditions) for up to max_cases cases from each of `seeds` campaign seeds (the first `seed`
/// itself, then case_seed(seed, 1000 + i)), stopping each at its first kill. An unknown name is
/// InvalidInput.
std::vector<MutantResult> run_mutants(const MutantRun& run);

}  // namespace kvo::oracle
