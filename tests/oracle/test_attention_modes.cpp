// Attention's mode for mode detection (SPEC 7): one axis, the arithmetic profile, tightest first
// (exact, then the profiles by increasing bound); a captured answer judged under each value as
// check judges it; the default pinned to fp32, --profile pinning its own. The axis order is the
// truth's: the bounds are nested in it element by element.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "kvo/oracle/cpu_subjects.hpp"
#include "kvo/oracle/op_driver.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/read_judge.hpp"
#include "kvo/truth/truth.hpp"

namespace kvo::oracle {
namespace {

using spec::AttentionProfile;

constexpr std::uint64_t kSeed0 = 0xA77E0000ull;

std::string tag(std::uint64_t seed) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "seed 0x%016llX", static_cast<unsigned long long>(seed));
  return buf;
}

const OpDriver& attention() { return driver_of(spec::Op::kAttention); }

/// The index of `name` on attention's profile axis.
std::size_t value_of(const std::string& name) {
  const std::vector<std::string> values = attention().mode_axes().at(0).values;
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i] == name) return i;
  ADD_FAILURE() << name << " is not on the profile axis";
  return 0;
}

TEST(AttentionModes, OneProfileAxisTightestFirst) {
  const std::vector<ModeAxis> axes = attention().mode_axes();
  ASSERT_EQ(axes.size(), 1u);
  EXPECT_EQ(axes[0].name, "profile");
  EXPECT_EQ(axes[0].values, (std::vector<std::string>{"exact", "fp32", "fp16_p", "bf16_p"}));
  // The indexer's modes are its own axes (SPEC 5), the contract's defaults first.
  const std::vector<ModeAxis> indexer = driver_of(spec::Op::kIndexer).mode_axes();
  ASSERT_EQ(indexer.size(), 5u);
  EXPECT_EQ(indexer[0].name, "index_nan");
  EXPECT_EQ(indexer[0].values, (std::vector<std::string>{"skip", "first", "lowest"}));
  EXPECT_EQ(indexer[1].name, "index_score_scale");
  EXPECT_EQ(indexer[1].values, (std::vector<std::string>{"one", "rsqrt_dim"}));
  EXPECT_EQ(indexer[2].name, "index_neg_inf");
  EXPECT_EQ(indexer[2].values, (std::vector<std::string>{"keep", "drop"}));
  // Then the declared form's judged-only axes: the two orders engines emit, and the layouts.
  EXPECT_EQ(indexer[3].name, "topk_order");
  EXPECT_EQ(indexer[3].values, (std::vector<std::string>{"ascending_ids", "descending_score"}));
  EXPECT_EQ(indexer[4].name, "topk_layout");
  EXPECT_EQ(indexer[4].values, (std::vector<std::string>{"token_major", "head_major"}));
}

TEST(AttentionModes, PinsFp32UnlessAProfileIsGiven) {
  Overrides o;
  o.read.head_dim = 16;
  ModeChoice pinned;
  const Overrides same = attention().pin_modes(o, pinned);
  EXPECT_EQ(pinned, (ModeChoice{value_of("fp32")}));
  EXPECT_EQ(same.read.head_dim, 16);
  EXPECT_FALSE(same.read.profile.has_value());
  o.read.profile = AttentionProfile::kBf16P;
  attention().pin_modes(o, pinned);
  EXPECT_EQ(pinned, (ModeChoice{value_of("bf16_p")}));
}

// The bounds are nested in the axis order (fp32 <= fp16_p <= bf16_p, element by element), so a
// subject that passes one profile passes every looser one.
TEST(AttentionModes, ProfileBoundsAreNestedInAxisOrder) {
  const AttentionProfile order[] = {AttentionProfile::kFp32, AttentionProfile::kFp16P,
                                    AttentionProfile::kBf16P};
  for (int i = 0; i < 100; ++i) {
    const std::uint64_t seed = kSeed0 + static_cast<std::uint64_t>(i);
    const ReadCase rc = make_read_case(seed, {});
    ReadExpectation e(rc);
    for (std::size_t k = 1; k < 3; ++k) {
      const auto& tight = e.attention_truth(spec::Ordering::kForeign, order[k - 1]);
      const auto& loose = e.attention_truth(spec::Ordering::kForeign, order[k]);
      for (std::size_t j = 0; j < tight.bound.size(); ++j) {
        ASSERT_LE(tight.bound[j], loose.bound[j])
            << tag(seed) << " element " << j << ": " << spec::name_of(order[k - 1]) << " vs "
            << spec::name_of(order[k]);
      }
    }
  }
}

// One run of a subject, judged under every value: the flash emulations pass their own profile and
// every looser one, the fp32 emulation (cpu-naive-f32) passes fp32, exact fails every foreign
// subject somewhere and passes the reference, and rounding P to bf16 fails the fp32 bound on some
// case. Each verdict is the one `check` gives under that profile.
TEST(AttentionModes, CapturedAnswerJudgedUnderEveryProfile) {
  const auto bf16 = make_cpu_flash_subject("cpu-flash-bf16", AttentionProfile::kBf16P);
  const auto fp16 = make_cpu_flash_subject("cpu-flash-fp16", AttentionProfile::kFp16P);
  const auto naive = make_cpu_naive_subject();
  const auto reference = make_canonical_mutant({}, "reference");
  int bf16_fails_fp32 = 0, bf16_fails_exact = 0, naive_fails_exact = 0;
  for (int i = 0; i < 40; ++i) {
    const std::uint64_t seed = kSeed0 + static_cast<std::uint64_t>(i);
    const auto pc = attention().prepare(seed, {});
    const auto judged = [&](Subject& s, const char* value) {
      const auto answer = attention().capture(s, *pc);
      EXPECT_EQ(answer->run_outcome, spec::Outcome::kPass) << answer->run_error;
      return answer->judge_under({value_of(value)});
    };
    for (const char* v : {"bf16_p"}) {
      const Verdict verdict = judged(*bf16, v);
      EXPECT_EQ(verdict.outcome, spec::Outcome::kPass) << tag(seed) << " " << verdict.report;
    }
    for (const char* v : {"fp16_p", "bf16_p"}) {
      const Verdict verdict = judged(*fp16, v);
      EXPECT_EQ(verdict.outcome, spec::Outcome::kPass) << tag(seed) << " " << verdict.report;
    }
    for (const char* v : {"fp32", "fp16_p", "bf16_p"}) {
      const Verdict verdict = judged(*naive, v);
      EXPECT_EQ(verdict.outcome, spec::Outcome::kPass) << tag(seed) << " " << verdict.report;
    }
    const Verdict exact = judged(*reference, "exact");
    EXPECT_EQ(exact.outcome, spec::Outcome::kPass) << tag(seed) << " " << exact.report;
    bf16_fails_fp32 += judged(*bf16, "fp32").outcome == spec::Outcome::kMismatch;
    bf16_fails_exact += judged(*bf16, "exact").outcome == spec::Outcome::kMismatch;
    naive_fails_exact += judged(*naive, "exact").outcome == spec::Outcome::kMismatch;
    // The captured answer under the subject's own profile is what check's judge says.
    EXPECT_EQ(judged(*bf16, "bf16_p").outcome, attention().judge(*bf16, *pc).outcome) << tag(seed);
  }
  EXPECT_GT(bf16_fails_fp32, 0);
  EXPECT_GT(bf16_fails_exact, 0);
  EXPECT_GT(naive_fails_exact, 0);
}

// A subject that cannot run the op is captured with its outcome, never judged.
TEST(AttentionModes, CaptureKeepsWhyASubjectDidNotRun) {
  const auto writes_only = make_function_subject("writes-only", WriteFunction{});
  const auto pc = attention().prepare(kSeed0, {});
  const auto answer = attention().capture(*writes_only, *pc);
  EXPECT_EQ(answer->run_outcome, spec::Outcome::kUnsupported);
  EXPECT_NE(answer->run_error.find("unsupported"), std::string::npos) << answer->run_error;
}

// --profile on a canonical subject is bad input; on a foreign one it replaces the declared profile.
TEST(AttentionModes, ProfileOverrideAppliesToForeignSubjectsOnly) {
  const auto reference = make_canonical_mutant({}, "reference");
  const auto bf16 = make_cpu_flash_subject("cpu-flash-bf16", AttentionProfile::kBf16P);
  EXPECT_TRUE(profile_override_problem(*reference, std::nullopt).empty());
  EXPECT_NE(profile_override_problem(*reference, AttentionProfile::kFp32).find("canonical"),
            std::string::npos);
  EXPECT_TRUE(profile_override_problem(*bf16, AttentionProfile::kFp32).empty());
  Overrides o;
  o.read.profile = AttentionProfile::kFp32;
  bool rejected_under_fp32 = false;
  for (int i = 0; i < 20 && !rejected_under_fp32; ++i) {
    const auto pc = attention().prepare(kSeed0 + static_cast<std::uint64_t>(i), o);
    EXPECT_EQ(attention().judge(*reference, *pc).outcome, spec::Outcome::kInvalidInput);
    const Verdict v = attention().judge(*bf16, *pc);
    rejected_under_fp32 = v.outcome == spec::Outcome::kMismatch;
    if (rejected_under_fp32) {
      EXPECT_NE(v.report.find("profile fp32"), std::string::npos) << v.report;
    }
  }
  EXPECT_TRUE(rejected_under_fp32);
}

}  // namespace
}  // namespace kvo::oracle
