#pragma once
/// \file report_files.hpp
/// Machine-readable campaign reports for CI systems: JUnit XML (one testcase per subject and op)
/// and JSON. Each file is written to a temporary name and renamed, so a failed write leaves
/// nothing.

#include <string>
#include <vector>

#include "kvo/oracle/campaign.hpp"

namespace kvo::oracle {

/// The JSON key of an outcome's count in a subject's row: its name, '_' for '-' ("failed_to_run").
std::string outcome_count_key(spec::Outcome outcome);

std::string junit_xml(const CheckReport& report);
std::string report_json(const CheckReport& report);

/// The report a `--json` file holds (report_json's form, as written by this version). Throws
/// spec::InvalidInput naming `source`, the key and what was expected: text that is not one JSON
/// object, a missing or mistyped key, an unknown op or outcome, a count below zero or counts that
/// do not add up to the cases.
CheckReport read_report_json(const std::string& text, const std::string& source);

/// One verdict from the reports of every shard of one campaign (`kvoracle report merge`): the
/// counts, bytes and coverage summed (a condition's first case the earliest), the worst outcome,
/// each subject's first failure the earliest case's and the other shards' first failures after it
/// (every failing shard's reproduce line), seconds the longest shard's. The same report, timing
/// aside, as the campaign run unsharded, but for those later failures. Throws spec::InvalidInput
/// naming the source when the shards disagree (seed, shard count, subjects, coverage rows), when a
/// shard is given twice or one is missing.
CheckReport merge_reports(const std::vector<CheckReport>& shards,
                          const std::vector<std::string>& sources);

/// Writes `text` to `path` atomically; throws spec::FailedToRun naming the path on an I/O error.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace kvo::oracle
