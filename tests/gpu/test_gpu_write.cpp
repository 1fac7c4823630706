// GPU layer writes (cuda-fused and cuda-unfused) against the CPU reference, byte for byte over
// whole buffers (guards included), on random cases that cover every layout, dtype, saturation and
// scale mode, block sizes 1..256, token counts 1..70000 and layer mixes; planted bugs that the diff
// must locate exactly; bad input rejected before any launch. Every test skips without a GPU.
//
// KVO_GPU_CASES (environment) sets the random cases of the RandomCases shards (default 64 each);
// every failing case prints its seed and the flags that replay it with `kvoracle check`.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/testing/faults.hpp"
#include "kvo/gpu/write.hpp"
#include "kvo/oracle/cache_diff.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo {
namespace {

using gpu::WritePath;
using gpu::testing::WriteFault;
using spec::BufferKind;
using spec::DType;
using spec::LayerKind;

std::atomic<std::int64_t> g_cases{0};        // random cases diffed (both paths)
std::atomic<std::int64_t> g_unsupported{0};  // cases a GPU path declined (a failure)

/// Prints the campaign totals once, after every test (the device script sums them).
class CaseCountPrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf("[gpu-cases] random cases diffed: %lld (unsupported: %lld)\n",
                static_cast<long long>(g_cases.load()),
                static_cast<long long>(g_unsupported.load()));
  }
};
const auto* const g_printer = ::testing::AddGlobalTestEnvironment(new CaseCountPrinter);

bool gpu_ready(std::string* why) { return gpu::device_count(why) > 0; }

#define KVO_REQUIRE_GPU()                                              \
  do {                                                                 \
    std::string why_;                                                  \
    if (!gpu_ready(&why_)) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)

std::int64_t env_int(const char* name, std::int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoll(v, nullptr, 0) : fallback;
}

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(v));
  return buf;
}

/// Runs case `seed` through the reference and both GPU paths and diffs every layer. Returns an
/// empty string on success, else the failure report (with the seed and the replay flags).
std::string run_case(std::uint64_t seed, const oracle::CaseOverrides& o) {
  const oracle::WriteCase wc = oracle::make_write_case(seed, o);
  const reference::PagedCacheLayout layout(wc.config);
  std::vector<spec::LayerCaches> expected = oracle::make_model_caches(layout);
  for (std::size_t l = 0; l < wc.writes.size(); ++l) {
    reference::write_layer(wc.config, wc.writes[l], expected[l]);
  }
  for (WritePath path : {WritePath::kFused, WritePath::kUnfused}) {
    const char* name = path == WritePath::kFused ? "cuda-fused" : "cuda-unfused";
    std::vector<spec::LayerCaches> actual = oracle::make_model_caches(layout);
    try {
      for (std::size_t l = 0; l < wc.writes.size(); ++l) {
        gpu::write_layer_host(path, wc.config, wc.writes[l], actual[l]);
      }
    } catch (const spec::Unsupported& e) {
      ++g_unsupported;
      return std::string(name) + " seed " + hex(seed) + ": unexpected unsupported: " + e.what();
    } catch (const std::exception& e) {
      return std::string(name) + " seed " + hex(seed) + ": " + e.what() +
             "\n  replay: kvoracle check --case-seed " + hex(seed) + " --subject " + name +
             o.to_flags();
    }
    oracle::CacheDiff diff;
    for (std::size_t l = 0; l < wc.writes.size(); ++l) {
      diff.merge(oracle::diff_layer_caches(layout, static_cast<std::int64_t>(l), expected[l],
                                           actual[l], &wc.writes[l]));
    }
    if (!diff.equal()) {
      return std::string(name) + " seed " + hex(seed) + ": " + wc.describe() + "\n" +
             diff.report() + "\n  replay: kvoracle check --case-seed " + hex(seed) + " --subject " +
             name + o.to_flags();
    }
  }
  ++g_cases;
  return {};
}

// ---------------------------------------------------------------------------------------------
// Random cases: everything drawn by the generator (layouts, dtypes, modes, block sizes, slot
// types, separate index mappings, edge values with inf/NaN, padding, layer mixes).

class RandomCases : public ::testing::TestWithParam<int> {};

TEST_P(RandomCases, GpuMatchesReference) {
  KVO_REQUIRE_GPU();
  const std::int64_t n = env_int("KVO_GPU_CASES", 64);
  const std::uint64_t campaign = 0x6B766F7247505500ull + static_cast<std::uint64_t>(GetParam());
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t seed = oracle::case_seed(campaign, static_cast<std::uint64_t>(i));
    const std::string failure = run_case(seed, {});
    ASSERT_TRUE(failure.empty()) << failure;
  }
}
INSTANTIATE_TEST_SUITE_P(Shards, RandomCases, ::testing::Range(0, 8));

// Every layout x cache dtype x activation dtype x saturation x scale mode, each once (810 cases),
// with the remaining switches rotated.
TEST(GpuWrite, EveryLayoutDtypeAndMode) {
  KVO_REQUIRE_GPU();
  std::uint64_t i = 0;
  for (const auto& layout : spec::EnumInfo<spec::KvLayout>::kNames) {
    for (const auto& cache : spec::EnumInfo<DType>::kNames) {
      for (DType act : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (const auto& sat : spec::EnumInfo<spec::Saturation>::kNames) {
          for (const auto& mode : spec::EnumInfo<spec::ScaleMode>::kNames) {
            oracle::CaseOverrides o;
            o.layout = layout.value;
            o.kv_dtype = cache.value;
            o.act_dtype = act;
            o.saturation = sat.value;
            o.scale_mode = mode.value;
            o.per_head_scale = (i & 1) != 0;
            o.via_model_dtype = (i % 3) == 0;
            o.index_layout = (i & 2) ? spec::IndexLayout::kBlockScale : spec::IndexLayout::kFlat;
            o.index_dtype = (i & 4) ? DType::kFp8E4M3 : DType::kBF16;
            o.ue8m0 = (i & 8) != 0;
            o.edge_values = (i % 5) < 2;
            o.layers = "DS";
            const std::uint64_t seed = oracle::case_seed(0x4D4F444553ull, i++);
            const std::string failure = run_case(seed, o);
            ASSERT_TRUE(failure.empty()) << failure;
          }
        }
      }
    }
  }
}

// Page sizes 1..256, powers of two and not, 20 seeds each.
TEST(GpuWrite, BlockSizes) {
  KVO_REQUIRE_GPU();
  constexpr std::array<std::int64_t, 20> kSizes{1,  2,  3,  5,   7,   8,   13,  16,  17,  31,
                                                32, 33, 64, 100, 127, 128, 129, 200, 255, 256};
  for (std::int64_t bs : kSizes) {
    for (std::uint64_t i = 0; i < 20; ++i) {
      oracle::CaseOverrides o;
      o.block_size = bs;
      o.tokens = 1 + static_cast<std::int64_t>((i * 37 + static_cast<std::uint64_t>(bs)) % 300);
      const std::uint64_t seed = oracle::case_seed(0xB10C5u + static_cast<std::uint64_t>(bs), i);
      const std::string failure = run_case(seed, o);
      ASSERT_TRUE(failure.empty()) << "block_size " << bs << ": " << failure;
    }
  }
}

// Token counts straddling warp (32), thread-block (256 threads, tiles of up to 64 tokens) and grid
// edges, up to 70000.
TEST(GpuWrite, TokenCountsStraddleEdges) {
  KVO_REQUIRE_GPU();
  constexpr std::array<std::int64_t, 30> kTokens{
      1,    2,    31,   32,   33,    63,    64,    65,    127,   128,
      129,  255,  256,  257,  511,   513,   1023,  1024,  1025,  2047,
      4095, 4096, 4097, 8193, 16385, 32769, 65535, 65536, 65537, 70000};
  std::uint64_t i = 0;
  for (std::int64_t t : kTokens) {
    for (int rep = 0; rep < 3; ++rep) {
      oracle::CaseOverrides o;
      o.tokens = t;
      if (t > 2048) {
        o.layers = rep == 0 ? "DS" : "S";
        o.num_kv_heads = 1 + rep;
        o.head_dim = rep == 2 ? 128 : 64;
      }
      const std::uint64_t seed = oracle::case_seed(0x70C5u, i++);
      const std::string failure = run_case(seed, o);
      ASSERT_TRUE(failure.empty()) << "tokens " << t << ": " << failure;
    }
  }
}

// rapidcheck: any seed, any block size 1..256, any number of tokens up to 600 (a plain TEST
// around rc::check, so that it can skip without a GPU; RC_PARAMS applies).
TEST(GpuWriteProperty, FusedAndUnfusedMatchReference) {
  KVO_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("GPU writes equal the reference", [] {
    const auto seed = *rc::gen::arbitrary<std::uint64_t>();
    oracle::CaseOverrides o;
    o.block_size = *rc::gen::inRange<std::int64_t>(1, 257);
    o.tokens = *rc::gen::inRange<std::int64_t>(1, 601);
    const std::string failure = run_case(seed, o);
    RC_ASSERT(failure.empty());
  }));
}

// The kernels divide by a scale without a hardware division where that is exact (convert.cuh
// divide8); every one of the 2^32 float32 x must give __fdiv_rn's bits, for adversarial scales
// (significand all ones, 1 + ulp, powers of two, both ends of the fast range and past them) and
// 200 random ones.
TEST(FastDivision, ExhaustiveAgainstFdivRn) {
  KVO_REQUIRE_GPU();
  std::vector<float> scales = {0.37f,          1.0f,        0.5f, 3.0f,    5.0f,
                               7.0f,           1.0f / 3.0f, 1.5f, 448.0f,  0.1f,
                               1e-4f / 448.0f, 1e-6f,       1e6f, 1.7e-7f, 3.1e7f};
  for (int e = -22; e <= 22; e += 3) {
    for (std::uint32_t mant : {0x7FFFFFu, 0x000001u, 0x400000u, 0x7FFFFEu}) {
      const std::uint32_t bits = static_cast<std::uint32_t>(127 + e) << 23 | mant;
      float s;
      std::memcpy(&s, &bits, 4);
      scales.push_back(s);
    }
  }
  std::uint64_t z = 0x5EEDull;
  for (int i = 0; i < 200; ++i) {
    z += 0x9E3779B97F4A7C15ull;
    std::uint64_t h = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    const auto e = static_cast<std::uint32_t>(127 - 21 + static_cast<int>(h % 43));
    const std::uint32_t bits = e << 23 | static_cast<std::uint32_t>((h >> 8) & 0x7FFFFFu);
    float s;
    std::memcpy(&s, &bits, 4);
    scales.push_back(s);
  }
  for (float s : scales) {
    std::uint32_t bits;
    std::memcpy(&bits, &s, 4);
    EXPECT_EQ(gpu::count_division_mismatches(s), 0)
        << "scale " << s << " (bits " << hex(bits) << ")";
  }
}

// ---------------------------------------------------------------------------------------------
// Hand-built cases: planted bugs, bad input, legacy_wrap collisions.

/// Two layers (dense, sparse), 8 blocks of 4 slots, 2 heads of 16, index 128, f32 activations,
/// bf16 caches: every element's value is distinct from its neighbours.
spec::ModelConfig small_config(spec::KvLayout layout) {
  spec::ModelConfig c;
  c.layers = {LayerKind::kDense, LayerKind::kSparse};
  c.geometry = {8, 4, 2, 16, 128};
  c.act_dtype = DType::kF32;
  c.layout = layout;
  c.kv.cache_dtype = DType::kBF16;
  c.index.layout = spec::IndexLayout::kFlat;
  c.index.flat_dtype = DType::kBF16;
  c.slot_type = spec::SlotType::kI64;
  return c;
}

spec::HostTensor f32_tensor(std::vector<std::int64_t> shape, float base) {
  spec::HostTensor t;
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  t.bytes.resize(static_cast<std::size_t>(t.numel()) * 4);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float x = base + 0.25f * static_cast<float>(i % 97) + static_cast<float>(i / 97);
    std::memcpy(t.bytes.data() + i * 4, &x, 4);
  }
  return t;
}

spec::LayerWrite small_write(const spec::ModelConfig& c, LayerKind kind,
                             std::vector<std::int64_t> slots) {
  spec::LayerWrite w;
  w.kind = kind;
  const auto n = static_cast<std::int64_t>(slots.size());
  w.k = f32_tensor({n, c.geometry.num_kv_heads, c.geometry.head_dim}, 1.0f);
  w.v = f32_tensor({n, c.geometry.num_kv_heads, c.geometry.head_dim}, -3.0f);
  if (kind == LayerKind::kSparse) w.index_k = f32_tensor({n, c.geometry.index_dim}, 0.5f);
  w.slots.type = c.slot_type;
  w.slots.slots = std::move(slots);
  w.k_scale = {1.0f};
  w.v_scale = {1.0f};
  return w;
}

/// Writes both layers with the reference and with cuda-fused, planting `fault` (if any) in layer 1
/// only; returns the merged diff.
oracle::CacheDiff planted_diff(const spec::ModelConfig& c, const std::vector<std::int64_t>& slots,
                               std::optional<WriteFault> fault) {
  const reference::PagedCacheLayout layout(c);
  std::vector<spec::LayerCaches> expected = oracle::make_model_caches(layout);
  std::vector<spec::LayerCaches> actual = oracle::make_model_caches(layout);
  oracle::CacheDiff diff;
  for (std::size_t l = 0; l < c.layers.size(); ++l) {
    const spec::LayerWrite w = small_write(c, c.layers[l], slots);
    reference::write_layer(c, w, expected[l]);
    if (l == 1 && fault.has_value()) {
      gpu::testing::write_layer_host_faulty(*fault, WritePath::kFused, c, w, actual[l]);
    } else {
      gpu::write_layer_host(WritePath::kFused, c, w, actual[l]);
    }
    diff.merge(oracle::diff_layer_caches(layout, static_cast<std::int64_t>(l), expected[l],
                                         actual[l], &w));
  }
  return diff;
}

TEST(PlantedBug, PaddingSlotWrapsLikeTorchIndexing) {
  KVO_REQUIRE_GPU();
  // Token 1 is padding (-1); the bug writes it to the last slot: block 7, offset 3.
  const oracle::CacheDiff diff =
      planted_diff(small_config(spec::KvLayout::kNhd), {5, -1}, WriteFault::kWrapNegativeSlots);
  ASSERT_FALSE(diff.equal());
  ASSERT_TRUE(diff.first.has_value());
  const oracle::ByteMismatch& m = *diff.first;
  EXPECT_EQ(m.layer, 1);
  EXPECT_EQ(m.buffer, BufferKind::kK);
  EXPECT_EQ(m.guard_distance, 0);
  EXPECT_EQ(m.coord.block, 7);
  EXPECT_EQ(m.coord.offset, 3);
  EXPECT_EQ(m.coord.head, 0);
  EXPECT_EQ(m.coord.dim, 0);
  EXPECT_NE(m.writer.find("no token"), std::string::npos) << m.writer;
  EXPECT_NE(diff.report().find("index_k"), std::string::npos) << "the index-K row lands there too";
}

TEST(PlantedBug, OffsetPlusOne) {
  KVO_REQUIRE_GPU();
  // Slot 9 = block 2, offset 1; the bug writes offset 2, so offset 1 keeps its poison.
  const oracle::CacheDiff diff =
      planted_diff(small_config(spec::KvLayout::kNhd), {9}, WriteFault::kOffsetPlusOne);
  ASSERT_TRUE(diff.first.has_value());
  const oracle::ByteMismatch& m = *diff.first;
  EXPECT_EQ(m.layer, 1);
  EXPECT_EQ(m.buffer, BufferKind::kK);
  EXPECT_EQ(m.coord.block, 2);
  EXPECT_EQ(m.coord.offset, 1);
  EXPECT_EQ(m.coord.head, 0);
  EXPECT_EQ(m.coord.dim, 0);
  EXPECT_NE(m.writer.find("token 0"), std::string::npos) << m.writer;
}

TEST(PlantedBug, HndNhdStrideSwap) {
  KVO_REQUIRE_GPU();
  // Slot 8 = block 2, offset 0. Head 0 lands at the same place in both layouts; head 1 is at
  // element 16 of the token in NHD but 64 in HND, so the first wrong byte is (2, 0, head 1, dim 0).
  const oracle::CacheDiff diff =
      planted_diff(small_config(spec::KvLayout::kNhd), {8}, WriteFault::kSwapHndNhd);
  ASSERT_TRUE(diff.first.has_value());
  const oracle::ByteMismatch& m = *diff.first;
  EXPECT_EQ(m.layer, 1);
  EXPECT_EQ(m.buffer, BufferKind::kK);
  EXPECT_EQ(m.coord.block, 2);
  EXPECT_EQ(m.coord.offset, 0);
  EXPECT_EQ(m.coord.head, 1);
  EXPECT_EQ(m.coord.dim, 0);
}

TEST(PlantedBug, WithoutTheFaultTheSameCasesPass) {
  KVO_REQUIRE_GPU();
  for (const std::vector<std::int64_t>& slots :
       {std::vector<std::int64_t>{5, -1}, std::vector<std::int64_t>{9},
        std::vector<std::int64_t>{8}}) {
    EXPECT_TRUE(planted_diff(small_config(spec::KvLayout::kNhd), slots, std::nullopt).equal());
  }
}

/// Copies of the poisoned caches, to show that nothing changed.
std::vector<std::vector<std::uint8_t>> storage_of(const spec::LayerCaches& c) {
  std::vector<std::vector<std::uint8_t>> out;
  for (const auto& b : c.buffers) out.push_back(b.storage);
  return out;
}

TEST(BadInput, RejectedBeforeAnyLaunch) {
  KVO_REQUIRE_GPU();
  const spec::ModelConfig c = small_config(spec::KvLayout::kPackedHnd);
  const reference::PagedCacheLayout layout(c);
  struct Bad {
    std::vector<std::int64_t> slots;
    const char* field;
  };
  for (const Bad& bad : {Bad{{3, 32}, "slot_mapping"}, Bad{{7, 7}, "slot_mapping"},
                         Bad{{-2, 1000000}, "slot_mapping"}}) {
    for (WritePath path : {WritePath::kFused, WritePath::kUnfused}) {
      spec::LayerCaches caches = oracle::make_layer_caches(layout, 1, LayerKind::kSparse);
      const auto before = storage_of(caches);
      const spec::LayerWrite w = small_write(c, LayerKind::kSparse, bad.slots);
      try {
        gpu::write_layer_host(path, c, w, caches);
        ADD_FAILURE() << "accepted slots " << bad.slots[0] << ", " << bad.slots[1];
      } catch (const spec::InvalidInput& e) {
        EXPECT_EQ(e.field(), bad.field);
        EXPECT_EQ(e.index(), 1);
      }
      EXPECT_EQ(storage_of(caches), before) << "no byte may change on rejected input";
    }
  }
}

TEST(LegacyWrap, CollisionsResolveLastWriterWins) {
  KVO_REQUIRE_GPU();
  spec::ModelConfig c = small_config(spec::KvLayout::kNhd);
  c.slot_mode = spec::SlotMode::kLegacyWrap;
  const reference::PagedCacheLayout layout(c);
  // -1 wraps to slot 31, which token 0 writes too (collision: token 1 wins); -2 wraps to 30 alone.
  for (const std::vector<std::int64_t>& slots :
       {std::vector<std::int64_t>{31, -1}, std::vector<std::int64_t>{-1, 31, 4},
        std::vector<std::int64_t>{30, -1}, std::vector<std::int64_t>{-2, 3}}) {
    for (WritePath path : {WritePath::kFused, WritePath::kUnfused}) {
      for (LayerKind kind : {LayerKind::kDense, LayerKind::kSparse}) {
        const spec::LayerWrite w = small_write(c, kind, slots);
        spec::LayerCaches expected = oracle::make_layer_caches(layout, 1, kind);
        spec::LayerCaches actual = oracle::make_layer_caches(layout, 1, kind);
        reference::write_layer(c, w, expected);
        gpu::write_layer_host(path, c, w, actual);
        const oracle::CacheDiff d = oracle::diff_layer_caches(layout, 1, expected, actual, &w);
        EXPECT_TRUE(d.equal()) << "slots " << slots[0] << ", " << slots[1] << ": " << d.report();
      }
    }
  }
}

TEST(BadInput, DeviceApiChecksPointers) {
  KVO_REQUIRE_GPU();
  const spec::ModelConfig c = small_config(spec::KvLayout::kNhd);
  gpu::DeviceWriteInputs in;  // all null
  in.num_tokens = 1;
  gpu::DeviceLayerCaches caches;
  EXPECT_THROW(gpu::launch_fused_write(c, LayerKind::kDense, in, caches, nullptr),
               spec::InvalidInput);
}

}  // namespace
}  // namespace kvo
