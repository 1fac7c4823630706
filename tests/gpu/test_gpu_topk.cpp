// The indexer's block top-k selection alone (kvo/gpu/testing/topk.hpp: topk.cuh's kernel on given
// scores) against a plain CPU expectation of SPEC 5: the min(topk, n_valid) highest scores, equal
// scores won by the lower id, -0 equal to +0; canonical ids ascending then -1 padding, fast ids
// best first then -1. Sizes straddle the warp (32), the tournament (k <= 16) and the shared key
// tile (4096 blocks: bitonic sort below, counted ranks above) up to the limit (16384); rows with
// every score tied, heavy ties, the forced init/local scores, -1e30 (NaN blocks), infinities, and
// n_valid below topk, zero included; the same for the one-launch indexer's selection (fused heads).
// Skips without a GPU (the input checks run everywhere).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/testing/topk.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo {
namespace {

using gpu::ReadKernel;
using gpu::testing::block_topk_host;

/// SPEC 5 on the CPU: the k_eff best of blocks [0, n_valid) by (score descending, id ascending),
/// ascending (canonical) or best first (fast), then -1 up to topk.
std::vector<std::int32_t> expected_ids(const float* row, std::int32_t n_valid, std::int64_t topk,
                                       bool canonical) {
  std::vector<std::int32_t> order(static_cast<std::size_t>(n_valid));
  std::iota(order.begin(), order.end(), 0);
  // A stable sort keeps equal scores in id order; -0 > +0 is false both ways, so they tie.
  std::stable_sort(order.begin(), order.end(),
                   [row](std::int32_t a, std::int32_t b) { return row[a] > row[b]; });
  order.resize(static_cast<std::size_t>(std::min<std::int64_t>(topk, n_valid)));
  if (canonical) std::sort(order.begin(), order.end());
  order.resize(static_cast<std::size_t>(topk), -1);
  return order;
}

/// Kinds of rows: scores of each block j of a row.
enum class RowKind { kRandom, kFewValues, kAllTied, kForced, kCount };

void fill_row(float* row, std::int64_t n, std::int32_t n_valid, RowKind kind, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> pick(0, 6);
  const float few[7] = {-1.0f, 0.0f, -0.0f, 1.0f, 2.0f, 2.0f, -1e30f};
  for (std::int64_t j = 0; j < n; ++j) {
    float s = 0.0f;
    switch (kind) {
      case RowKind::kRandom:
        s = normal(rng);
        break;
      case RowKind::kFewValues:
        s = few[pick(rng)];
        break;
      case RowKind::kAllTied:
        s = 0.5f;
        break;
      default: {  // init blocks 1e30, local 1e29, NaN blocks -1e30, a few infinities
        const int p = pick(rng);
        s = j < 2                   ? 1e30f
            : j >= n_valid - 2      ? 1e29f
            : p == 0                ? -1e30f
            : p == 1 && j % 7 == 0  ? -INFINITY
            : p == 2 && j % 11 == 0 ? INFINITY
                                    : normal(rng);
      }
    }
    row[j] = j < n_valid ? s : 7e30f;  // past n_valid: never selected, whatever it holds
  }
}

const std::int32_t kNValid[] = {0,    1,    2,    15,   16,   17,   31,   32,    33,   63,
                                64,   65,   100,  255,  256,  257,  1000, 1023,  1024, 1025,
                                2048, 4095, 4096, 4097, 5000, 8191, 8192, 12289, 16384};
const std::int64_t kTopk[] = {1, 2, 8, 15, 16, 17, 31, 32, 33, 64, 100, 512, 1024, 2047, 2048};

/// Runs both families over every n_valid and row kind with scores of stride n (>= every n_valid)
/// and compares each row. fused_heads > 0: the one-launch indexer's selection, a CUDA block per
/// that many consecutive rows (the row kinds of one n_valid, kCount of them, taken 1, 2 or 4 at a
/// time as a query row's heads).
void check_topk(std::int64_t n, std::int64_t topk, std::uint32_t seed,
                std::int64_t fused_heads = 0) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> n_valid;
  std::vector<RowKind> kinds;
  for (std::int32_t nv : kNValid) {
    if (nv > n) continue;
    for (int k = 0; k < static_cast<int>(RowKind::kCount); ++k) {
      n_valid.push_back(nv);
      kinds.push_back(static_cast<RowKind>(k));
    }
  }
  const auto rows = static_cast<std::int64_t>(n_valid.size());
  std::vector<float> scores(static_cast<std::size_t>(rows * n));
  for (std::int64_t r = 0; r < rows; ++r)
    fill_row(&scores[static_cast<std::size_t>(r * n)], n, n_valid[r], kinds[r], rng);
  for (const ReadKernel kernel : {ReadKernel::kCanonical, ReadKernel::kFast}) {
    const bool canonical = kernel == ReadKernel::kCanonical;
    const std::vector<std::int32_t> ids =
        block_topk_host(scores, rows, n, n_valid, topk, kernel, fused_heads);
    ASSERT_EQ(static_cast<std::int64_t>(ids.size()), rows * topk);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::vector<std::int32_t> want =
          expected_ids(&scores[static_cast<std::size_t>(r * n)], n_valid[r], topk, canonical);
      const std::vector<std::int32_t> got(ids.begin() + r * topk, ids.begin() + (r + 1) * topk);
      ASSERT_EQ(got, want) << (canonical ? "canonical" : "fast") << ", n " << n << ", topk " << topk
                           << ", row " << r << ": n_valid " << n_valid[r] << ", kind "
                           << static_cast<int>(kinds[r]) << ", fused heads " << fused_heads
                           << " (seed " << seed << ")";
    }
  }
}

#define KVO_REQUIRE_GPU_TOPK()                                                     \
  do {                                                                             \
    std::string why_;                                                              \
    if (gpu::device_count(&why_) == 0) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)

TEST(GpuBlockTopk, MatchesTheCpuExpectationAtEveryPathAndBoundary) {
  KVO_REQUIRE_GPU_TOPK();
  std::uint32_t seed = 0x70C0;
  for (std::int64_t topk : kTopk) ASSERT_NO_FATAL_FAILURE(check_topk(16384, topk, ++seed));
}

// The one-launch indexer's selection (its threshold selection from kThresholdFrom blocks, the
// tournament below, select_best past k 16) with 1, 2 and 4 heads a CUDA block, up to its 4,096
// blocks: all-tied and few-valued rows put every key of a warp among its candidates.
TEST(GpuBlockTopk, TheOneLaunchSelectionMatchesAtEveryPathAndBoundary) {
  KVO_REQUIRE_GPU_TOPK();
  static_assert(static_cast<int>(RowKind::kCount) % 4 == 0, "the row kinds group into 4 heads");
  std::uint32_t seed = 0x70C2;
  for (const std::int64_t heads : {1, 2, 4}) {
    for (std::int64_t topk : kTopk) ASSERT_NO_FATAL_FAILURE(check_topk(4096, topk, ++seed, heads));
  }
}

TEST(GpuBlockTopk, StrideEqualToNValid) {
  KVO_REQUIRE_GPU_TOPK();
  // Rows packed with stride n: the last n_valid of each call reads up to the array's end.
  std::uint32_t seed = 0x70C1;
  for (std::int64_t n : {1, 17, 33, 4096, 4097}) {
    for (std::int64_t topk : {1, 16, 17, 1024, 2048})
      ASSERT_NO_FATAL_FAILURE(check_topk(n, topk, ++seed));
  }
}

TEST(GpuBlockTopk, BadInputRejectedBeforeAnyLaunch) {
  const std::vector<float> one = {1.0f};
  EXPECT_THROW(block_topk_host({NAN}, 1, 1, {1}, 1), spec::InvalidInput);
  EXPECT_THROW(block_topk_host(one, 1, 1, {2}, 1), spec::InvalidInput);   // n_valid > n
  EXPECT_THROW(block_topk_host(one, 1, 1, {-1}, 1), spec::InvalidInput);  // n_valid < 0
  EXPECT_THROW(block_topk_host(one, 1, 1, {1}, 0), spec::InvalidInput);   // topk 0
  EXPECT_THROW(block_topk_host(one, 1, 2, {1}, 1), spec::InvalidInput);   // scores not [1, 2]
  EXPECT_THROW(block_topk_host(one, 1, 1, {1}, 2049), spec::Unsupported);
  EXPECT_THROW(block_topk_host({0.0f, 1.0f}, 2, 1, {1, 1}, 1, ReadKernel::kCanonical, 3),
               spec::InvalidInput);  // 2 rows are not a multiple of 3 fused heads
  EXPECT_THROW(block_topk_host({0.0f, 1.0f}, 2, 1, {1, 0}, 1, ReadKernel::kCanonical, 2),
               spec::InvalidInput);  // a fused row's heads with two n_valid
  EXPECT_THROW(
      block_topk_host(std::vector<float>(4097, 0.0f), 1, 4097, {1}, 1, ReadKernel::kCanonical, 1),
      spec::Unsupported);  // past the one launch's 4,096 blocks
  EXPECT_THROW(block_topk_host(std::vector<float>(16385, 0.0f), 1, 16385, {1}, 1),
               spec::Unsupported);
}

}  // namespace
}  // namespace kvo
