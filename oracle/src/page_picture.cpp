#include "page_picture.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "kvo/oracle/harness.hpp"

namespace kvo::oracle {
namespace {

constexpr std::int64_t kPictureBlocks = 16;
constexpr std::int64_t kPictureWidth = 64;

/// Slot -> the token whose bytes must be there (the last one that maps to it).
std::map<std::int64_t, std::int64_t> targets(const spec::ModelConfig& c,
                                             const spec::SlotMapping& m) {
  std::map<std::int64_t, std::int64_t> out;
  for (std::size_t t = 0; t < m.slots.size(); ++t) {
    std::int64_t s = m.slots[t];
    if (s < 0) s = c.slot_mode == spec::SlotMode::kLegacyWrap ? s + c.geometry.capacity() : -1;
    if (s >= 0) out[s] = static_cast<std::int64_t>(t);
  }
  return out;
}

/// The picture of one buffer.
void picture(std::ostringstream& s, const reference::PagedCacheLayout& layout,
             const spec::CacheBuffer& expected, const spec::CacheBuffer& actual,
             const std::map<std::int64_t, std::int64_t>& target) {
  const std::int64_t bs = layout.config().geometry.block_size;
  std::set<std::int64_t> differ;
  const std::int64_t body_end = expected.guard_bytes + expected.body_bytes();
  for (const auto& [from, to] : expected.storage.compare_ranges(actual.storage)) {
    for (std::int64_t at = std::max(from, expected.guard_bytes); at < std::min(to, body_end);
         ++at) {
      if (expected.storage.byte(at) == actual.storage.byte(at)) continue;
      const auto c = oracle::locate(layout, expected.kind, at - expected.guard_bytes);
      // A strided view's padding (SPEC 3) shows at the slot it lies in, if any.
      if (c->block < 0) continue;
      differ.insert(c->block * bs + std::max<std::int64_t>(c->offset, 0));
    }
  }
  std::set<std::int64_t> blocks;
  for (std::int64_t slot : differ) blocks.insert(slot / bs);
  for (const auto& [slot, token] : target) blocks.insert(slot / bs);
  s << "  buffer " << spec::name_of(expected.kind) << ": " << differ.size() << " slots differ; "
    << "o written as expected, X targeted but wrong, ! not targeted but changed, . untouched\n";
  std::int64_t shown = 0;
  for (std::int64_t b : blocks) {
    if (shown++ == kPictureBlocks) {
      s << "    ... " << blocks.size() - static_cast<std::size_t>(kPictureBlocks)
        << " more blocks\n";
      break;
    }
    for (std::int64_t start = 0; start < bs; start += kPictureWidth) {
      s << "    block " << b << " [" << start << ".." << std::min(bs, start + kPictureWidth) - 1
        << "] ";
      for (std::int64_t o = start; o < std::min(bs, start + kPictureWidth); ++o) {
        const std::int64_t slot = b * bs + o;
        const bool targeted = target.count(slot) != 0, wrong = differ.count(slot) != 0;
        s << (targeted ? (wrong ? 'X' : 'o') : (wrong ? '!' : '.'));
      }
      s << "\n";
    }
  }
}

}  // namespace

CacheDiff explain_layer(std::ostringstream& s, const reference::PagedCacheLayout& layout,
                        std::int64_t layer, const spec::ModelConfig& config,
                        const spec::LayerWrite& write, const spec::LayerCaches& expected,
                        const spec::LayerCaches& actual) {
  CacheDiff d = diff_write_layer(config, layout, static_cast<std::size_t>(layer), write, expected,
                                 actual, kExplainSamples);
  if (d.equal()) return d;
  s << "layer " << layer << " (" << spec::name_of(write.kind) << "):\n";
  for (const spec::CacheBuffer& e : expected.buffers) {
    const spec::CacheBuffer& a = *actual.find(e.kind);
    if (e.storage.same_as(a.storage)) continue;
    const spec::SlotMapping& m = e.kind == spec::BufferKind::kIndexK && config.separate_index_slots
                                     ? write.index_slots
                                     : write.slots;
    picture(s, layout, e, a, targets(config, m));
  }
  return d;
}

void list_samples(std::ostringstream& s, const CacheDiff& diff) {
  s << "first differing elements:\n";
  for (std::size_t i = 0; i < std::min(kExplainSamples, diff.samples.size()); ++i)
    s << "  " << diff.samples[i].describe() << "\n";
}

}  // namespace kvo::oracle
