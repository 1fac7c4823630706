// Huge caches (issue 14): lazy storage (spec::ByteStorage) materialises only the pages a case
// touches, so a buffer past 2^32 bytes costs the host a few pages; the diff still sees a stray
// write anywhere in it and names the first mismatch with its coordinates past 2^31 and 2^32.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "kvo/oracle/cache_diff.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/reference/read_path.hpp"
#include "kvo/subjects/cpu_read.hpp"
#include "kvo/subjects/cpu_write.hpp"

namespace kvo::oracle {
namespace {

constexpr std::int64_t kPage = spec::ByteStorage::kPageBytes;

/// Resident set size of this process now, in bytes (/proc/self/statm's second field, in pages).
std::int64_t rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  long size = 0, resident = 0;
  if (f == nullptr || std::fscanf(f, "%ld %ld", &size, &resident) != 2) resident = 0;
  if (f != nullptr) std::fclose(f);
  return static_cast<std::int64_t>(resident) * sysconf(_SC_PAGESIZE);
}

TEST(ByteStorage, LazyBytesMeanPoisonUntilMaterialised) {
  const std::uint64_t salt = 0x1234;
  spec::ByteStorage s = spec::ByteStorage::lazy(10 * kPage + 100, salt);
  ASSERT_TRUE(s.is_lazy());
  EXPECT_TRUE(s.materialised().empty());
  for (std::int64_t i : {std::int64_t{0}, kPage + 3, 10 * kPage + 99}) {
    EXPECT_EQ(s.byte(i), spec::poison_byte(salt, static_cast<std::uint64_t>(i))) << i;
  }
  // Materialising bytes 5000..5001 poisons page 1 as a whole, nothing else.
  s.materialise(5000, 5002);
  ASSERT_EQ(s.materialised(), (std::vector<spec::ByteRange>{{kPage, 2 * kPage}}));
  for (std::int64_t i = kPage; i < 2 * kPage; ++i) {
    ASSERT_EQ(s.data()[i], spec::poison_byte(salt, static_cast<std::uint64_t>(i))) << i;
  }
  // The short last page and a write through the raw pointer.
  s.materialise(10 * kPage + 50, 10 * kPage + 51);
  s.data()[10 * kPage + 99] = 0x42;
  EXPECT_EQ(s.byte(10 * kPage + 99), 0x42);
  // A copy holds the same pages and means the same bytes; a dense storage of the same bytes is
  // the same too.
  const spec::ByteStorage copy = s;
  EXPECT_TRUE(copy.same_as(s));
  EXPECT_EQ(copy.materialised(), s.materialised());
  spec::ByteStorage dense = spec::ByteStorage::poisoned(s.size(), salt, false);
  ASSERT_FALSE(dense.is_lazy());
  EXPECT_FALSE(dense.same_as(s));
  dense[static_cast<std::size_t>(10 * kPage + 99)] = 0x42;
  EXPECT_TRUE(dense.same_as(s));
  EXPECT_TRUE(s.same_as(dense));
}

TEST(ByteStorage, AStrayWriteIntoAPageNobodyMaterialisedIsSeen) {
  const std::uint64_t salt = 99;
  spec::ByteStorage s = spec::ByteStorage::lazy(64 * kPage, salt);
  s.materialise(0, kPage);
  const spec::ByteStorage before = s;
  // A writer with no business on page 40 stores two bytes there, one of them zero. The page is
  // adopted: the nonzero byte differs from its poison; the zero one reads as untouched (the
  // host's blind spot, cache_storage.hpp).
  s.data()[40 * kPage + 7] = static_cast<std::uint8_t>(spec::poison_byte(salt, 40 * kPage + 7) ^ 1);
  s.data()[40 * kPage + 9] = 0;
  EXPECT_FALSE(s.same_as(before));
  EXPECT_EQ(s.materialised(), (std::vector<spec::ByteRange>{{0, kPage}, {40 * kPage, 41 * kPage}}));
  EXPECT_EQ(s.byte(40 * kPage + 9), spec::poison_byte(salt, 40 * kPage + 9));
  EXPECT_NE(s.byte(40 * kPage + 7), before.byte(40 * kPage + 7));
  // store() takes whole pages and marks them.
  std::vector<std::uint8_t> page(static_cast<std::size_t>(kPage), 0);
  s.store(50 * kPage, page);
  EXPECT_EQ(s.byte(50 * kPage), 0);
  EXPECT_THROW(s.store(50 * kPage + 1, std::span<const std::uint8_t>(page.data(), 10)),
               std::invalid_argument);
}

TEST(ByteStorage, NothingHeldIsLazyStorageWithNoPageStrayOrMaterialised) {
  // What a device mirror asks before poisoning a buffer on the device instead of copying it: a
  // page materialised, stored, adopted as a stray write or copied makes it hold something.
  spec::ByteStorage s = spec::ByteStorage::lazy(64 * kPage, 3);
  EXPECT_TRUE(s.nothing_held());
  EXPECT_TRUE(spec::ByteStorage(s).nothing_held());
  spec::ByteStorage stray = spec::ByteStorage::lazy(64 * kPage, 3);
  stray.data()[20 * kPage] = static_cast<std::uint8_t>(spec::poison_byte(3, 20 * kPage) ^ 1);
  EXPECT_FALSE(stray.nothing_held());
  spec::ByteStorage stored = spec::ByteStorage::lazy(64 * kPage, 3);
  stored.store(kPage, std::vector<std::uint8_t>(static_cast<std::size_t>(kPage), 7));
  EXPECT_FALSE(stored.nothing_held());
  s.materialise(5, 6);
  s.materialise(7, 8);  // the same page: still one
  EXPECT_FALSE(s.nothing_held());
  EXPECT_FALSE(spec::ByteStorage(s).nothing_held());
  spec::ByteStorage moved = std::move(s);
  EXPECT_FALSE(moved.nothing_held());
  EXPECT_FALSE(spec::ByteStorage::poisoned(kPage, 3, false).nothing_held());  // dense
}

TEST(ByteStorage, AReaderOfTheWholeBufferHoldsNothing) {
  // A reader handed the writable view (a user's NumPy function converting a whole huge cache)
  // maps zero pages everywhere; they are not writes, so a look adopts none of them and gives them
  // back. A page written among them still is adopted.
  const std::int64_t pages = 4096;  // 16 MiB
  spec::ByteStorage s = spec::ByteStorage::lazy(pages * kPage, 5);
  s.materialise(0, kPage);
  const std::uint8_t* raw = s.data();
  std::uint64_t sum = 0;
  for (std::int64_t i = 0; i < s.size(); i += 512) sum += raw[i];
  s.data()[100 * kPage + 3] = static_cast<std::uint8_t>(spec::poison_byte(5, 100 * kPage + 3) ^ 1);
  const std::int64_t rss_read = rss_bytes();
  EXPECT_EQ(s.materialised(),
            (std::vector<spec::ByteRange>{{0, kPage}, {100 * kPage, 101 * kPage}}));
  EXPECT_NE(sum, std::uint64_t{1});  // the reads are not optimised away
  // Looking poisons two pages, not 4096.
  EXPECT_LT(rss_bytes() - rss_read, std::int64_t{1} << 20);
  EXPECT_EQ(s.byte(2000 * kPage), spec::poison_byte(5, 2000 * kPage));
}

/// A one-layer dense-mix configuration whose K buffer passes 2^32 bytes (bf16: element offsets
/// past 2^31 as well).
spec::ModelConfig huge_config() {
  spec::ModelConfig c;
  c.layers = {spec::LayerKind::kDense};
  const std::int64_t block_bytes = 16 * 2 * 64 * 2;  // 16 tokens x 2 heads x 64 dims, bf16: 4 KiB
  c.geometry = {(std::int64_t{1} << 32) / block_bytes + 3, 16, 2, 64, 128};
  c.kv.cache_dtype = spec::DType::kBF16;
  c.kv.scale_mode = spec::ScaleMode::kNone;
  return c;
}

/// Two tokens: one at slot 5 and one in the cache's last block.
spec::LayerWrite huge_write(const spec::ModelConfig& c) {
  spec::LayerWrite w;
  w.kind = spec::LayerKind::kDense;
  const std::int64_t t = 2, row = c.geometry.num_kv_heads * c.geometry.head_dim;
  for (spec::HostTensor* x : {&w.k, &w.v}) {
    x->dtype = spec::DType::kBF16;
    x->shape = {t, c.geometry.num_kv_heads, c.geometry.head_dim};
    x->bytes.resize(static_cast<std::size_t>(t * row * 2));
    for (std::size_t i = 0; i < x->bytes.size(); i += 2) {
      x->bytes[i] = static_cast<std::uint8_t>(i * 7);
      x->bytes[i + 1] = 0x3F;  // bf16 values near 1, never zero
    }
  }
  w.slots.type = spec::SlotType::kI64;
  w.slots.slots = {5, c.geometry.capacity() - 2};
  w.k_scale = {1.0f};
  w.v_scale = {1.0f};
  return w;
}

TEST(HugeCache, AWritePast2To32BytesIsJudgedWithinAFewPages) {
  const spec::ModelConfig c = huge_config();
  const reference::PagedCacheLayout layout(c);
  ASSERT_GT(layout.buffer_bytes(spec::BufferKind::kK), std::int64_t{1} << 32);
  const std::int64_t rss_before = rss_bytes();
  spec::LayerCaches initial = make_layer_caches(layout, 0, spec::LayerKind::kDense);
  ASSERT_TRUE(initial.buffers[0].storage.is_lazy());
  const spec::LayerWrite w = huge_write(c);
  materialise_write(layout, initial, w);
  spec::LayerCaches expected = initial;
  reference::write_layer(c, w, expected);
  spec::LayerCaches actual = initial;
  subjects::write_layer_fused(c, w, actual);
  const CacheDiff same = diff_layer_caches(layout, 0, expected, actual, &w);
  EXPECT_TRUE(same.equal()) << same.report();
  // The diff reads the pages either side holds, not 2 x 8.6 GB.
  EXPECT_GT(same.compared_bytes, 0);
  EXPECT_LT(same.compared_bytes, std::int64_t{1} << 20) << same.report();
  // Two 8.6 GB buffers, three copies: the host holds a few pages of each.
  EXPECT_LT(rss_bytes() - rss_before, std::int64_t{64} << 20);

  // The int32-offset mutant loses the last token's stores (element offsets past 2^31): the diff
  // names the first one, past byte 2^32, still the poison.
  spec::LayerCaches wrapped = initial;
  subjects::write_layer_fused_mutated(c, w, wrapped, subjects::WriteMutation::kInt32Offset);
  const CacheDiff d = diff_layer_caches(layout, 0, expected, wrapped, &w);
  ASSERT_FALSE(d.equal());
  ASSERT_TRUE(d.first.has_value());
  EXPECT_EQ(d.first->coord.block, c.geometry.num_blocks - 1);
  EXPECT_EQ(d.first->coord.offset, 14);
  EXPECT_GT(d.first->byte, std::int64_t{1} << 32);
  EXPECT_NE(d.first->actual_value.find("poison: not written"), std::string::npos) << d.report();
  // 2 heads x 64 dims x 2 bytes of K and of V.
  // (A byte whose value happens to equal its poison does not differ: 510 of the 512 here.)
  EXPECT_GT(d.differing_bytes, 2 * 2 * 64 * 2 - 8) << d.report();
  EXPECT_LE(d.differing_bytes, 2 * 2 * 64 * 2) << d.report();

  // A stray store in the middle of the buffer, on a page no case touched.
  spec::LayerCaches stray = actual;
  const std::int64_t at = (std::int64_t{3} << 30) + 1234;
  spec::CacheBuffer& k = *stray.find(spec::BufferKind::kK);
  const std::uint8_t poison = k.storage.byte(k.guard_bytes + at);
  // Not zero: a stray zero is the host's blind spot (cache_storage.hpp).
  k.body()[at] = static_cast<std::uint8_t>(poison == 0x80 ? 0x81 : poison ^ 0x80);
  const CacheDiff s = diff_layer_caches(layout, 0, expected, stray, &w);
  ASSERT_TRUE(s.first.has_value()) << s.report();
  EXPECT_EQ(s.first->byte, at);
  EXPECT_EQ(s.differing_bytes, 1) << s.report();
  EXPECT_NE(s.first->expected_value.find("poison: must stay unwritten"), std::string::npos)
      << s.report();
}

// Property: every case of the huge theme writes past byte 2^32 of a K/V buffer, on lazy storage,
// and the fused CPU writer matches the reference on it.
RC_GTEST_PROP(HugeCache, TheHugeThemeWritesPast2To32AndTheFusedWriterMatches, ()) {
  const auto index = *rc::gen::inRange<std::uint64_t>(0, 1000);
  const std::uint64_t seed =
      case_seed(*rc::gen::arbitrary<std::uint64_t>(), index * kThemeSlots + kThemeHugeCache);
  RC_ASSERT(theme_slot(seed) == kThemeHugeCache);
  const WriteCase wc = make_write_case(seed, {});
  const reference::PagedCacheLayout layout(wc.config);
  const spec::CacheGeometry& g = wc.config.geometry;
  std::int64_t end = 0;
  for (const spec::LayerWrite& w : wc.writes) {
    for (std::int64_t slot : w.slots.slots) {
      if (slot < 0) continue;
      end = std::max(
          end,
          (reference::kv_element(wc.config, 0, slot / g.block_size, slot % g.block_size, 0, 0) +
           1) *
              static_cast<std::int64_t>(spec::dtype_bytes(wc.config.kv.cache_dtype)));
    }
  }
  RC_ASSERT(end > std::int64_t{1} << 32);
  RC_ASSERT(wc.config.layers.size() <= 2u);
  for (std::size_t l = 0; l < wc.writes.size(); ++l) {
    spec::LayerCaches initial =
        make_layer_caches(layout, static_cast<std::int64_t>(l), wc.writes[l].kind);
    RC_ASSERT(initial.find(layout.kv_buffer(0))->storage.is_lazy());
    materialise_write(layout, initial, wc.writes[l]);
    spec::LayerCaches expected = initial, actual = initial;
    reference::write_layer(wc.config, wc.writes[l], expected);
    subjects::write_layer_fused(wc.config, wc.writes[l], actual);
    const CacheDiff d =
        diff_layer_caches(layout, static_cast<std::int64_t>(l), expected, actual, &wc.writes[l]);
    RC_ASSERT(d.equal());
  }
}

// Property: every read case of the huge theme reads K, V and index-K, each a lazy buffer past 2^32
// bytes, only from blocks past byte 2^32 of every buffer, and holds a few pages of them.
RC_GTEST_PROP(HugeCache, TheHugeReadThemeReadsPast2To32OfEveryBuffer, ()) {
  const auto index = *rc::gen::inRange<std::uint64_t>(0, 1000);
  const std::uint64_t seed =
      case_seed(*rc::gen::arbitrary<std::uint64_t>(), index * kThemeSlots + kThemeHugeCache);
  const std::int64_t rss_before = rss_bytes();
  const ReadCase rc = make_read_case(seed, {});
  const spec::ModelConfig& c = rc.config;
  const reference::PagedCacheLayout layout(c);
  const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  constexpr std::int64_t k2To32 = std::int64_t{1} << 32;
  for (const spec::BufferKind kind :
       {layout.kv_buffer(0), layout.kv_buffer(1), spec::BufferKind::kIndexK}) {
    RC_ASSERT(rc.caches.find(kind)->storage.is_lazy());
    RC_ASSERT(layout.buffer_bytes(kind) > k2To32);
  }
  for (const std::int32_t b : rc.batch.block_table) {
    if (b < 0) continue;
    RC_ASSERT(reference::kv_element(c, 0, b, 0, 0, 0) * eb > k2To32);
    RC_ASSERT(reference::kv_element(c, 1, b, 0, 0, 0) * eb > k2To32);
    RC_ASSERT(reference::index_value_byte(c, b, 0, 0) > k2To32);
  }
  RC_ASSERT(rss_bytes() - rss_before < (std::int64_t{256} << 20));
}

// A read with byte offsets in uint32 (the naive subjects' offset_bits 32, the catalogue's
// indexer- and attention-uint32-offset) is exactly the subject on a cache below 2^32 bytes, and
// reads other pages on a huge one: the bug is gated by the size alone, which the theme reaches.
TEST(HugeCache, Uint32OffsetsChangeOnlyAHugeCasesReads) {
  const subjects::ReadMutation uint32{.offset_bits = 32};
  int huge_differ = 0;
  for (std::uint64_t i = 0; i < 8; ++i) {
    for (const std::uint64_t slot : {std::uint64_t{0}, kThemeHugeCache}) {
      const ReadCase rc = make_read_case(case_seed(0x0FF5E7ull, i * kThemeSlots + slot), {});
      const reference::TopkSelection sel =
          reference::indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
      const auto attend = [&](const subjects::ReadMutation& m) {
        return subjects::naive_attention(rc.config, rc.attention, rc.batch, rc.q, rc.caches,
                                         rc.k_scale, rc.v_scale, &sel, m)
            .bytes;
      };
      const auto select = [&](const subjects::ReadMutation& m) {
        return subjects::naive_indexer(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches, m);
      };
      if (slot == 0) {
        EXPECT_EQ(attend(uint32), attend({})) << "seed " << rc.seed;
        EXPECT_EQ(select(uint32), select({})) << "seed " << rc.seed;
      } else {
        huge_differ += attend(uint32) != attend({});
      }
    }
  }
  // A huge case whose rows attend some token reads another page for it (all but padded ones).
  EXPECT_GE(huge_differ, 6);
}

}  // namespace
}  // namespace kvo::oracle
