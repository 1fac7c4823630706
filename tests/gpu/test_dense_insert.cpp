// The dense-layer fused insert (qknorm + rope + insert, SPEC 4) on the GPU against its CPU
// reference: q_out and the whole K/V buffers (guards included) byte for byte, over the random cases
// of oracle::make_dense_case; div_approx inserts by SPEC 7's admissible sets (every other byte
// exact), and scale_in_model_dtype on the same cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/write.hpp"
#include "kvo/oracle/cache_diff.hpp"
#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/cuda_subjects.hpp"
#include "kvo/oracle/dense_case.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/reference/dense_insert.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"

namespace kvo {
namespace {

using spec::DType;

/// SPEC 7's judgement of a div_approx dense insert's K/V buffers: every byte where `actual`
/// differs from the reference's `expected` lies in an element that a token writes, and its code
/// is one that reference::admissible_kv_codes admits for that token's value before the scaling
/// (K normed and rotated, V as given: read back from a reference run into an f32 cache with scale
/// none, which stores exactly those values). Returns the failure (empty: pass); `off_pick` counts
/// the elements off the reference's own pick.
std::string judge_dense_admissible(const spec::ModelConfig& c, const spec::DenseInsert& in,
                                   const spec::LayerCaches& expected,
                                   const spec::LayerCaches& actual, std::int64_t& off_pick) {
  spec::ModelConfig raw = c;
  raw.kv.cache_dtype = DType::kF32;
  raw.kv.scale_mode = spec::ScaleMode::kNone;
  raw.kv.via_model_dtype = false;
  raw.kv.scale_in_model_dtype = false;
  const reference::PagedCacheLayout layout(c), raw_layout(raw);
  spec::LayerCaches values = oracle::make_layer_caches(raw_layout, 0, spec::LayerKind::kDense);
  reference::dense_insert(raw, in, values);
  // The dense cases' slots are distinct (a permutation), so each slot has at most one writer.
  std::vector<std::int64_t> writer(static_cast<std::size_t>(c.geometry.capacity()), -1);
  for (std::size_t t = 0; t < in.kv.slots.slots.size(); ++t) {
    if (in.kv.slots.slots[t] >= 0)
      writer[static_cast<std::size_t>(in.kv.slots.slots[t])] = static_cast<std::int64_t>(t);
  }
  for (const spec::CacheBuffer& e : expected.buffers) {
    const spec::CacheBuffer* a = actual.find(e.kind);
    if (a == nullptr || a->storage.size() != e.storage.size()) return "buffer missing or resized";
    std::int64_t judged = -1;
    for (std::size_t j = 0; j < static_cast<std::size_t>(e.storage.size()); ++j) {
      if (e.storage[j] == a->storage[j]) continue;
      const std::int64_t byte = static_cast<std::int64_t>(j) - e.guard_bytes;
      const auto at =
          byte >= 0 && byte < e.body_bytes() ? oracle::locate(layout, e.kind, byte) : std::nullopt;
      const std::int64_t slot = at ? at->block * c.geometry.block_size + at->offset : -1;
      if (!at || writer[static_cast<std::size_t>(slot)] < 0) {
        return std::string(spec::name_of(e.kind)) + " byte " + std::to_string(byte) +
               " changed where no token writes";
      }
      const std::int64_t start = byte - at->byte_in_element;
      if (start == judged) continue;
      judged = start;
      const float x = reference::decode(
          reference::load_code(
              values.find(raw_layout.kv_buffer(at->kv))->body() +
                  raw_layout.kv_element(at->kv, at->block, at->offset, at->head, at->dim) * 4,
              DType::kF32),
          DType::kF32);
      const std::vector<float>& scales = at->kv == 0 ? in.kv.k_scale : in.kv.v_scale;
      const float s = scales[c.kv.per_head_scale ? static_cast<std::size_t>(at->head) : 0];
      const std::vector<std::uint32_t> codes =
          reference::admissible_kv_codes(x, s, c.kv, c.act_dtype);
      const std::uint32_t got = reference::load_code(a->body() + start, c.kv.cache_dtype);
      if (!std::binary_search(codes.begin(), codes.end(), got)) {
        return at->describe() + ": code " + std::to_string(got) +
               " not admissible for x = " + std::to_string(x) + " (" +
               std::to_string(codes.size()) + " codes admitted)";
      }
      ++off_pick;
    }
  }
  return {};
}

/// One dense case through the reference and the GPU: q_out byte for byte, the K/V buffers byte
/// for byte (div_approx: by admissible sets). Returns the failure report, or empty.
std::string run_dense(std::uint64_t seed, const oracle::DenseCase& ic, std::int64_t& off_pick) {
  const reference::PagedCacheLayout layout(ic.config);
  spec::LayerCaches expected = oracle::make_layer_caches(layout, 0, spec::LayerKind::kDense);
  spec::LayerCaches actual = oracle::make_layer_caches(layout, 0, spec::LayerKind::kDense);
  const spec::HostTensor q_ref = reference::dense_insert(ic.config, ic.in, expected);
  const spec::HostTensor q_gpu = gpu::dense_insert_host(ic.config, ic.in, actual);
  char tag[64];
  std::snprintf(tag, sizeof tag, "seed 0x%016llX ", static_cast<unsigned long long>(seed));
  const std::string what = tag + spec::describe(ic.config);
  if (q_ref.bytes.size() != q_gpu.bytes.size()) return what + ": q_out size differs";
  const auto mismatch = std::mismatch(q_ref.bytes.begin(), q_ref.bytes.end(), q_gpu.bytes.begin());
  if (mismatch.first != q_ref.bytes.end()) {
    return what + ": q_out differs first at byte " +
           std::to_string(mismatch.first - q_ref.bytes.begin());
  }
  if (ic.config.kv.scale_mode == spec::ScaleMode::kDivApprox) {
    const std::string failure =
        judge_dense_admissible(ic.config, ic.in, expected, actual, off_pick);
    return failure.empty() ? failure : what + ": " + failure;
  }
  const oracle::CacheDiff d = oracle::diff_layer_caches(layout, 0, expected, actual, &ic.in.kv);
  return d.equal() ? std::string() : what + "\n" + d.report();
}

TEST(DenseInsert, GpuMatchesReference) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const char* env = std::getenv("KVO_DENSE_CASES");
  const std::int64_t n = env != nullptr ? std::strtoll(env, nullptr, 0) : 400;
  std::int64_t off_pick = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t seed = 0xD15E0000ull + static_cast<std::uint64_t>(i);
    const std::string failure = run_dense(seed, oracle::make_dense_case(seed), off_pick);
    ASSERT_TRUE(failure.empty()) << failure;
  }
  std::printf(
      "[gpu-cases] dense insert cases diffed: %lld (div_approx elements off the "
      "reference's pick: %lld)\n",
      static_cast<long long>(n), static_cast<long long>(off_pick));
}

// scale_in_model_dtype in the dense insert: the same random cases with the scale rounded to the
// activation dtype first (scale none becomes divide, so that a scale applies). The reference's
// bytes differ from those of the unrounded scale on some cases (checked on the host), and the GPU
// follows the rounded one.
TEST(DenseInsert, ScaleInModelDtypeMatchesReference) {
  std::vector<std::pair<std::uint64_t, oracle::DenseCase>> cases;
  std::int64_t telling = 0;
  for (std::uint64_t i = 0; i < 120; ++i) {
    const std::uint64_t seed = 0x5CA1E000ull + i;
    oracle::DenseCase ic = oracle::make_dense_case(seed);
    if (ic.config.kv.scale_mode == spec::ScaleMode::kNone)
      ic.config.kv.scale_mode = spec::ScaleMode::kDivide;
    const reference::PagedCacheLayout layout(ic.config);
    spec::LayerCaches plain = oracle::make_layer_caches(layout, 0, spec::LayerKind::kDense);
    spec::LayerCaches rounded = plain;
    reference::dense_insert(ic.config, ic.in, plain);
    ic.config.kv.scale_in_model_dtype = true;
    reference::dense_insert(ic.config, ic.in, rounded);
    for (std::size_t b = 0; b < plain.buffers.size(); ++b)
      telling += plain.buffers[b].storage != rounded.buffers[b].storage ? 1 : 0;
    cases.emplace_back(seed, std::move(ic));
  }
  ASSERT_GT(telling, 0) << "no case tells the rounded scale from the given one";
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  std::int64_t off_pick = 0;
  for (const auto& [seed, ic] : cases) {
    const std::string failure = run_dense(seed, ic, off_pick);
    ASSERT_TRUE(failure.empty()) << failure;
  }
}

}  // namespace
}  // namespace kvo

namespace kvo {
namespace {

// vLLM's arithmetic on the GPU (cuda-dense-engine: fma squares per lane, an xor butterfly, rsqrtf,
// the rope in plain operators): not bit-exact with the canonical kernel on some cases, and
// accepted on every case as a foreign dense insert by SPEC 4's admissible sets around the float64
// truth (the GPU twin of cpu-dense-engine).
TEST(DenseInsert, EngineArithmeticIsForeignAndAccepted) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  std::int64_t differing_cases = 0;
  for (std::uint64_t i = 0; i < 60; ++i) {
    const oracle::DenseCase dc = oracle::make_dense_case(0xE61E0000ull + i);
    if (dc.config.geometry.head_dim > 256) continue;
    const reference::PagedCacheLayout layout(dc.config);
    spec::LayerCaches canonical = oracle::make_layer_caches(layout, 0, spec::LayerKind::kDense);
    spec::LayerCaches engine = canonical;
    const spec::HostTensor q1 = gpu::dense_insert_host(dc.config, dc.in, canonical);
    const spec::HostTensor q2 = gpu::dense_insert_engine_host(dc.config, dc.in, engine);
    bool same = q1.bytes == q2.bytes;
    for (std::size_t b = 0; b < canonical.buffers.size(); ++b)
      same = same && canonical.buffers[b].storage == engine.buffers[b].storage;
    differing_cases += same ? 0 : 1;
  }
  EXPECT_GT(differing_cases, 0) << "the engine arithmetic never left the canonical bytes";
  oracle::CheckOptions o;
  o.seed = 0xE61E;
  o.cases = 300;
  o.ops = {spec::Op::kDense};
  o.subjects = {"cuda-dense-engine"};
  oracle::SubjectList subjects = oracle::make_cuda_subjects();
  const oracle::CheckReport report = oracle::run_check(o, subjects);
  EXPECT_EQ(report.worst, spec::Outcome::kPass) << report.summary();
  std::printf(
      "[gpu-cases] cuda-dense-engine (foreign, admissible sets): 300 cases; %lld of 60 "
      "differ from the canonical kernel's bytes\n",
      static_cast<long long>(differing_cases));
}

}  // namespace
}  // namespace kvo
