#pragma once
// What the reference tier's tests (test_reference_tier*.cpp) share.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

#include "kvo/oracle/campaign.hpp"

namespace kvo::oracle {

/// The odd cases of a campaign: every stress theme but the huge caches' (theme slot 6,
/// kThemeHugeCache), whose device mirrors of several GiB, held by the tier's thread and the main
/// thread, would crowd the other test shards sharing the GPU (the device script's `tier` stage
/// runs the whole default distribution in a process of its own). Of the default sample (the first
/// 8, then one in 16 from 8: even cases only), cases 1, 3, 5 and 7 remain.
inline void without_huge_caches(CheckOptions& o) {
  o.total_shards = 2;
  o.shard_index = 1;
}

/// The device lanes of the tier tests' campaigns (CheckOptions::device_lanes; the default is 8):
/// several, so that the resident path's cases run on lanes side by side, fewer than the device's
/// cores of a test shard.
inline constexpr std::int64_t kTestDeviceLanes = 4;

/// Two runs of one campaign that must agree on everything but time (the same cases on one device
/// lane and on several: CheckOptions::device_lanes): every verdict, report and count.
inline void expect_same_verdicts(const CheckReport& a, const CheckReport& b) {
  EXPECT_EQ(a.worst, b.worst) << a.summary() << "\n---\n" << b.summary();
  EXPECT_EQ(a.cases_run, b.cases_run);
  EXPECT_EQ(a.bytes_compared, b.bytes_compared);
  EXPECT_EQ(a.tier_cases, b.tier_cases);
  EXPECT_EQ(a.cpu_cases, b.cpu_cases);
  EXPECT_EQ(a.tier_checks, b.tier_checks);
  EXPECT_EQ(a.resident_cases, b.resident_cases);
  EXPECT_EQ(a.resident_checks, b.resident_checks);
  EXPECT_EQ(a.resident_fallbacks, b.resident_fallbacks);
  EXPECT_EQ(a.resident_first_fallback, b.resident_first_fallback);
  EXPECT_EQ(a.resident_alone, b.resident_alone);
  EXPECT_EQ(a.tier_disagreement, b.tier_disagreement);
  ASSERT_EQ(a.subjects.size(), b.subjects.size());
  for (std::size_t s = 0; s < a.subjects.size(); ++s) {
    for (int o = 0; o < 5; ++o) EXPECT_EQ(a.subjects[s].counts[o], b.subjects[s].counts[o]) << s;
    EXPECT_EQ(a.subjects[s].first_failure, b.subjects[s].first_failure);
  }
  ASSERT_EQ(a.coverage.size(), b.coverage.size());
  for (std::size_t i = 0; i < a.coverage.size(); ++i) {
    EXPECT_EQ(a.coverage[i].cases, b.coverage[i].cases) << a.coverage[i].condition;
    EXPECT_EQ(a.coverage[i].reached, b.coverage[i].reached) << a.coverage[i].condition;
    EXPECT_EQ(a.coverage[i].first_case, b.coverage[i].first_case) << a.coverage[i].condition;
  }
}

}  // namespace kvo::oracle
