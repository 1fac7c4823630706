// Paged-cache layouts (SPEC 3): offsets worked out by hand on a tiny geometry, buffer sets and
// sizes. The inverse, guards and poison belong to the oracle's harness (test_harness.cpp).
#include <gtest/gtest.h>

#include "../common/tiny.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::reference {
namespace {

using spec::BufferKind;
using spec::KvLayout;

using testing::tiny;  // nb = 2 blocks, bs = 3, nkv = 2 heads, hd = 8

struct HandOffset {
  KvLayout layout;
  std::int64_t k_element;  // of (b=1, o=0, h=1, d=3)
  std::int64_t v_element;
};

// Worked by hand from SPEC 3's formulas for (b, o, h, d) = (1, 0, 1, 3):
//  nhd        ((1*3 + 0)*2 + 1)*8 + 3                 = 59 (K and V in separate buffers)
//  hnd        ((1*2 + 1)*3 + 0)*8 + 3                 = 75
//  packed_hnd ((1*2 + 1)*3 + 0)*16 + kv*8 + 3         = 147 / 155
//  packed_nhd ((1*3 + 0)*2 + 1)*16 + kv*8 + 3         = 115 / 123
//  split_nhd  (((1*2 + kv)*3 + 0)*2 + 1)*8 + 3        = 107 / 155
//  split_hnd  (((1*2 + kv)*2 + 1)*3 + 0)*8 + 3        = 123 / 171
const HandOffset kHand[] = {{KvLayout::kNhd, 59, 59},         {KvLayout::kHnd, 75, 75},
                            {KvLayout::kPackedHnd, 147, 155}, {KvLayout::kPackedNhd, 115, 123},
                            {KvLayout::kSplitNhd, 107, 155},  {KvLayout::kSplitHnd, 123, 171}};

TEST(PagedCacheLayout, KvOffsetsMatchHandWorkedValues) {
  for (const HandOffset& h : kHand) {
    const PagedCacheLayout layout(tiny(h.layout));
    EXPECT_EQ(layout.kv_element(0, 1, 0, 1, 3), h.k_element) << spec::name_of(h.layout);
    EXPECT_EQ(layout.kv_element(1, 1, 0, 1, 3), h.v_element) << spec::name_of(h.layout);
  }
}

TEST(PagedCacheLayout, BufferSetsAndSizes) {
  spec::ModelConfig c = tiny(KvLayout::kNhd);
  c.kv.cache_dtype = spec::DType::kBF16;
  const PagedCacheLayout nhd(c);
  EXPECT_EQ(nhd.buffers(spec::LayerKind::kDense),
            (std::vector<BufferKind>{BufferKind::kK, BufferKind::kV}));
  EXPECT_EQ(nhd.buffer_bytes(BufferKind::kK), 2 * 3 * 2 * 8 * 2);
  c.layout = KvLayout::kSplitHnd;
  c.kv.cache_dtype = spec::DType::kFp8E4M3;
  const PagedCacheLayout split(c);
  EXPECT_EQ(split.buffers(spec::LayerKind::kSparse),
            (std::vector<BufferKind>{BufferKind::kKv, BufferKind::kIndexK}));
  EXPECT_EQ(split.buffer_bytes(BufferKind::kKv), 2 * 2 * 3 * 2 * 8);
  // Flat bf16 index-K [nb, bs, index_dim].
  EXPECT_EQ(split.buffer_bytes(BufferKind::kIndexK), 2 * 3 * 256 * 2);
}

TEST(PagedCacheLayout, IndexFlatAndBlockScaleOffsets) {
  spec::ModelConfig c = tiny(KvLayout::kNhd);
  c.index.flat_dtype = spec::DType::kBF16;
  const PagedCacheLayout flat(c);
  // ((1*3 + 2)*256 + 5) elements of 2 bytes.
  EXPECT_EQ(flat.index_value_byte(1, 2, 5), (5 * 256 + 5) * 2);

  c.index.layout = spec::IndexLayout::kBlockScale;
  const PagedCacheLayout bsl(c);
  // A block: 3*256 fp8 values then 3*2 fp32 scales = 768 + 24 = 792 bytes.
  EXPECT_EQ(bsl.blockscale_block_bytes(), 792);
  EXPECT_EQ(bsl.buffer_bytes(BufferKind::kIndexK), 2 * 792);
  EXPECT_EQ(bsl.index_value_byte(1, 2, 5), 792 + 2 * 256 + 5);
  // Token 2, group 1: 792 + 768 + (2*2 + 1)*4. Not token-interleaved (the vLLM trap).
  EXPECT_EQ(bsl.index_scale_byte(1, 2, 1), 792 + 768 + 20);
}

}  // namespace
}  // namespace kvo::reference
