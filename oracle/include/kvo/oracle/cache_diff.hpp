#pragma once
/// \file cache_diff.hpp
/// The byte-exact cache diff of SPEC 7: whole buffers, guard bands included, never a tolerance. It
/// reports the number of differing bytes per buffer and the first difference in full: layer, buffer
/// (or guard), block, offset, head, dim, byte in element, both bytes, both element codes and their
/// decoded values, and which token of the call should (or should not) have written there.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kvo/oracle/harness.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::oracle {

struct ByteMismatch {
  std::int64_t layer = 0;
  spec::BufferKind buffer = spec::BufferKind::kK;
  /// 0 inside the body; < 0 bytes before it (leading guard); > 0 bytes past its end (1 = first).
  std::int64_t guard_distance = 0;
  std::int64_t byte = 0;  ///< within the body (meaningful when guard_distance == 0)
  oracle::ElementCoord coord;
  std::uint8_t expected_byte = 0, actual_byte = 0;
  std::uint32_t expected_code = 0, actual_code = 0;  ///< whole element codes
  std::string expected_value, actual_value;          ///< decoded
  std::string writer;   ///< which token should have written here, or that none should have
  int code_digits = 2;  ///< hex digits of an element code
  spec::DType dtype = spec::DType::kF32;  ///< the element's
  /// Every code the contract admits here when it admits more than one (SPEC 7), else empty.
  std::vector<std::uint32_t> admissible;
  /// Or the admitted ranges of codes in value order (ordered_code images), when given as ranges.
  std::vector<std::pair<std::int64_t, std::int64_t>> admissible_ranges;

  /// Whether the expected side still holds the poison (no token writes here) and the actual side
  /// (the subject did not write here).
  bool expected_poison = false, actual_poison = false;

  std::string describe() const;
  /// The mismatch's class, independent of the case (Verdict::failure_class): a write into a guard
  /// band or a view's padding, a stray write, an element not written, a wrong element or scale.
  std::string kind() const;
  std::string expected_code_text() const;
  std::string actual_code_text() const;
};

struct BufferDiffCount {
  std::int64_t layer = 0;
  spec::BufferKind buffer = spec::BufferKind::kK;
  std::int64_t differing_bytes = 0;
  std::int64_t guard_bytes = 0;    ///< of which inside guard bands
  std::int64_t padding_bytes = 0;  ///< of which a strided view's padding (SPEC 3)
};

struct CacheDiff {
  std::int64_t differing_bytes = 0;
  /// Bytes the diff read: whole buffers, but a huge (lazy) one's pages that either side holds
  /// (the rest is poison on both sides).
  std::int64_t compared_bytes = 0;
  /// Elements whose bytes differ from the reference's pick but lie in their admissible set.
  std::int64_t admitted_elements = 0;
  std::vector<BufferDiffCount> buffers;  ///< only buffers with differences
  std::optional<ByteMismatch> first;
  std::vector<ByteMismatch> samples;  ///< the first differing elements (first == samples.front())

  bool equal() const { return differing_bytes == 0; }
  /// Adds another diff (e.g. the next layer's), keeping the earliest first mismatch.
  void merge(const CacheDiff& other);
  /// The multi-line report of SPEC 7.
  std::string report() const;
  /// The first mismatch's class (ByteMismatch::kind); empty when equal.
  std::string failure_class() const;
};

/// The codes the contract admits at one element (SPEC 7); one code or none means only the
/// expected bytes are right.
using AdmissibleCodes = std::function<std::vector<std::uint32_t>(const ElementCoord&)>;

/// An order-preserving integer image of a code of `dtype` (sign and magnitude: +0 and -0 share
/// 0), and the code of an image (the + sign for 0).
std::int64_t ordered_code(std::uint32_t code, spec::DType dtype);
std::uint32_t code_of_ordered(std::int64_t ordered, spec::DType dtype);

/// Closed ranges of ordered_code images the contract admits at one element: a foreign kernel's
/// bound (SPEC 4), which around zero spans more codes than a list could hold. Empty: only the
/// expected bytes are right.
using AdmissibleRanges =
    std::function<std::vector<std::pair<std::int64_t, std::int64_t>>(const ElementCoord&)>;

/// Diffs one layer's caches. `write` (may be null) attributes mismatches to tokens; up to
/// `max_samples` differing elements are described in full. With `admissible` (or `ranges`), an
/// element whose code differs from the expected one but lies in its admissible set is counted as
/// admitted, not as differing; guard bands and every element with one admissible code stay
/// byte-exact.
CacheDiff diff_layer_caches(const reference::PagedCacheLayout& layout, std::int64_t layer,
                            const spec::LayerCaches& expected, const spec::LayerCaches& actual,
                            const spec::LayerWrite* write, std::size_t max_samples = 1,
                            const AdmissibleCodes* admissible = nullptr,
                            const AdmissibleRanges* ranges = nullptr);

/// The reference's name of the element at a located coordinate.
reference::CacheElement element_of(const ElementCoord& at);

/// One layer of a write call diffed against the reference's caches: byte-exact, except that
/// where the contract admits several codes (div_approx, legacy-wrap races:
/// reference::admits_several) each element is judged against reference::admissible_codes.
CacheDiff diff_write_layer(const spec::ModelConfig& config,
                           const reference::PagedCacheLayout& layout, std::size_t layer,
                           const spec::LayerWrite& write, const spec::LayerCaches& expected,
                           const spec::LayerCaches& actual, std::size_t samples = 1);

}  // namespace kvo::oracle
