// kvoracle report merge: one verdict from the JSON reports of a campaign's shards (issue 15).
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvo/oracle/report_files.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/traces/safetensors.hpp"

namespace kvo::cli {
namespace {

struct MergeFlags {
  std::vector<std::string> reports;
  std::string junit, json;
  bool coverage = false;
};

int run_merge(const MergeFlags& f) {
  std::vector<oracle::CheckReport> shards;
  for (const std::string& path : f.reports) {
    const std::vector<std::uint8_t> bytes = traces::read_file_bytes(path, "report");
    shards.push_back(oracle::read_report_json(std::string(bytes.begin(), bytes.end()), path));
  }
  // Everything is read and checked before anything is written.
  const oracle::CheckReport merged = oracle::merge_reports(shards, f.reports);
  std::printf("kvoracle report merge: %zu shard report(s) of one campaign\n", shards.size());
  std::cout << merged.summary() << std::endl;
  if (f.coverage) std::cout << merged.coverage_table() << std::flush;
  if (!f.junit.empty()) oracle::write_file_atomically(f.junit, oracle::junit_xml(merged));
  if (!f.json.empty()) oracle::write_file_atomically(f.json, oracle::report_json(merged));
  return spec::exit_status(merged.worst);
}

}  // namespace

void add_report(CLI::App& app, int& status) {
  CLI::App* report = app.add_subcommand("report", "campaign reports");
  report->require_subcommand(1);
  auto f = std::make_shared<MergeFlags>();
  CLI::App* merge = report->add_subcommand(
      "merge",
      "one verdict from every shard's --json report of one campaign (same seed, each shard once): "
      "counts and coverage summed, every failing shard's reproduce line kept");
  merge->add_option("reports", f->reports, "the shards' JSON reports")->required();
  merge->add_option("--junit", f->junit, "write the merged JUnit XML report");
  merge->add_option("--json", f->json, "write the merged report as JSON");
  merge->add_flag("--coverage", f->coverage, "print the merged coverage table");
  merge->callback([f, &status] { status = run_merge(*f); });
}

}  // namespace kvo::cli
