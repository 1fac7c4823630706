// SPEC 3 strided views, against the dense layout: a drawn write case written by the reference
// into its dense caches and into strided views of the same configuration (draw_kv_strides,
// draw_index_strides) holds the same bytes in every element, and every padding byte and guard of
// the views keeps its value.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstring>

#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"

namespace kvo::oracle {
namespace {

RC_GTEST_PROP(Strided, TheReferenceWritesEachElementAsTheDenseLayoutAndLeavesPadding, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  // Its byte patterns touch every byte of both caches: a huge cache's (test_huge_cache) would
  // cost gigabytes.
  RC_PRE(theme_slot(seed) != kThemeHugeCache);
  CaseOverrides o;
  o.kv_strides = spec::KvStrides{};  // dense, whatever the seed's theme
  o.index_strides = spec::IndexStrides{};
  o.layers = "DS";  // one layer of each kind keeps a case cheap
  const WriteCase wc = make_write_case(seed, o);
  spec::ModelConfig strided = wc.config;
  strided.kv_strides = draw_kv_strides(seed, wc.config);
  strided.index_strides = draw_index_strides(seed, wc.config);
  const reference::PagedCacheLayout dense_layout(wc.config), strided_layout(strided);
  for (std::size_t layer = 0; layer < wc.writes.size(); ++layer) {
    const spec::LayerWrite& w = wc.writes[layer];
    spec::LayerCaches dense =
        make_layer_caches(dense_layout, static_cast<std::int64_t>(layer), w.kind);
    spec::LayerCaches view =
        make_layer_caches(strided_layout, static_cast<std::int64_t>(layer), w.kind);
    // Every element starts with the same bytes in both (a pattern of its dense offset), the
    // view's padding with 0xA5; so the two can be compared element by element after the writes.
    // (A view of nhd / hnd may hold K and V in one allocation, the dense layout in two buffers:
    // an element's dense buffer is the dense layout's for its K/V part.)
    const auto in_dense = [&](ElementCoord coord) {
      if (coord.buffer != spec::BufferKind::kIndexK)
        coord.buffer = dense_layout.kv_buffer(coord.kv);
      return std::pair{coord.buffer, byte_offset(dense_layout, coord)};
    };
    for (spec::CacheBuffer& d : dense.buffers) {
      for (std::int64_t byte = 0; byte < d.body_bytes(); ++byte)
        d.body()[static_cast<std::size_t>(byte)] = static_cast<std::uint8_t>(byte * 131 + 7);
    }
    for (spec::CacheBuffer& b : view.buffers) {
      for (std::int64_t byte = 0; byte < b.body_bytes(); ++byte) {
        const ElementCoord coord = *locate(strided_layout, b.kind, byte);
        b.body()[static_cast<std::size_t>(byte)] =
            coord.padding ? 0xA5 : static_cast<std::uint8_t>(in_dense(coord).second * 131 + 7);
      }
    }
    const spec::LayerCaches before_write = view;
    reference::write_layer(wc.config, w, dense);
    reference::write_layer(strided, w, view);
    for (const spec::CacheBuffer& b : view.buffers) {
      const spec::CacheBuffer& before = *before_write.find(b.kind);
      for (std::int64_t byte = 0; byte < b.body_bytes(); ++byte) {
        const auto at = static_cast<std::size_t>(byte);
        const ElementCoord coord = *locate(strided_layout, b.kind, byte);
        if (coord.padding) {
          RC_ASSERT(b.body()[at] == std::uint8_t{0xA5});
          continue;
        }
        const auto [kind, offset] = in_dense(coord);
        RC_ASSERT(b.body()[at] == dense.find(kind)->body()[static_cast<std::size_t>(offset)]);
      }
      // The guard bands are untouched too.
      RC_ASSERT(std::memcmp(b.storage.data(), before.storage.data(),
                            static_cast<std::size_t>(b.guard_bytes)) == 0);
    }
  }
}

}  // namespace
}  // namespace kvo::oracle
