// The cache diff (SPEC 7) on planted bugs: the report must name the right layer, buffer, block,
// offset, head and dim, both values, and the token responsible.
#include <gtest/gtest.h>

#include "kvo/oracle/cache_diff.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"

namespace kvo::oracle {
namespace {

using spec::BufferKind;

spec::HostTensor iota_tensor(std::vector<std::int64_t> shape, float base) {
  spec::HostTensor t;
  t.dtype = spec::DType::kF32;
  t.shape = std::move(shape);
  const std::int64_t n = t.numel();
  t.bytes.resize(static_cast<std::size_t>(n) * 4);
  for (std::int64_t i = 0; i < n; ++i) {
    reference::store_code(reference::bits_of(base + static_cast<float>(i)), spec::DType::kF32,
                          &t.bytes[static_cast<std::size_t>(i) * 4]);
  }
  return t;
}

struct Fixture {
  spec::ModelConfig config;
  spec::LayerWrite write;
};

/// nb = 4, bs = 2, nkv = 2, hd = 8, f32 activations (values 1, 2, 3, ...), bf16 cache.
Fixture fixture(spec::KvLayout layout, std::vector<std::int64_t> slots) {
  Fixture f;
  f.config.layers = {spec::LayerKind::kDense};
  f.config.geometry = {4, 2, 2, 8, 128};
  f.config.act_dtype = spec::DType::kF32;
  f.config.layout = layout;
  const auto rows = static_cast<std::int64_t>(slots.size());
  f.write.k = iota_tensor({rows, 2, 8}, 1.0f);
  f.write.v = iota_tensor({rows, 2, 8}, -100.0f);
  f.write.slots.slots = std::move(slots);
  f.write.k_scale = {1.0f};
  f.write.v_scale = {1.0f};
  return f;
}

CacheDiff run_planted(const Fixture& f, const std::function<void(spec::LayerCaches&)>& buggy) {
  const reference::PagedCacheLayout layout(f.config);
  spec::LayerCaches expected = oracle::make_layer_caches(layout, 0, spec::LayerKind::kDense);
  spec::LayerCaches actual = expected;
  reference::write_layer(f.config, f.write, expected);
  buggy(actual);
  return diff_layer_caches(layout, 0, expected, actual, &f.write);
}

TEST(CacheDiff, IdenticalCachesReportNothing) {
  const Fixture f = fixture(spec::KvLayout::kNhd, {3, 0});
  const CacheDiff d =
      run_planted(f, [&](spec::LayerCaches& c) { reference::write_layer(f.config, f.write, c); });
  EXPECT_TRUE(d.equal());
  EXPECT_FALSE(d.first.has_value());
  EXPECT_GT(d.compared_bytes, 0);
}

TEST(CacheDiff, MinusOneThatWrapsIsNamedAtTheLastSlot) {
  // The vllm#43810 class: padding -1 indexed from the end overwrites block 3, offset 1.
  const Fixture f = fixture(spec::KvLayout::kNhd, {0, -1});
  const CacheDiff d = run_planted(f, [&](spec::LayerCaches& c) {
    spec::ModelConfig wrapping = f.config;
    wrapping.slot_mode = spec::SlotMode::kLegacyWrap;
    reference::write_layer(wrapping, f.write, c);
  });
  ASSERT_FALSE(d.equal());
  ASSERT_TRUE(d.first.has_value());
  const ByteMismatch& m = *d.first;
  EXPECT_EQ(m.buffer, BufferKind::kK);
  EXPECT_EQ(m.guard_distance, 0);
  EXPECT_EQ(m.coord.block, 3);
  EXPECT_EQ(m.coord.offset, 1);
  EXPECT_EQ(m.coord.head, 0);
  EXPECT_EQ(m.coord.dim, 0);
  EXPECT_NE(m.writer.find("no token of this call maps to slot 7"), std::string::npos) << m.writer;
  // Token 1's row is (2 heads x 8) further on: its first K value is 17 = bf16 0x4188.
  EXPECT_EQ(m.actual_code, 0x4188u);
  EXPECT_EQ(m.actual_value, "17");
  // K and V each carry one wrongly written slot: 2 heads x 8 dims x 2 bytes.
  EXPECT_EQ(d.buffers.size(), 2u);
  EXPECT_LE(d.differing_bytes, 2 * 32);
  EXPECT_NE(d.report().find("layer 0, buffer=k block=3 offset=1 kv=K head=0 dim=0"),
            std::string::npos)
      << d.report();
}

TEST(CacheDiff, OffByOneOffsetNamesTheTokenThatShouldHaveWritten) {
  const Fixture f = fixture(spec::KvLayout::kNhd, {4});
  const CacheDiff d = run_planted(f, [&](spec::LayerCaches& c) {
    spec::LayerWrite shifted = f.write;
    shifted.slots.slots = {5};
    reference::write_layer(f.config, shifted, c);
  });
  ASSERT_TRUE(d.first.has_value());
  const ByteMismatch& m = *d.first;
  EXPECT_EQ(m.coord.block, 2);
  EXPECT_EQ(m.coord.offset, 0);
  EXPECT_EQ(m.coord.head, 0);
  EXPECT_EQ(m.coord.dim, 0);
  EXPECT_EQ(m.expected_code, 0x3F80u);  // bf16(1.0), token 0's first K element
  EXPECT_NE(m.writer.find("token 0 (slot_mapping[0] = 4) should have written slot 4"),
            std::string::npos)
      << m.writer;
}

TEST(CacheDiff, HndNhdStrideSwapIsLocatedInTheExpectedLayout) {
  const Fixture f = fixture(spec::KvLayout::kHnd, {1});
  const CacheDiff d = run_planted(f, [&](spec::LayerCaches& c) {
    spec::ModelConfig swapped = f.config;
    swapped.layout = spec::KvLayout::kNhd;  // same buffer sizes, other strides
    reference::write_layer(swapped, f.write, c);
  });
  ASSERT_TRUE(d.first.has_value());
  // HND element ((0*2 + 0)*2 + 1)*8 + 0 = 8 is (block 0, offset 1, head 0, dim 0); NHD put head 1
  // of offset 0 there instead... it left it poisoned: NHD writes elements 16..31 for slot 1.
  EXPECT_EQ(d.first->coord.block, 0);
  EXPECT_EQ(d.first->coord.offset, 1);
  EXPECT_EQ(d.first->coord.head, 0);
  EXPECT_EQ(d.first->coord.dim, 0);
  EXPECT_EQ(d.first->byte, 16);
}

TEST(CacheDiff, GuardBandWriteIsReportedAsSuch) {
  const Fixture f = fixture(spec::KvLayout::kPackedHnd, {2});
  const CacheDiff d = run_planted(f, [&](spec::LayerCaches& c) {
    reference::write_layer(f.config, f.write, c);
    spec::CacheBuffer& kv = *c.find(BufferKind::kKv);
    kv.storage[static_cast<std::size_t>(kv.guard_bytes + kv.body_bytes() + 3)] ^=
        0x40;  // a 4th byte past the end
  });
  ASSERT_TRUE(d.first.has_value());
  EXPECT_EQ(d.first->buffer, BufferKind::kKv);
  EXPECT_EQ(d.first->guard_distance, 4);
  ASSERT_EQ(d.buffers.size(), 1u);
  EXPECT_EQ(d.buffers[0].guard_bytes, 1);
  EXPECT_NE(d.report().find("3 bytes past its end"), std::string::npos) << d.report();
}

TEST(CacheDiff, Fp8ValuesAreDecodedInTheReport) {
  Fixture f = fixture(spec::KvLayout::kNhd, {0});
  f.config.kv.cache_dtype = spec::DType::kFp8E4M3;
  const CacheDiff d = run_planted(f, [&](spec::LayerCaches& c) {
    reference::write_layer(f.config, f.write, c);
    c.find(BufferKind::kV)->body()[1] ^= 0x01;  // V[0][0][1] = -99 -> 0xEC (-96); 0xED is -104
  });
  ASSERT_TRUE(d.first.has_value());
  EXPECT_EQ(d.first->buffer, BufferKind::kV);
  EXPECT_EQ(d.first->coord.dim, 1);
  EXPECT_EQ(d.first->expected_code, 0xECu);
  EXPECT_EQ(d.first->actual_code, 0xEDu);
  EXPECT_EQ(d.first->expected_value, "-96");
  EXPECT_EQ(d.first->actual_value, "-104");
  EXPECT_EQ(d.differing_bytes, 1);
}

}  // namespace
}  // namespace kvo::oracle
