#pragma once
/// \file case_flags.hpp
/// The command line's table of case flags (options.hpp's add_case_flags) for callers that hold
/// flags as text: the Python package maps its keyword overrides onto them. No CLI11 here, so that
/// such callers compile without it (kvo_cli_options links it).

#include <string>
#include <vector>

#include "kvo/oracle/op_driver.hpp"

namespace kvo::cli {

/// The overrides that `flags` (as `kvoracle check` takes them: "--block-size", "16", ...) fix,
/// through add_case_flags: one table of every dimension for the command line and the Python
/// package. Throws spec::InvalidInput naming the flag when one is unknown, lacks its value or has a
/// value its option rejects.
oracle::Overrides parse_case_flags(const std::vector<std::string>& flags);

/// Every flag of add_case_flags ("--block-size", ...), for callers that map their own names on
/// them.
std::vector<std::string> case_flag_names();

}  // namespace kvo::cli
