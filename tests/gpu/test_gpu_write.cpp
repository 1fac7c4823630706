// GPU layer writes (cuda-fused and cuda-unfused) against the CPU reference, byte for byte over
// whole buffers (guards included), on random cases that cover every layout, dtype, saturation and
// scale mode, block sizes 1..256, token counts 1..70000 and layer mixes; planted bugs that the diff
// must locate exactly; bad input rejected before any launch. Every test skips without a GPU.
// A write that admits several results (div_approx, a legacy_wrap race: reference::admits_several)
// is judged by SPEC 7's admissible sets, element by element, every other byte exact.
//
// KVO_GPU_CASES (environment) sets the random cases of the RandomCases shards (default 64 each);
// every failing case prints its seed and the flags that replay it with `kvoracle check`.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/testing/division.hpp"
#include "kvo/gpu/testing/faults.hpp"
#include "kvo/gpu/write.hpp"
#include "kvo/oracle/cache_diff.hpp"
#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/cuda_subjects.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
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
// Elements of admissible-set layers whose GPU code is admissible but not the reference's own pick
// (div_approx: the approximate division chose another code); both paths counted.
std::atomic<std::int64_t> g_off_pick{0};
// Layers of the random cases, and those the fused write ran through its specialised kernel.
std::atomic<std::int64_t> g_layers{0};
std::atomic<std::int64_t> g_specialised{0};

/// Prints the campaign totals once, after every test (the device script sums them).
class CaseCountPrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf("[gpu-cases] random cases diffed: %lld (unsupported: %lld)\n",
                static_cast<long long>(g_cases.load()),
                static_cast<long long>(g_unsupported.load()));
    std::printf("[gpu-cases] admissible elements off the reference's pick: %lld\n",
                static_cast<long long>(g_off_pick.load()));
    std::printf("[gpu-cases] layers through the fused write's specialised kernel: %lld of %lld\n",
                static_cast<long long>(g_specialised.load()),
                static_cast<long long>(g_layers.load()));
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

/// SPEC 7's judgement of one layer whose write admits several results: every byte that differs
/// from the reference's (`expected`) must lie in the body, inside an element whose actual code is
/// one of reference::admissible_codes (empty for an element no token writes, whose poison must
/// stay). `off_pick` counts the elements that differ from the reference's own pick.
struct Admissible {
  std::string failure;  ///< empty: the layer passes
  std::int64_t off_pick = 0;
};

Admissible judge_admissible(const reference::PagedCacheLayout& layout, std::int64_t layer,
                            const spec::LayerWrite& w, const spec::LayerCaches& expected,
                            const spec::LayerCaches& actual) {
  Admissible out;
  const spec::ModelConfig& c = layout.config();
  for (const spec::CacheBuffer& e : expected.buffers) {
    const spec::CacheBuffer* a = actual.find(e.kind);
    const std::string where =
        "layer " + std::to_string(layer) + " " + std::string(spec::name_of(e.kind)) + ": ";
    if (a == nullptr || a->storage.size() != e.storage.size()) {
      out.failure = where + "buffer missing or resized";
      return out;
    }
    std::int64_t judged = -1;  // body byte where the last judged element starts
    // A huge (lazy) buffer: only where either side holds pages (spec::ByteStorage).
    for (const auto& [from, to] : e.storage.compare_ranges(a->storage))
      for (std::int64_t j = from; j < to; ++j) {
        if (e.storage.byte(j) == a->storage.byte(j)) continue;
        const std::int64_t byte = j - e.guard_bytes;
        const std::optional<oracle::ElementCoord> at = byte >= 0 && byte < e.body_bytes()
                                                           ? oracle::locate(layout, e.kind, byte)
                                                           : std::nullopt;
        if (!at.has_value()) {
          out.failure = where + "byte " + std::to_string(byte) + " outside every element changed";
          return out;
        }
        const std::int64_t start = byte - at->byte_in_element;
        if (start == judged) continue;
        judged = start;
        const std::int64_t width = at->is_scale ? 4 : layout.element_bytes(e.kind);
        std::uint32_t got = 0, want = 0;
        for (std::int64_t b = width - 1; b >= 0; --b) {
          got = got << 8 | a->storage.byte(a->guard_bytes + start + b);
          want = want << 8 | e.storage.byte(e.guard_bytes + start + b);
        }
        reference::CacheElement el;
        el.buffer = at->buffer;
        el.kv = at->kv < 0 ? 0 : at->kv;
        el.block = at->block;
        el.offset = at->offset;
        el.head = at->head < 0 ? 0 : at->head;
        el.dim = at->dim < 0 ? 0 : at->dim;
        el.is_scale = at->is_scale;
        el.group = at->group < 0 ? 0 : at->group;
        const std::vector<std::uint32_t> codes = reference::admissible_codes(c, w, el);
        if (!std::binary_search(codes.begin(), codes.end(), got)) {
          std::string set;
          for (std::uint32_t code : codes) set += " " + hex(code);
          out.failure = where + at->describe() + ": code " + hex(got) + " (reference " + hex(want) +
                        ") not admissible; admissible:" + (set.empty() ? " none (unwritten)" : set);
          return out;
        }
        ++out.off_pick;
      }
  }
  return out;
}

const char* path_name(WritePath path) {
  switch (path) {
    case WritePath::kFused:
      return "cuda-fused";
    case WritePath::kUnfused:
      return "cuda-unfused";
    case WritePath::kFusedGeneric:
      break;
  }
  return "cuda-fused-generic";
}

/// Runs case `seed` through the reference and the three GPU paths and judges every layer: byte for
/// byte, or by admissible sets where the write admits several results. Returns an empty string on
/// success, else the failure report (with the seed and the replay flags).
std::string run_write_case(const oracle::WriteCase& wc, std::uint64_t seed,
                           const oracle::CaseOverrides& o);
std::string run_case(std::uint64_t seed, const oracle::CaseOverrides& o) {
  return run_write_case(oracle::make_write_case(seed, o), seed, o);
}

/// run_case's judgement of a case already made (a test may have changed its inputs: its replay
/// line then names the seed the case started from).
std::string run_write_case(const oracle::WriteCase& wc, std::uint64_t seed,
                           const oracle::CaseOverrides& o) {
  const reference::PagedCacheLayout layout(wc.config);
  // The poisoned caches, a huge one's touched pages materialised (the huge theme).
  std::vector<spec::LayerCaches> initial = oracle::make_model_caches(layout);
  for (std::size_t l = 0; l < wc.writes.size(); ++l) {
    oracle::materialise_write(layout, initial[l], wc.writes[l]);
  }
  std::vector<spec::LayerCaches> expected = initial;
  for (std::size_t l = 0; l < wc.writes.size(); ++l) {
    reference::write_layer(wc.config, wc.writes[l], expected[l]);
  }
  for (std::size_t l = 0; l < wc.writes.size(); ++l) {
    ++g_layers;
    if (gpu::fused_write_is_specialised(wc.config, wc.writes[l].kind)) ++g_specialised;
  }
  // The fused write (its specialised kernel where it applies), the unfused launches, and the fused
  // write's generic kernel on the same case.
  for (WritePath path : {WritePath::kFused, WritePath::kUnfused, WritePath::kFusedGeneric}) {
    const char* name = path_name(path);
    std::vector<spec::LayerCaches> actual = initial;
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
      if (reference::admits_several(wc.config, wc.writes[l])) {
        const Admissible j = judge_admissible(layout, static_cast<std::int64_t>(l), wc.writes[l],
                                              expected[l], actual[l]);
        if (!j.failure.empty()) {
          return std::string(name) + " seed " + hex(seed) + ": " + wc.describe() + "\n  " +
                 j.failure + "\n  replay: kvoracle check --case-seed " + hex(seed) + " --subject " +
                 name + o.to_flags();
        }
        g_off_pick += j.off_pick;
        continue;
      }
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

// Every layout x cache dtype x activation dtype x saturation x scale mode, each once (1080 cases),
// with the remaining switches rotated (scale_in_model_dtype where a scale applies, the blockscale
// formula where the index-K is blockscale).
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
            o.scale_in_model_dtype = mode.value != spec::ScaleMode::kNone && (i % 4) == 1;
            if (*o.index_layout == spec::IndexLayout::kBlockScale) {
              o.blockscale_scale = (i & 16) != 0 ? spec::BlockScaleFormula::kMulRecip
                                                 : spec::BlockScaleFormula::kDivide;
            }
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

// ---------------------------------------------------------------------------------------------
// The fused write's specialised kernel (gpu/src/write_decode.cuh): which configurations take it
// (host logic, no GPU), and each of its 36 instantiations (and the divide mode's checking ones)
// against the reference and the generic kernel (run_case diffs all three paths).

TEST(SpecialisedWrite, AppliesExactlyToTheConfigurationsItIsBuiltFor) {
  spec::ModelConfig c;
  c.layers = spec::parse_layer_mix("DS");
  c.geometry = {64, 16, 4, 128, 128};
  c.act_dtype = DType::kBF16;
  c.kv.cache_dtype = DType::kFp8E4M3;
  c.kv.saturation = spec::Saturation::kSatFinite;
  c.kv.scale_mode = spec::ScaleMode::kDivide;
  c.index.layout = spec::IndexLayout::kBlockScale;
  spec::validate(c);
  ASSERT_TRUE(gpu::fused_write_is_specialised(c, LayerKind::kSparse));
  ASSERT_TRUE(gpu::fused_write_is_specialised(c, LayerKind::kDense));
  // Each change below leaves the instantiated set (the layer kind it concerns in brackets).
  const std::vector<std::pair<std::string, void (*)(spec::ModelConfig&)>> outside = {
      {"f32 activations", [](spec::ModelConfig& m) { m.act_dtype = DType::kF32; }},
      {"fp16 cache", [](spec::ModelConfig& m) { m.kv.cache_dtype = DType::kF16; }},
      {"e5m2 cache", [](spec::ModelConfig& m) { m.kv.cache_dtype = DType::kFp8E5M2; }},
      {"torch saturation",
       [](spec::ModelConfig& m) { m.kv.saturation = spec::Saturation::kTorch; }},
      {"div_approx", [](spec::ModelConfig& m) { m.kv.scale_mode = spec::ScaleMode::kDivApprox; }},
      {"via_model_dtype", [](spec::ModelConfig& m) { m.kv.via_model_dtype = true; }},
      {"scale_in_model_dtype", [](spec::ModelConfig& m) { m.kv.scale_in_model_dtype = true; }},
      {"legacy_wrap", [](spec::ModelConfig& m) { m.slot_mode = spec::SlotMode::kLegacyWrap; }},
      {"K and V rows of 8200 elements", [](spec::ModelConfig& m) { m.geometry.num_kv_heads = 41; }},
  };
  for (const auto& [what, change] : outside) {
    spec::ModelConfig m = c;
    change(m);
    EXPECT_FALSE(gpu::fused_write_is_specialised(m, LayerKind::kDense)) << what;
  }
  spec::ModelConfig flat_fp8 = c;  // an fp8 flat index-K: the sparse layers only
  flat_fp8.index.layout = spec::IndexLayout::kFlat;
  flat_fp8.index.flat_dtype = DType::kFp8E4M3;
  EXPECT_FALSE(gpu::fused_write_is_specialised(flat_fp8, LayerKind::kSparse));
  EXPECT_TRUE(gpu::fused_write_is_specialised(flat_fp8, LayerKind::kDense));
  // 1,024 K/V threads leave no room for the index warps (sparse layers only).
  spec::ModelConfig wide = c;
  wide.geometry.num_kv_heads = 32;
  EXPECT_FALSE(gpu::fused_write_is_specialised(wide, LayerKind::kSparse));
  EXPECT_TRUE(gpu::fused_write_is_specialised(wide, LayerKind::kDense));
  spec::ModelConfig fp16_bf16 = c;  // inside: fp16 activations, a bf16 cache, scale none
  fp16_bf16.act_dtype = DType::kF16;
  fp16_bf16.kv.cache_dtype = DType::kBF16;
  fp16_bf16.kv.scale_mode = spec::ScaleMode::kNone;
  fp16_bf16.kv.saturation = spec::Saturation::kTorch;  // no fp8 anywhere: irrelevant
  EXPECT_TRUE(gpu::fused_write_is_specialised(fp16_bf16, LayerKind::kSparse));
}

// The default write case distribution sends layers to each kernel, so the random-case tests diff
// both against the reference.
TEST(SpecialisedWrite, TheCaseDistributionReachesBothKernels) {
  std::int64_t layers = 0, specialised = 0;
  for (std::uint64_t i = 0; i < 400; ++i) {
    const oracle::WriteCase wc = oracle::make_write_case(oracle::case_seed(0x5BEC1A1u, i), {});
    for (const spec::LayerWrite& w : wc.writes) {
      ++layers;
      if (gpu::fused_write_is_specialised(wc.config, w.kind)) ++specialised;
    }
  }
  std::printf("[specialised] %lld of %lld layers of 400 default cases\n",
              static_cast<long long>(specialised), static_cast<long long>(layers));
  // Each of the distribution's independent draws (activation, cache dtype, saturation, scale mode,
  // model-dtype roundings, slot mode, index layout) may leave the instantiated set: a few percent
  // of its layers take the specialised kernel (42 of 944 when written); the test below covers each
  // instantiation on purpose.
  EXPECT_GE(specialised * 40, layers)
      << "fewer than 2.5% of the layers reach the specialised kernel";
  EXPECT_GE((layers - specialised) * 2, layers) << "fewer than half reach the generic kernel";
}

// Every instantiation (activation x cache x scale mode x index layout), at token counts that
// straddle a warp, the 1..4-token tiles and several waves of blocks, over random layouts, views,
// block sizes and edge values (inf, NaN, subnormals, midpoints). KVO_SPECIALISED_MAX_TOKENS caps
// the token counts (the sanitizer run's).
TEST(SpecialisedWrite, EveryInstantiationMatchesTheReferenceAndTheGenericKernel) {
  KVO_REQUIRE_GPU();
  constexpr std::array<std::int64_t, 8> kTokens{1, 3, 33, 130, 257, 2113, 4225, 9001};
  const std::int64_t max_tokens = env_int("KVO_SPECIALISED_MAX_TOKENS", kTokens.back());
  std::uint64_t i = 0;
  for (DType act : {DType::kBF16, DType::kF16}) {
    for (DType cache : {DType::kBF16, DType::kFp8E4M3}) {
      for (spec::ScaleMode mode :
           {spec::ScaleMode::kNone, spec::ScaleMode::kDivide, spec::ScaleMode::kMulRecip}) {
        for (int index = 0; index < 3; ++index) {  // dense only, flat bf16, blockscale
          oracle::CaseOverrides o;
          o.act_dtype = act;
          o.kv_dtype = cache;
          o.saturation = spec::Saturation::kSatFinite;
          o.scale_mode = mode;
          o.via_model_dtype = false;
          o.scale_in_model_dtype = false;
          o.slot_mode = spec::SlotMode::kStrict;
          o.layers = index == 0 ? "D" : "DS";
          o.index_layout = index == 2 ? spec::IndexLayout::kBlockScale : spec::IndexLayout::kFlat;
          o.index_dtype = DType::kBF16;
          for (std::int64_t tokens : kTokens) {
            if (tokens > max_tokens) continue;
            o.per_head_scale = (i & 1) != 0;
            o.ue8m0 = (i & 2) != 0;
            o.edge_values = (i % 3) == 0;
            o.tokens = tokens;
            const std::uint64_t seed = oracle::case_seed(0x5BEC1A2u, i++);
            const oracle::WriteCase wc = oracle::make_write_case(seed, o);
            for (const spec::LayerWrite& w : wc.writes)
              ASSERT_TRUE(gpu::fused_write_is_specialised(wc.config, w.kind)) << wc.describe();
            const std::string failure = run_case(seed, o);
            ASSERT_TRUE(failure.empty()) << failure;
          }
        }
      }
    }
  }
}

std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

/// SplitMix64: the next value of state z (the tests' deterministic draws).
std::uint64_t splitmix_next(std::uint64_t& z) {
  z += 0x9E3779B97F4A7C15ull;
  std::uint64_t h = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  h ^= h >> 31;
  return h;
}

/// A float32 of biased exponent 127 + [lo, lo + n) and a drawn significand: a scale.
float random_scale(std::uint64_t& z, int lo, int n) {
  const std::uint64_t h = splitmix_next(z);
  const auto e =
      static_cast<std::uint32_t>(127 + lo + static_cast<int>(h % static_cast<std::uint64_t>(n)));
  const std::uint32_t bits = e << 23 | static_cast<std::uint32_t>((h >> 8) & 0x7FFFFFu);
  float s;
  std::memcpy(&s, &bits, 4);
  return s;
}

// The specialised write's divide mode on bf16 activations divides by a scale's RecipPair, two
// operations an element, where the warp's check passed that scale at all 128 bf16 significands
// (convert.cuh, write_decode.cuh). The scales the check rejects, found by a deterministic search
// over scales in range_ok_s that are not powers of two (each rejects at least one significand by
// definition).
std::vector<float> scales_the_pair_check_rejects(std::size_t n) {
  std::vector<float> out;
  std::uint64_t z = 0xD1F1DEull;
  for (std::int64_t tries = 0; out.size() < n && tries < (std::int64_t{1} << 23); ++tries) {
    const float s = random_scale(z, -20, 41);
    // (A power of two is rejected too, for another reason: one multiply divides it exactly.)
    if ((bits_of(s) & 0x7FFFFFu) != 0u && !gpu::testing::recip_pair_passes(s)) out.push_back(s);
  }
  return out;
}

// The proof on the host, by the kernel's own code (no GPU): for every scale the check passes
// (adversarial significands at every exponent of the range and past it, 300 random, and the
// rejected ones' neighbours), every bf16 x in the pair's exponent range, both signs, gives
// fl(x / s) bit for bit; the search finds scales the check rejects, so the kernel's fall back is
// reachable (the GPU test below drives it).
TEST(SpecialisedDivision, EveryScaleThePairCheckPassesDividesEveryBf16InRangeExactly) {
  const std::vector<float> rejected = scales_the_pair_check_rejects(6);
  std::printf("[pair-check] rejected scales:");
  for (float s : rejected) std::printf(" %a", static_cast<double>(s));
  std::printf("\n");
  ASSERT_GE(rejected.size(), 1u) << "the search found no scale the check rejects";
  std::vector<float> scales = {0.37f, 1.0f, 0.5f, 3.0f, 1.0f / 3.0f, 0.1f, 448.0f, 1e-6f, 1e6f};
  for (int e = -22; e <= 22; ++e) {
    for (std::uint32_t mant : {0x7FFFFFu, 0x000001u, 0x400000u, 0x7FFFFEu, 0x2AAAABu}) {
      const std::uint32_t bits = static_cast<std::uint32_t>(127 + e) << 23 | mant;
      float s;
      std::memcpy(&s, &bits, 4);
      scales.push_back(s);
    }
  }
  for (float s : rejected) {
    scales.push_back(std::nextafter(s, 0.0f));
    scales.push_back(std::nextafter(s, 1e30f));
  }
  const std::size_t first_random = scales.size();
  std::uint64_t z = 0xB16F00Dull;
  for (int i = 0; i < 300; ++i) scales.push_back(random_scale(z, -20, 41));
  std::int64_t passed = 0, random_passed = 0, judged = 0;
  for (std::size_t k = 0; k < scales.size(); ++k) {
    const float s = scales[k];
    if (!gpu::testing::recip_pair_passes(s)) continue;
    ++passed;
    if (k >= first_random) ++random_passed;
    for (std::uint32_t b = 0; b < 0x10000u; ++b) {
      const std::uint32_t xb = b << 16;
      float x;
      std::memcpy(&x, &xb, 4);
      if (!gpu::testing::in_recip_pair_range(x)) continue;
      ++judged;
      const float got = gpu::testing::divide_by_recip_pair(x, s), want = x / s;
      ASSERT_EQ(bits_of(got), bits_of(want))
          << "scale " << hex(bits_of(s)) << " x " << hex(xb) << ": the pair gives " << got
          << ", fl(x / s) is " << want;
    }
  }
  std::printf(
      "[pair-check] %lld of %zu scales pass (%lld of the 300 random); %lld (scale, x) "
      "judged exact\n",
      static_cast<long long>(passed), scales.size(), static_cast<long long>(random_passed),
      static_cast<long long>(judged));
  // Outside the range the pair is not used: a scale past range_ok_s never passes.
  EXPECT_FALSE(gpu::testing::recip_pair_passes(0x1.0p-21f * 1.5f));
  EXPECT_FALSE(gpu::testing::recip_pair_passes(0x1.0p+21f * 1.5f));
  // Scales just below a power of two (significand all ones) are hard for the pair at every
  // exponent and are rejected; random ones almost never are.
  EXPECT_GE(random_passed, 297) << "the check rejects more than 1% of random scales";
}

// The divide mode end to end with its check: a sparse layer at token counts that give each thread
// 4 tokens (where the kernel checks its scales), per tensor and per head, its scales the rejected
// ones and passing ones mixed, every K and V element a rejected scale's failing significand (or
// another) at an exponent in [-12, 12] and either sign, zeros and subnormals among them (the fall
// back). The specialised kernel must equal the reference byte for byte. (A pair's one-ulp fp32
// error almost never moves an e4m3 byte: the test that a check letting a rejected scale through
// fails is FastDivision.TheRecipPairCheckOnTheDevice..., on the fp32 quotients.)
TEST(SpecialisedWrite, TheDivideModeWithItsCheckMatchesTheReferenceWithRejectedScales) {
  KVO_REQUIRE_GPU();
  const std::vector<float> rejected = scales_the_pair_check_rejects(4);
  ASSERT_GE(rejected.size(), 1u);
  // Each rejected scale's failing significands j (1 + j / 128).
  std::vector<int> failing;
  for (float s : rejected)
    for (int j = 0; j < 128; ++j)
      if (!gpu::testing::recip_pair_exact_at(s, j)) failing.push_back(j);
  std::uint64_t i = 0;
  for (bool per_head : {false, true}) {
    for (std::int64_t tokens : {9001, 40000}) {
      oracle::CaseOverrides o;
      o.act_dtype = DType::kBF16;
      o.kv_dtype = DType::kFp8E4M3;
      o.saturation = spec::Saturation::kSatFinite;
      o.scale_mode = spec::ScaleMode::kDivide;
      o.via_model_dtype = false;
      o.scale_in_model_dtype = false;
      o.slot_mode = spec::SlotMode::kStrict;
      o.layers = "DS";
      o.index_layout = spec::IndexLayout::kBlockScale;
      o.per_head_scale = per_head;
      o.num_kv_heads = 4;
      o.head_dim = 128;
      o.edge_values = false;
      o.tokens = tokens;
      const std::uint64_t seed = oracle::case_seed(0xD1F1DEu, i++);
      oracle::WriteCase wc = oracle::make_write_case(seed, o);
      std::uint64_t z = seed;
      for (spec::LayerWrite& w : wc.writes) {
        ASSERT_TRUE(gpu::fused_write_is_specialised(wc.config, w.kind)) << wc.describe();
        for (std::vector<float>* scale : {&w.k_scale, &w.v_scale})
          for (std::size_t h = 0; h < scale->size(); ++h)
            (*scale)[h] = h % 2 == 0 ? rejected[(h / 2 + (scale == &w.v_scale)) % rejected.size()]
                                     : 0.0123f + 0.001f * static_cast<float>(h);
        for (spec::HostTensor* t : {&w.k, &w.v}) {
          ASSERT_EQ(t->dtype, DType::kBF16);
          for (std::int64_t e = 0; e < t->numel(); ++e) {
            const std::uint64_t h = splitmix_next(z);
            std::uint32_t b16;
            if (h % 97 == 0) {
              b16 = (h >> 8) % 2 == 0 ? 0x0000u : 0x0001u;  // zero, a subnormal: the fall back
            } else {
              const int j = h % 5 == 0 ? static_cast<int>((h >> 8) % 128)
                                       : failing[(h >> 8) % failing.size()];
              const auto exp =
                  static_cast<std::uint32_t>(127 - 12 + static_cast<int>((h >> 20) % 25));
              b16 = ((h >> 40) & 1u) << 15 | exp << 7 | static_cast<std::uint32_t>(j);
            }
            t->bytes[2 * e] = static_cast<std::uint8_t>(b16 & 0xFFu);
            t->bytes[2 * e + 1] = static_cast<std::uint8_t>(b16 >> 8);
          }
        }
      }
      const std::string failure = run_write_case(wc, seed, o);
      ASSERT_TRUE(failure.empty()) << "(inputs replaced by the test) " << failure;
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
  for (int i = 0; i < 200; ++i) scales.push_back(random_scale(z, -21, 43));
  for (float s : scales) {
    std::uint32_t bits;
    std::memcpy(&bits, &s, 4);
    EXPECT_EQ(gpu::count_division_mismatches(s), 0)
        << "scale " << s << " (bits " << hex(bits) << ")";
  }
}

// The index-K block scale without a division (convert.cuh blockscale_scale,
// divide8_by_block_scale): every non-negative amax (2^31 bit patterns, NaN and infinity included)
// gives __fdiv_rn's scale, and under ue8m0 the multiply by the scale's exponent-bit reciprocal
// gives __fdiv_rn's quotient for +-amax and the edge values.
TEST(FastDivision, BlockScaleExhaustiveAgainstFdivRn) {
  KVO_REQUIRE_GPU();
  EXPECT_EQ(gpu::count_block_scale_mismatches(false), 0) << "fp32 block scales";
  EXPECT_EQ(gpu::count_block_scale_mismatches(true), 0) << "ue8m0 block scales";
}

// The specialised kernel's range test for the division on raw bf16 words (two values a 32-bit
// operation) agrees with the per-value test on every word in every position of an item.
TEST(FastDivision, Bf16RangeCheckExhaustive) {
  KVO_REQUIRE_GPU();
  EXPECT_EQ(gpu::count_bf16_range_mismatches(), 0);
}

// The specialised write's check of the scales on the device (warp_recip_pair_exact, by whole and
// partial warps whose lanes hold four scales interleaved) and its item division (divide8_bf16):
// the check's answer for each scale is the host's (recip_pair_passes), and with it every bf16 x
// divides exactly as __fdiv_rn, by the pair for the passing scales and by the fall back for the
// rejected ones. A check that let a rejected scale through fails here: the pair is wrong at that
// scale's failing significands (asserted on the host below).
TEST(FastDivision, TheRecipPairCheckOnTheDeviceAgreesAndEveryBf16DividesExactly) {
  KVO_REQUIRE_GPU();
  std::vector<float> scales = scales_the_pair_check_rejects(6);
  ASSERT_GE(scales.size(), 1u);
  for (float s : scales) {
    bool wrong_somewhere = false;
    for (int j = 0; j < 128 && !wrong_somewhere; ++j) {
      const float m = 1.0f + static_cast<float>(j) / 128.0f;
      wrong_somewhere = bits_of(gpu::testing::divide_by_recip_pair(m, s)) != bits_of(m / s);
    }
    EXPECT_TRUE(wrong_somewhere) << "rejected scale " << hex(bits_of(s));
  }
  for (float s : {0.37f, 448.0f / 3.0f, 1.0f, 0.5f, 1e-6f, 3.1e7f, 0x1.fffffep+3f, 0.0123f})
    scales.push_back(s);
  std::vector<bool> passed;
  EXPECT_EQ(gpu::count_recip_pair_mismatches(scales, &passed), 0);
  ASSERT_EQ(passed.size(), scales.size());
  std::size_t n_passed = 0;
  for (std::size_t i = 0; i < scales.size(); ++i) {
    EXPECT_EQ(passed[i], gpu::testing::recip_pair_passes(scales[i]))
        << "scale " << hex(bits_of(scales[i]));
    n_passed += passed[i] ? 1 : 0;
  }
  EXPECT_GT(n_passed, 0u);
  EXPECT_LT(n_passed, scales.size());
}

/// The divisors of the exhaustive div.full.f32 checks: in the fast range and far outside it (tiny,
/// huge, subnormal, bf16-rounded, powers of two), and the 0 and infinity that fp16
/// scale_in_model_dtype makes of s < 2^-25 and s >= 65520.
const std::vector<float>& div_full_scales() {
  static const std::vector<float> scales = {0.37f,
                                            3.0f,
                                            1.0f / 3.0f,
                                            0.1f,
                                            448.0f,
                                            1.0f,
                                            0.5f,
                                            0.30078125f,
                                            1e-4f / 448.0f,
                                            1e6f,
                                            1e-6f,
                                            3.1e7f,
                                            1.7e-7f,
                                            1e30f,
                                            1e-30f,
                                            1.5f * 8.5070592e37f,
                                            1.1754944e-38f,
                                            1e-40f,
                                            0.0123f,
                                            0.0f,
                                            std::numeric_limits<float>::infinity()};
  return scales;
}

std::string bits_text(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return hex(b);
}

// div_approx's admissible sets rest on div.full.f32 being within 2 ulp of the correctly rounded
// quotient (SPEC 2), and canonical where that is NaN: checked for all 2^32 float32 x at every
// divisor of div_full_scales. Prints how many quotients differ at all, and how many move a zero or
// infinite quotient (or step onto zero): inside SPEC 2's window, but outside a rule that keeps
// zero and infinity exact (GpuWriteDivApprox.ZeroAndInfinityQuotientsInsideTheWindow).
TEST(DivApprox, DivFullWithinTwoUlpExhaustive) {
  KVO_REQUIRE_GPU();
  std::int64_t differing = 0;
  for (float s : div_full_scales()) {
    const gpu::testing::DivFullCounts n = gpu::testing::count_div_full(s);
    EXPECT_EQ(n.outside_window, 0) << "scale " << s << " (bits " << bits_text(s) << ")";
    EXPECT_EQ(n.nan_not_canonical, 0) << "scale " << s << " (bits " << bits_text(s) << ")";
    std::printf(
        "[div-full] scale %.9g: %lld of 2^32 quotients differ from __fdiv_rn, %lld move "
        "a zero or infinite quotient or step onto zero\n",
        static_cast<double>(s), static_cast<long long>(n.differing),
        static_cast<long long>(n.zero_or_infinity_moved));
    for (const gpu::testing::DivFullExample& e : n.examples) {
      std::printf("[div-full]   x %s: __fdiv_rn %s, div.full %s\n", hex(e.x).c_str(),
                  hex(e.q).c_str(), hex(e.got).c_str());
    }
    differing += n.differing;
  }
  EXPECT_GT(differing, 0) << "div.full.f32 equal to __fdiv_rn everywhere: not the approximate "
                             "division, or div_approx would need no admissible sets";
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
                             std::vector<std::int64_t> slots, float kv_scale = 1.0f) {
  spec::LayerWrite w;
  w.kind = kind;
  const auto n = static_cast<std::int64_t>(slots.size());
  w.k = f32_tensor({n, c.geometry.num_kv_heads, c.geometry.head_dim}, 1.0f);
  w.v = f32_tensor({n, c.geometry.num_kv_heads, c.geometry.head_dim}, -3.0f);
  if (kind == LayerKind::kSparse) w.index_k = f32_tensor({n, c.geometry.index_dim}, 0.5f);
  w.slots.type = c.slot_type;
  w.slots.slots = std::move(slots);
  w.k_scale = {kv_scale};
  w.v_scale = {kv_scale};
  return w;
}

/// Writes both layers with the reference and with cuda-fused, planting `fault` (if any) in layer 1
/// only; returns the merged diff.
oracle::CacheDiff planted_diff(const spec::ModelConfig& c, const std::vector<std::int64_t>& slots,
                               std::optional<WriteFault> fault, float kv_scale = 1.0f) {
  const reference::PagedCacheLayout layout(c);
  std::vector<spec::LayerCaches> expected = oracle::make_model_caches(layout);
  std::vector<spec::LayerCaches> actual = oracle::make_model_caches(layout);
  oracle::CacheDiff diff;
  for (std::size_t l = 0; l < c.layers.size(); ++l) {
    const spec::LayerWrite w = small_write(c, c.layers[l], slots, kv_scale);
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

// Huge caches (issue 14) on the device: a dense layer whose K and V buffers pass 2^32 bytes
// (bf16: element offsets past 2^31), lazy on the host (a few pages), whole on the device.
struct HugeRun {
  spec::ModelConfig c;
  spec::LayerWrite w;
  spec::LayerCaches initial, expected;
};

HugeRun huge_run(const spec::KvStrides& strides) {
  HugeRun r;
  r.c = small_config(spec::KvLayout::kNhd);
  r.c.layers = {LayerKind::kDense};
  r.c.geometry.block_size = 16;
  r.c.geometry.num_kv_heads = 2;
  r.c.geometry.head_dim = 64;
  r.c.geometry.num_blocks = (std::int64_t{1} << 32) / (16 * 2 * 64 * 2) + 3;  // 4 KiB blocks
  r.c.kv_strides = strides;
  const reference::PagedCacheLayout layout(r.c);
  r.w = small_write(r.c, LayerKind::kDense, {5, r.c.geometry.capacity() - 2});
  r.initial = oracle::make_layer_caches(layout, 0, LayerKind::kDense);
  oracle::materialise_write(layout, r.initial, r.w);
  r.expected = r.initial;
  reference::write_layer(r.c, r.w, r.expected);
  return r;
}

TEST(GpuHugeCache, WritesPast2To32BytesMatchAndPlantedBugsShow) {
  KVO_REQUIRE_GPU();
  const HugeRun r = huge_run({});
  const reference::PagedCacheLayout layout(r.c);
  ASSERT_TRUE(r.initial.find(spec::BufferKind::kK)->storage.is_lazy());
  for (WritePath path : {WritePath::kFused, WritePath::kUnfused}) {
    spec::LayerCaches actual = r.initial;
    gpu::write_layer_host(path, r.c, r.w, actual);
    const oracle::CacheDiff d = oracle::diff_layer_caches(layout, 0, r.expected, actual, &r.w);
    EXPECT_TRUE(d.equal()) << d.report();
  }
  // int32 element offsets: the token in the last block is lost, named past byte 2^32.
  spec::LayerCaches wrapped = r.initial;
  gpu::testing::write_layer_host_faulty(WriteFault::kInt32Offset, WritePath::kFused, r.c, r.w,
                                        wrapped);
  const oracle::CacheDiff d = oracle::diff_layer_caches(layout, 0, r.expected, wrapped, &r.w);
  ASSERT_TRUE(d.first.has_value()) << d.report();
  EXPECT_EQ(d.first->coord.block, r.c.geometry.num_blocks - 1) << d.report();
  EXPECT_GT(d.first->byte, std::int64_t{1} << 32) << d.report();
}

TEST(GpuHugeCache, AStrayWriteOnAPageNoCaseTouchedComesBackFromTheDevice) {
  KVO_REQUIRE_GPU();
  // A view with every block padded to twice its size, addressed as the dense tensor by the
  // planted bug: the last token's rows land in block (nb - 1) / 2 of the view, on pages the host
  // never materialised, which the device finds changed and sends back.
  const std::int64_t row = 2 * 64;
  const HugeRun r = huge_run({2 * 16 * row, row, 64, 0, 0});
  const reference::PagedCacheLayout layout(r.c);
  spec::LayerCaches actual = r.initial;
  gpu::testing::write_layer_host_faulty(WriteFault::kStridedAssumedDense, WritePath::kFused, r.c,
                                        r.w, actual);
  const oracle::CacheDiff d = oracle::diff_layer_caches(layout, 0, r.expected, actual, &r.w);
  ASSERT_TRUE(d.first.has_value()) << d.report();
  EXPECT_EQ(d.first->coord.block, (r.c.geometry.num_blocks - 1) / 2) << d.report();
  EXPECT_NE(d.first->expected_value.find("poison: must stay unwritten"), std::string::npos)
      << d.report();
  // The lost rows and the stray ones: K and V, 2 heads x 64 dims x 2 bytes each, twice, give or
  // take bytes equal to their poison.
  EXPECT_GT(d.differing_bytes, 2 * 2 * 2 * 64 * 2 - 16) << d.report();
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

/// A planted diff's first wrong byte is layer 1's K element (block, offset, head, dim).
void expect_first_k(const oracle::CacheDiff& diff, std::int64_t block, std::int64_t offset,
                    std::int64_t head, std::int64_t dim) {
  ASSERT_TRUE(diff.first.has_value());
  const oracle::ByteMismatch& m = *diff.first;
  EXPECT_EQ(m.layer, 1);
  EXPECT_EQ(m.buffer, BufferKind::kK);
  EXPECT_EQ(m.coord.block, block);
  EXPECT_EQ(m.coord.offset, offset);
  EXPECT_EQ(m.coord.head, head);
  EXPECT_EQ(m.coord.dim, dim);
}

TEST(PlantedBug, OffsetPlusOne) {
  KVO_REQUIRE_GPU();
  // Slot 9 = block 2, offset 1; the bug writes offset 2, so offset 1 keeps its poison.
  const oracle::CacheDiff diff =
      planted_diff(small_config(spec::KvLayout::kNhd), {9}, WriteFault::kOffsetPlusOne);
  expect_first_k(diff, 2, 1, 0, 0);
  if (diff.first) {
    EXPECT_NE(diff.first->writer.find("token 0"), std::string::npos) << diff.first->writer;
  }
}

TEST(PlantedBug, HndNhdStrideSwap) {
  KVO_REQUIRE_GPU();
  // Slot 8 = block 2, offset 0. Head 0 lands at the same place in both layouts; head 1 is at
  // element 16 of the token in NHD but 64 in HND, so the first wrong byte is (2, 0, head 1, dim 0).
  expect_first_k(planted_diff(small_config(spec::KvLayout::kNhd), {8}, WriteFault::kSwapHndNhd), 2,
                 0, 1, 0);
}

/// An fp8 e4m3 cache dividing by 256: K = 1 + 0.25 d (head 0) lands on the subnormals, d = 0 on
/// 2^-8 (code 0x02), d = 1 on 2.5 * 2^-9, halfway between codes 0x02 (even) and 0x03.
spec::ModelConfig fp8_subnormal_config() {
  spec::ModelConfig c = small_config(spec::KvLayout::kNhd);
  c.kv.cache_dtype = DType::kFp8E4M3;
  c.kv.scale_mode = spec::ScaleMode::kDivide;
  return c;
}

/// The first wrong K element of slot 9 (block 2, offset 1) under a planted fp8 cast bug: its dim
/// and both codes.
void expect_fp8_cast_bug(WriteFault fault, std::int64_t dim, std::uint32_t expected,
                         std::uint32_t actual) {
  const oracle::CacheDiff diff = planted_diff(fp8_subnormal_config(), {9}, fault, 256.0f);
  expect_first_k(diff, 2, 1, 0, dim);
  if (!diff.first) return;
  EXPECT_EQ(diff.first->expected_code, expected) << diff.first->describe();
  EXPECT_EQ(diff.first->actual_code, actual) << diff.first->describe();
}

TEST(PlantedBug, Fp8FlushToZeroLosesTheSubnormals) {
  KVO_REQUIRE_GPU();
  expect_fp8_cast_bug(WriteFault::kFp8FlushToZero, 0, 0x02, 0x00);  // 2^-8 flushed to +0
}

TEST(PlantedBug, Fp8RoundHalfAwayMovesATie) {
  KVO_REQUIRE_GPU();
  expect_fp8_cast_bug(WriteFault::kRoundHalfAway, 1, 0x02, 0x03);  // 2.5 * 2^-9: away, not even
}

TEST(PlantedBug, VectorTailOverrunZeroesPastTheRow) {
  KVO_REQUIRE_GPU();
  // fp8 rows of head_dim 8: 8 bytes, half a 16-byte vector. The 8 bytes past head 1's row of
  // offset 1 are offset 2's head 0, which no token writes: its poison becomes zero (and head 0's
  // overrun zeroes head 1's row, stored in the same warp before it).
  spec::ModelConfig c = small_config(spec::KvLayout::kNhd);
  c.kv.cache_dtype = DType::kFp8E4M3;
  c.geometry.head_dim = 8;
  const oracle::CacheDiff diff = planted_diff(c, {9}, WriteFault::kVectorTailOverrun);
  ASSERT_TRUE(diff.first.has_value());
  EXPECT_EQ(diff.first->layer, 1);
  EXPECT_EQ(diff.first->buffer, BufferKind::kK);
  EXPECT_EQ(diff.first->coord.block, 2);
  EXPECT_EQ(diff.first->actual_byte, 0u) << diff.first->describe();
  const bool past_the_row =
      std::any_of(diff.buffers.begin(), diff.buffers.end(), [](const oracle::BufferDiffCount& b) {
        return b.layer == 1 && b.buffer == BufferKind::kK && b.differing_bytes >= 8;
      });
  EXPECT_TRUE(past_the_row) << diff.report();
  // Rows of 16 bytes have no tail: the same write is exact.
  c.geometry.head_dim = 16;
  EXPECT_TRUE(planted_diff(c, {9}, WriteFault::kVectorTailOverrun).equal());
}

TEST(PlantedBug, TornWrapRaceMixesTwoWritersBytes) {
  KVO_REQUIRE_GPU();
  // legacy_wrap: token 1's -1 wraps onto slot 31 (block 7, offset 3), which token 2 writes too.
  // Either writer's element is admissible (SPEC 3); the planted race keeps token 1's even bytes
  // and token 2's odd ones, an element of neither. Slot 5's only writer is stored whole.
  spec::ModelConfig c = small_config(spec::KvLayout::kNhd);
  c.slot_mode = spec::SlotMode::kLegacyWrap;
  EXPECT_TRUE(planted_diff(c, {5, -1, 31}, std::nullopt).equal());
  const oracle::CacheDiff diff = planted_diff(c, {5, -1, 31}, WriteFault::kTornWrapRace);
  ASSERT_TRUE(diff.first.has_value()) << diff.report();
  EXPECT_EQ(diff.first->layer, 1);
  EXPECT_EQ(diff.first->coord.block, 7) << diff.first->describe();
  EXPECT_EQ(diff.first->coord.offset, 3) << diff.first->describe();
  // Without a collision the same fault writes every byte.
  EXPECT_TRUE(planted_diff(c, {5, -1}, WriteFault::kTornWrapRace).equal());
}

TEST(PlantedBug, WithoutTheFaultTheSameCasesPass) {
  KVO_REQUIRE_GPU();
  for (const std::vector<std::int64_t>& slots :
       {std::vector<std::int64_t>{5, -1}, std::vector<std::int64_t>{9},
        std::vector<std::int64_t>{8}}) {
    EXPECT_TRUE(planted_diff(small_config(spec::KvLayout::kNhd), slots, std::nullopt).equal());
  }
  EXPECT_TRUE(planted_diff(fp8_subnormal_config(), {9}, std::nullopt, 256.0f).equal());
}

/// Copies of the poisoned caches, to show that nothing changed.
std::vector<std::vector<std::uint8_t>> storage_of(const spec::LayerCaches& c) {
  std::vector<std::vector<std::uint8_t>> out;
  for (const auto& b : c.buffers) {
    out.emplace_back(b.storage.data(), b.storage.data() + b.storage.size());
  }
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

// ---------------------------------------------------------------------------------------------
// SPEC 2's write modes on hand-built cases that tell each mode from its neighbour. The host part
// (the case does tell them apart, by the reference's own bytes) runs everywhere; the GPU part
// skips without a device.

/// A [rows, cols...] tensor of dtype `act` with element i = value(i) rounded to act (RNE).
template <class F>
spec::HostTensor act_tensor(DType act, std::vector<std::int64_t> shape, F value) {
  spec::HostTensor t;
  t.dtype = act;
  t.shape = std::move(shape);
  const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(act));
  t.bytes.resize(static_cast<std::size_t>(t.numel() * eb));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    reference::store_code(reference::encode(value(i), act, spec::Saturation::kSatFinite), act,
                          t.bytes.data() + i * eb);
  }
  return t;
}

/// One layer of `kind`: 4 blocks of 8 slots, 2 KV heads of 64, index_dim 256, NHD, int64 slots.
spec::ModelConfig mode_config(LayerKind kind, DType act, DType cache, spec::ScaleMode mode) {
  spec::ModelConfig c;
  c.layers = {kind};
  c.geometry = {4, 8, 2, 64, 256};
  c.act_dtype = act;
  c.layout = spec::KvLayout::kNhd;
  c.kv.cache_dtype = cache;
  c.kv.scale_mode = mode;
  c.index.layout = spec::IndexLayout::kFlat;
  c.index.flat_dtype = DType::kBF16;
  c.slot_type = spec::SlotType::kI64;
  return c;
}

/// A write of `tokens` tokens on slots 0..tokens-1 with K[i] = k(i), V[i] = v(i) (i the flat
/// element index of [T, nkv, hd]) and index-K[i] = ik(i) ([T, index_dim], sparse layers).
template <class FK, class FV, class FI>
spec::LayerWrite mode_write(const spec::ModelConfig& c, std::int64_t tokens, FK k, FV v, FI ik) {
  const spec::CacheGeometry& g = c.geometry;
  spec::LayerWrite w;
  w.kind = c.layers.front();
  w.k = act_tensor(c.act_dtype, {tokens, g.num_kv_heads, g.head_dim}, k);
  w.v = act_tensor(c.act_dtype, {tokens, g.num_kv_heads, g.head_dim}, v);
  if (w.kind == LayerKind::kSparse) w.index_k = act_tensor(c.act_dtype, {tokens, g.index_dim}, ik);
  w.slots.type = c.slot_type;
  for (std::int64_t t = 0; t < tokens; ++t) w.slots.slots.push_back(t);
  w.k_scale = {1.0f};
  w.v_scale = {1.0f};
  return w;
}

/// The reference's caches for one layer of `c`.
spec::LayerCaches reference_caches(const spec::ModelConfig& c, const spec::LayerWrite& w) {
  const reference::PagedCacheLayout layout(c);
  spec::LayerCaches caches = oracle::make_layer_caches(layout, 0, w.kind);
  reference::write_layer(c, w, caches);
  return caches;
}

/// Bytes where two layers' caches differ (same configuration shape).
std::int64_t differing_bytes(const spec::LayerCaches& a, const spec::LayerCaches& b) {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < a.buffers.size(); ++i) {
    for (std::size_t j = 0; j < static_cast<std::size_t>(a.buffers[i].storage.size()); ++j)
      n += a.buffers[i].storage[j] != b.buffers[i].storage[j] ? 1 : 0;
  }
  return n;
}

/// Both GPU paths on one layer, byte for byte against `expected`; the failure report, or empty.
std::string gpu_paths_equal(const spec::ModelConfig& c, const spec::LayerWrite& w,
                            const spec::LayerCaches& expected) {
  const reference::PagedCacheLayout layout(c);
  for (WritePath path : {WritePath::kFused, WritePath::kUnfused}) {
    spec::LayerCaches actual = oracle::make_layer_caches(layout, 0, w.kind);
    gpu::write_layer_host(path, c, w, actual);
    const oracle::CacheDiff d = oracle::diff_layer_caches(layout, 0, expected, actual, &w);
    if (!d.equal()) {
      return std::string(path == WritePath::kFused ? "cuda-fused" : "cuda-unfused") + " " +
             spec::describe(c) + "\n" + d.report();
    }
  }
  return {};
}

// scale_in_model_dtype: each scale is s' * (1 + 2^-12) with s' of two or three significant bits
// (0.75, 1.5, 0.625), so bf16 and fp16 both round it to s', and every element is x = m * s' (exact
// in both) for m an e4m3 rounding midpoint: x / s' is the tie m (to even), x / s falls just below
// it, and x * fl(1/s') just above it, so the rounded scale moves the code of many elements; the
// GPU must follow the rounded scale, per tensor and per head.
TEST(GpuWriteModes, ScaleInModelDtypeMatchesReference) {
  struct One {
    spec::ModelConfig config;
    spec::LayerWrite write;
    spec::LayerCaches expected;
  };
  constexpr float kUp = 1.0f + 1.0f / 4096.0f;
  std::vector<One> cases;
  for (DType act : {DType::kBF16, DType::kF16}) {
    for (spec::ScaleMode mode : {spec::ScaleMode::kDivide, spec::ScaleMode::kMulRecip}) {
      for (bool per_head : {false, true}) {
        spec::ModelConfig c = mode_config(LayerKind::kDense, act, DType::kFp8E4M3, mode);
        c.kv.per_head_scale = per_head;
        c.kv.scale_in_model_dtype = true;
        const std::int64_t hd = c.geometry.head_dim, nkv = c.geometry.num_kv_heads;
        const std::vector<float> k_base =
            per_head ? std::vector<float>{0.75f, 1.5f} : std::vector<float>{0.75f};
        const std::vector<float> v_base =
            per_head ? std::vector<float>{0.625f, 0.75f} : std::vector<float>{0.75f};
        // Element i of [T, nkv, hd]: the midpoint of e4m3 codes c, c + 1 (c cycling over 0x28 ..
        // 0x57), alternating in sign, times the rounded scale of its head.
        auto ties = [&](const std::vector<float>& base) {
          return [&, base](std::int64_t i) {
            const auto code = 0x28u + static_cast<std::uint32_t>(i % 48);
            const float m = 0.5f * (reference::decode(code, DType::kFp8E4M3) +
                                    reference::decode(code + 1, DType::kFp8E4M3));
            const float x = m * base[static_cast<std::size_t>(i / hd % nkv) % base.size()];
            return (i / 48) % 2 == 0 ? x : -x;
          };
        };
        spec::LayerWrite w =
            mode_write(c, 8, ties(k_base), ties(v_base), [](std::int64_t) { return 0.0f; });
        w.k_scale.clear();
        w.v_scale.clear();
        for (float b : k_base) w.k_scale.push_back(b * kUp);
        for (float b : v_base) w.v_scale.push_back(b * kUp);
        spec::LayerCaches expected = reference_caches(c, w);
        spec::ModelConfig plain = c;
        plain.kv.scale_in_model_dtype = false;
        ASSERT_GT(differing_bytes(expected, reference_caches(plain, w)), 0)
            << spec::describe(c) << ": the case does not tell the rounded scale from s";
        cases.push_back({c, std::move(w), std::move(expected)});
      }
    }
  }
  KVO_REQUIRE_GPU();
  for (const One& one : cases) {
    const std::string failure = gpu_paths_equal(one.config, one.write, one.expected);
    EXPECT_TRUE(failure.empty()) << failure;
  }
}

/// Group maxima where SPEC 2's two blockscale formulas give different scales (fl(amax / 448) !=
/// fl(amax * fl(1 / 448))), found with the reference among the values 1 + i/1024 representable in
/// `act`.
std::vector<float> distinguishing_amax(DType act, std::size_t want) {
  std::vector<float> out;
  spec::IndexQuant divide, mul_recip;
  divide.layout = mul_recip.layout = spec::IndexLayout::kBlockScale;
  mul_recip.blockscale_scale = spec::BlockScaleFormula::kMulRecip;
  std::vector<float> group(static_cast<std::size_t>(spec::kScaleGroup), 0.0f);
  std::vector<std::uint8_t> q(group.size());
  for (int i = 0; i < 4096 && out.size() < want; ++i) {
    const float amax = reference::round_to(1.0f + static_cast<float>(i) / 1024.0f, act);
    if (!out.empty() && out.back() == amax) continue;
    group[0] = amax;
    if (reference::quantize_group_blockscale(group, divide, q) !=
        reference::quantize_group_blockscale(group, mul_recip, q)) {
      out.push_back(amax);
    }
  }
  return out;
}

// blockscale_scale mul_recip: every 128-group's maximum is one where amax / 448 and
// amax * fl(1/448) round differently, so the stored fp32 scales (and some codes) differ between
// the formulas; the GPU's fused and unfused index-K paths must store the mul_recip ones.
TEST(GpuWriteModes, BlockscaleMulRecipMatchesReference) {
  struct One {
    spec::ModelConfig config;
    spec::LayerWrite write;
    spec::LayerCaches expected;
  };
  std::vector<One> cases;
  for (DType act : {DType::kF32, DType::kBF16}) {
    const std::vector<float> amax = distinguishing_amax(act, 16);
    ASSERT_EQ(amax.size(), 16u) << "too few distinguishing group maxima in " << spec::name_of(act);
    for (bool ue8m0 : {false, true}) {
      spec::ModelConfig c =
          mode_config(LayerKind::kSparse, act, DType::kBF16, spec::ScaleMode::kNone);
      c.index.layout = spec::IndexLayout::kBlockScale;
      c.index.ue8m0 = ue8m0;
      c.index.blockscale_scale = spec::BlockScaleFormula::kMulRecip;
      const std::int64_t idim = c.geometry.index_dim;
      // Token t, group g: element 0 of the group is +-amax[(2t + g) % 16], the others a ramp
      // inside it (index-K [T, 256]).
      spec::LayerWrite w = mode_write(
          c, 8, [](std::int64_t i) { return 0.125f * static_cast<float>(i % 64); },
          [](std::int64_t i) { return -0.25f * static_cast<float>(i % 32); },
          [&](std::int64_t i) {
            const std::int64_t t = i / idim, e = i % idim, g = e / spec::kScaleGroup;
            const float m = amax[static_cast<std::size_t>((2 * t + g) % 16)];
            const std::int64_t j = e % spec::kScaleGroup;
            if (j == 0) return (t + g) % 2 == 0 ? m : -m;
            return m * (static_cast<float>(j) / 128.0f - 0.5f);
          });
      spec::LayerCaches expected = reference_caches(c, w);
      spec::ModelConfig divide = c;
      divide.index.blockscale_scale = spec::BlockScaleFormula::kDivide;
      const std::int64_t apart = differing_bytes(expected, reference_caches(divide, w));
      // ue8m0 rounds both scales up to one power of two unless one of them is exactly a power of
      // two, which none is here: only the plain scales must differ; the ue8m0 case runs the
      // flag through the GPU all the same.
      if (!ue8m0) {
        ASSERT_GT(apart, 0) << spec::describe(c) << ": the formulas agree on this case";
      }
      cases.push_back({c, std::move(w), std::move(expected)});
    }
  }
  KVO_REQUIRE_GPU();
  for (const One& one : cases) {
    const std::string failure = gpu_paths_equal(one.config, one.write, one.expected);
    EXPECT_TRUE(failure.empty()) << failure;
  }
}

// SPEC 2's NaN rule on the GPU: a NaN through the scaling (divide, mul_recip, div_approx) is the
// canonical NaN whatever the input's sign and payload (e4m3 0x7F even in the torch mode, f32
// 0x7FFFFFFF); with scale none the input NaN reaches the cast as it is (torch: 0xFF for -NaN; f32
// cache: its own bits). Blockscale index-K: a NaN element is ignored by amax and stores 0x7F.
TEST(GpuWriteModes, NanThroughArithmeticIsCanonical) {
  KVO_REQUIRE_GPU();
  const std::array<std::uint32_t, 4> kNans = {0x7FC00000u, 0xFFC00000u, 0xFF812345u, 0x7F80ABCDu};
  auto value = [&](std::int64_t i) {
    // Elements 0, 2, 4, 6 of every 8 are NaNs (each pattern in turn), the others 1.5 * (i % 7).
    if (i % 2 == 0) {
      float f;
      std::memcpy(&f, &kNans[static_cast<std::size_t>((i / 2) % 4)], 4);
      return f;
    }
    return 1.5f * static_cast<float>(i % 7);
  };
  for (DType cache : {DType::kFp8E4M3, DType::kF32}) {
    for (const auto& mode : spec::EnumInfo<spec::ScaleMode>::kNames) {
      spec::ModelConfig c = mode_config(LayerKind::kSparse, DType::kF32, cache, mode.value);
      c.kv.saturation = spec::Saturation::kTorch;
      c.index.layout = spec::IndexLayout::kBlockScale;
      spec::LayerWrite w = mode_write(c, 4, value, value, value);
      w.k_scale = {0.37f};
      w.v_scale = {3.0f};
      const reference::PagedCacheLayout layout(c);
      const spec::LayerCaches expected = reference_caches(c, w);
      for (WritePath path : {WritePath::kFused, WritePath::kUnfused}) {
        spec::LayerCaches actual = oracle::make_layer_caches(layout, 0, w.kind);
        gpu::write_layer_host(path, c, w, actual);
        const std::string tag =
            std::string(path == WritePath::kFused ? "fused " : "unfused ") + spec::describe(c);
        const std::int64_t eb = static_cast<std::int64_t>(spec::dtype_bytes(cache));
        const std::int64_t hd = c.geometry.head_dim, nkv = c.geometry.num_kv_heads;
        for (int kv = 0; kv < 2; ++kv) {
          const std::uint8_t* body = actual.find(layout.kv_buffer(kv))->body();
          for (std::int64_t i = 0; i < 4 * nkv * hd; i += 2) {
            const std::int64_t t = i / (nkv * hd), h = i / hd % nkv, d = i % hd;
            const std::uint32_t in = kNans[static_cast<std::size_t>((i / 2) % 4)];
            const std::uint32_t got =
                reference::load_code(body + layout.kv_element(kv, t / 8, t % 8, h, d) * eb, cache);
            std::uint32_t want;
            if (mode.value != spec::ScaleMode::kNone) {
              want = cache == DType::kF32 ? 0x7FFFFFFFu : 0x7Fu;
            } else {
              want = cache == DType::kF32 ? in : ((in >> 31) != 0 ? 0xFFu : 0x7Fu);
            }
            ASSERT_EQ(got, want) << tag << ": " << (kv == 0 ? "K" : "V") << " element " << i
                                 << " from NaN " << hex(in);
          }
        }
        const std::uint8_t* index = actual.find(BufferKind::kIndexK)->body();
        for (std::int64_t i = 0; i < 4 * c.geometry.index_dim; i += 2) {
          const std::int64_t t = i / c.geometry.index_dim, d = i % c.geometry.index_dim;
          ASSERT_EQ(index[layout.index_value_byte(t / 8, t % 8, d)], 0x7Fu)
              << tag << ": index-K element " << i;
        }
        // Everything else: the reference's bytes (div_approx by admissible sets).
        if (mode.value == spec::ScaleMode::kDivApprox) {
          const Admissible j = judge_admissible(layout, 0, w, expected, actual);
          EXPECT_TRUE(j.failure.empty()) << tag << ": " << j.failure;
        } else {
          const oracle::CacheDiff d = oracle::diff_layer_caches(layout, 0, expected, actual, &w);
          EXPECT_TRUE(d.equal()) << tag << "\n" << d.report();
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// div_approx: the GPU divides with div.full.f32 (Triton's `/`); its bytes are judged by SPEC 2's
// admissible sets and must pass, while on inputs next to a rounding boundary of the cast they
// differ from the correctly rounded reference's on some elements (else the mode would be moot).

/// A dense div_approx layer (f32 activations, per-head scales 0.37, 3.3 for K and 0.0123, 1.7 for
/// V, 32 tokens) whose elements sit on and next to rounding boundaries of `cache`: element i is
/// fl(m * s) moved (i % 9) - 4 steps along the float32 line, m the midpoint between the codes
/// c and c + 1 of `cache` (c cycling over 48 codes from that of 0.25), of alternating sign; so
/// x / s is within a few ulp of a boundary, where a 2-ulp error moves the code.
std::pair<spec::ModelConfig, spec::LayerWrite> boundary_case(DType cache) {
  spec::ModelConfig c =
      mode_config(LayerKind::kDense, DType::kF32, cache, spec::ScaleMode::kDivApprox);
  c.kv.per_head_scale = true;
  const std::vector<float> k_scale = {0.37f, 3.3f}, v_scale = {0.0123f, 1.7f};
  const std::int64_t hd = c.geometry.head_dim, nkv = c.geometry.num_kv_heads;
  const std::uint32_t base = reference::encode(0.25f, cache, spec::Saturation::kSatFinite);
  auto near_boundary = [&](const std::vector<float>& scale) {
    return [&, scale](std::int64_t i) {
      const auto code = base + static_cast<std::uint32_t>((i / 9) % 48);
      const double m = 0.5 * (static_cast<double>(reference::decode(code, cache)) +
                              static_cast<double>(reference::decode(code + 1, cache)));
      const float s = scale[static_cast<std::size_t>(i / hd % nkv)];
      float x = static_cast<float>(m) * s;
      for (std::int64_t k = (i % 9) - 4; k != 0; k += k > 0 ? -1 : 1)
        x = std::nextafter(x, k > 0 ? std::numeric_limits<float>::infinity() : 0.0f);
      return (i / 9) % 2 == 0 ? x : -x;
    };
  };
  spec::LayerWrite w = mode_write(c, 32, near_boundary(k_scale), near_boundary(v_scale),
                                  [](std::int64_t) { return 0.0f; });
  w.k_scale = k_scale;
  w.v_scale = v_scale;
  return {c, std::move(w)};
}

TEST(GpuWriteDivApprox, AdmissibleOnBoundariesAndNotAlwaysCorrectlyRounded) {
  KVO_REQUIRE_GPU();
  std::int64_t off_fp8 = 0, off_all = 0;
  for (DType cache : {DType::kFp8E4M3, DType::kFp8E5M2, DType::kBF16, DType::kF16, DType::kF32}) {
    const auto [c, w] = boundary_case(cache);
    const reference::PagedCacheLayout layout(c);
    const spec::LayerCaches expected = reference_caches(c, w);
    for (WritePath path : {WritePath::kFused, WritePath::kUnfused}) {
      spec::LayerCaches actual = oracle::make_layer_caches(layout, 0, w.kind);
      gpu::write_layer_host(path, c, w, actual);
      const Admissible j = judge_admissible(layout, 0, w, expected, actual);
      EXPECT_TRUE(j.failure.empty()) << spec::describe(c) << ": " << j.failure;
      std::printf("[div-approx] %s %s: %lld of 8192 elements off the correctly rounded pick\n",
                  path == WritePath::kFused ? "fused" : "unfused",
                  std::string(spec::name_of(cache)).c_str(), static_cast<long long>(j.off_pick));
      off_all += j.off_pick;
      if (spec::is_fp8(cache)) off_fp8 += j.off_pick;
    }
  }
  std::printf("[div-approx] boundary cases: %lld elements differ from the reference (fp8: %lld)\n",
              static_cast<long long>(off_all), static_cast<long long>(off_fp8));
  g_off_pick += off_all;
  EXPECT_GT(off_fp8, 0) << "div.full.f32 never moved an fp8 code next to a rounding boundary";
}

// Random div_approx cases (every layout, dtype, saturation, scale_in_model_dtype, ...) through
// run_case, whose judge takes admissible sets for them.
TEST(GpuWriteDivApprox, RandomCasesAdmissible) {
  KVO_REQUIRE_GPU();
  const std::int64_t before = g_off_pick.load();
  const std::int64_t n = env_int("KVO_GPU_CASES", 64) * 2;
  for (std::int64_t i = 0; i < n; ++i) {
    oracle::CaseOverrides o;
    o.scale_mode = spec::ScaleMode::kDivApprox;
    const std::string failure =
        run_case(oracle::case_seed(0xD1FA7u, static_cast<std::uint64_t>(i)), o);
    ASSERT_TRUE(failure.empty()) << failure;
  }
  std::printf("[div-approx] %lld random cases: %lld elements differ from the reference\n",
              static_cast<long long>(n), static_cast<long long>(g_off_pick.load() - before));
}

// The H200's div.full.f32 turns some zero quotients into the smallest subnormal of their sign and
// some infinite ones into the largest finite float (DivApprox.DivFullWithinTwoUlpExhaustive):
// 1 ulp along the float line, inside SPEC 2's window ("y within 2 ulp of the correctly rounded
// quotient"), and visible in an f32 cache only. Every such x of the exhaustive scan, written
// through both GPU paths into an f32 cache, must pass the admissible sets.
TEST(GpuWriteDivApprox, ZeroAndInfinityQuotientsInsideTheWindow) {
  KVO_REQUIRE_GPU();
  std::int64_t written = 0;
  for (float s : div_full_scales()) {
    if (s == 0.0f || std::isinf(s)) continue;  // no valid scale is
    const gpu::testing::DivFullCounts n = gpu::testing::count_div_full(s);
    if (n.examples.empty()) continue;
    spec::ModelConfig c =
        mode_config(LayerKind::kDense, DType::kF32, DType::kF32, spec::ScaleMode::kDivApprox);
    const std::vector<gpu::testing::DivFullExample> ex = n.examples;
    spec::LayerWrite w = mode_write(
        c, 1,
        [&](std::int64_t i) {
          float x;
          std::memcpy(&x, &ex[static_cast<std::size_t>(i) % ex.size()].x, 4);
          return x;
        },
        [](std::int64_t) { return 1.0f; }, [](std::int64_t) { return 0.0f; });
    w.k_scale = {s};
    w.v_scale = {s};
    const reference::PagedCacheLayout layout(c);
    const spec::LayerCaches expected = reference_caches(c, w);
    for (WritePath path : {WritePath::kFused, WritePath::kUnfused}) {
      spec::LayerCaches actual = oracle::make_layer_caches(layout, 0, w.kind);
      gpu::write_layer_host(path, c, w, actual);
      // The kernel stores div.full.f32's own quotient (the scan's `got`).
      const std::uint8_t* k = actual.find(BufferKind::kK)->body();
      for (std::size_t i = 0; i < ex.size(); ++i) {
        EXPECT_EQ(
            reference::load_code(
                k + layout.kv_element(0, 0, 0, 0, static_cast<std::int64_t>(i)) * 4, DType::kF32),
            ex[i].got)
            << "x " << hex(ex[i].x) << " / " << s;
      }
      const Admissible j = judge_admissible(layout, 0, w, expected, actual);
      EXPECT_TRUE(j.failure.empty())
          << "scale " << s << " (bits " << bits_text(s) << "): " << j.failure
          << "\n  reference::admissible_kv_codes keeps zero and infinite quotients exact and never "
             "steps onto zero; div.full.f32 does, within SPEC 2's 2 ulp";
      ++written;
    }
  }
  std::printf("[div-approx] zero/infinity edge writes judged: %lld\n",
              static_cast<long long>(written));
}

/// A campaign (the oracle's own judging, SPEC 7) of `cases` write cases over `subjects`.
oracle::CheckReport write_campaign(oracle::SubjectList& subjects,
                                   const std::vector<std::string>& names,
                                   const oracle::CaseOverrides& o, std::int64_t cases) {
  oracle::CheckOptions options;
  options.seed = 0xD1FAC0DEull;
  options.cases = cases;
  options.overrides.write = o;
  options.subjects = names;
  options.ops = {spec::Op::kWrite};
  return oracle::run_check(options, subjects);
}

// The oracle's campaign judges div_approx by admissible sets: the production GPU paths pass, and
// the write fault that stores one code beyond each set is caught on every case.
TEST(GpuWriteDivApprox, CampaignJudgesByAdmissibleSets) {
  KVO_REQUIRE_GPU();
  oracle::CaseOverrides o;
  o.scale_mode = spec::ScaleMode::kDivApprox;
  oracle::SubjectList subjects = oracle::make_cuda_subjects();
  subjects.push_back(oracle::make_cuda_div_approx_beyond_subject("cuda-div-approx-one-beyond"));
  const oracle::CheckReport good = write_campaign(subjects, {"cuda-fused", "cuda-unfused"}, o, 200);
  EXPECT_EQ(good.worst, spec::Outcome::kPass) << good.summary();
  const oracle::CheckReport bad = write_campaign(subjects, {"cuda-div-approx-one-beyond"}, o, 50);
  ASSERT_EQ(bad.subjects.size(), 1u);
  EXPECT_EQ(bad.subjects[0].count(spec::Outcome::kMismatch), 50) << bad.summary();
}

// ---------------------------------------------------------------------------------------------
// The planted write faults of SPEC 2-3's real bug classes, each located on a hand-built case.

// div_approx_one_code_beyond: every element of the boundary cases (fp8, 16-bit, f32 caches) is
// off its admissible set, by exactly one code past the set's largest or smallest magnitude.
TEST(PlantedBug, DivApproxOneCodeBeyondLeavesEverySetByOneCode) {
  KVO_REQUIRE_GPU();
  for (DType cache : {DType::kFp8E4M3, DType::kFp8E5M2, DType::kBF16, DType::kF32}) {
    const auto [c, w] = boundary_case(cache);
    const reference::PagedCacheLayout layout(c);
    spec::LayerCaches actual = oracle::make_layer_caches(layout, 0, w.kind);
    gpu::testing::write_layer_host_faulty(WriteFault::kDivApproxOneCodeBeyond, WritePath::kFused, c,
                                          w, actual);
    const std::uint32_t sign =
        cache == DType::kF32 ? 0x80000000u : (spec::is_fp8(cache) ? 0x80u : 0x8000u);
    const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(cache));
    const std::int64_t hd = c.geometry.head_dim, nkv = c.geometry.num_kv_heads;
    std::int64_t outside = 0, elements = 0;
    for (int kv = 0; kv < 2; ++kv) {
      const std::uint8_t* body = actual.find(layout.kv_buffer(kv))->body();
      for (std::int64_t t = 0; t < 32; ++t) {
        for (std::int64_t h = 0; h < nkv; ++h) {
          for (std::int64_t d = 0; d < hd; ++d) {
            reference::CacheElement el;
            el.buffer = layout.kv_buffer(kv);
            el.kv = kv;
            el.block = t / 8;
            el.offset = t % 8;
            el.head = h;
            el.dim = d;
            const std::vector<std::uint32_t> codes = reference::admissible_codes(c, w, el);
            const std::uint32_t got = reference::load_code(
                body + layout.kv_element(kv, el.block, el.offset, h, d) * eb, cache);
            ++elements;
            ASSERT_FALSE(codes.empty());
            if (std::binary_search(codes.begin(), codes.end(), got)) continue;
            ++outside;
            // One code beyond: the set's codes share a sign (no quotient crosses zero) and run
            // contiguously in magnitude from codes.front() to codes.back().
            const std::uint32_t lo = codes.front() & ~sign, hi = codes.back() & ~sign;
            EXPECT_EQ(got & sign, codes.front() & sign) << spec::describe(c);
            EXPECT_TRUE((got & ~sign) == hi + 1 || (got & ~sign) + 1 == lo)
                << spec::describe(c) << ": code " << hex(got) << ", set " << hex(codes.front())
                << ".." << hex(codes.back());
          }
        }
      }
    }
    EXPECT_EQ(outside, elements) << spec::describe(c);
    // The production kernel on the same case stays inside every set.
    const spec::LayerCaches expected = reference_caches(c, w);
    spec::LayerCaches good = oracle::make_layer_caches(layout, 0, w.kind);
    gpu::write_layer_host(WritePath::kFused, c, w, good);
    EXPECT_TRUE(judge_admissible(layout, 0, w, expected, good).failure.empty());
    EXPECT_FALSE(judge_admissible(layout, 0, w, expected, actual).failure.empty());
  }
}

// e4m3_into_e5m2: slot 9 (block 2, offset 1) of an e5m2 cache receives K[0][0][0] = 1.0 as the
// e4m3 code 0x38 where e5m2's is 0x3C.
TEST(PlantedBug, E4m3CodesInAnE5m2Cache) {
  KVO_REQUIRE_GPU();
  spec::ModelConfig c = small_config(spec::KvLayout::kNhd);
  c.kv.cache_dtype = DType::kFp8E5M2;
  const oracle::CacheDiff diff = planted_diff(c, {9}, WriteFault::kE4m3IntoE5m2);
  ASSERT_TRUE(diff.first.has_value());
  const oracle::ByteMismatch& m = *diff.first;
  EXPECT_EQ(m.layer, 1);
  EXPECT_EQ(m.buffer, BufferKind::kK);
  EXPECT_EQ(m.coord.block, 2);
  EXPECT_EQ(m.coord.offset, 1);
  EXPECT_EQ(m.coord.head, 0);
  EXPECT_EQ(m.coord.dim, 0);
  EXPECT_EQ(m.expected_byte, 0x3Cu);
  EXPECT_EQ(m.actual_byte, 0x38u);
  EXPECT_TRUE(planted_diff(c, {9}, std::nullopt).equal());
}

// trunc_div_negative_slot, NHD: the padding token's K row (2 heads x 16 bf16 = 64 bytes) lands in
// the 64 bytes before K's body, its index-K row (128 bf16) in the 256 before index-K's: guard
// bands, nothing inside the bodies.
TEST(PlantedBug, TruncatedSlotMinusOneWritesBeforePageZero) {
  KVO_REQUIRE_GPU();
  const oracle::CacheDiff diff =
      planted_diff(small_config(spec::KvLayout::kNhd), {5, -1}, WriteFault::kTruncDivNegativeSlot);
  ASSERT_TRUE(diff.first.has_value());
  EXPECT_EQ(diff.first->layer, 1);
  EXPECT_EQ(diff.first->buffer, BufferKind::kK);
  EXPECT_LT(diff.first->guard_distance, 0);
  EXPECT_GE(diff.first->guard_distance, -64);
  for (const oracle::BufferDiffCount& b : diff.buffers) {
    EXPECT_EQ(b.layer, 1);
    EXPECT_EQ(b.differing_bytes, b.guard_bytes) << spec::name_of(b.buffer) << ": body changed";
    EXPECT_LE(b.guard_bytes, b.buffer == BufferKind::kIndexK ? 256 : 64);
  }
  EXPECT_TRUE(planted_diff(small_config(spec::KvLayout::kNhd), {5, -1}, std::nullopt).equal());
}

// trunc_div_negative_slot, HND ([nb, nkv, bs, hd]): offset -1 of head 1 is the last token of head
// 0 in page 0, so the padding token's head-1 K row overwrites slot 3's head 0 (written by no
// token), exactly as the real kernel corrupts a neighbour; its head-0 row lands in the guard.
TEST(PlantedBug, TruncatedSlotMinusOneCorruptsTheNeighbouringHead) {
  KVO_REQUIRE_GPU();
  const spec::ModelConfig c = small_config(spec::KvLayout::kHnd);
  const reference::PagedCacheLayout layout(c);
  const spec::LayerWrite w = small_write(c, LayerKind::kSparse, {5, -1});
  spec::LayerCaches expected = oracle::make_layer_caches(layout, 1, LayerKind::kSparse);
  spec::LayerCaches actual = oracle::make_layer_caches(layout, 1, LayerKind::kSparse);
  reference::write_layer(c, w, expected);
  gpu::testing::write_layer_host_faulty(WriteFault::kTruncDivNegativeSlot, WritePath::kFused, c, w,
                                        actual);
  const std::uint8_t* want = expected.find(BufferKind::kK)->body();
  const std::uint8_t* got = actual.find(BufferKind::kK)->body();
  const std::int64_t hd = c.geometry.head_dim;
  for (std::int64_t d = 0; d < hd; ++d) {
    const std::int64_t e = layout.kv_element(0, 0, 3, 0, d) * 2;
    // Token 1's K, head 1, dim d: f32 source element (1 * 2 + 1) * 16 + d, stored as bf16.
    const std::uint32_t row = reference::encode(reference::source_value(w.k, 3 * hd + d),
                                                DType::kBF16, spec::Saturation::kSatFinite);
    EXPECT_EQ(reference::load_code(got + e, DType::kBF16), row) << "dim " << d;
    EXPECT_NE(reference::load_code(want + e, DType::kBF16), row) << "dim " << d;
  }
  const oracle::CacheDiff d = oracle::diff_layer_caches(layout, 1, expected, actual, &w);
  ASSERT_TRUE(d.first.has_value());
  EXPECT_LT(d.first->guard_distance, 0) << "head 0's row lands in the leading guard";
  EXPECT_GE(d.first->guard_distance, -2 * hd);
}

// Each write fault, as the mutation catalogue runs it (the factories of cuda_subjects.hpp), is
// caught by the campaign on the cases it needs, and none of them faults the CUDA context: the
// stray row of trunc_div_negative_slot stays in memory the host path owns (the device mirror):
// a mismatch where it lands in a guard band, failed-to-run naming its body offset past one.
TEST(PlantedBug, CampaignCatchesEachWriteFault) {
  KVO_REQUIRE_GPU();
  oracle::SubjectList subjects;
  subjects.push_back(oracle::make_cuda_div_approx_beyond_subject("cuda-div-approx-one-beyond"));
  subjects.push_back(oracle::make_cuda_e4m3_into_e5m2_subject("cuda-e4m3-into-e5m2"));
  subjects.push_back(oracle::make_cuda_trunc_div_negative_slot_subject("cuda-trunc-div-slot"));
  oracle::CaseOverrides approx, e5m2, any;
  approx.scale_mode = spec::ScaleMode::kDivApprox;
  e5m2.kv_dtype = DType::kFp8E5M2;
  for (const auto& [name, o] :
       {std::pair{"cuda-div-approx-one-beyond", approx}, std::pair{"cuda-e4m3-into-e5m2", e5m2},
        std::pair{"cuda-trunc-div-slot", any}}) {
    const oracle::CheckReport r = write_campaign(subjects, {name}, o, 60);
    ASSERT_EQ(r.subjects.size(), 1u);
    const oracle::SubjectSummary& sum = r.subjects[0];
    EXPECT_GT(sum.count(spec::Outcome::kMismatch), 0) << r.summary();
    // A write one token stride before the body lands in the guard band (a mismatch) when the
    // stride fits in it, else in the device mirror's margin: failed-to-run naming the body offset.
    if (sum.count(spec::Outcome::kFailedToRun) > 0) {
      EXPECT_STREQ(name, "cuda-trunc-div-slot") << r.summary();
    }
    EXPECT_EQ(sum.count(spec::Outcome::kUnsupported), 0) << r.summary();
    std::printf("[planted] %s: %lld of %lld cases caught (%lld mismatch, %lld failed to run)\n",
                name,
                static_cast<long long>(sum.count(spec::Outcome::kMismatch) +
                                       sum.count(spec::Outcome::kFailedToRun)),
                static_cast<long long>(sum.cases),
                static_cast<long long>(sum.count(spec::Outcome::kMismatch)),
                static_cast<long long>(sum.count(spec::Outcome::kFailedToRun)));
  }
}

}  // namespace
}  // namespace kvo
