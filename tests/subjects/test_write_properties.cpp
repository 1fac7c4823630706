// Properties of the write path over random cases (oracle::make_write_case draws configurations,
// allocator-shaped slot mappings with -1 tails, and SPEC 8 values, edge values included): the
// reference and the two CPU subjects agree byte for byte, write nothing outside the targeted slots
// and reject bad slots before writing.
// rapidcheck prints the failing case's seed; `kvoracle check --case-seed S` replays it.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <set>

#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/subjects/cpu_write.hpp"

namespace kvo::subjects {
namespace {

using oracle::make_layer_caches;
using reference::PagedCacheLayout;
using reference::write_layer;

using spec::BufferKind;

/// The (block, offset) pairs a mapping targets under the configuration's slot rules.
std::set<std::int64_t> targeted_slots(const spec::ModelConfig& c, const spec::SlotMapping& m) {
  std::set<std::int64_t> out;
  for (std::int64_t s : m.slots) {
    if (s >= 0) out.insert(s);
    if (s < 0 && c.slot_mode == spec::SlotMode::kLegacyWrap) out.insert(s + c.geometry.capacity());
  }
  return out;
}

RC_GTEST_PROP(WriteProperties, FusedUnfusedAndReferenceGiveIdenticalBytes, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const oracle::WriteCase wc = oracle::make_write_case(seed, {});
  RC_TAG(spec::name_of(wc.config.layout));
  const PagedCacheLayout layout(wc.config);
  for (std::size_t l = 0; l < wc.writes.size(); ++l) {
    spec::LayerCaches poisoned =
        make_layer_caches(layout, static_cast<std::int64_t>(l), wc.writes[l].kind);
    oracle::materialise_write(layout, poisoned, wc.writes[l]);  // a huge cache's touched pages
    spec::LayerCaches ref = poisoned, fused = poisoned, unfused = poisoned;
    write_layer(wc.config, wc.writes[l], ref);
    write_layer_fused(wc.config, wc.writes[l], fused);
    write_layer_unfused(wc.config, wc.writes[l], unfused);
    for (std::size_t b = 0; b < ref.buffers.size(); ++b) {
      RC_ASSERT(fused.buffers[b].storage == ref.buffers[b].storage);
      RC_ASSERT(unfused.buffers[b].storage == ref.buffers[b].storage);
    }
  }
}

RC_GTEST_PROP(WriteProperties, NoByteOutsideTheTargetedSlotsChanges, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const oracle::WriteCase wc = oracle::make_write_case(seed, {});
  const PagedCacheLayout layout(wc.config);
  const spec::ModelConfig& c = wc.config;
  for (std::size_t l = 0; l < wc.writes.size(); ++l) {
    const spec::LayerWrite& w = wc.writes[l];
    spec::LayerCaches before = make_layer_caches(layout, static_cast<std::int64_t>(l), w.kind);
    oracle::materialise_write(layout, before, w);  // a huge cache's touched pages
    spec::LayerCaches after = before;
    write_layer(c, w, after);
    const auto kv_slots = targeted_slots(c, w.slots);
    const auto index_slots = targeted_slots(c, c.separate_index_slots ? w.index_slots : w.slots);
    for (std::size_t b = 0; b < before.buffers.size(); ++b) {
      const spec::CacheBuffer& was = before.buffers[b];
      const spec::CacheBuffer& now = after.buffers[b];
      // Where either side holds pages (a huge cache's untouched pages mean poison on both).
      for (const auto& [from, to] : was.storage.compare_ranges(now.storage))
        for (std::int64_t i = from; i < to; ++i) {
          if (was.storage.byte(i) == now.storage.byte(i)) continue;
          const std::int64_t byte = i - was.guard_bytes;
          RC_ASSERT(byte >= 0);  // guard bands never change
          RC_ASSERT(byte < was.body_bytes());
          const auto coord = oracle::locate(layout, was.kind, byte);
          RC_ASSERT(coord.has_value());
          const std::int64_t slot = coord->block * c.geometry.block_size + coord->offset;
          const auto& allowed = was.kind == BufferKind::kIndexK ? index_slots : kv_slots;
          RC_ASSERT(allowed.count(slot) == 1u);
        }
    }
  }
}

RC_GTEST_PROP(WriteProperties, PaddingWritesNothing, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  oracle::CaseOverrides o;
  o.slot_mode = spec::SlotMode::kStrict;
  oracle::WriteCase wc = oracle::make_write_case(seed, o);
  const PagedCacheLayout layout(wc.config);
  spec::LayerWrite w = wc.writes.front();
  for (auto& s : w.slots.slots) s = -1;
  for (auto& s : w.index_slots.slots) s = -1;
  const spec::LayerCaches before = make_layer_caches(layout, 0, w.kind);
  spec::LayerCaches ref = before, fused = before, unfused = before;
  write_layer(wc.config, w, ref);
  write_layer_fused(wc.config, w, fused);
  write_layer_unfused(wc.config, w, unfused);
  for (std::size_t b = 0; b < before.buffers.size(); ++b) {
    RC_ASSERT(ref.buffers[b].storage == before.buffers[b].storage);
    RC_ASSERT(fused.buffers[b].storage == before.buffers[b].storage);
    RC_ASSERT(unfused.buffers[b].storage == before.buffers[b].storage);
  }
}

RC_GTEST_PROP(WriteProperties, InvalidSlotIsRejectedNamingItAndNothingIsWritten, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const oracle::WriteCase wc = oracle::make_write_case(seed, {});
  const PagedCacheLayout layout(wc.config);
  spec::LayerWrite w = wc.writes.front();
  const auto n = static_cast<std::int64_t>(w.slots.slots.size());
  const std::int64_t at = *rc::gen::inRange<std::int64_t>(0, n);
  const bool duplicate = *rc::gen::arbitrary<bool>() && at > 0 && w.slots.slots[0] >= 0;
  std::int64_t& slot = w.slots.slots[static_cast<std::size_t>(at)];
  const std::int64_t capacity = wc.config.geometry.capacity();
  slot = duplicate ? w.slots.slots[0] : capacity + *rc::gen::inRange<std::int64_t>(0, 1000);
  const std::string expected_value = std::to_string(slot);
  const spec::LayerCaches before = make_layer_caches(layout, 0, w.kind);
  for (int form = 0; form < 3; ++form) {
    spec::LayerCaches caches = before;
    try {
      if (form == 0) write_layer(wc.config, w, caches);
      if (form == 1) write_layer_fused(wc.config, w, caches);
      if (form == 2) write_layer_unfused(wc.config, w, caches);
      RC_FAIL("accepted an invalid slot");
    } catch (const spec::InvalidInput& e) {
      RC_ASSERT(e.field() == std::string("slot_mapping"));
      RC_ASSERT(e.index() == at);
      RC_ASSERT(e.value() == expected_value);
    }
    for (std::size_t b = 0; b < before.buffers.size(); ++b)
      RC_ASSERT(caches.buffers[b].storage == before.buffers[b].storage);
  }
}

}  // namespace
}  // namespace kvo::subjects
