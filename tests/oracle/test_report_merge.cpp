// Reports read back and merged (issue 15: shards on several GPUs or machines, one verdict): the
// shards of a campaign merge into the report of the campaign run unsharded, every failing shard's
// reproduce line kept; a report file that is not one, or shards that are not one campaign, are
// InvalidInput naming the file and the key.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../common/invalid_input.hpp"
#include "kvo/oracle/mutants.hpp"
#include "kvo/oracle/report_files.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {
namespace {

CheckOptions campaign() {
  CheckOptions o;
  o.seed = 0x5E4D;
  o.cases = 30;
  o.jobs = 1;
  o.subjects = {"cpu-fused", "minus-one-stops-write", "reversed-tie-order", "cpu-dense"};
  return o;
}

CheckReport run(CheckOptions o) {
  auto subjects = make_subjects();
  add_named_mutants(o.subjects, subjects);
  return run_check(o, subjects);
}

/// The report's JSON with its timing and a merged report's later failures left out.
std::string comparable(CheckReport r) {
  r.seconds = 0.0;
  for (SubjectSummary& s : r.subjects) s.more_failures.clear();
  return report_json(r);
}

using kvo::testing::invalid_input;

TEST(ReportMerge, ShardsMergeIntoTheUnshardedCampaignsReport) {
  const CheckReport whole = run(campaign());
  ASSERT_EQ(whole.worst, spec::Outcome::kMismatch);
  std::vector<CheckReport> shards;
  std::vector<std::string> sources;
  for (std::int64_t i = 2; i >= 0; --i) {  // any order
    CheckOptions o = campaign();
    o.total_shards = 3;
    o.shard_index = i;
    const std::string source = "shard" + std::to_string(i) + ".json";
    // Through the file's text, as `kvoracle report merge` reads it.
    const CheckReport r = read_report_json(report_json(run(o)), source);
    EXPECT_EQ(r.shard_index, i);
    EXPECT_EQ(r.total_shards, 3);
    shards.push_back(r);
    sources.push_back(source);
  }
  const CheckReport merged = merge_reports(shards, sources);
  EXPECT_EQ(comparable(merged), comparable(whole));
  // Every failing shard's first failure is kept, with its reproduce line, after the earliest.
  int failing_shards = 0;
  for (const CheckReport& s : shards) failing_shards += !s.subjects[1].first_failure.empty();
  const SubjectSummary& stops = merged.subjects[1];
  ASSERT_EQ(stops.name, "minus-one-stops-write");
  EXPECT_EQ(1 + stops.more_failures.size(), static_cast<std::size_t>(failing_shards));
  ASSERT_GE(stops.more_failures.size(), 1u);
  for (const std::string& f : stops.more_failures)
    EXPECT_NE(f.find("reproduce: kvoracle check --case-seed"), std::string::npos) << f;
  EXPECT_NE(merged.summary().find("later failure of minus-one-stops-write"), std::string::npos);
  EXPECT_NE(junit_xml(merged).find(stops.more_failures.front().substr(0, 20)), std::string::npos);
  // A merged report is itself a report file that reads back the same.
  EXPECT_EQ(report_json(read_report_json(report_json(merged), "merged.json")), report_json(merged));
}

TEST(ReportMerge, ShardsThatAreNotOneCampaignAreNamed) {
  std::vector<CheckReport> shards;
  for (std::int64_t i = 0; i < 2; ++i) {
    CheckOptions o = campaign();
    o.cases = 6;
    o.total_shards = 2;
    o.shard_index = i;
    shards.push_back(run(o));
  }
  const std::vector<std::string> names{"a.json", "b.json"};
  EXPECT_NO_THROW(merge_reports(shards, names));
  EXPECT_NE(invalid_input([&] {
              merge_reports({shards[0]}, {"a.json"});
            }).find("no report of shard 1 of 2"),
            std::string::npos);
  EXPECT_NE(invalid_input([&] {
              merge_reports({shards[0], shards[0]}, names);
            }).find("b.json: shard_index = 0: that shard is given twice"),
            std::string::npos);
  CheckReport other = shards[1];
  other.seed = 7;
  EXPECT_NE(invalid_input([&] {
              merge_reports({shards[0], other}, names);
            }).find("b.json: seed"),
            std::string::npos);
  // A subject run on one shard and skipped on another was judged on part of the cases only.
  other = shards[1];
  other.subjects[0].skipped = "no CUDA device answers";
  EXPECT_NE(invalid_input([&] {
              merge_reports({shards[0], other}, names);
            }).find("b.json: subjects[0].skipped"),
            std::string::npos);
  other = shards[1];
  other.coverage.pop_back();
  EXPECT_NE(invalid_input([&] {
              merge_reports({shards[0], other}, names);
            }).find("b.json: coverage"),
            std::string::npos);
}

TEST(ReportMerge, AFileThatIsNotAReportIsNamedByItsKey) {
  CheckOptions o = campaign();
  o.cases = 4;
  const std::string good = report_json(run(o));
  EXPECT_NO_THROW(read_report_json(good, "r.json"));
  const auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const std::size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  const struct {
    std::string text, expect;
  } bad[] = {
      {"", "r.json = (its text): not JSON"},
      {"[1, 2]", "r.json = [1,2]: not an object"},
      {good.substr(0, good.size() / 2), "not JSON"},
      {replaced("\"seed\"", "\"sed\""), "r.json: seed = (absent): missing"},
      {replaced("\"cases_run\": 4", "\"cases_run\": -4"), "r.json: cases_run = -4"},
      {replaced("\"cases_run\": 4", "\"cases_run\": \"4\""),
       "cases_run = \"4\": expected an integer"},
      {replaced("\"op\": \"write\"", "\"op\": \"read\""), "subjects[0].op = read: unknown"},
      {replaced("\"pass\": 4", "\"pass\": 3"),
       "subjects[0].cases = 4: the outcome counts add up to 3"},
      {replaced("\"result\": \"mismatch\"", "\"result\": \"pass\""),
       "result = pass: the subjects' counts say mismatch"},
      {replaced("\"shard_index\": 0", "\"shard_index\": 1"), "shard_index = 1: must be in [0, 0]"},
      {replaced("\"more_failures\": []", "\"more_failures\": [3]"),
       "subjects[0].more_failures[0] = 3: expected a string"},
  };
  for (const auto& b : bad) {
    const std::string message = invalid_input([&] { read_report_json(b.text, "r.json"); });
    EXPECT_NE(message.find(b.expect), std::string::npos) << "got: " << message;
  }
}

}  // namespace
}  // namespace kvo::oracle
