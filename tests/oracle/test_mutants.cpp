// The mutation score and the CI-facing parts of the campaign: every catalogued mutant is killed
// within 200 cases; shards partition a campaign; JUnit and JSON reports say what the summary says.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "../common/invalid_input.hpp"
#include "kvo/oracle/mutants.hpp"
#include "kvo/oracle/report_files.hpp"
#include "kvo/oracle/shrink.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/subjects/cpu_write.hpp"

namespace kvo::oracle {
namespace {

using kvo::testing::invalid_input;

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

// Shards from the schedulers people run (issue 15): a Slurm job array (ids from MIN by STEP) and a
// Kubernetes Indexed Job (an index, its count from the flag or GTEST_TOTAL_SHARDS); flags win.
TEST(Shards, SlurmArraysAndKubernetesIndexedJobsAreHonoured) {
  const auto shard = [](std::optional<std::int64_t> total = {},
                        std::optional<std::int64_t> index = {}) {
    CheckOptions o;
    apply_shard_environment(o, total, index);
    return std::pair{o.shard_index, o.total_shards};
  };
  EXPECT_EQ(shard(), (std::pair<std::int64_t, std::int64_t>{0, 1}));  // nothing set
  ::setenv("SLURM_ARRAY_TASK_ID", "5", 1);
  ::setenv("SLURM_ARRAY_TASK_MIN", "1", 1);
  ::setenv("SLURM_ARRAY_TASK_STEP", "2", 1);
  ::setenv("SLURM_ARRAY_TASK_COUNT", "4", 1);
  EXPECT_EQ(shard(), (std::pair<std::int64_t, std::int64_t>{2, 4}));      // ids 1, 3, 5, 7
  EXPECT_EQ(shard(8, 6), (std::pair<std::int64_t, std::int64_t>{6, 8}));  // the flags win
  ::setenv("SLURM_ARRAY_TASK_ID", "4", 1);  // not an id of 1, 3, 5, ...
  EXPECT_NE(invalid_input([&] { shard(); }).find("SLURM_ARRAY_TASK_ID = 4"), std::string::npos);
  ::setenv("SLURM_ARRAY_TASK_ID", "9", 1);  // id 9 is index 4 of 4
  EXPECT_NE(invalid_input([&] { shard(); }).find("SLURM_ARRAY_TASK_COUNT = 4"), std::string::npos);
  for (const char* v : {"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP",
                        "SLURM_ARRAY_TASK_COUNT"})
    ::unsetenv(v);
  ::setenv("JOB_COMPLETION_INDEX", "3", 1);
  EXPECT_NE(invalid_input([&] { shard(); }).find("--total-shards"), std::string::npos);
  EXPECT_EQ(shard(8), (std::pair<std::int64_t, std::int64_t>{3, 8}));
  ::setenv("GTEST_TOTAL_SHARDS", "5", 1);
  EXPECT_EQ(shard(), (std::pair<std::int64_t, std::int64_t>{3, 5}));
  ::setenv("JOB_COMPLETION_INDEX", "-1", 1);
  EXPECT_THROW(shard(), spec::InvalidInput);
  ::unsetenv("JOB_COMPLETION_INDEX");
  ::unsetenv("GTEST_TOTAL_SHARDS");
}

/// A report as text, its timing left out.
std::string untimed(CheckReport r) {
  r.seconds = 0.0;
  return report_json(r) + r.summary() + r.coverage_table();
}

// Issue 15: the campaign spread over jobs gives the same report (verdicts, first failures with
// their reproduce lines, coverage, bytes compared) as one job, fail-fast included.
TEST(Jobs, TheReportIsTheSameForAnyNumberOfJobs) {
  for (const bool fail_fast : {false, true}) {
    std::string one;
    for (const std::int64_t jobs : {1, 2, 5}) {
      CheckOptions o;
      o.seed = 0x10B5;
      o.cases = 24;
      o.jobs = jobs;
      o.fail_fast = fail_fast;
      o.subjects = {"cpu-fused", "cpu-naive-f32", "cpu-dense", "legacy-wrap-torn-element",
                    "reversed-tie-order"};
      auto subjects = make_subjects();
      add_named_mutants(o.subjects, subjects);
      const std::string text = untimed(run_check(o, subjects));
      EXPECT_NE(text.find("reproduce: kvoracle check --case-seed"), std::string::npos) << text;
      if (jobs == 1) {
        one = text;
      } else {
        EXPECT_EQ(text, one) << jobs << " jobs, fail_fast " << fail_fast;
      }
    }
  }
  EXPECT_THROW(campaign_jobs(-1), spec::InvalidInput);
  EXPECT_GE(campaign_jobs(0), 1);
  EXPECT_EQ(campaign_jobs(3), 3);
}

// A subject that is not concurrent (a GPU, device or Python one) is called from one thread, one
// case after another, whatever the jobs; a concurrent one may be called on the workers.
TEST(Jobs, ANonConcurrentSubjectIsCalledFromOneThreadAtATime) {
  std::atomic<int> inside{0}, overlaps{0};
  std::set<std::thread::id> threads;
  std::mutex m;
  const auto record = [&](const spec::ModelConfig& c, const spec::LayerWrite& w,
                          spec::LayerCaches& caches) {
    if (inside.fetch_add(1) != 0) ++overlaps;
    {
      const std::lock_guard<std::mutex> lock(m);
      threads.insert(std::this_thread::get_id());
    }
    subjects::write_layer_fused(c, w, caches);
    inside.fetch_sub(1);
  };
  CheckOptions o;
  o.cases = 16;
  o.jobs = 4;
  o.ops = {spec::Op::kWrite};
  SubjectList subjects;
  subjects.push_back(make_function_subject("one-at-a-time", record));
  EXPECT_EQ(run_check(o, subjects).worst, spec::Outcome::kPass);
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(threads, (std::set<std::thread::id>{std::this_thread::get_id()}));
}

TEST(Jobs, MutantResultsAreTheSameForAnyNumberOfJobs) {
  MutantRun run;
  run.names = {"minus-one-stops-write", "reversed-tie-order", "dense-gptj-rope",
               "attention-uint32-offset"};
  run.seeds = 3;
  std::vector<std::string> one;
  for (const std::int64_t jobs : {1, 3}) {
    run.jobs = jobs;
    std::vector<std::string> got;
    for (const MutantResult& r : run_mutants(run)) {
      got.push_back(r.name + " " + std::to_string(r.cases) + " " + std::to_string(r.median_cases) +
                    " " + std::to_string(r.worst_cases) + " " + r.first_failure);
    }
    if (jobs == 1) {
      one = got;
    } else {
      EXPECT_EQ(got, one);
    }
  }
  ASSERT_EQ(one.size(), 4u);
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

namespace kvo::oracle {
namespace {

/// The "--flag value" pairs of a flags text ("--a 1 --b x" -> {"--a 1", "--b x"}).
std::vector<std::string> flag_pairs(const std::string& flags) {
  std::istringstream in(flags);
  std::vector<std::string> pairs;
  for (std::string flag, value; in >> flag >> value;) pairs.push_back(flag + " " + value);
  return pairs;
}

TEST(Shrink, KeepsEveryModeAndDimensionTheCallerFixedSoACorrectKernelPassesTheShrunkCase) {
  // A planted fp8 rounding bug behind what an adapter or a user fixes: each fixed mode stays in
  // the shrunk case (the "no scale" step once turned scale_mode=divide into none, a case the
  // correct kernel fails too), the shrunk case fails in the class the original did, and the
  // correct kernel passes it.
  const std::string name = "fp8-round-half-away";
  const Mutant& m = *std::find_if(mutant_catalogue().begin(), mutant_catalogue().end(),
                                  [&](const Mutant& x) { return x.name == name; });
  std::vector<CaseOverrides> fixed(6);
  fixed[0].scale_mode = spec::ScaleMode::kDivide;
  fixed[1].scale_mode = spec::ScaleMode::kMulRecip;
  fixed[1].per_head_scale = true;
  fixed[2].saturation = spec::Saturation::kNoSat;
  fixed[2].via_model_dtype = true;
  fixed[3].scale_in_model_dtype = true;
  fixed[3].scale_mode = spec::ScaleMode::kDivide;
  fixed[4].layout = spec::KvLayout::kNhd;
  fixed[4].block_size = 16;
  fixed[4].tokens = 40;
  fixed[5].blockscale_scale = spec::BlockScaleFormula::kMulRecip;
  fixed[5].index_layout = spec::IndexLayout::kBlockScale;
  for (CaseOverrides f : fixed) {
    f.kv_dtype = spec::DType::kFp8E4M3;
    SubjectList subjects;
    add_named_mutants({name}, subjects);
    CheckOptions o;
    o.cases = 200;
    o.ops = {m.op};
    o.fail_fast = true;
    o.overrides.write = f;
    const CheckReport r = run_check(o, subjects);
    ASSERT_EQ(r.worst, spec::Outcome::kMismatch) << f.to_flags() << "\n" << r.summary();
    const std::string original_class = r.subjects[0].failure_classes.at(0).name;
    const auto shrunk = shrink_failure(o, *r.subjects[0].failing_seed, name, m.op, subjects);
    ASSERT_TRUE(shrunk.has_value()) << f.to_flags();
    EXPECT_GT(shrunk->steps, 0) << f.to_flags();
    EXPECT_EQ(shrunk->failure_class, original_class) << shrunk->command;
    const std::string shrunk_flags = shrunk->overrides.write.to_flags();
    for (const std::string& pair : flag_pairs(f.to_flags()))
      EXPECT_NE(shrunk_flags.find(pair), std::string::npos) << pair << " lost: " << shrunk_flags;
    EXPECT_NE(theme_slot(shrunk->seed), kThemeHugeCache) << shrunk->command;

    CheckOptions replay;
    replay.case_seed = shrunk->seed;
    replay.overrides = shrunk->overrides;
    replay.ops = {m.op};
    replay.subjects = {"cpu-fused"};
    SubjectList correct = make_subjects();
    EXPECT_EQ(run_check(replay, correct).worst, spec::Outcome::kPass) << shrunk->command;
    replay.subjects = {name};
    const CheckReport again = run_check(replay, subjects);
    EXPECT_EQ(again.worst, spec::Outcome::kMismatch) << shrunk->command;
    EXPECT_EQ(again.subjects[0].failure_classes.at(0).name, original_class) << shrunk->command;
  }
}

TEST(Shrink, AFailingHugeCacheCaseMovesToASmallCacheWhereTheBugNeedsNone) {
  // A wrong-element bug that any cache shows: its first failing case of the huge-cache theme
  // shrinks to a case of another theme (caches of kilobytes, not gigabytes).
  const std::string name = "fp8-round-half-away";
  SubjectList subjects;
  add_named_mutants({name}, subjects);
  CheckOptions o;
  o.ops = {spec::Op::kWrite};
  o.overrides.write.kv_dtype = spec::DType::kFp8E4M3;
  std::optional<std::uint64_t> huge;
  for (std::uint64_t i = kThemeHugeCache; i < 400 && !huge; i += kThemeSlots) {
    CheckOptions one = o;
    one.case_seed = case_seed(o.seed, i);
    if (run_check(one, subjects).worst == spec::Outcome::kMismatch) huge = one.case_seed;
  }
  ASSERT_TRUE(huge.has_value());
  ASSERT_EQ(theme_slot(*huge), kThemeHugeCache);
  const auto shrunk = shrink_failure(o, *huge, name, spec::Op::kWrite, subjects);
  ASSERT_TRUE(shrunk.has_value());
  EXPECT_NE(theme_slot(shrunk->seed), kThemeHugeCache) << shrunk->command;
  const WriteCase wc = make_write_case(shrunk->seed, shrunk->overrides.write);
  EXPECT_LT(wc.config.geometry.num_blocks * wc.config.geometry.block_size, 1 << 16)
      << shrunk->command;
}

}  // namespace
}  // namespace kvo::oracle
