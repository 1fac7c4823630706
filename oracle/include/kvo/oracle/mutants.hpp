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
  std::string models;   ///< the real bug it models
  Overrides overrides;  ///< the conditions under which the bug can show
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
  std::string first_failure;
  std::string skipped;  ///< non-empty: not run here (e.g. a CUDA mutant without a GPU), and why
};

/// Appends to the subject lists the catalogued mutants among `names`, so that a mutant can be named
/// wherever a subject can (`kvoracle check --subject minus-one-wraps`, `kvoracle explain`).
void add_named_mutants(const std::vector<std::string>& names, SubjectList& subjects);

/// Runs each mutant (all, or those named) for up to `max_cases` cases from `seed`, stopping at the
/// first kill. An unknown name is InvalidInput.
std::vector<MutantResult> run_mutants(std::uint64_t seed, std::int64_t max_cases,
                                      const std::vector<std::string>& names = {});

}  // namespace kvo::oracle
