#pragma once
/// \file testing.hpp
/// The GoogleTest helper (target kvoracle::testing): a user's kernel judged in one assertion,
///
///     kvo::oracle::CheckOptions options;        // ops, cases, seed, overrides
///     options.overrides.write.layout = kvo::spec::KvLayout::kNhd;
///     EXPECT_TRUE(kvo::oracle::testing::passes(
///         kvo::oracle::make_function_subject("my-write", my_write), options));
///
/// A failure's message is the campaign's SPEC 7 report (test_campaign.hpp): the case seed, the
/// first mismatch with its coordinates, the reproduce line, the line that replays that case in
/// this test (KVO_CASE_SEED=S ./test --gtest_filter=...), and the case shrunk. The campaign seed
/// is printed on a pass too. Header-only: the AssertionResult is built by the user's GoogleTest.

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/subject.hpp"
#include "kvo/oracle/test_campaign.hpp"

namespace kvo::oracle::testing {

namespace detail {

/// "Suite.Test" of the running test (a --gtest_filter for it), empty outside a test.
inline std::string current_test_name() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info == nullptr ? std::string()
                         : std::string(info->test_suite_name()) + "." + info->name();
}

inline ::testing::AssertionResult to_assertion(const TestVerdict& v) {
  char seed[24];
  std::snprintf(seed, sizeof seed, "0x%016llX", static_cast<unsigned long long>(v.seed));
  ::testing::Test::RecordProperty("kvoracle_seed", seed);
  if (!v.passed) return ::testing::AssertionFailure() << v.message;
  std::printf("%s\n", v.message.c_str());  // the seed and the cases judged, on a pass too
  std::fflush(stdout);
  return ::testing::AssertionSuccess() << v.message;
}

}  // namespace detail

/// Judges the subjects of `subjects` named by options.subjects (all when empty) on options.ops.
inline ::testing::AssertionResult passes(SubjectList& subjects, CheckOptions options = {}) {
  return detail::to_assertion(
      run_test_campaign(subjects, std::move(options), gtest_rerun(detail::current_test_name())));
}

/// Judges `subject` on every op of options.ops it implements.
inline ::testing::AssertionResult passes(std::unique_ptr<Subject> subject,
                                         CheckOptions options = {}) {
  if (subject == nullptr) return ::testing::AssertionFailure() << "kvoracle: no subject given";
  options.subjects = {subject->name()};
  SubjectList list;
  list.push_back(std::move(subject));
  return passes(list, std::move(options));
}

}  // namespace kvo::oracle::testing
