// The oracle's cache harness (kvo/oracle/harness.hpp, moved out of reference/): the inverse of the
// SPEC 3 offsets (locate) by hand and as a property over random configurations, the checked
// forward offset, the model arena, guards and poison.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "../common/tiny.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {
namespace {

using reference::PagedCacheLayout;
using spec::BufferKind;
using spec::KvLayout;

using testing::tiny;  // nb = 2 blocks, bs = 3, nkv = 2 heads, hd = 8

TEST(Harness, LocateNamesScaleBytes) {
  spec::ModelConfig c = tiny(KvLayout::kNhd);
  c.index.layout = spec::IndexLayout::kBlockScale;
  const PagedCacheLayout layout(c);
  const auto coord = locate(layout, BufferKind::kIndexK, 792 + 768 + 20 + 3);
  ASSERT_TRUE(coord.has_value());
  EXPECT_TRUE(coord->is_scale);
  EXPECT_EQ(coord->block, 1);
  EXPECT_EQ(coord->offset, 2);
  EXPECT_EQ(coord->group, 1);
  EXPECT_EQ(coord->byte_in_element, 3);
  EXPECT_FALSE(locate(layout, BufferKind::kIndexK, 2 * 792).has_value());
  EXPECT_FALSE(locate(layout, BufferKind::kKv, 0).has_value());  // nhd has no single KV tensor
}

TEST(Harness, ByteOffsetRejectsCoordinatesOutsideTheGeometry) {
  const PagedCacheLayout layout(tiny(KvLayout::kNhd));
  ElementCoord c;
  c.buffer = BufferKind::kK;
  c.kv = 0;
  c.block = 2;  // nb = 2
  c.offset = 0;
  c.head = 0;
  c.dim = 0;
  try {
    byte_offset(layout, c);
    FAIL() << "expected InvalidInput";
  } catch (const spec::InvalidInput& e) {
    EXPECT_EQ(e.field(), "block");
    EXPECT_EQ(e.value(), "2");
  }
  c.block = 0;
  c.buffer = BufferKind::kV;  // kv = 0 lives in K
  EXPECT_THROW(byte_offset(layout, c), spec::InvalidInput);
}

TEST(Harness, ArenaIsLayerMajor) {
  spec::ModelConfig c = tiny(KvLayout::kNhd);
  c.layers = spec::parse_layer_mix("DS");
  const PagedCacheLayout layout(c);
  const std::int64_t kv = layout.buffer_bytes(BufferKind::kK);
  const std::int64_t idx = layout.buffer_bytes(BufferKind::kIndexK);
  EXPECT_EQ(arena_bytes(layout), 4 * kv + idx);
  EXPECT_EQ(arena_offset(layout, {1, BufferKind::kV, 7}), 3 * kv + 7);
  const auto at = locate_arena(layout, 4 * kv + 5);
  ASSERT_TRUE(at.has_value());
  EXPECT_EQ(at->layer, 1);
  EXPECT_EQ(at->buffer, BufferKind::kIndexK);
  EXPECT_EQ(at->byte, 5);
  EXPECT_FALSE(locate_arena(layout, 4 * kv + idx).has_value());
  EXPECT_THROW(arena_offset(layout, {0, BufferKind::kIndexK, 0}),
               spec::InvalidInput);  // dense layer
}

TEST(Harness, BuffersArePoisonedWithGuards) {
  const PagedCacheLayout layout(tiny(KvLayout::kPackedHnd));
  const spec::LayerCaches caches = make_layer_caches(layout, 3, spec::LayerKind::kSparse);
  ASSERT_EQ(caches.buffers.size(), 2u);
  for (const spec::CacheBuffer& b : caches.buffers) {
    EXPECT_EQ(b.guard_bytes, spec::kGuardBytes);
    EXPECT_EQ(b.body_bytes(), layout.buffer_bytes(b.kind));
    const std::uint64_t salt = poison_salt(3, b.kind);
    int distinct = 0;
    for (std::int64_t i = 0; i < b.storage.size(); ++i) {
      ASSERT_EQ(b.storage[i], poison_byte(salt, i)) << i;
      distinct += i > 0 && b.storage[i] != b.storage[i - 1];
    }
    EXPECT_GT(distinct, static_cast<int>(b.storage.size() / 2));  // not a constant fill
  }
  EXPECT_NE(poison_salt(0, BufferKind::kK), poison_salt(1, BufferKind::kK));
}

// The inverse of every byte offset is the coordinate it came from, in every layout.
RC_GTEST_PROP(Harness, LocateInvertsByteOffset, ()) {
  spec::ModelConfig c;
  c.layers = {spec::LayerKind::kSparse};
  c.geometry.num_blocks = *rc::gen::inRange<std::int64_t>(1, 5);
  c.geometry.block_size = *rc::gen::inRange<std::int64_t>(1, 20);
  c.geometry.num_kv_heads = *rc::gen::inRange<std::int64_t>(1, 4);
  c.geometry.head_dim = 8 * *rc::gen::inRange<std::int64_t>(1, 4);
  c.layout = *rc::gen::element(KvLayout::kNhd, KvLayout::kHnd, KvLayout::kPackedHnd,
                               KvLayout::kPackedNhd, KvLayout::kSplitNhd, KvLayout::kSplitHnd);
  c.kv.cache_dtype =
      *rc::gen::element(spec::DType::kBF16, spec::DType::kFp8E4M3, spec::DType::kF32);
  c.index.layout = *rc::gen::element(spec::IndexLayout::kFlat, spec::IndexLayout::kBlockScale);
  c.geometry.index_dim = c.index.layout == spec::IndexLayout::kBlockScale
                             ? 128 * *rc::gen::inRange<std::int64_t>(1, 3)
                             : 8 * *rc::gen::inRange<std::int64_t>(1, 5);
  const PagedCacheLayout layout(c);
  for (BufferKind b : layout.buffers(spec::LayerKind::kSparse)) {
    std::vector<bool> seen(static_cast<std::size_t>(layout.buffer_bytes(b)), false);
    for (std::int64_t byte = 0; byte < layout.buffer_bytes(b); ++byte) {
      const auto coord = locate(layout, b, byte);
      RC_ASSERT(coord.has_value());
      const std::int64_t back = byte_offset(layout, *coord);
      RC_ASSERT(back == byte);
      seen[static_cast<std::size_t>(back)] = true;
    }
    for (bool s : seen) RC_ASSERT(s);
  }
}

// SPEC 3 strided views by hand: nhd, 2 blocks of 2 tokens, 1 head of 8 dims, bf16; head stride 8,
// token stride 16 (8 elements of padding after each token), block stride 40 (8 more after the
// block), offset 4: element (b, o, 0, d) at 4 + 40 b + 16 o + d; the body is 4 + 2 * 40 elements.
TEST(Harness, StridedViewsPutElementsAtTheirStridesAndNamePadding) {
  spec::ModelConfig c;
  c.layers = {spec::LayerKind::kDense};
  c.geometry = {2, 2, 1, 8, 8};
  c.layout = KvLayout::kNhd;
  c.kv_strides = {40, 16, 8, 0, 4};
  const PagedCacheLayout layout(c);
  EXPECT_EQ(layout.buffer_bytes(BufferKind::kK), (4 + 2 * 40) * 2);
  EXPECT_EQ(layout.kv_element(0, 1, 1, 0, 3), 4 + 40 + 16 + 3);
  // V's element (block 1, offset 1, head 0, dim 3), its byte 1.
  const auto expect_v_element = [](const std::optional<ElementCoord>& e) {
    ASSERT_TRUE(e.has_value());
    EXPECT_FALSE(e->padding);
    EXPECT_EQ(e->kv, 1);
    EXPECT_EQ(e->block, 1);
    EXPECT_EQ(e->offset, 1);
    EXPECT_EQ(e->dim, 3);
    EXPECT_EQ(e->byte_in_element, 1);
  };
  expect_v_element(locate(layout, BufferKind::kV, (4 + 40 + 16 + 3) * 2 + 1));
  for (std::int64_t e : {0, 3, 4 + 8, 4 + 16 + 8, 4 + 32, 4 + 40 + 32 + 7}) {
    const auto pad = locate(layout, BufferKind::kK, e * 2);
    ASSERT_TRUE(pad.has_value()) << e;
    EXPECT_TRUE(pad->padding) << e;
  }
  EXPECT_NE(locate(layout, BufferKind::kK, (4 + 16 + 8) * 2)->describe().find("padding"),
            std::string::npos);
  // nhd as one allocation, vLLM's [2, nb, ...] with padding: V 100 elements after K (K's view
  // spans 64), the buffer one KV tensor of offset + 2 x 100 elements.
  spec::ModelConfig one = c;
  one.kv_strides = {40, 16, 8, 100, 4};
  const PagedCacheLayout one_layout(one);
  EXPECT_EQ(one_layout.buffers(spec::LayerKind::kDense), std::vector<BufferKind>{BufferKind::kKv});
  EXPECT_EQ(one_layout.buffer_bytes(BufferKind::kKv), (4 + 2 * 100) * 2);
  EXPECT_EQ(one_layout.kv_element(1, 1, 1, 0, 3), 4 + 100 + 40 + 16 + 3);
  expect_v_element(locate(one_layout, BufferKind::kKv, (4 + 100 + 40 + 16 + 3) * 2 + 1));
  for (std::int64_t e : {4 + 64, 4 + 99, 4 + 100 + 64, 4 + 199}) {
    EXPECT_TRUE(locate(one_layout, BufferKind::kKv, e * 2)->padding) << e;
  }
  // Bad views: a stride below the extent inside it (elements would share bytes), V over K in one
  // allocation, a packed row's halves apart, a negative offset.
  const auto rejects = [&](spec::KvLayout l, spec::KvStrides s, const char* field) {
    spec::ModelConfig bad = c;
    bad.layout = l;
    bad.kv_strides = s;
    try {
      spec::validate(bad);
      ADD_FAILURE() << field << " accepted";
    } catch (const spec::InvalidInput& e) {
      EXPECT_EQ(e.field(), field) << e.what();
    }
  };
  rejects(KvLayout::kNhd, {40, 16, 7, 0, 0}, "kv_strides.head");
  rejects(KvLayout::kNhd, {40, 7, 8, 0, 0}, "kv_strides.token");
  rejects(KvLayout::kNhd, {23, 16, 8, 0, 0}, "kv_strides.block");
  rejects(KvLayout::kNhd, {40, 16, 8, 8, 0}, "kv_strides.kv_part");
  rejects(KvLayout::kPackedNhd, {80, 32, 16, 9, 0}, "kv_strides.kv_part");
  rejects(KvLayout::kSplitNhd, {40, 8, 8, 8, 0}, "kv_strides.kv_part");  // V over K's token 1
  rejects(KvLayout::kNhd, {40, 16, 8, 0, -1}, "kv_strides.offset");
  EXPECT_EQ(spec::parse_kv_strides(spec::kv_strides_text(c.kv_strides), "f"), c.kv_strides);
  EXPECT_TRUE(spec::parse_kv_strides("dense", "f").dense());
  for (const char* text : {"1,2,3,4", "1,2,3,4,5,6", "a,2,3,4,5", "1,,3,4,5", ""})
    EXPECT_THROW(spec::parse_kv_strides(text, "--kv-strides"), spec::InvalidInput) << text;
}

// SPEC 3 strided index-K views by hand. Flat bf16, 2 blocks of 2 tokens, index_dim 8: token stride
// 16, block stride 40, offset 4: element (b, o, d) at 4 + 40 b + 16 o + d. Blockscale, 2 blocks of
// 1 token, index_dim 128: a block's 128 value bytes and 4 scale bytes, block stride 144, offset 16.
TEST(Harness, StridedIndexViewsPutRowsAtTheirStridesAndNamePadding) {
  spec::ModelConfig c;
  c.layers = {spec::LayerKind::kSparse};
  c.geometry = {2, 2, 1, 8, 8};
  c.index.layout = spec::IndexLayout::kFlat;
  c.index.flat_dtype = spec::DType::kBF16;
  c.index_strides = {40, 16, 4};
  const PagedCacheLayout layout(c);
  EXPECT_EQ(layout.buffer_bytes(BufferKind::kIndexK), (4 + 2 * 40) * 2);
  EXPECT_EQ(layout.index_value_byte(1, 1, 3), (4 + 40 + 16 + 3) * 2);
  const auto e = locate(layout, BufferKind::kIndexK, (4 + 40 + 16 + 3) * 2 + 1);
  ASSERT_TRUE(e.has_value());
  EXPECT_FALSE(e->padding);
  EXPECT_EQ(e->block, 1);
  EXPECT_EQ(e->offset, 1);
  EXPECT_EQ(e->dim, 3);
  EXPECT_EQ(e->byte_in_element, 1);
  for (std::int64_t p : {0, 3, 4 + 8, 4 + 16 + 8, 4 + 32, 4 + 40 + 32 + 7}) {
    const auto pad = locate(layout, BufferKind::kIndexK, p * 2);
    ASSERT_TRUE(pad.has_value()) << p;
    EXPECT_TRUE(pad->padding) << p;
    EXPECT_NE(pad->describe().find("padding"), std::string::npos) << p;
  }
  EXPECT_EQ(locate(layout, BufferKind::kIndexK, (4 + 16 + 8) * 2)->offset, 1);  // after token 1

  spec::ModelConfig bs = c;
  bs.geometry = {2, 1, 1, 8, 128};
  bs.index.layout = spec::IndexLayout::kBlockScale;
  bs.index_strides = {144, 0, 16};
  const PagedCacheLayout bs_layout(bs);
  EXPECT_EQ(bs_layout.buffer_bytes(BufferKind::kIndexK), 16 + 2 * 144);
  EXPECT_EQ(bs_layout.index_value_byte(1, 0, 5), 16 + 144 + 5);
  EXPECT_EQ(bs_layout.index_scale_byte(1, 0, 0), 16 + 144 + 128);
  const auto scale = locate(bs_layout, BufferKind::kIndexK, 16 + 144 + 128 + 2);
  ASSERT_TRUE(scale.has_value());
  EXPECT_TRUE(scale->is_scale);
  EXPECT_EQ(scale->block, 1);
  EXPECT_EQ(scale->byte_in_element, 2);
  for (std::int64_t p : {0, 15, 16 + 132, 16 + 143, 16 + 144 + 132}) {
    EXPECT_TRUE(locate(bs_layout, BufferKind::kIndexK, p)->padding) << p;
  }
  // Bad views: a row or block stride below the extent inside it, a blockscale token stride, a
  // negative offset; each names its field.
  const auto rejects = [&](const spec::ModelConfig& base, spec::IndexStrides s, const char* field) {
    spec::ModelConfig bad = base;
    bad.index_strides = s;
    try {
      spec::validate(bad);
      ADD_FAILURE() << field << " accepted";
    } catch (const spec::InvalidInput& x) {
      EXPECT_EQ(x.field(), field) << x.what();
    }
  };
  rejects(c, {40, 7, 0}, "index_strides.token");
  rejects(c, {23, 16, 0}, "index_strides.block");
  rejects(c, {40, 16, -1}, "index_strides.offset");
  rejects(bs, {144, 128, 0}, "index_strides.token");
  rejects(bs, {131, 0, 0}, "index_strides.block");
  EXPECT_EQ(spec::parse_index_strides(spec::index_strides_text(c.index_strides), "f"),
            c.index_strides);
  EXPECT_TRUE(spec::parse_index_strides("dense", "f").dense());
  for (const char* text : {"1,2", "1,2,3,4", "a,2,3", "1,,3", ""})
    EXPECT_THROW(spec::parse_index_strides(text, "--index-strides"), spec::InvalidInput) << text;
  // A dense-layer model ignores the index view (no index-K buffer to view).
  spec::ModelConfig dense_only = c;
  dense_only.layers = {spec::LayerKind::kDense};
  dense_only.index_strides = {1, 1, -5};
  EXPECT_NO_THROW(spec::validate(dense_only));
}

// Over random configurations and drawn strided views (draw_kv_strides), every byte of a K/V buffer
// is padding or exactly one element's, and byte_offset takes the element back to it; the
// elements are all there.
RC_GTEST_PROP(Harness, StridedLocateIsTheInverseOfByteOffset, ()) {
  spec::ModelConfig c;
  c.layers = {spec::LayerKind::kDense};
  c.geometry.num_blocks = *rc::gen::inRange<std::int64_t>(1, 4);
  c.geometry.block_size = *rc::gen::inRange<std::int64_t>(1, 9);
  c.geometry.num_kv_heads = *rc::gen::inRange<std::int64_t>(1, 4);
  c.geometry.head_dim = 8 * *rc::gen::inRange<std::int64_t>(1, 3);
  c.layout = *rc::gen::element(KvLayout::kNhd, KvLayout::kHnd, KvLayout::kPackedHnd,
                               KvLayout::kPackedNhd, KvLayout::kSplitNhd, KvLayout::kSplitHnd);
  c.kv.cache_dtype =
      *rc::gen::element(spec::DType::kBF16, spec::DType::kFp8E4M3, spec::DType::kF32);
  c.kv_strides = draw_kv_strides(*rc::gen::arbitrary<std::uint64_t>(), c);
  const PagedCacheLayout layout(c);
  const auto eb = layout.element_bytes(layout.kv_buffer(0));
  for (BufferKind b : layout.buffers(spec::LayerKind::kDense)) {
    std::int64_t element_bytes = 0;
    for (std::int64_t byte = 0; byte < layout.buffer_bytes(b); ++byte) {
      const auto coord = locate(layout, b, byte);
      RC_ASSERT(coord.has_value());
      if (coord->padding) continue;
      ++element_bytes;
      RC_ASSERT(byte_offset(layout, *coord) == byte);
    }
    const std::int64_t parts = spec::kv_in_one_tensor(c) ? 2 : 1;  // one allocation: K and V
    RC_ASSERT(element_bytes ==
              parts * c.geometry.capacity() * c.geometry.num_kv_heads * c.geometry.head_dim * eb);
  }
}

// The same for index-K views (draw_index_strides), flat and blockscale.
RC_GTEST_PROP(Harness, StridedIndexLocateIsTheInverseOfByteOffset, ()) {
  spec::ModelConfig c;
  c.layers = {spec::LayerKind::kSparse};
  c.geometry.num_blocks = *rc::gen::inRange<std::int64_t>(1, 4);
  c.geometry.block_size = *rc::gen::inRange<std::int64_t>(1, 9);
  c.index.layout = *rc::gen::element(spec::IndexLayout::kFlat, spec::IndexLayout::kBlockScale);
  c.index.flat_dtype = *rc::gen::element(spec::DType::kBF16, spec::DType::kFp8E4M3);
  c.geometry.index_dim = c.index.layout == spec::IndexLayout::kBlockScale
                             ? 128 * *rc::gen::inRange<std::int64_t>(1, 3)
                             : 8 * *rc::gen::inRange<std::int64_t>(1, 4);
  c.index_strides = draw_index_strides(*rc::gen::arbitrary<std::uint64_t>(), c);
  RC_ASSERT(!c.index_strides.dense());
  const PagedCacheLayout layout(c);
  std::int64_t element_bytes = 0;
  for (std::int64_t byte = 0; byte < layout.buffer_bytes(BufferKind::kIndexK); ++byte) {
    const auto coord = locate(layout, BufferKind::kIndexK, byte);
    RC_ASSERT(coord.has_value());
    if (coord->padding) continue;
    ++element_bytes;
    RC_ASSERT(byte_offset(layout, *coord) == byte);
  }
  const spec::ModelConfig dense = [&] {
    spec::ModelConfig d = c;
    d.index_strides = {};
    return d;
  }();
  RC_ASSERT(element_bytes == PagedCacheLayout(dense).buffer_bytes(BufferKind::kIndexK));
}

}  // namespace
}  // namespace kvo::oracle
