// The mutation score and the CI-facing parts of the campaign: every catalogued mutant is killed
// within 200 cases; shards partition a campaign; JUnit and JSON reports say what the summary says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "kvo/oracle/mutants.hpp"
#include "kvo/oracle/report_files.hpp"
#include "kvo/oracle/shrink.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {
namespace {

TEST(Mutants, CatalogueHasAtLeastTwelveDistinctBugsOverEveryOp) {
  const auto& cat = mutant_catalogue();
  EXPECT_GE(cat.size(), 12u);
  std::set<std::string> names;
  std::set<spec::Op> ops;
  for (const Mutant& m : cat) {
    EXPECT_TRUE(names.insert(m.name).second) << m.name;
    ops.insert(m.op);
    EXPECT_FALSE(m.models.empty()) << m.name;
    ASSERT_TRUE(static_cast<bool>(m.make)) << m.name;
    // A mutant is a subject of its op, named as catalogued.
    const auto subject = m.make();
    EXPECT_EQ(subject->name(), m.name);
    EXPECT_TRUE(subject->implements(m.op)) << m.name;
  }
  // Every op of the registry has mutants.
  const std::vector<spec::Op> every = all_ops();
  EXPECT_EQ(ops, (std::set<spec::Op>(every.begin(), every.end())));
}

TEST(Mutants, EveryMutantIsKilledWithin200Cases) {
  for (const std::uint64_t seed : {0x6D757461ull, 0x1234ull}) {
    MutantRun run;
    run.seed = seed;
    for (const MutantResult& r : run_mutants(run)) {
      if (!r.skipped.empty()) continue;  // a CUDA mutant without a GPU
      EXPECT_TRUE(r.killed) << r.name << " survived 200 cases from seed " << seed;
      EXPECT_NE(r.first_failure.find("reproduce: kvoracle check --case-seed"), std::string::npos)
          << r.first_failure;
    }
  }
}

TEST(Mutants, MedianCasesToKillOverSeeds) {
  MutantRun run;
  run.names = {"minus-one-stops-write", "fp8-round-half-away"};
  run.seeds = 5;
  const std::vector<MutantResult> results = run_mutants(run);
  ASSERT_EQ(results.size(), 2u);
  for (const MutantResult& r : results) {
    EXPECT_EQ(r.seeds, 5) << r.name;
    EXPECT_EQ(r.seeds_killed, 5) << r.name;
    EXPECT_GE(r.median_cases, 1.0) << r.name;
    EXPECT_LE(r.median_cases, static_cast<double>(r.worst_cases)) << r.name;
    EXPECT_LE(r.worst_cases, 200) << r.name;
  }
}

TEST(Mutants, UnknownMutantIsInvalidInput) {
  MutantRun run;
  run.names = {"minus-one-wraps", "no-such-bug"};
  EXPECT_THROW(run_mutants(run), spec::InvalidInput);
  run.names = {};
  run.seeds = 0;
  EXPECT_THROW(run_mutants(run), spec::InvalidInput);
}

TEST(Shards, ShardsPartitionTheCampaign) {
  CheckOptions o;
  o.seed = 3;
  o.cases = 25;
  o.ops = {spec::Op::kWrite};
  std::int64_t total = 0;
  for (std::int64_t i = 0; i < 4; ++i) {
    o.total_shards = 4;
    o.shard_index = i;
    auto subjects = make_subjects();
    const CheckReport r = run_check(o, subjects);
    EXPECT_EQ(r.worst, spec::Outcome::kPass);
    total += r.cases_run;
  }
  EXPECT_EQ(total, 25);
  o.shard_index = 4;
  auto subjects = make_subjects();
  EXPECT_THROW(run_check(o, subjects), spec::InvalidInput);
}

TEST(Shards, GoogleTestEnvironmentIsHonoured) {
  CheckOptions o;
  ::setenv("GTEST_TOTAL_SHARDS", "3", 1);
  ::setenv("GTEST_SHARD_INDEX", "2", 1);
  apply_shard_environment(o);
  EXPECT_EQ(o.total_shards, 3);
  EXPECT_EQ(o.shard_index, 2);
  ::setenv("GTEST_SHARD_INDEX", "3", 1);
  EXPECT_THROW(apply_shard_environment(o), spec::InvalidInput);
  ::setenv("GTEST_SHARD_INDEX", "x", 1);
  EXPECT_THROW(apply_shard_environment(o), spec::InvalidInput);
  ::unsetenv("GTEST_TOTAL_SHARDS");
  ::unsetenv("GTEST_SHARD_INDEX");
}

TEST(ReportFiles, JunitAndJsonCarryTheOutcomes) {
  CheckOptions o;
  o.cases = 3;
  o.ops = {spec::Op::kWrite};
  o.subjects = {"cpu-fused", "minus-one-wraps"};
  auto subjects = make_subjects();
  add_named_mutants(o.subjects, subjects);
  const CheckReport r = run_check(o, subjects);
  const std::string xml = junit_xml(r);
  EXPECT_NE(xml.find("<testcase classname=\"kvoracle.check.write\" name=\"cpu-fused\">"),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<failure type=\"mismatch\""), std::string::npos) << xml;
  EXPECT_NE(xml.find("failures=\"1\""), std::string::npos) << xml;
  const std::string json = report_json(r);
  EXPECT_NE(json.find("\"result\": \"mismatch\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"name\": \"minus-one-wraps\", \"op\": \"write\""), std::string::npos)
      << json;
  // Written atomically; a path that cannot be written leaves nothing and says which.
  const std::string path = ::testing::TempDir() + "kvo_report.json";
  write_file_atomically(path, json);
  std::ifstream in(path);
  std::stringstream back;
  back << in.rdbuf();
  EXPECT_EQ(back.str(), json);
  EXPECT_THROW(write_file_atomically("/nonexistent-dir/x.json", json), spec::FailedToRun);
}

}  // namespace
}  // namespace kvo::oracle

namespace kvo::oracle {
namespace {

TEST(Shrink, ABrokenSubjectShrinksToASmallCaseThatItsCommandReplays) {
  for (const char* name :
       {"minus-one-wraps", "hnd-nhd-stride-swap", "missing-causal-mask", "dense-gptj-rope"}) {
    const Mutant& m = *std::find_if(mutant_catalogue().begin(), mutant_catalogue().end(),
                                    [&](const Mutant& x) { return x.name == name; });
    SubjectList subjects;
    add_named_mutants({name}, subjects);
    CheckOptions o;
    o.cases = 50;
    o.ops = {m.op};
    o.fail_fast = true;
    o.overrides = m.overrides;
    const CheckReport r = run_check(o, subjects);
    ASSERT_EQ(r.worst, spec::Outcome::kMismatch) << name;
    const auto shrunk = shrink_failure(o, *r.subjects[0].failing_seed, name, m.op, subjects);
    ASSERT_TRUE(shrunk.has_value()) << name;
    EXPECT_GT(shrunk->steps, 0) << name;
    if (m.op == spec::Op::kWrite) {
      EXPECT_EQ(shrunk->overrides.write.layers.value_or("?").size(), 1u)
          << name << ": " << shrunk->command;
    }
    EXPECT_NE(shrunk->first_failure.find("reproduce: " + shrunk->command), std::string::npos)
        << shrunk->first_failure;
    // The printed command's case, rebuilt from its seed and fixed dimensions, fails the same way.
    CheckOptions replay;
    replay.case_seed = shrunk->seed;
    replay.overrides = shrunk->overrides;
    replay.ops = {m.op};
    const CheckReport again = run_check(replay, subjects);
    EXPECT_EQ(again.worst, spec::Outcome::kMismatch) << name;
    EXPECT_EQ(again.subjects[0].first_failure, shrunk->first_failure) << name;
  }
}

}  // namespace
}  // namespace kvo::oracle
