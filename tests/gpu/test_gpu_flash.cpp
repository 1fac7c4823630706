// The flash family (kvo/gpu/read.hpp: flash_attention_host) against the oracle's profiles (SPEC
// principle 4): every default read case passes under its profile bf16_p, rounding P fails the
// fp32 bound on some, and each planted bug (the kFlash faults of kvo_gpu_testing,
// spec::AttentionBug) is rejected under every profile within 200 default cases. Sparse attention
// over the reference selection, dense attention too. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/read.hpp"
#include "kvo/gpu/testing/faults.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/read_judge.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo {
namespace {

using gpu::testing::ReadFault;
using spec::AttentionProfile;

constexpr std::uint64_t kSeed0 = 0xF1A5C0DEull;

std::string tag(const oracle::ReadCase& rc) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "seed 0x%016llX ", static_cast<unsigned long long>(rc.seed));
  return buf + rc.describe();
}

/// The flash kernel's attention on the expectation's case (sparse: over the reference selection;
/// dense: every visible token), with `fault` planted when given.
spec::HostTensor flash(const oracle::ReadExpectation& e, std::optional<ReadFault> fault) {
  const oracle::ReadCase& rc = e.read_case();
  // The selection as the case hands it to attention (SPEC 6: engine orders, -1 and ids past n_valid
  // anywhere).
  const std::vector<std::int32_t> ids = e.dense() ? std::vector<std::int32_t>{} : e.attended()->ids;
  const std::int64_t topk = e.dense() ? 0 : e.attended()->topk;
  if (fault.has_value()) {
    return gpu::testing::flash_attention_host_faulty(*fault, rc.config, rc.attention, rc.batch,
                                                     rc.q, rc.caches, rc.k_scale, rc.v_scale, ids,
                                                     topk);
  }
  return gpu::flash_attention_host(rc.config, rc.attention, rc.batch, rc.q, rc.caches, rc.k_scale,
                                   rc.v_scale, ids, topk);
}

int env_cases(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

// Every default case, sparse and dense, passes under bf16_p; the same outputs under fp32 fail
// on some case (P in bf16 is a real error that only the profile admits).
TEST(GpuFlash, PassesItsProfileAndFailsFp32) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const int n = env_cases("KVO_GPU_FLASH_CASES", 200);
  int fp32_failures = 0;
  double worst = 0.0, worst_fp32 = 0.0;
  for (int i = 0; i < n; ++i) {
    oracle::ReadOverrides o;
    o.max_seq_len = i % 4 == 0 ? 1200 : std::optional<std::int64_t>{};
    const oracle::ReadCase rc = oracle::make_read_case(kSeed0 + static_cast<std::uint64_t>(i), o);
    for (const bool dense : {false, true}) {
      oracle::ReadExpectation e(rc, dense);
      const spec::HostTensor out = flash(e, std::nullopt);
      const oracle::AttentionDiff own =
          oracle::diff_attention_output(e, out, AttentionProfile::kBf16P);
      ASSERT_TRUE(own.pass()) << tag(rc) << (dense ? " (dense)" : " (sparse)") << "\n"
                              << own.report();
      worst = std::max(worst, own.max_error_ratio);
      const oracle::AttentionDiff fp32 =
          oracle::diff_attention_output(e, out, AttentionProfile::kFp32);
      fp32_failures += !fp32.pass();
      worst_fp32 = std::max(worst_fp32, fp32.max_error_ratio);
    }
  }
  EXPECT_GT(fp32_failures, 0) << "bf16 P passed the fp32 bound on every case from seed " << kSeed0;
  std::printf(
      "[gpu-flash] %d default cases x (sparse, dense) pass under bf16_p, worst error / allowed "
      "%.3g; under fp32 %d of %d fail, worst %.3g\n",
      n, worst, fp32_failures, 2 * n, worst_fp32);
}

// Each planted bug is rejected under every profile (the loosest, bf16_p, the hard one) within 200
// default cases; prints the first killing case and how many of the 200 kill it.
TEST(GpuFlash, PlantedBugsCaughtUnderEveryProfile) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const std::pair<ReadFault, const char*> faults[] = {
      {ReadFault::kFlashDropChunkLast, "drop_chunk_last"},
      {ReadFault::kFlashScaleOff, "scale_off"},
      {ReadFault::kFlashNeighbourV, "neighbour_v"},
      {ReadFault::kFlashStopAtMinusOne, "stop_at_minus_one"},
      {ReadFault::kFlashMaskedChunkNan, "masked_chunk_nan"}};
  constexpr int kFaults = static_cast<int>(std::size(faults));
  const AttentionProfile profiles[] = {AttentionProfile::kFp32, AttentionProfile::kFp16P,
                                       AttentionProfile::kBf16P};
  constexpr int kCases = 200;
  int first[kFaults][3], killed[kFaults][3] = {};
  std::string report[kFaults];
  for (auto& f : first) std::fill(std::begin(f), std::end(f), -1);
  for (int i = 0; i < kCases; ++i) {
    const oracle::ReadCase rc = oracle::make_read_case(kSeed0 + static_cast<std::uint64_t>(i), {});
    oracle::ReadExpectation e(rc);
    for (int f = 0; f < kFaults; ++f) {
      const spec::HostTensor out = flash(e, faults[f].first);
      for (int p = 0; p < 3; ++p) {
        const oracle::AttentionDiff d = oracle::diff_attention_output(e, out, profiles[p]);
        if (d.pass()) continue;
        ++killed[f][p];
        if (first[f][p] >= 0) continue;
        first[f][p] = i;
        if (profiles[p] == AttentionProfile::kBf16P) report[f] = tag(rc) + "\n" + d.report();
      }
    }
  }
  for (int f = 0; f < kFaults; ++f) {
    for (int p = 0; p < 3; ++p) {
      EXPECT_GE(first[f][p], 0) << faults[f].second << " under " << spec::name_of(profiles[p])
                                << " never caught in " << kCases << " cases from seed " << kSeed0;
      std::printf("[gpu-flash] %s under %s: first caught at case %d, killed by %d/%d\n",
                  faults[f].second, std::string(spec::name_of(profiles[p])).c_str(), first[f][p],
                  killed[f][p], kCases);
    }
    std::printf("%s\n", report[f].c_str());
  }
}

// Bad input is rejected before any launch, as by attention_host: the same block twice in a row
// (SPEC 6). An id past n_valid is not bad input: it selects nothing.
TEST(GpuFlash, BadSelectionRejected) {
  oracle::ReadOverrides o;
  o.topk = 2;
  const oracle::ReadCase rc = oracle::make_read_case(kSeed0, o);
  oracle::ReadExpectation e(rc);
  std::vector<std::int32_t> ids = e.selection().ids;
  ids[0] = ids[1] = 0;  // checked on the host: no GPU needed
  EXPECT_THROW(gpu::flash_attention_host(rc.config, rc.attention, rc.batch, rc.q, rc.caches,
                                         rc.k_scale, rc.v_scale, ids, e.selection().topk),
               spec::InvalidInput);
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  ids = e.selection().ids;
  ids[0] = 1 << 20;
  EXPECT_NO_THROW(gpu::flash_attention_host(rc.config, rc.attention, rc.batch, rc.q, rc.caches,
                                            rc.k_scale, rc.v_scale, ids, e.selection().topk));
}

}  // namespace
}  // namespace kvo
