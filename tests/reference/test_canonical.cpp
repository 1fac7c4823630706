// SPEC 6.1-6.2: the canonical reductions and exp, hand-checked and against float64.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <vector>

#include "kvo/reference/canonical.hpp"
#include "kvo/reference/numbers.hpp"

namespace kvo::reference {
namespace {

TEST(TreeSum, PairsHalvesAsTheSpecSays) {
  // m = 4: x = {a, b, c, d} -> {a + c, b + d} -> (a + c) + (b + d).
  EXPECT_EQ(tree_sum(std::vector<float>{1.0f, 2.0f, 4.0f, 8.0f}), 15.0f);
  // 1e8 + 1 - 1e8 in tree order: (1e8 + -1e8) + (1 + 0) = 1, where a left-to-right sum gives 0.
  EXPECT_EQ(tree_sum(std::vector<float>{1e8f, 1.0f, -1e8f}), 1.0f);
  EXPECT_EQ(bits_of(tree_sum(std::vector<float>{})), 0u);
  EXPECT_EQ(bits_of(tree_sum(std::vector<float>{-0.0f})), 0x80000000u);  // one element: no addition
  // Three elements pad to four with +0: (-0 + -0) + (-0 + +0) = -0 + +0 = +0.
  EXPECT_EQ(bits_of(tree_sum(std::vector<float>{-0.0f, -0.0f, -0.0f})), 0u);
}

TEST(CanonicalDot, GroupsOfEightWithFmaThenTree) {
  std::vector<float> a(16, 1.0f), b(16, 1.0f);
  EXPECT_EQ(canonical_dot(a, b), 16.0f);
  // Group 0 accumulates 2^24, then +1 seven times by fma, each lost to rounding (2^24 + 1 is a tie
  // that goes to the even 2^24); the tree then adds group 1 (8): exactly 2^24 + 8.
  a.assign(16, 1.0f);
  a[0] = 16777216.0f;
  EXPECT_EQ(canonical_dot(a, b), 16777216.0f + 8.0f);
}

// The group results are kept on the stack up to 512 groups and on the heap past them, padded with
// +0 to a power of two: on either side of that edge, and for group counts that need padding, the
// dot is the spec's sequence written out here, bit for bit.
TEST(CanonicalDot, EqualsTheSpecsSequenceOnEitherSideOfTheStackBuffer) {
  for (const std::size_t groups : {std::size_t{1}, std::size_t{3}, std::size_t{511},
                                   std::size_t{512}, std::size_t{513}, std::size_t{1500}}) {
    std::vector<float> a(8 * groups), b(8 * groups);
    for (std::size_t i = 0; i < a.size(); ++i) {
      // Values of many magnitudes and both signs, so that every rounding shows.
      a[i] = std::ldexp(static_cast<float>((i * 2654435761u) % 2001) - 1000.0f,
                        static_cast<int>(i % 23) - 11);
      b[i] = std::ldexp(static_cast<float>((i * 40503u) % 1999) - 999.0f,
                        static_cast<int>(i % 17) - 8);
    }
    std::vector<float> results(groups);
    for (std::size_t g = 0; g < groups; ++g) {
      float acc = 0.0f;
      for (std::size_t i = 8 * g; i < 8 * g + 8; ++i) acc = std::fma(a[i], b[i], acc);
      results[g] = acc;
    }
    EXPECT_EQ(bits_of(canonical_dot(a, b)), bits_of(tree_sum(results))) << groups << " groups";
  }
}

TEST(CanonicalExp, HandValues) {
  EXPECT_EQ(canonical_exp2(0.0f), 1.0f);
  EXPECT_EQ(canonical_exp2(1.0f), 2.0f);
  EXPECT_EQ(canonical_exp2(-126.0f), std::ldexp(1.0f, -126));
  EXPECT_EQ(bits_of(canonical_exp2(-126.5f)), 0u);  // below -126: +0
  EXPECT_EQ(bits_of(canonical_exp2(-INFINITY)), 0u);
  EXPECT_TRUE(std::isinf(canonical_exp2(127.5f)));
  EXPECT_TRUE(std::isnan(canonical_exp2(NAN)));
  EXPECT_EQ(canonical_exp(0.0f), 1.0f);
  // Half-way arguments round to even: 0.5 -> n = 0, 1.5 -> n = 2 (f = -0.5).
  EXPECT_NEAR(canonical_exp2(1.5f), 2.8284271247f, 1e-6);
}

RC_GTEST_PROP(CanonicalExp, WithinTwoUlpOfTheTruthOnItsDomain, ()) {
  const float y = *rc::gen::map(rc::gen::inRange(-126000000, 127000000),
                                [](int v) { return static_cast<float>(v) * 1e-6f; });
  const float got = canonical_exp2(y);
  const double want = std::exp2(static_cast<double>(y));
  const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
  RC_ASSERT(std::fabs(static_cast<double>(got) - want) <= 2.0 * ulp);
}

RC_GTEST_PROP(CanonicalDot, WithinTheDerivedBoundOfFloat64, ()) {
  const int n = 8 * *rc::gen::inRange(1, 64);
  std::vector<float> a(static_cast<std::size_t>(n)), b(a.size());
  double exact = 0.0, sum_abs = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(*rc::gen::inRange(-1000000, 1000000)) * 1e-3f;
    b[i] = static_cast<float>(*rc::gen::inRange(-1000000, 1000000)) * 1e-3f;
    exact += static_cast<double>(a[i]) * b[i];
    sum_abs += std::fabs(static_cast<double>(a[i]) * b[i]);
  }
  const double depth = 8.0 + std::ceil(std::log2(n / 8.0));
  const double gamma = depth * 0x1p-24 / (1.0 - depth * 0x1p-24);
  RC_ASSERT(std::fabs(static_cast<double>(canonical_dot(a, b)) - exact) <= gamma * sum_abs);
}

}  // namespace
}  // namespace kvo::reference
