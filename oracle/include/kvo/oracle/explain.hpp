#pragma once
/// \file explain.hpp
/// `kvoracle explain`: everything about one case for one subject and op, from the op's driver. For
/// the ops that write caches: the SPEC 7 report over every layer, a picture of the pages involved
/// (which slots should have changed, which did, which differ), the token responsible for each and
/// the first differing elements decoded side by side. For the read ops: the batch and the top-k
/// rows or attention elements that differ.

#include <cstdint>
#include <string>

#include "kvo/oracle/campaign.hpp"

namespace kvo::oracle {

struct Explanation {
  spec::Outcome outcome = spec::Outcome::kPass;
  std::string text;
};

/// Explains case `case_seed` (with the options' overrides) for the subject named `subject` on `op`.
/// An unknown subject, or one that does not implement `op`, is InvalidInput.
Explanation explain_case(const CheckOptions& options, std::uint64_t case_seed,
                         const std::string& subject, spec::Op op, SubjectList& subjects);

}  // namespace kvo::oracle
