#include "kvo/oracle/cache_diff.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "kvo/oracle/harness.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"

namespace kvo::oracle {
namespace {

using spec::BufferKind;

std::string hex(std::uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*X", digits, v);
  return buf;
}

/// The code of the element of type dt at storage index `at`, read as the buffer means its bytes
/// (a huge buffer's unmaterialised bytes are poison).
std::uint32_t code_at(const spec::ByteStorage& storage, std::int64_t at, spec::DType dt) {
  std::uint8_t bytes[4] = {};
  for (std::size_t k = 0; k < spec::dtype_bytes(dt); ++k) {
    bytes[k] = storage.byte(at + static_cast<std::int64_t>(k));
  }
  return reference::load_code(bytes, dt);
}

std::string value_text(float x) {
  if (std::isnan(x)) return "nan";
  std::ostringstream s;
  s.precision(9);
  s << x;
  return s.str();
}

/// The dtype of the element at a coordinate (for decoding both sides).
spec::DType element_dtype(const spec::ModelConfig& c, const oracle::ElementCoord& coord) {
  if (coord.buffer != BufferKind::kIndexK) return c.kv.cache_dtype;
  if (c.index.layout == spec::IndexLayout::kFlat) return c.index.flat_dtype;
  return coord.is_scale ? spec::DType::kF32 : spec::DType::kFp8E4M3;
}

/// Which token of the call targets a (block, offset), given the slot rules; the last one wins
/// (legacy_wrap collisions), which is the token whose bytes must be there.
std::string attribute(const spec::ModelConfig& c, const spec::LayerWrite& w,
                      const oracle::ElementCoord& coord) {
  const bool index = coord.buffer == BufferKind::kIndexK;
  const spec::SlotMapping& m = index && c.separate_index_slots ? w.index_slots : w.slots;
  const std::int64_t cap = c.geometry.capacity();
  const std::int64_t slot = coord.block * c.geometry.block_size + coord.offset;
  std::int64_t writer = -1;
  for (std::size_t t = 0; t < m.slots.size(); ++t) {
    std::int64_t s = m.slots[t];
    if (s < 0) s = c.slot_mode == spec::SlotMode::kLegacyWrap ? s + cap : -1;
    if (s == slot) writer = static_cast<std::int64_t>(t);
  }
  std::ostringstream out;
  if (writer < 0) {
    out << "no token of this call maps to slot " << slot << ": these bytes must be untouched";
  } else {
    out << "token " << writer << " ("
        << (index && c.separate_index_slots ? "index_slot_mapping" : "slot_mapping") << "["
        << writer << "] = " << m.slots[static_cast<std::size_t>(writer)]
        << ") should have written slot " << slot;
  }
  return out.str();
}

}  // namespace

std::string ByteMismatch::describe() const {
  std::ostringstream s;
  s << "layer " << layer << ", ";
  if (guard_distance != 0) {
    s << "guard band of buffer " << spec::name_of(buffer) << " ("
      << (guard_distance < 0 ? std::to_string(-guard_distance) + " bytes before the body"
                             : std::to_string(guard_distance - 1) + " bytes past its end")
      << "): expected " << hex(expected_byte, 2) << " (poison), got " << hex(actual_byte, 2)
      << "; no write may land in a guard band";
    return s.str();
  }
  if (coord.padding) {
    s << coord.describe() << " (byte " << byte << " of the buffer): expected "
      << hex(expected_byte, 2) << " (poison), got " << hex(actual_byte, 2)
      << "; a strided view's padding belongs to no element and no write may touch it (SPEC 3)";
    return s.str();
  }
  s << coord.describe() << " (byte " << byte << " of the buffer): expected byte "
    << hex(expected_byte, 2) << ", got " << hex(actual_byte, 2) << "; element expected "
    << expected_code_text() << " = " << expected_value << ", got " << actual_code_text() << " = "
    << actual_value;
  if (!admissible.empty()) {
    s << ", not one of the admissible codes {";
    for (std::size_t i = 0; i < admissible.size(); ++i)
      s << (i ? ", " : "") << hex(admissible[i], code_digits);
    s << "}";
  }
  if (!admissible_ranges.empty()) {
    s << ", outside the admitted codes";
    for (const auto& [lo, hi] : admissible_ranges) {
      s << " [" << hex(code_of_ordered(lo, dtype), code_digits) << " = "
        << value_text(reference::decode(code_of_ordered(lo, dtype), dtype)) << " .. "
        << hex(code_of_ordered(hi, dtype), code_digits) << " = "
        << value_text(reference::decode(code_of_ordered(hi, dtype), dtype)) << "]";
    }
  }
  s << "; " << writer;
  return s.str();
}

std::int64_t ordered_code(std::uint32_t code, spec::DType dtype) {
  const std::uint32_t sign = 1u << (8 * spec::dtype_bytes(dtype) - 1);
  const std::int64_t mag = code & (sign - 1);
  return (code & sign) != 0 ? -mag : mag;
}

std::uint32_t code_of_ordered(std::int64_t ordered, spec::DType dtype) {
  const std::uint32_t sign = 1u << (8 * spec::dtype_bytes(dtype) - 1);
  return ordered < 0 ? sign | static_cast<std::uint32_t>(-ordered)
                     : static_cast<std::uint32_t>(ordered);
}

std::string ByteMismatch::expected_code_text() const { return hex(expected_code, code_digits); }
std::string ByteMismatch::actual_code_text() const { return hex(actual_code, code_digits); }

void CacheDiff::merge(const CacheDiff& other) {
  differing_bytes += other.differing_bytes;
  compared_bytes += other.compared_bytes;
  admitted_elements += other.admitted_elements;
  buffers.insert(buffers.end(), other.buffers.begin(), other.buffers.end());
  if (!first && other.first) first = other.first;
  samples.insert(samples.end(), other.samples.begin(), other.samples.end());
}

std::string ByteMismatch::kind() const {
  if (guard_distance != 0) return "a write into a guard band";
  if (coord.padding) return "a write into a strided view's padding";
  if (expected_poison) return "a stray write (no token maps there)";
  if (actual_poison) return "an element not written";
  return coord.is_scale ? "a wrong scale" : "a wrong element";
}

std::string CacheDiff::failure_class() const {
  if (equal()) return {};
  return first ? first->kind() : "a buffer missing or of another size";
}

std::string CacheDiff::report() const {
  std::ostringstream s;
  const std::string admitted = admitted_elements
                                   ? std::to_string(admitted_elements) +
                                         " elements differ from the reference's pick within their "
                                         "admissible sets (SPEC 7)"
                                   : "";
  if (equal()) {
    if (admitted_elements) {
      s << "caches match within the admissible sets (" << compared_bytes
        << " bytes compared, guards included; " << admitted << ")";
    } else {
      s << "caches identical (" << compared_bytes << " bytes compared, guards included)";
    }
    return s.str();
  }
  s << differing_bytes << " of " << compared_bytes << " bytes differ";
  if (admitted_elements) s << " (besides, " << admitted << ")";
  for (const auto& b : buffers) {
    s << "\n  layer " << b.layer << " " << spec::name_of(b.buffer) << ": " << b.differing_bytes
      << " bytes";
    if (b.guard_bytes) s << " (" << b.guard_bytes << " in guard bands)";
    if (b.padding_bytes) s << " (" << b.padding_bytes << " in padding)";
  }
  if (first) s << "\n  first: " << first->describe();
  return s.str();
}

CacheDiff diff_layer_caches(const reference::PagedCacheLayout& layout, std::int64_t layer,
                            const spec::LayerCaches& expected, const spec::LayerCaches& actual,
                            const spec::LayerWrite* write, std::size_t max_samples,
                            const AdmissibleCodes* admissible, const AdmissibleRanges* ranges) {
  CacheDiff diff;
  for (const spec::CacheBuffer& eb : expected.buffers) {
    const spec::CacheBuffer* ab = actual.find(eb.kind);
    BufferDiffCount count{layer, eb.kind, 0, 0};
    if (ab == nullptr || ab->storage.size() != eb.storage.size()) {
      diff.compared_bytes += eb.storage.size();
      count.differing_bytes = eb.storage.size();
      diff.differing_bytes += count.differing_bytes;
      diff.buffers.push_back(count);
      continue;
    }
    // A huge (lazy) buffer is read where either side holds pages; every other byte is poison on
    // both sides (spec::ByteStorage), known equal unread, so not counted as compared.
    const std::vector<spec::ByteRange> read = eb.storage.compare_ranges(ab->storage);
    for (const auto& [from, to] : read) diff.compared_bytes += to - from;
    if (eb.storage.same_as(ab->storage)) continue;  // the common case, at memcmp speed
    const std::int64_t body_end = eb.guard_bytes + eb.body_bytes();
    // Dense on both sides, equal runs are skipped at memcmp speed (a few differing elements in a
    // buffer of megabytes: an admissible code, a stray byte).
    const bool dense = !eb.storage.is_lazy() && !ab->storage.is_lazy();
    const std::uint8_t* ed = eb.storage.data();
    const std::uint8_t* ad = ab->storage.data();
    for (const auto& [from, to] : read)
      for (std::int64_t i = from; i < to; ++i) {
        if (dense) {
          i = std::mismatch(ed + i, ed + to, ad + i).first - ed;
          if (i >= to) break;
        }
        const std::uint8_t e = eb.storage.byte(i);
        const std::uint8_t a = ab->storage.byte(i);
        if (e == a) continue;
        const bool guard = i < eb.guard_bytes || i >= body_end;
        // A strided view's padding byte (SPEC 3) is compared like a guard's: exactly, no element.
        const bool padding = !guard && oracle::locate(layout, eb.kind, i - eb.guard_bytes)->padding;
        std::vector<std::uint32_t> codes;
        std::vector<std::pair<std::int64_t, std::int64_t>> admitted_ranges;
        if (ranges != nullptr && !guard && !padding) {
          const oracle::ElementCoord coord = *oracle::locate(layout, eb.kind, i - eb.guard_bytes);
          const spec::DType dt = element_dtype(layout.config(), coord);
          const std::int64_t start = i - coord.byte_in_element;
          admitted_ranges = (*ranges)(coord);
          const std::int64_t o = ordered_code(code_at(ab->storage, start, dt), dt);
          const bool inside =
              std::any_of(admitted_ranges.begin(), admitted_ranges.end(),
                          [o](const auto& r) { return r.first <= o && o <= r.second; });
          if (inside) {
            ++diff.admitted_elements;
            i = start + static_cast<std::int64_t>(spec::dtype_bytes(dt)) - 1;
            continue;
          }
        } else if (admissible != nullptr && !guard && !padding) {
          // The whole element: admitted when its code is one the contract allows (SPEC 7).
          const oracle::ElementCoord coord = *oracle::locate(layout, eb.kind, i - eb.guard_bytes);
          const spec::DType dt = element_dtype(layout.config(), coord);
          const std::int64_t start = i - coord.byte_in_element;
          codes = (*admissible)(coord);
          if (codes.size() > 1) {
            const std::uint32_t code = code_at(ab->storage, start, dt);
            if (std::find(codes.begin(), codes.end(), code) != codes.end()) {
              ++diff.admitted_elements;
              i = start + static_cast<std::int64_t>(spec::dtype_bytes(dt)) - 1;
              continue;
            }
          } else {
            codes.clear();
          }
        }
        ++count.differing_bytes;
        if (guard) ++count.guard_bytes;
        if (padding) ++count.padding_bytes;
        if (diff.samples.size() >= max_samples) continue;
        ByteMismatch m;
        m.layer = layer;
        m.buffer = eb.kind;
        m.expected_byte = e;
        m.actual_byte = a;
        if (guard) {
          m.guard_distance = i < eb.guard_bytes ? i - eb.guard_bytes : i - body_end + 1;
        } else {
          m.byte = i - eb.guard_bytes;
          m.coord = *oracle::locate(layout, eb.kind, m.byte);
          if (padding) {
            if (!diff.first) diff.first = m;
            diff.samples.push_back(std::move(m));
            continue;
          }
          // One sample per element: the element's later bytes add nothing.
          if (!diff.samples.empty() && diff.samples.back().buffer == eb.kind &&
              diff.samples.back().guard_distance == 0 &&
              diff.samples.back().byte - diff.samples.back().coord.byte_in_element ==
                  m.byte - m.coord.byte_in_element) {
            continue;
          }
          const spec::DType dt = element_dtype(layout.config(), m.coord);
          const std::int64_t start = m.byte - m.coord.byte_in_element;
          m.expected_code = code_at(eb.storage, eb.guard_bytes + start, dt);
          m.actual_code = code_at(ab->storage, ab->guard_bytes + start, dt);
          m.expected_value = value_text(reference::decode(m.expected_code, dt));
          m.actual_value = value_text(reference::decode(m.actual_code, dt));
          // Say when a side still holds the poison: on the expected side the element is never
          // written; on the actual side the subject did not write it.
          const auto is_poison = [&](const spec::CacheBuffer& buf) {
            const std::uint64_t salt = oracle::poison_salt(layer, buf.kind);
            for (std::int64_t k = 0; k < static_cast<std::int64_t>(spec::dtype_bytes(dt)); ++k) {
              const auto at = static_cast<std::uint64_t>(eb.guard_bytes + start + k);
              if (buf.storage.byte(static_cast<std::int64_t>(at)) != spec::poison_byte(salt, at)) {
                return false;
              }
            }
            return true;
          };
          m.expected_poison = is_poison(eb);
          m.actual_poison = is_poison(*ab);
          if (m.expected_poison) m.expected_value += " (poison: must stay unwritten)";
          if (m.actual_poison) m.actual_value += " (poison: not written)";
          m.writer = write != nullptr ? attribute(layout.config(), *write, m.coord) : "";
          m.code_digits = static_cast<int>(2 * spec::dtype_bytes(dt));
          m.dtype = dt;
          m.admissible = std::move(codes);
          m.admissible_ranges = std::move(admitted_ranges);
        }
        if (!diff.first) diff.first = m;
        diff.samples.push_back(std::move(m));
      }
    if (count.differing_bytes) {
      diff.differing_bytes += count.differing_bytes;
      diff.buffers.push_back(count);
    }
  }
  return diff;
}

reference::CacheElement element_of(const ElementCoord& at) {
  reference::CacheElement e;
  e.buffer = at.buffer;
  e.kv = at.kv < 0 ? 0 : at.kv;
  e.block = at.block;
  e.offset = at.offset;
  e.head = at.head;
  e.dim = at.dim;
  e.is_scale = at.is_scale;
  e.group = at.group;
  return e;
}

CacheDiff diff_write_layer(const spec::ModelConfig& config,
                           const reference::PagedCacheLayout& layout, std::size_t layer,
                           const spec::LayerWrite& write, const spec::LayerCaches& expected,
                           const spec::LayerCaches& actual, std::size_t samples) {
  if (!reference::admits_several(config, write)) {
    return diff_layer_caches(layout, static_cast<std::int64_t>(layer), expected, actual, &write,
                             samples);
  }
  // SPEC 7: div_approx quotients and legacy-wrap races admit several codes per element; the
  // reference names them element by element, asked only where the bytes differ.
  const AdmissibleCodes admissible = [&](const ElementCoord& at) {
    return reference::admissible_codes(config, write, element_of(at));
  };
  return diff_layer_caches(layout, static_cast<std::int64_t>(layer), expected, actual, &write,
                           samples, &admissible);
}

}  // namespace kvo::oracle
