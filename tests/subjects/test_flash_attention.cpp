// The flash-style CPU attention (subjects::flash_attention) against the oracle's profiles (SPEC
// principle 4): the correct emulation passes every default case under its own profile and is
// rejected under fp32 when P is rounded; each planted bug of spec::AttentionBug, emulated in
// every profile's arithmetic, is rejected under that profile within 200 default cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "kvo/oracle/cpu_subjects.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/read_judge.hpp"
#include "kvo/spec/read.hpp"

namespace kvo {
namespace {

using spec::AttentionBug;
using spec::AttentionProfile;

constexpr std::uint64_t kSeed0 = 0xF1A50000ull;
constexpr int kCases = 200;

std::string tag(const oracle::ReadCase& rc) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "seed 0x%016llX ", static_cast<unsigned long long>(rc.seed));
  return buf + rc.describe();
}

/// `subject`'s attention on the default case of `seed` (sparse, over the reference selection),
/// judged under `profile`.
oracle::AttentionDiff judge(oracle::Subject& subject, const oracle::ReadCase& rc,
                            AttentionProfile profile) {
  oracle::ReadExpectation e(rc);
  return oracle::diff_attention_output(e, subject.attention(rc, e.attended()), profile);
}

class FlashProfile : public ::testing::TestWithParam<AttentionProfile> {};

// Every default case passes under the emulation's own profile.
TEST_P(FlashProfile, CorrectEmulationPassesItsOwnProfile) {
  const AttentionProfile profile = GetParam();
  const auto subject = oracle::make_cpu_flash_subject("flash", profile);
  double worst = 0.0;
  for (int i = 0; i < kCases; ++i) {
    const oracle::ReadCase rc = oracle::make_read_case(kSeed0 + static_cast<std::uint64_t>(i), {});
    const oracle::AttentionDiff d = judge(*subject, rc, profile);
    ASSERT_TRUE(d.pass()) << tag(rc) << "\n" << d.report();
    worst = std::max(worst, d.max_error_ratio);
  }
  std::printf("[flash] %s: %d/%d default cases pass, worst error / allowed %.3g\n",
              std::string(spec::name_of(profile)).c_str(), kCases, kCases, worst);
}

// Each planted bug, in the arithmetic of the profile it is judged under, is caught within kCases
// default cases (the nested bounds make the loosest profile, bf16_p, the hard one). Prints the
// first killing case, how many of the kCases kill it, and on how many the truth's own planted copy
// of the bug was reported invisible to the bound.
TEST_P(FlashProfile, EveryPlantedBugIsCaught) {
  const AttentionProfile profile = GetParam();
  for (const auto& entry : spec::EnumInfo<AttentionBug>::kNames) {
    if (entry.value == AttentionBug::kNone) continue;
    const auto mutant = oracle::make_cpu_flash_subject("mutant", profile, entry.value);
    int first = -1, killed = 0, blind = 0;
    std::string report;
    for (int i = 0; i < kCases; ++i) {
      const oracle::ReadCase rc =
          oracle::make_read_case(kSeed0 + static_cast<std::uint64_t>(i), {});
      const oracle::AttentionDiff d = judge(*mutant, rc, profile);
      blind += std::any_of(d.blind.begin(), d.blind.end(),
                           [&](const oracle::BlindSpot& b) { return b.bug == entry.value; });
      if (d.pass()) continue;
      ++killed;
      if (first < 0) first = i, report = tag(rc) + "\n" + d.report();
    }
    ASSERT_GE(first, 0) << entry.name << " under " << spec::name_of(profile)
                        << " was never caught in " << kCases << " cases from seed " << kSeed0;
    std::printf(
        "[flash] %s under %s: first caught at case %d, killed by %d/%d cases (%d blind)\n%s\n",
        std::string(entry.name).c_str(), std::string(spec::name_of(profile)).c_str(), first, killed,
        kCases, blind, report.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Profiles, FlashProfile,
                         ::testing::Values(AttentionProfile::kFp32, AttentionProfile::kFp16P,
                                           AttentionProfile::kBf16P),
                         [](const auto& info) { return std::string(spec::name_of(info.param)); });

// Rounding P is a real error: judged under fp32 the bf16 emulation fails some default case, so the
// profile is what lets it pass.
TEST(FlashProfile, RoundedPFailsTheFp32Bound) {
  const auto subject = oracle::make_cpu_flash_subject("flash", AttentionProfile::kBf16P);
  int failing = 0;
  for (int i = 0; i < 20; ++i) {
    const oracle::ReadCase rc = oracle::make_read_case(kSeed0 + static_cast<std::uint64_t>(i), {});
    failing += !judge(*subject, rc, AttentionProfile::kFp32).pass();
  }
  EXPECT_GT(failing, 0) << "bf16 P passed the fp32 bound on 20 cases from seed " << kSeed0;
}

}  // namespace
}  // namespace kvo
