#pragma once
/// \file report_files.hpp
/// Machine-readable campaign reports for CI systems: JUnit XML (one testcase per subject and op)
/// and JSON. Each file is written to a temporary name and renamed, so a failed write leaves
/// nothing.

#include <string>

#include "kvo/oracle/campaign.hpp"

namespace kvo::oracle {

std::string junit_xml(const CheckReport& report);
std::string report_json(const CheckReport& report);

/// Writes `text` to `path` atomically; throws spec::FailedToRun naming the path on an I/O error.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace kvo::oracle
