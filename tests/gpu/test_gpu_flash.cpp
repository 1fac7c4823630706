// The flash family (kvo/gpu/read.hpp: flash_attention_host) against the oracle's profiles (SPEC
// principle 4): every default read case passes under its profile bf16_p, rounding P fails the
// fp32 bound on some, and each planted bug (the kFlash faults of kvo_gpu_testing,
// spec::AttentionBug) is rejected under every profile within 200 default cases. Sparse attention
// over the reference selection, dense attention too. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

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
  int fp32_failures = 0, decode_cases = 0;
  double worst = 0.0, worst_fp32 = 0.0;
  for (int i = 0; i < n; ++i) {
    oracle::ReadOverrides o;
    o.max_seq_len = i % 4 == 0 ? 1200 : std::optional<std::int64_t>{};
    const oracle::ReadCase rc = oracle::make_read_case(kSeed0 + static_cast<std::uint64_t>(i), o);
    decode_cases += gpu::flash_is_decode(rc.config, rc.attention);
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
  EXPECT_GT(decode_cases, 0) << "no default case took the decode kernels";
  std::printf(
      "[gpu-flash] %d default cases x (sparse, dense) pass under bf16_p (%d through the decode "
      "kernels), worst error / allowed %.3g; under fp32 %d of %d fail, worst %.3g\n",
      n, decode_cases, worst, fp32_failures, 2 * n, worst_fp32);
}

// The decode kernels (tensor cores, a row's selected blocks spread over CUDA blocks) on each of
// their instantiations (cache dtype x head_dim) at 1, 3, 4 and 16 query heads per KV head and
// chunks of 128, 100 and 16 tokens, over contexts that end inside a chunk: every case, sparse and
// dense, takes them (flash_is_decode) and passes under bf16_p.
TEST(GpuFlash, DecodeKernelsPassTheProfileOnEveryInstantiation) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  // The sanitizers' run takes the first sparse_block only.
  const int sparse_blocks = std::min(3, env_cases("KVO_GPU_FLASH_DECODE_SPARSE_BLOCKS", 3));
  int cases = 0;
  double worst = 0.0;
  std::uint64_t seed = kSeed0 ^ 0xDEC0DEull;
  for (const spec::DType dt :
       {spec::DType::kBF16, spec::DType::kF16, spec::DType::kFp8E4M3, spec::DType::kFp8E5M2}) {
    for (const std::int64_t hd : {64, 128}) {
      for (const std::int64_t group : {1, 3, 4, 16}) {
        for (int b = 0; b < sparse_blocks; ++b) {
          const std::int64_t sb = std::array<std::int64_t, 3>{128, 100, 16}[b];
          oracle::ReadOverrides o;
          o.kv_dtype = dt;
          o.head_dim = hd;
          o.group_size = group;
          o.sparse_block = sb;
          o.max_seq_len = 5 * sb + 37;
          o.adversarial = cases % 2 == 1;
          // A drawn strided view may leave rows unaligned for 16-byte loads: draw again.
          std::optional<oracle::ReadCase> rc;
          for (int tries = 0; tries < 50 && !rc; ++tries) {
            oracle::ReadCase c = oracle::make_read_case(++seed, o);
            if (gpu::flash_is_decode(c.config, c.attention)) rc = std::move(c);
          }
          ASSERT_TRUE(rc.has_value()) << "no decode case drawn for " << spec::name_of(dt) << " hd "
                                      << hd << " group " << group << " sparse_block " << sb;
          for (const bool dense : {false, true}) {
            oracle::ReadExpectation e(*rc, dense);
            const oracle::AttentionDiff d =
                oracle::diff_attention_output(e, flash(e, std::nullopt), AttentionProfile::kBf16P);
            ASSERT_TRUE(d.pass()) << tag(*rc) << (dense ? " (dense)" : " (sparse)") << "\n"
                                  << d.report();
            worst = std::max(worst, d.max_error_ratio);
          }
          ++cases;
        }
      }
    }
  }
  std::printf(
      "[gpu-flash] decode kernels: %d cases x (sparse, dense) pass under bf16_p, worst error / "
      "allowed %.3g\n",
      cases, worst);
}

// The decode kernels run a row's chunk slots in CUDA blocks of one to kFlashDecodeMaxPerBlock
// slots, the next slot's rows in flight while a slot computes; however many a block runs, every
// slot's partial result is computed alone, so the output must be the same bits. Checked on cases
// with up to 16 selected blocks and, dense, over a hundred chunks (blocks that end partway through
// the row's slots, empty slots, -1 and ids past n_valid), every dtype and head_dim.
TEST(GpuFlash, DecodeBlocksOfSeveralSlotsGiveTheSameBits) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  int cases = 0;
  std::uint64_t seed = kSeed0 ^ 0x5107ull;
  for (const spec::DType dt :
       {spec::DType::kBF16, spec::DType::kF16, spec::DType::kFp8E4M3, spec::DType::kFp8E5M2}) {
    for (const std::int64_t hd : {64, 128}) {
      oracle::ReadOverrides o;
      o.kv_dtype = dt;
      o.head_dim = hd;
      o.sparse_block = 16;
      o.topk = 16;
      o.max_seq_len = 1800;
      std::optional<oracle::ReadCase> rc;
      for (int tries = 0; tries < 50 && !rc; ++tries) {
        oracle::ReadCase c = oracle::make_read_case(++seed, o);
        if (gpu::flash_is_decode(c.config, c.attention)) rc = std::move(c);
      }
      ASSERT_TRUE(rc.has_value()) << "no decode case drawn for " << spec::name_of(dt) << " hd "
                                  << hd;
      for (const bool dense : {false, true}) {
        oracle::ReadExpectation e(*rc, dense);
        const std::vector<std::int32_t> ids =
            e.dense() ? std::vector<std::int32_t>{} : e.attended()->ids;
        const std::int64_t topk = e.dense() ? 0 : e.attended()->topk;
        const spec::HostTensor base = flash(e, std::nullopt);
        ASSERT_TRUE(oracle::diff_attention_output(e, base, AttentionProfile::kBf16P).pass())
            << tag(*rc);
        for (const int per : {2, 3, 8}) {
          const spec::HostTensor out = gpu::testing::flash_attention_host_slots_per_block(
              per, rc->config, rc->attention, rc->batch, rc->q, rc->caches, rc->k_scale,
              rc->v_scale, ids, topk);
          ASSERT_EQ(out.bytes.size(), base.bytes.size());
          const auto at = std::mismatch(out.bytes.begin(), out.bytes.end(), base.bytes.begin());
          const std::size_t byte = static_cast<std::size_t>(at.first - out.bytes.begin());
          ASSERT_TRUE(at.first == out.bytes.end())
              << tag(*rc) << (dense ? " (dense)" : " (sparse)") << ": " << per
              << " slots a block: first differing output byte " << byte << " (element "
              << byte / spec::dtype_bytes(out.dtype) << "): " << int{*at.first} << " vs "
              << int{*at.second};
        }
        ++cases;
      }
    }
  }
  std::printf(
      "[gpu-flash] decode kernels: %d calls give the same bits at 2, 3 and 8 slots a "
      "block as the launch's own choice\n",
      cases);
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
