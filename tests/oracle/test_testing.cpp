// The GoogleTest helper (testing.hpp) as a user's test sees it: a correct subject passes and prints
// its seed; a planted bug fails with the SPEC 7 report (campaign and case seed, first mismatch,
// reproduce lines, the shrunk case), and KVO_CASE_SEED replays exactly that case; what judged
// nothing (a subject that cannot run, every case unsupported) or could not run is never a pass.
#include "kvo/oracle/testing.hpp"

#include <gtest/gtest.h>

#include <stdlib.h>
#include <cstdlib>

#include <regex>
#include <stdexcept>
#include <string>

#include "kvo/reference/layer_write.hpp"
#include "kvo/spec/outcome.hpp"

namespace {

using kvo::oracle::CheckOptions;
using kvo::oracle::make_function_subject;
using kvo::oracle::testing::passes;
namespace spec = kvo::spec;

CheckOptions write_options(std::int64_t cases) {
  CheckOptions o;
  o.seed = 0x5EED;
  o.cases = cases;
  o.ops = {spec::Op::kWrite};
  o.overrides.write.layers = "DS";
  return o;
}

/// The reference's write behind a user's function: what a correct kernel does.
void correct_write(const spec::ModelConfig& c, const spec::LayerWrite& w, spec::LayerCaches& out) {
  kvo::reference::write_layer(c, w, out);
}

/// A planted bug: K and V exchanged (a kernel that takes its pointer arguments in the wrong order).
void swapped_kv_write(const spec::ModelConfig& c, const spec::LayerWrite& w,
                      spec::LayerCaches& out) {
  spec::LayerWrite bad = w;
  std::swap(bad.k, bad.v);
  kvo::reference::write_layer(c, bad, out);
}

/// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

TEST(TestingHelper, CorrectSubjectPassesAndReportsItsSeed) {
  const ::testing::AssertionResult r =
      passes(make_function_subject("user-write", correct_write), write_options(30));
  EXPECT_TRUE(r);
  EXPECT_NE(std::string(r.message()).find("seed 0x0000000000005EED, 30 cases"), std::string::npos)
      << r.message();
  EXPECT_NE(std::string(r.message()).find("result: pass"), std::string::npos) << r.message();
}

TEST(TestingHelper, PlantedBugFailsWithSeedFirstMismatchAndReproduce) {
  const ::testing::AssertionResult r =
      passes(make_function_subject("user-write-swapped", swapped_kv_write), write_options(30));
  ASSERT_FALSE(r);
  const std::string m = r.message();
  EXPECT_NE(m.find("kvoracle: mismatch (campaign seed 0x0000000000005EED)"), std::string::npos)
      << m;
  // The first failing case: its seed, the first differing byte with its coordinates, the
  // campaign's reproduce line, and the line that replays it in this very test.
  std::smatch seed;
  ASSERT_TRUE(std::regex_search(m, seed, std::regex("case [0-9]+ seed (0x[0-9A-F]{16})"))) << m;
  EXPECT_NE(m.find("first: layer "), std::string::npos) << m;
  // Every reproduce line reruns this very test (the command line cannot replay a user's
  // function): the case's own line, and the line under "reproduce in this test".
  const std::string rerun =
      " " + kvo::oracle::testing::gtest_rerun(
                "TestingHelper.PlantedBugFailsWithSeedFirstMismatchAndReproduce");
  EXPECT_NE(m.find("reproduce: KVO_CASE_SEED=" + seed[1].str() + rerun + "\n"), std::string::npos)
      << m;
  EXPECT_NE(m.find("reproduce in this test (user-write-swapped, write): KVO_CASE_SEED=" +
                   seed[1].str() + rerun),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("kvoracle check --case-seed"), std::string::npos) << m;
  EXPECT_NE(m.find("shrunk failure of user-write-swapped (write"), std::string::npos) << m;
  // The shrunk case's line: its seed and the reductions from this test's overrides.
  std::smatch shrunk;
  ASSERT_TRUE(std::regex_search(
      m, shrunk,
      std::regex("reproduce: KVO_CASE_SEED=(0x[0-9A-F]{16}) KVO_CASE_REDUCTIONS=(write:[0-9,]+)" +
                 std::regex_replace(rerun, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)"))))
      << m;
  const std::string shrunk_text = m.substr(m.find("shrunk failure of"));
  const std::string shrunk_first = shrunk_text.substr(shrunk_text.find("first: layer "));

  // The replay line's variable runs exactly that case, which fails the same way.
  {
    const ScopedEnv replay("KVO_CASE_SEED", seed[1].str());
    const ::testing::AssertionResult again =
        passes(make_function_subject("user-write-swapped", swapped_kv_write), write_options(30));
    ASSERT_FALSE(again);
    const std::string a = again.message();
    EXPECT_NE(a.find(", 1 cases in"), std::string::npos) << a;
    EXPECT_NE(a.find("case 0 seed " + seed[1].str()), std::string::npos) << a;
  }
  // The shrunk line's variables run the shrunk case: the same first mismatch, word for word.
  const ScopedEnv replay("KVO_CASE_SEED", shrunk[1].str());
  const ScopedEnv reductions("KVO_CASE_REDUCTIONS", shrunk[2].str());
  const ::testing::AssertionResult again =
      passes(make_function_subject("user-write-swapped", swapped_kv_write), write_options(30));
  ASSERT_FALSE(again);
  const std::string a = again.message();
  EXPECT_NE(a.find(", 1 cases in"), std::string::npos) << a;
  EXPECT_NE(a.find(shrunk_first.substr(0, shrunk_first.find('\n'))), std::string::npos)
      << a << "\n---- shrunk:\n"
      << shrunk_text;
}

// A planted failure that runs only where KVO_PLANTED_FAILURE is set: the GoogleTest lines of its
// report are run as printed by python/tests/test_reproduce_lines.py (skipped everywhere else).
TEST(TestingHelperPlanted, FailsWithLinesThatReplayIt) {
  if (std::getenv("KVO_PLANTED_FAILURE") == nullptr) GTEST_SKIP() << "KVO_PLANTED_FAILURE unset";
  EXPECT_TRUE(
      passes(make_function_subject("user-write-swapped", swapped_kv_write), write_options(30)));
}

TEST(TestingHelper, MalformedReductionsFailNamingTheVariable) {
  for (const char* text : {"write", "write:x", "nosuchop:1", "write:999", "write:0,0"}) {
    const ScopedEnv reductions("KVO_CASE_REDUCTIONS", text);
    const ::testing::AssertionResult r =
        passes(make_function_subject("user-write", correct_write), write_options(3));
    ASSERT_FALSE(r) << text;
    EXPECT_NE(std::string(r.message()).find("invalid input: KVO_CASE_REDUCTIONS"),
              std::string::npos)
        << text << ": " << r.message();
  }
}

TEST(TestingHelper, EnvironmentWidensTheCampaign) {
  const ScopedEnv seed("KVO_SEED", "0x77");
  const ScopedEnv cases("KVO_CASES", "12");
  const ::testing::AssertionResult r =
      passes(make_function_subject("user-write", correct_write), write_options(30));
  EXPECT_TRUE(r);
  EXPECT_NE(std::string(r.message()).find("seed 0x0000000000000077, 12 cases"), std::string::npos)
      << r.message();
}

TEST(TestingHelper, MalformedEnvironmentFailsNamingTheVariable) {
  const ScopedEnv cases("KVO_CASES", "12 cases");
  const ::testing::AssertionResult r =
      passes(make_function_subject("user-write", correct_write), write_options(30));
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("the campaign did not run: invalid input: KVO_CASES"),
            std::string::npos)
      << r.message();
  kvo::oracle::SubjectList none;
  const kvo::oracle::testing::TestVerdict v =
      kvo::oracle::testing::run_test_campaign(none, write_options(30), "", false);
  EXPECT_FALSE(v.ran);
  EXPECT_EQ(v.outcome, "invalid-input");
}

TEST(TestingHelper, WhatJudgedNothingIsNotAPass) {
  kvo::oracle::SubjectFunctions absent;
  absent.write = correct_write;
  absent.unavailable_reason = [] { return std::string("no CUDA device answers"); };
  const ::testing::AssertionResult r1 =
      passes(make_function_subject("user-cuda-write", absent), write_options(5));
  ASSERT_FALSE(r1);
  EXPECT_NE(std::string(r1.message())
                .find("not judged: user-cuda-write (write) did not run here: no CUDA device"),
            std::string::npos)
      << r1.message();
  // Its summary's verdict says so too: never "result: pass" for a run that judged nothing.
  EXPECT_NE(std::string(r1.message()).find("result: not judged"), std::string::npos)
      << r1.message();
  EXPECT_EQ(std::string(r1.message()).find("result: pass"), std::string::npos) << r1.message();

  const ::testing::AssertionResult r2 =
      passes(make_function_subject("user-nothing",
                                   [](const spec::ModelConfig&, const spec::LayerWrite&,
                                      spec::LayerCaches&) { throw spec::Unsupported("only NHD"); }),
             write_options(5));
  ASSERT_FALSE(r2);
  EXPECT_NE(std::string(r2.message())
                .find("not judged: user-nothing (write): it declared all 5 cases unsupported"),
            std::string::npos)
      << r2.message();
  EXPECT_NE(std::string(r2.message()).find("result: not judged"), std::string::npos)
      << r2.message();
  // Each class of what did not pass is counted with a case to replay, unsupported ones too.
  EXPECT_NE(std::string(r2.message()).find("5  unsupported: only NHD (first: case 0, seed 0x"),
            std::string::npos)
      << r2.message();
}

TEST(TestingHelper, ThrowingSubjectAndBadOptionsFail) {
  const ::testing::AssertionResult r1 =
      passes(make_function_subject(
                 "user-throws",
                 [](const spec::ModelConfig&, const spec::LayerWrite&, spec::LayerCaches&) {
                   throw std::runtime_error("cudaErrorIllegalAddress");
                 }),
             write_options(3));
  ASSERT_FALSE(r1);
  EXPECT_NE(std::string(r1.message()).find("kvoracle: failed-to-run"), std::string::npos)
      << r1.message();
  EXPECT_NE(std::string(r1.message()).find("cudaErrorIllegalAddress"), std::string::npos);

  // A list and names: a name the list does not hold is bad input, reported, not thrown.
  kvo::oracle::SubjectList list;
  list.push_back(make_function_subject("user-write", correct_write));
  CheckOptions o = write_options(3);
  o.subjects = {"user-write", "user-wirte"};
  const ::testing::AssertionResult r2 = passes(list, o);
  ASSERT_FALSE(r2);
  EXPECT_NE(std::string(r2.message()).find("subject[1] = user-wirte: unknown subject"),
            std::string::npos)
      << r2.message();
  o.subjects = {"user-write"};
  EXPECT_TRUE(passes(list, o));
}

}  // namespace
