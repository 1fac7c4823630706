// A seed names the same case in every version: a reproduce line printed by an older kvoracle (a CI
// log, an issue) must still rebuild the case that failed. Each op's first 40 cases of the default
// campaign seed, as their case files hold them (configuration, inputs, caches and the reference's
// answer: OpDriver::encode_case), hash to the value recorded when the generator last changed on
// purpose. A change that moves a hash changes what old seeds mean: it is a change of the case
// distribution, to be made knowingly and said in docs/changes.md, never as a side effect of a
// refactor or a speed-up.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/case_tensors.hpp"
#include "kvo/oracle/op_driver.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/reference/generator.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {
namespace {

/// FNV-1a over a byte string, then SplitMix64's finaliser into the running hash.
std::uint64_t fold(std::uint64_t h, const void* data, std::size_t n) {
  std::uint64_t f = 0xCBF29CE484222325ull;
  const auto* p = static_cast<const std::uint8_t*>(data);
  for (std::size_t i = 0; i < n; ++i) f = (f ^ p[i]) * 0x100000001B3ull;
  return reference::mix64(h ^ f ^ n);
}
std::uint64_t fold(std::uint64_t h, const std::string& s) { return fold(h, s.data(), s.size()); }

/// The first `n` case seeds of the default campaign.
std::vector<std::uint64_t> default_case_seeds(std::uint64_t n) {
  const CheckOptions defaults;
  std::vector<std::uint64_t> seeds;
  for (std::uint64_t i = 0; i < n; ++i) seeds.push_back(case_seed(defaults.seed, i));
  return seeds;
}

/// The hash of `cases` cases of `op` drawn as the default campaign draws them (huge cases, whose
/// lazy caches no case file holds, count by their seed alone).
std::uint64_t case_hash(spec::Op op, std::int64_t cases) {
  const OpDriver& driver = driver_of(op);
  const CheckOptions defaults;
  std::uint64_t h = 0;
  for (std::int64_t i = 0; i < cases; ++i) {
    const std::uint64_t seed = case_seed(defaults.seed, static_cast<std::uint64_t>(i));
    h = fold(h, &seed, sizeof seed);
    const auto c = driver.prepare(seed, defaults.overrides);
    TensorSet set;
    TensorWriter out(set);
    try {
      driver.encode_case(*c, out);
    } catch (const spec::Unsupported&) {
      continue;
    }
    for (const auto& [key, value] : set.metadata) h = fold(fold(h, key), value);
    for (const NamedTensor& t : set.tensors) {
      h = fold(h, t.name);
      h = fold(h, t.shape.data(), t.shape.size() * sizeof t.shape[0]);
      h = fold(h, t.bytes.data(), t.bytes.size());
    }
  }
  return h;
}

struct Recorded {
  spec::Op op;
  std::uint64_t hash;
};

TEST(CaseStability, EachOpsCasesAreTheRecordedOnes) {
  constexpr Recorded kRecorded[] = {
      {spec::Op::kWrite, 0x5189BA0AF57F5298ull},
      {spec::Op::kDense, 0x3DEC22CE2922B356ull},
      // Read cases moved on 2026-12-07 (issue 54): production widths (topk 16 in a third of the
      // cases, 7-15 in a sixth) and the ties theme's rows of up to 48 blocks cut at 16
      // (docs/changes.md); then the long theme's 1-token rows cut at topk 2048 (DeepSeek-V3.2).
      {spec::Op::kIndexer, 0xC0EF9296696B0F23ull},
      {spec::Op::kAttention, 0x530BFFDC64BD4C7Aull},
  };
  for (const Recorded& r : kRecorded) {
    const std::uint64_t h = case_hash(r.op, 40);
    char text[32];
    std::snprintf(text, sizeof text, "0x%016llX", static_cast<unsigned long long>(h));
    EXPECT_EQ(h, r.hash) << spec::name_of(r.op)
                         << ": the first 40 cases of seed 0x6B766F72 hash to " << text
                         << ", not the recorded value: this change moves what a seed "
                         << "means (see the comment at the top of this file)";
  }
}

// The GPU tier's resident path draws a write case without its values and generates them on the
// device from WriteCase::values: filled on the host, they are the bytes the case was drawn with,
// zero rows and CUDA-graph padding rows included.
TEST(CaseStability, AWriteCaseDrawnWithoutValuesFillsToTheSameCase) {
  std::int64_t zero_rows = 0, padded = 0;
  for (const std::uint64_t seed : default_case_seeds(200)) {
    const WriteCase drawn = make_write_case(seed, {});
    WriteCase deferred = make_write_case(seed, {}, CaseValues::kDeferred);
    ASSERT_TRUE(deferred.values.has_value());
    ASSERT_EQ(deferred.writes.size(), drawn.writes.size());
    EXPECT_TRUE(deferred.writes.front().k.bytes.empty()) << "seed " << seed;
    fill_write_values(deferred);
    EXPECT_EQ(deferred.describe(), drawn.describe());
    for (std::size_t l = 0; l < drawn.writes.size(); ++l) {
      const spec::LayerWrite& a = drawn.writes[l];
      const spec::LayerWrite& b = deferred.writes[l];
      ASSERT_EQ(a.k.bytes, b.k.bytes) << "seed " << seed << " layer " << l;
      ASSERT_EQ(a.v.bytes, b.v.bytes) << "seed " << seed << " layer " << l;
      ASSERT_EQ(a.index_k.bytes, b.index_k.bytes) << "seed " << seed << " layer " << l;
      ASSERT_EQ(a.k.shape, b.k.shape);
      ASSERT_EQ(a.slots.slots, b.slots.slots);
      ASSERT_EQ(a.index_slots.slots, b.index_slots.slots);
      ASSERT_EQ(a.k_scale, b.k_scale);
      ASSERT_EQ(a.v_scale, b.v_scale);
    }
    zero_rows += drawn.zero_rows > 0;
    padded += drawn.values->row_keys.size() > drawn.writes.front().slots.slots.size();
  }
  EXPECT_GT(zero_rows, 20) << "the comparison reached cases with all-zero rows";
  EXPECT_GT(padded, 20) << "... and source rows past the slot mapping";
}

// The GPU tier's resident read path draws a read case without writing its caches and writes them
// on the device from ReadCase::values: the deferred draw is the same case (inputs, table, scales,
// the rows' keys, slots, bias and planted patches) with nothing held on the host.
TEST(CaseStability, AReadCaseDrawnWithoutValuesIsTheSameCase) {
  std::int64_t patched = 0, biased = 0;
  for (const std::uint64_t seed : default_case_seeds(200)) {
    const ReadCase drawn = make_read_case(seed, {});
    const ReadCase deferred = make_read_case(seed, {}, CaseValues::kDeferred);
    ASSERT_EQ(deferred.describe(), drawn.describe()) << "seed " << seed;
    EXPECT_EQ(deferred.index_q.bytes, drawn.index_q.bytes) << "seed " << seed;
    EXPECT_EQ(deferred.q.bytes, drawn.q.bytes) << "seed " << seed;
    EXPECT_EQ(deferred.batch.block_table, drawn.batch.block_table) << "seed " << seed;
    EXPECT_EQ(deferred.batch.seq_lens, drawn.batch.seq_lens) << "seed " << seed;
    EXPECT_EQ(deferred.k_scale, drawn.k_scale) << "seed " << seed;
    EXPECT_EQ(deferred.v_scale, drawn.v_scale) << "seed " << seed;
    const ReadCaseValues& a = drawn.values;
    const ReadCaseValues& b = deferred.values;
    ASSERT_EQ(a.keys.size(), b.keys.size()) << "seed " << seed;
    for (std::size_t k = 0; k < a.keys.size(); ++k) {
      ASSERT_EQ(a.keys[k].request, b.keys[k].request) << "seed " << seed << " key " << k;
      ASSERT_EQ(a.keys[k].position, b.keys[k].position) << "seed " << seed << " key " << k;
    }
    EXPECT_EQ(a.slots.slots, b.slots.slots) << "seed " << seed;
    EXPECT_EQ(a.v_bias, b.v_bias) << "seed " << seed;
    ASSERT_EQ(a.patches.size(), b.patches.size()) << "seed " << seed;
    for (std::size_t k = 0; k < a.patches.size(); ++k) {
      EXPECT_EQ(a.patches[k].tensor, b.patches[k].tensor) << "seed " << seed << " patch " << k;
      EXPECT_EQ(a.patches[k].row, b.patches[k].row) << "seed " << seed << " patch " << k;
      EXPECT_EQ(a.patches[k].element, b.patches[k].element) << "seed " << seed << " patch " << k;
      EXPECT_EQ(a.patches[k].code, b.patches[k].code) << "seed " << seed << " patch " << k;
    }
    ASSERT_EQ(deferred.caches.buffers.size(), drawn.caches.buffers.size());
    for (const spec::CacheBuffer& buf : deferred.caches.buffers) {
      EXPECT_TRUE(buf.storage.is_lazy() && buf.storage.materialised().empty())
          << "seed " << seed << ": a deferred case holds " << spec::name_of(buf.kind) << " bytes";
    }
    patched += !a.patches.empty();
    biased += a.v_bias != 0.0f;
  }
  EXPECT_GT(patched, 5) << "the comparison reached cases with planted rows";
  EXPECT_GT(biased, 5) << "... and biased value rows";
}

}  // namespace
}  // namespace kvo::oracle
