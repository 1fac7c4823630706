// The GoogleTest helper (testing.hpp) as a user's test sees it: a correct subject passes and prints
// its seed; a planted bug fails with the SPEC 7 report (campaign and case seed, first mismatch,
// reproduce lines, the shrunk case), and KVO_CASE_SEED replays exactly that case; what judged
// nothing (a subject that cannot run, every case unsupported) or could not run is never a pass.
#include "kvo/oracle/testing.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

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
  EXPECT_NE(m.find("reproduce: kvoracle check --case-seed " + seed[1].str() +
                   " --subject user-write-swapped --ops write --layers DS"),
            std::string::npos)
      << m;
  EXPECT_NE(
      m.find("reproduce in this test (user-write-swapped, write): KVO_CASE_SEED=" + seed[1].str()),
      std::string::npos)
      << m;
  EXPECT_NE(m.find("--gtest_filter=TestingHelper.PlantedBugFailsWithSeedFirstMismatchAndReproduce"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("the kvoracle command line replays its own subjects only"), std::string::npos);
  EXPECT_NE(m.find("shrunk failure of user-write-swapped (write"), std::string::npos) << m;

  // The replay line's variable runs exactly that case, which fails the same way.
  const ScopedEnv replay("KVO_CASE_SEED", seed[1].str());
  const ::testing::AssertionResult again =
      passes(make_function_subject("user-write-swapped", swapped_kv_write), write_options(30));
  ASSERT_FALSE(again);
  const std::string a = again.message();
  EXPECT_NE(a.find(", 1 cases in"), std::string::npos) << a;
  EXPECT_NE(a.find("case 0 seed " + seed[1].str()), std::string::npos) << a;
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
