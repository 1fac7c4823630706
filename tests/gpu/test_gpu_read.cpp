// The read kernels (kvo/gpu/read.hpp) over random read cases (page sizes 1..128 with sparse_block
// independent of them, GQA ratios 1 to 16, every layout, bf16/fp16/fp8 caches, flat and
// block-scaled index-K, decode, MTP and prefill rows, padded rows) and long sequences up to 64k
// tokens: the canonical family against the reference bit for bit (top-k ids, sparse attention over
// the reference selection, dense attention); the fast family in foreign mode (tie-aware top-k,
// attention within the derived bound of the float64 truth), and its planted bugs rejected by that
// same mode. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/read.hpp"
#include "kvo/gpu/testing/faults.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/read_diff.hpp"
#include "kvo/oracle/read_judge.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/reference/read_path.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/truth/truth.hpp"

namespace kvo {
namespace {

using spec::DType;

class GpuRead : public ::testing::TestWithParam<int> {};

std::string tag(const oracle::ReadCase& rc) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "seed 0x%016llX ", static_cast<unsigned long long>(rc.seed));
  return buf + rc.describe();
}

/// The largest n_valid of a case's query rows (a row sits at most at its request's last token).
std::int64_t max_n_valid(const oracle::ReadCase& rc) {
  std::int64_t m = 1;
  for (std::int64_t len : rc.batch.seq_lens)
    if (len > 0) m = std::max(m, (len - 1) / rc.indexer.sparse_block + 1);
  return m;
}

/// The indexer's one-launch path (where the call is fused) in shape `shape` gives `ids`, the ids
/// of its two-launch path (`two`), first difference named.
void expect_ids_of_two_launches(const oracle::ReadCase& rc, const std::vector<std::int32_t>& two,
                                const std::vector<std::int32_t>& ids, gpu::ReadKernel kernel,
                                gpu::FusedShape shape) {
  ASSERT_EQ(two.size(), ids.size()) << tag(rc);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(ids[i], two[i]) << tag(rc) << ": id " << i << " (fused "
                              << gpu::indexer_is_fused(rc.config, rc.indexer, kernel,
                                                       max_n_valid(rc))
                              << ", forced lanes " << shape.split << " span " << shape.span
                              << ", kernel " << static_cast<int>(kernel)
                              << ") differs from the two-launch path's";
  }
}

/// The one launch's shapes a case runs besides the launch's own ({0, 0}): 1 or 2 lanes a token
/// and 1-8 logical blocks a CUDA block (clamped to the case's blocks), by its seed, so that the
/// campaign's cases spread over the shapes' CUDA blocks a row.
gpu::FusedShape forced_shape(std::uint64_t seed) {
  return {1 + static_cast<int>(seed % 2), 1 + static_cast<int>(seed / 2 % 8)};
}

/// expect_ids_of_two_launches with the launch's own shape and with forced_shape(seed).
void expect_same_ids_both_paths(const oracle::ReadCase& rc, const std::vector<std::int32_t>& two,
                                gpu::ReadKernel kernel) {
  for (const gpu::FusedShape shape : {gpu::FusedShape{}, forced_shape(rc.seed)}) {
    ASSERT_NO_FATAL_FAILURE(expect_ids_of_two_launches(
        rc, two,
        gpu::indexer_topk_host(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches, kernel, {},
                               gpu::IndexerPath::kFused, shape),
        kernel, shape));
  }
}

/// The chunk slots a CUDA block of the specialised attention kernel a case runs besides the
/// launch's own choice, by its seed: 1, 2, 3, 5, 7, 16, 24 or 40 (runs of the flattened (row, KV
/// head, slot) order, crossing from one (row, KV head) to the next; 40 clamped to the kernel's 24).
int forced_slots_per_block(std::uint64_t seed) {
  return std::array<int, 8>{1, 2, 3, 5, 7, 16, 24, 40}[seed / 16 % 8];
}

/// The specialised attention kernel with forced_slots_per_block(seed) gives the bits of the
/// launch's own choice (`own`), in the family `kernel`; `what`: sparse or dense.
void expect_same_bits_forced_slots(const oracle::ReadCase& rc,
                                   const std::vector<std::int32_t>& handed, std::int64_t topk,
                                   const spec::HostTensor& own, gpu::ReadKernel kernel,
                                   const char* what) {
  if (!gpu::attention_is_specialised(rc.config, rc.attention)) return;
  const int per = forced_slots_per_block(rc.seed);
  const oracle::AttentionDiff d =
      oracle::diff_attention_exact(own, gpu::testing::attention_host_slots_per_block(
                                            per, rc.config, rc.attention, rc.batch, rc.q, rc.caches,
                                            rc.k_scale, rc.v_scale, handed, topk, kernel));
  ASSERT_TRUE(d.pass()) << tag(rc) << " (" << what << ", kernel " << static_cast<int>(kernel)
                        << ", " << per
                        << " chunk slots a CUDA block forced, against the launch's own choice)\n"
                        << d.report();
}

/// The fast family's verdicts on one case in foreign mode: tie-aware top-k and bounded attention
/// (sparse over the reference selection). Empty strings: accepted.
struct ForeignVerdict {
  std::string topk, attention;
};

ForeignVerdict judge_fast(const oracle::ReadCase& rc, const reference::TopkSelection& sel,
                          std::optional<gpu::testing::ReadFault> fault) {
  ForeignVerdict v;
  const auto ids = fault.has_value()
                       ? gpu::testing::indexer_topk_host_faulty(*fault, rc.config, rc.indexer,
                                                                rc.batch, rc.index_q, rc.caches)
                       : gpu::indexer_topk_host(rc.config, rc.indexer, rc.batch, rc.index_q,
                                                rc.caches, gpu::ReadKernel::kFast);
  if (!fault.has_value()) {
    EXPECT_NO_FATAL_FAILURE(expect_same_ids_both_paths(rc, ids, gpu::ReadKernel::kFast));
  }
  const truth::ScoreTruth st = truth::indexer_truth(rc.config, rc.indexer, rc.batch, rc.index_q,
                                                    rc.caches, spec::Ordering::kForeign);
  const oracle::TopkDiff td =
      oracle::diff_topk_tie_aware(sel, st, rc.indexer, ids, {oracle::TopkOrder::kDescendingScore});
  if (!td.equal()) v.topk = td.report();
  const auto out =
      fault.has_value()
          ? gpu::testing::attention_host_faulty(*fault, rc.config, rc.attention, rc.batch, rc.q,
                                                rc.caches, rc.k_scale, rc.v_scale, sel.ids,
                                                sel.topk)
          : gpu::attention_host(rc.config, rc.attention, rc.batch, rc.q, rc.caches, rc.k_scale,
                                rc.v_scale, sel.ids, sel.topk, gpu::ReadKernel::kFast);
  if (!fault.has_value()) {
    EXPECT_NO_FATAL_FAILURE(expect_same_bits_forced_slots(rc, sel.ids, sel.topk, out,
                                                          gpu::ReadKernel::kFast, "sparse"));
  }
  const oracle::AttentionDiff ad = oracle::diff_attention_bounded(
      truth::attention_truth(rc.config, rc.attention, rc.batch, rc.q, rc.caches, rc.k_scale,
                             rc.v_scale, &sel, spec::Ordering::kForeign),
      out);
  if (!ad.pass()) v.attention = ad.report();
  return v;
}

/// Diffs one case; `dense` also runs dense attention (every visible token).
void check_case(const oracle::ReadCase& rc, bool dense) {
  const reference::TopkSelection sel =
      reference::indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
  const auto ids = gpu::indexer_topk_host(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
  const oracle::TopkDiff td = oracle::diff_topk_exact(sel, ids);
  ASSERT_TRUE(td.equal()) << tag(rc) << "\n" << td.report();
  ASSERT_NO_FATAL_FAILURE(expect_same_ids_both_paths(rc, ids, gpu::ReadKernel::kCanonical));
  // Attention is handed the rows as the case arranges them (SPEC 6: engine orders, -1 and ids past
  // n_valid anywhere) and must equal the reference over its own ascending rows, bit for bit.
  const std::vector<std::int32_t> handed = oracle::arrange_selection(sel, rc.attended, rc.seed);
  const auto sparse =
      gpu::attention_host(rc.config, rc.attention, rc.batch, rc.q, rc.caches, rc.k_scale,
                          rc.v_scale, handed, sel.topk + rc.attended.extra);
  const oracle::AttentionDiff sd =
      oracle::diff_attention_exact(reference::attention(rc.config, rc.attention, rc.batch, rc.q,
                                                        rc.caches, rc.k_scale, rc.v_scale, &sel)
                                       .out,
                                   sparse);
  ASSERT_TRUE(sd.pass()) << tag(rc) << " (sparse)\n" << sd.report();
  ASSERT_NO_FATAL_FAILURE(expect_same_bits_forced_slots(
      rc, handed, sel.topk + rc.attended.extra, sparse, gpu::ReadKernel::kCanonical, "sparse"));
  if (gpu::attention_is_specialised(rc.config, rc.attention)) {  // the generic kernel as well
    const oracle::AttentionDiff gd = oracle::diff_attention_exact(
        sparse, gpu::attention_host(rc.config, rc.attention, rc.batch, rc.q, rc.caches, rc.k_scale,
                                    rc.v_scale, handed, sel.topk + rc.attended.extra,
                                    gpu::ReadKernel::kCanonical, gpu::AttentionPath::kGeneric));
    ASSERT_TRUE(gd.pass()) << tag(rc) << " (sparse, generic kernel against the specialised)\n"
                           << gd.report();
  }
  const ForeignVerdict fast = judge_fast(rc, sel, std::nullopt);
  ASSERT_TRUE(fast.topk.empty()) << tag(rc) << " (fast top-k, foreign mode)\n" << fast.topk;
  ASSERT_TRUE(fast.attention.empty()) << tag(rc) << " (fast attention, foreign mode)\n"
                                      << fast.attention;
  if (!dense) return;
  const auto full = gpu::attention_host(rc.config, rc.attention, rc.batch, rc.q, rc.caches,
                                        rc.k_scale, rc.v_scale, {}, 0);
  const oracle::AttentionDiff dd =
      oracle::diff_attention_exact(reference::attention(rc.config, rc.attention, rc.batch, rc.q,
                                                        rc.caches, rc.k_scale, rc.v_scale, nullptr)
                                       .out,
                                   full);
  ASSERT_TRUE(dd.pass()) << tag(rc) << " (dense)\n" << dd.report();
  ASSERT_NO_FATAL_FAILURE(
      expect_same_bits_forced_slots(rc, {}, 0, full, gpu::ReadKernel::kCanonical, "dense"));
}

TEST_P(GpuRead, CanonicalKernelsAreBitExact) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const char* env = std::getenv("KVO_GPU_READ_CASES");
  const int n = env != nullptr ? std::atoi(env) : 60;
  int cases = 0;
  for (int i = 0; i < n; ++i) {
    const std::uint64_t seed = 0x5EAD0000ull + static_cast<std::uint64_t>(GetParam()) * 100000u + i;
    oracle::ReadOverrides o;
    o.max_seq_len = i % 3 == 0 ? 1200 : 300;
    const oracle::ReadCase rc = oracle::make_read_case(seed, o);
    ASSERT_NO_FATAL_FAILURE(check_case(rc, true));
    ++cases;
  }
  // Long sequences (to 64k tokens): the indexer and sparse attention over 16 selected blocks.
  const char* long_env = std::getenv("KVO_GPU_READ_LONG");  // 0 under compute-sanitizer
  const int long_cases = long_env != nullptr ? std::atoi(long_env) : 2;
  for (int i = 0; i < long_cases; ++i) {
    oracle::ReadOverrides o;
    o.max_seq_len = 65536;
    o.seq_len = i == 0 ? 65536 : 40000 + 17 * GetParam();
    o.sparse_block = 128;
    o.topk = 16;
    o.requests = 1;
    o.group_size = 16;
    o.num_kv_heads = 1;
    o.head_dim = 64;
    o.block_size = i == 0 ? 64 : 17;
    if (i == 1) {  // each of two index heads its own top-16 over ~300 blocks, their union
      o.index_group = spec::IndexGroup::kUnion;
      o.index_heads_per_kv = 2;
    }
    const oracle::ReadCase rc =
        oracle::make_read_case(0x10C0000ull + static_cast<std::uint64_t>(GetParam()) * 10 + i, o);
    ASSERT_NO_FATAL_FAILURE(check_case(rc, false));
    ++cases;
  }
  std::printf("[gpu-cases] read cases diffed: %d\n", cases);
}

INSTANTIATE_TEST_SUITE_P(Shards, GpuRead, ::testing::Range(0, 8));

// ---------------------------------------------------------------------------------------------
// Attention's specialised chunk kernel (gpu/src/attention_decode.cuh): which calls take it (host
// logic, no GPU), and each of its instantiations against the reference and the generic kernel
// (check_case diffs both when the case is specialised).

spec::AttentionParams params_with_group(const spec::ModelConfig& c, std::int64_t group) {
  spec::AttentionParams p;
  p.num_q_heads = c.geometry.num_kv_heads * group;
  p.sparse_block = 128;
  return p;
}

TEST(SpecialisedAttention, AppliesExactlyToTheCallsItIsBuiltFor) {
  spec::ModelConfig c;
  c.layers = spec::parse_layer_mix("S");
  c.geometry = {64, 16, 4, 128, 128};
  c.kv.cache_dtype = DType::kFp8E4M3;
  c.layout = spec::KvLayout::kSplitNhd;
  spec::validate(c);
  for (std::int64_t group : {1, 2, 4, 8, 16})
    EXPECT_TRUE(gpu::attention_is_specialised(c, params_with_group(c, group))) << group;
  for (std::int64_t group : {3, 32})
    EXPECT_FALSE(gpu::attention_is_specialised(c, params_with_group(c, group))) << group;
  const spec::AttentionParams p = params_with_group(c, 4);
  spec::AttentionParams wide = p;  // more than 128 positions a chunk
  wide.sparse_block = 129;
  EXPECT_FALSE(gpu::attention_is_specialised(c, wide));
  spec::AttentionParams narrow = p;
  narrow.sparse_block = 1;
  EXPECT_TRUE(gpu::attention_is_specialised(c, narrow));
  const std::vector<std::pair<std::string, void (*)(spec::ModelConfig&)>> outside = {
      {"f32 cache", [](spec::ModelConfig& m) { m.kv.cache_dtype = DType::kF32; }},
      {"head_dim 96", [](spec::ModelConfig& m) { m.geometry.head_dim = 96; }},
      {"head_dim 256", [](spec::ModelConfig& m) { m.geometry.head_dim = 256; }},
      {"rows 8 bytes apart from 16-byte alignment",
       [](spec::ModelConfig& m) {
         m.kv_strides = {16 * 2 * 4 * 136, 4 * 136, 136, 16 * 4 * 136, 8};
       }},
  };
  for (const auto& [what, change] : outside) {
    spec::ModelConfig m = c;
    change(m);
    spec::validate(m);
    EXPECT_FALSE(gpu::attention_is_specialised(m, p)) << what;
  }
  for (DType dt : {DType::kBF16, DType::kF16, DType::kFp8E5M2}) {
    spec::ModelConfig m = c;
    m.kv.cache_dtype = dt;
    m.geometry.head_dim = 64;
    EXPECT_TRUE(gpu::attention_is_specialised(m, p)) << spec::name_of(dt);
  }
}

// The default read case distribution sends cases to each kernel, so the random-case tests diff
// both against the reference.
TEST(SpecialisedAttention, TheCaseDistributionReachesBothKernels) {
  int specialised = 0;
  constexpr int kCases = 300;
  for (std::uint64_t i = 0; i < kCases; ++i) {
    const oracle::ReadCase rc = oracle::make_read_case(oracle::case_seed(0xDEC0DEu, i), {});
    if (gpu::attention_is_specialised(rc.config, rc.attention)) ++specialised;
  }
  std::printf("[specialised] attention: %d of %d default read cases\n", specialised, kCases);
  EXPECT_GE(specialised * 10, kCases) << "fewer than 10% of the cases reach the specialised kernel";
  EXPECT_GE((kCases - specialised) * 2, kCases) << "fewer than half reach the generic kernel";
}

// The specialised chunk kernel's runs (decode_run_length, attention_decode.cuh), on 1 to 132
// multiprocessors of three blocks, at most 24 slots a run: no run past 24; a forced count kept,
// clamped to 24; where two blocks a multiprocessor need runs of at most four, those; else the
// blocks fit the fewest waves that runs of 24 allow, with the shortest run that does (every block
// runs that many slots but the last). Every total up to 5,000 and 20,000 drawn up to 2^40 (fixed
// seed, printed). Needs no device: the rule runs on the host.
TEST(SpecialisedAttention, RunLengthsCoverEverySlotInTheFewestEvenWaves) {
  constexpr int kPerSm = 3, kMost = 24;
  constexpr std::uint64_t kSeed = 0x5E55133ull;
  std::printf("[run-length] seed 0x%llX\n", static_cast<unsigned long long>(kSeed));
  std::mt19937_64 rng(kSeed);
  std::uniform_int_distribution<long long> draw(1, 1ll << 40);
  const auto ceil_div = [](long long a, long long b) { return (a + b - 1) / b; };
  for (const long long sms : {1ll, 7ll, 78ll, 132ll}) {
    std::vector<long long> totals;
    for (long long t = 1; t <= 5000; ++t) totals.push_back(t);
    for (int i = 0; i < 20000; ++i) totals.push_back(draw(rng));
    for (const long long total : totals) {
      const int per = gpu::testing::decode_run_length(total, sms, kPerSm, kMost, 0);
      const std::string at = "total " + std::to_string(total) + ", " + std::to_string(sms) +
                             " multiprocessors: " + std::to_string(per) + " slots a run";
      ASSERT_TRUE(per >= 1 && per <= kMost) << at;
      const long long blocks = ceil_div(total, per);
      const long long two = ceil_div(total, 2 * sms);
      if (two <= 4) {
        ASSERT_EQ(per, std::max(1ll, two)) << at << ": short runs on two blocks a multiprocessor";
        ASSERT_LE(blocks, 2 * sms) << at;
        continue;
      }
      const long long resident = sms * kPerSm, waves = ceil_div(total, resident * kMost);
      ASSERT_LE(blocks, waves * resident) << at << ": more than the fewest waves (" << waves << ")";
      ASSERT_TRUE(per == 1 || ceil_div(total, per - 1) > waves * resident)
          << at << ": a shorter run fits the same waves";
    }
    for (const int forced : {1, 5, 24, 40})
      ASSERT_EQ(gpu::testing::decode_run_length(4096, sms, kPerSm, kMost, forced),
                std::min(forced, kMost));
  }
}

TEST(FusedIndexer, TheCaseDistributionReachesBothPaths) {
  int fused = 0;
  constexpr int kCases = 300;
  for (std::uint64_t i = 0; i < kCases; ++i) {
    const oracle::ReadCase rc = oracle::make_read_case(oracle::case_seed(0xDEC0DEu, i), {});
    if (gpu::indexer_is_fused(rc.config, rc.indexer, gpu::ReadKernel::kCanonical,
                              max_n_valid(rc))) {
      ++fused;
    }
  }
  std::printf("[fused] indexer: %d of %d default read cases in one launch\n", fused, kCases);
  EXPECT_GE(fused * 4, kCases) << "fewer than a quarter of the cases reach the fused indexer";
  EXPECT_GE((kCases - fused) * 10, kCases) << "fewer than 10% reach the two-launch path";
}

// The fused indexer over every index-K form the spec admits (flat bf16 and e4m3, block-scaled
// e4m3) and index_dim 64, 128, 256 (block-scaled: 128, 256); logical blocks of 128, 100 and 16
// tokens (warps that straddle two blocks), top 16 (the tournament, several KV heads a pass) and top
// 40 (the bitonic sort, head by head), up to 2,000 logical blocks a row (200 under the sanitizers),
// with the launch's own lanes a token and 1 and 2 forced: against the reference (canonical) and
// its two-launch path (both families), its counters back at 0 (indexer_topk_host checks).
TEST(FusedIndexer, EveryFormMatchesTheReferenceAndTheTwoLaunchPath) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const char* long_env = std::getenv("KVO_GPU_READ_LONG");  // 0 under compute-sanitizer
  const std::int64_t longest = long_env != nullptr && std::atoi(long_env) == 0 ? 3000 : 32000;
  int cases = 0;
  for (const bool block_scale : {false, true}) {
    for (DType dt : {DType::kBF16, DType::kFp8E4M3}) {  // the flat index-K cache's dtypes
      if (block_scale && dt != DType::kFp8E4M3) continue;
      for (std::int64_t idim : {64, 128, 256}) {
        if (block_scale && idim == 64) continue;  // block-scaled: groups of 128
        oracle::ReadOverrides o;
        o.index_layout = block_scale ? spec::IndexLayout::kBlockScale : spec::IndexLayout::kFlat;
        if (!block_scale) o.index_dtype = dt;
        o.index_dim = idim;
        o.index_group = spec::IndexGroup::kMax;
        o.sparse_block = std::array<std::int64_t, 3>{128, 100, 16}[cases % 3];
        o.topk = cases % 4 == 3 ? 40 : 16;
        o.max_seq_len = cases % 2 == 0 ? 1500 : longest;
        const oracle::ReadCase rc = oracle::make_read_case(0xF05ED000ull + cases, o);
        ++cases;
        const reference::TopkSelection sel =
            reference::indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
        for (const auto kernel : {gpu::ReadKernel::kCanonical, gpu::ReadKernel::kFast}) {
          if (!gpu::indexer_is_fused(rc.config, rc.indexer, kernel, max_n_valid(rc))) continue;
          const auto two = gpu::indexer_topk_host(rc.config, rc.indexer, rc.batch, rc.index_q,
                                                  rc.caches, kernel);
          // The launch's own shape, each lane count at one logical block a CUDA block and at the
          // most (one CUDA block a row), and a span that leaves a row's last CUDA block short.
          for (const gpu::FusedShape shape :
               {gpu::FusedShape{}, gpu::FusedShape{1, 1}, gpu::FusedShape{2, 1},
                gpu::FusedShape{1, 64}, gpu::FusedShape{2, 64}, gpu::FusedShape{2, 7}}) {
            const auto ids =
                gpu::indexer_topk_host(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches,
                                       kernel, {}, gpu::IndexerPath::kFused, shape);
            if (kernel == gpu::ReadKernel::kCanonical) {
              const oracle::TopkDiff td = oracle::diff_topk_exact(sel, ids);
              ASSERT_TRUE(td.equal()) << tag(rc) << " (fused, forced lanes " << shape.split
                                      << " span " << shape.span << ")\n"
                                      << td.report();
            }
            ASSERT_NO_FATAL_FAILURE(expect_ids_of_two_launches(rc, two, ids, kernel, shape));
          }
        }
      }
    }
  }
  std::printf("[fused] indexer: %d forms, each against the reference and the two-launch path\n",
              cases);
}

// Every instantiation (cache dtype x head_dim x query heads per KV head), over random layouts,
// page sizes, rows and selections; chunks of 128, 100 and 16 tokens (a warp of positions
// straddled, the in-register tree levels present and absent).
TEST(SpecialisedAttention, EveryInstantiationMatchesTheReferenceAndTheGenericKernel) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  int cases = 0;
  for (DType dt : {DType::kBF16, DType::kF16, DType::kFp8E4M3, DType::kFp8E5M2}) {
    for (std::int64_t hd : {64, 128}) {
      for (std::int64_t group : {1, 2, 4, 8, 16}) {
        oracle::ReadOverrides o;
        o.kv_dtype = dt;
        o.head_dim = hd;
        o.group_size = group;
        o.sparse_block = std::array<std::int64_t, 3>{128, 100, 16}[cases % 3];
        o.max_seq_len = 1200;
        const oracle::ReadCase rc = oracle::make_read_case(0xDEC0D000ull + cases, o);
        ASSERT_TRUE(gpu::attention_is_specialised(rc.config, rc.attention)) << tag(rc);
        ASSERT_NO_FATAL_FAILURE(check_case(rc, true));
        ++cases;
      }
    }
  }
  std::printf("[gpu-cases] specialised attention instantiations diffed: %d cases\n", cases);
}

// Every combination of the indexer's later modes (SPEC 5: index_group max or union over two index
// heads per KV head, index_neg_inf keep or drop, index-Q in bf16 or e4m3) with a -inf block
// planted, on both index-K layouts that hold e4m3: canonical bit-exact, fast accepted in foreign
// mode.
TEST(GpuRead, EveryIndexerModeCombination) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  int cases = 0;
  for (spec::IndexGroup group : {spec::IndexGroup::kMax, spec::IndexGroup::kUnion}) {
    for (spec::IndexNegInf neg_inf : {spec::IndexNegInf::kKeep, spec::IndexNegInf::kDrop}) {
      for (spec::IndexQType q : {spec::IndexQType::kActivation, spec::IndexQType::kFp8E4m3}) {
        for (std::uint64_t i = 0; i < 6; ++i) {
          oracle::ReadOverrides o;
          o.index_group = group;
          o.index_neg_inf = neg_inf;
          o.index_q = q;
          o.index_heads_per_kv = 2;
          o.neg_inf_block = true;
          o.topk = 1 + static_cast<std::int64_t>(i);
          o.index_layout = spec::IndexLayout::kBlockScale;
          o.max_seq_len = 300;
          const oracle::ReadCase rc = oracle::make_read_case(0x40DE0000ull + cases, o);
          SCOPED_TRACE(std::string(spec::name_of(group)) + " " +
                       std::string(spec::name_of(neg_inf)) + " " + std::string(spec::name_of(q)));
          ASSERT_NO_FATAL_FAILURE(check_case(rc, false));
          ++cases;
        }
      }
    }
  }
  std::printf("[gpu-cases] indexer mode combinations: %d cases\n", cases);
}

// Foreign mode proven on a real kernel: the fast family with a planted top-k bug (the local block
// unforced) and a planted softmax bug (exp2 without log2(e)) is rejected within a few cases, by the
// rule each breaks.
TEST(GpuReadFast, PlantedBugsRejectedInForeignMode) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  int topk_case = -1, softmax_case = -1;
  std::string topk_report, softmax_report;
  for (int i = 0; i < 50 && (topk_case < 0 || softmax_case < 0); ++i) {
    const oracle::ReadCase rc = oracle::make_read_case(0xFA570000ull + i, {});
    const reference::TopkSelection sel =
        reference::indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
    const ForeignVerdict local = judge_fast(rc, sel, gpu::testing::ReadFault::kIgnoreLocal);
    EXPECT_TRUE(local.attention.empty()) << tag(rc) << "\n" << local.attention;
    if (topk_case < 0 && !local.topk.empty()) topk_case = i, topk_report = local.topk;
    const ForeignVerdict exp2 = judge_fast(rc, sel, gpu::testing::ReadFault::kExpNoLog2e);
    EXPECT_TRUE(exp2.topk.empty()) << tag(rc) << "\n" << exp2.topk;
    if (softmax_case < 0 && !exp2.attention.empty())
      softmax_case = i, softmax_report = exp2.attention;
  }
  ASSERT_GE(topk_case, 0) << "the unforced local block was never caught";
  ASSERT_GE(softmax_case, 0) << "exp2 without log2(e) was never caught";
  std::printf(
      "[gpu-fast] local block unforced caught at case %d; exp2 without log2(e) at case %d\n",
      topk_case, softmax_case);
  std::printf("%s\n%s\n", topk_report.c_str(), softmax_report.c_str());
}

// Huge caches on the read side (issue 14): K, V and index-K each past 2^32 bytes (lazy on the
// host, whole on the device), every block the rows read past byte 2^32 of each: the canonical
// kernels bit for bit, the fast family in foreign mode.
TEST(GpuHugeRead, ReadsPast2To32BytesOfEveryBufferMatch) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  for (std::uint64_t i = 0; i < 4; ++i) {
    const oracle::ReadCase rc = oracle::make_read_case(
        oracle::case_seed(0x4B16EAull, i * oracle::kThemeSlots + oracle::kThemeHugeCache), {});
    ASSERT_TRUE(rc.caches.find(spec::BufferKind::kIndexK)->storage.is_lazy()) << tag(rc);
    ASSERT_GT(rc.caches.find(spec::BufferKind::kIndexK)->storage.size(), std::int64_t{1} << 32);
    ASSERT_NO_FATAL_FAILURE(check_case(rc, true));
  }
  std::printf("[gpu-cases] huge read cases diffed: 4\n");
}

// The canonical family's tie rule (SPEC 5: the lower block id wins an exact tie) planted wrong in
// its selection: on cases with wide exact ties the canonical judge (bit for bit) names the row and
// the ids; the production canonical kernel matches the reference on every one of them.
TEST(GpuRead, CanonicalTieBugCaughtBitForBit) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  int caught = -1, cases = 0;
  for (int i = 0; i < 40 && caught < 0; ++i, ++cases) {
    oracle::ReadOverrides o;
    o.tied_scores = true;
    const oracle::ReadCase rc = oracle::make_read_case(0x71E50000ull + i, o);
    SCOPED_TRACE(tag(rc));
    const reference::TopkSelection sel =
        reference::indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
    const auto good = gpu::indexer_topk_host(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches,
                                             gpu::ReadKernel::kCanonical);
    ASSERT_EQ(good, sel.ids);
    const auto tied = gpu::testing::indexer_topk_host_faulty(
        gpu::testing::ReadFault::kTiesToHigherId, rc.config, rc.indexer, rc.batch, rc.index_q,
        rc.caches, gpu::ReadKernel::kCanonical);
    ASSERT_EQ(tied.size(), sel.ids.size());
    for (std::size_t k = 0; k < tied.size() && caught < 0; ++k) {
      if (tied[k] == sel.ids[k]) continue;
      caught = i;
      std::printf(
          "[gpu-cases] tie won by the higher id caught at case %d: id slot %zu holds %d, "
          "the reference %d\n",
          i, k, tied[k], sel.ids[k]);
    }
  }
  ASSERT_GE(caught, 0) << "ties to the higher id never caught in " << cases << " tied cases";
}

// The fast indexer in the engines' declared forms (SPEC 5): head-major ids are the token-major ones
// transposed, element for element; ranked by 16-bit score keys it is accepted under keys16 (and on
// some cases only there: the keys decide); long rows (up to 5000 logical blocks: past 4096, the
// tiled rank path) included. The canonical family takes no key precision.
TEST(GpuReadFast, DeclaredTopkForms) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const spec::TopkForm head_major{spec::TopkOrder::kDescendingScore, spec::TopkLayout::kHeadMajor};
  const spec::TopkForm keys16{spec::TopkOrder::kDescendingScore, spec::TopkLayout::kTokenMajor, 16};
  int keys_decided = 0, cases = 0;
  for (int i = 0; i < 120; ++i) {
    oracle::ReadOverrides o;
    if (i % 8 == 7) {  // long rows: up to 5000 logical blocks of 4 tokens
      o.sparse_block = 4;
      o.max_seq_len = 20000;
    }
    const oracle::ReadCase rc = oracle::make_read_case(0xF0E40000ull + i, o);
    SCOPED_TRACE(tag(rc));
    const auto& c = rc;
    const std::vector<std::int32_t> rows = gpu::indexer_topk_host(
        c.config, c.indexer, c.batch, c.index_q, c.caches, gpu::ReadKernel::kFast);
    const std::vector<std::int32_t> hm = gpu::indexer_topk_host(
        c.config, c.indexer, c.batch, c.index_q, c.caches, gpu::ReadKernel::kFast, head_major);
    const reference::TopkSelection sel =
        reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches);
    ASSERT_EQ(oracle::token_major_ids(sel, hm, spec::TopkLayout::kHeadMajor), rows);
    const truth::ScoreTruth st = truth::indexer_truth(c.config, c.indexer, c.batch, c.index_q,
                                                      c.caches, spec::Ordering::kForeign);
    const std::vector<std::int32_t> keyed = gpu::indexer_topk_host(
        c.config, c.indexer, c.batch, c.index_q, c.caches, gpu::ReadKernel::kFast, keys16);
    const oracle::TopkDiff d = oracle::diff_topk_tie_aware(sel, st, c.indexer, keyed, keys16);
    ASSERT_TRUE(d.equal()) << d.report();
    keys_decided += !oracle::diff_topk_tie_aware(sel, st, c.indexer, keyed, {keys16.order}).equal();
    if (c.batch.num_queries() > 0) {  // no query rows: no launch, nothing to refuse
      EXPECT_THROW((void)gpu::indexer_topk_host(c.config, c.indexer, c.batch, c.index_q, c.caches,
                                                gpu::ReadKernel::kCanonical, keys16),
                   spec::Unsupported);
    }
    ++cases;
  }
  std::printf("[gpu-fast] declared forms: %d cases; 16-bit keys decided the choice on %d\n", cases,
              keys_decided);
}

TEST(GpuReadBadInput, RejectedBeforeAnyLaunch) {
  oracle::ReadCase rc = oracle::make_read_case(3, {});
  spec::ReadBatch bad = rc.batch;
  bad.block_table[0] = static_cast<std::int32_t>(rc.config.geometry.num_blocks);  // past the cache
  EXPECT_THROW(gpu::indexer_topk_host(rc.config, rc.indexer, bad, rc.index_q, rc.caches),
               spec::InvalidInput);
  spec::IndexerParams zero = rc.indexer;
  zero.topk = 0;
  EXPECT_THROW(gpu::indexer_topk_host(rc.config, zero, rc.batch, rc.index_q, rc.caches),
               spec::InvalidInput);
}

}  // namespace
}  // namespace kvo
