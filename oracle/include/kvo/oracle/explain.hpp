#pragma once
/// \file explain.hpp
/// `kvoracle explain`: everything about one failing case. For a write: the SPEC 7 report over every
/// layer, a picture of the pages involved (which slots should have changed, which did, which
/// differ), the token responsible for each and the first differing elements decoded side by side.
/// For the read ops: the top-k rows and attention elements that differ.

#include <cstdint>
#include <string>

#include "kvo/oracle/check.hpp"

namespace kvo::oracle {

struct Explanation {
  spec::Outcome outcome = spec::Outcome::kPass;
  std::string text;
};

/// Explains case `case_seed` (with the options' overrides) for the subject named `subject` on `op`.
/// The subject is looked up among the given lists; an unknown one is InvalidInput.
Explanation explain_case(const CheckOptions& options, std::uint64_t case_seed,
                         const std::string& subject, const std::string& op,
                         std::vector<std::unique_ptr<WriteSubject>>& write_subjects,
                         std::vector<std::unique_ptr<ReadSubject>>& read_subjects);

}  // namespace kvo::oracle
