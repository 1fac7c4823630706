// The dense insert's judgement (SPEC 4, SPEC 7): exact for a canonical subject (admissible sets
// only where the modes admit several codes), and for a foreign one admissible ranges around the
// float64 truth (truth/dense_truth.hpp) for K and q_out, V exact.
#include "kvo/oracle/dense_diff.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kvo/oracle/read_diff.hpp"
#include "kvo/reference/dense_insert.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/truth/dense_truth.hpp"

namespace kvo::oracle {
namespace {

/// The dense insert's caches against the reference's: byte-exact, except where the modes admit
/// several codes (div_approx, legacy-wrap races), judged element by element (SPEC 7).
CacheDiff diff_dense(const spec::ModelConfig& config, const reference::PagedCacheLayout& layout,
                     std::int64_t layer, const spec::DenseInsert& in,
                     const spec::LayerCaches& expected, const spec::LayerCaches& actual,
                     std::size_t samples) {
  if (!reference::admits_several(config, in.kv))
    return diff_layer_caches(layout, layer, expected, actual, &in.kv, samples);
  const AdmissibleCodes admissible = [&](const ElementCoord& at) {
    return reference::admissible_dense_codes(config, in, element_of(at));
  };
  return diff_layer_caches(layout, layer, expected, actual, &in.kv, samples, &admissible);
}

/// The float32 values bracketing [value - bound, value + bound] (rounded outward).
std::pair<float, float> bracket(double value, double bound) {
  float lo = static_cast<float>(value - bound), hi = static_cast<float>(value + bound);
  if (static_cast<double>(lo) > value - bound) lo = std::nextafter(lo, -INFINITY);
  if (static_cast<double>(hi) < value + bound) hi = std::nextafter(hi, INFINITY);
  return {lo, hi};
}

/// SPEC 4 foreign dense insert: the codes admitted at each K or V element, as ranges in value
/// order. K: over every token on the element's slot, the codes of every float32 within its truth's
/// bound, quantized as the configuration says (from the lowest admissible code of the low end to
/// the highest of the high end, so div_approx widens it too: quantization is monotone); a
/// non-finite truth admits the reference's codes only. V (no arithmetic before the insert): the
/// reference's admissible codes.
class ForeignDenseCodes {
 public:
  ForeignDenseCodes(const spec::ModelConfig& c, const spec::DenseInsert& in)
      : c_(c),
        in_(in),
        truth_(truth::dense_truth(c, in)),
        tokens_of_slot_(static_cast<std::size_t>(c.geometry.capacity())) {
    for (std::size_t t = 0; t < in.kv.slots.slots.size(); ++t) {
      std::int64_t slot = in.kv.slots.slots[t];
      if (slot < 0 && c.slot_mode == spec::SlotMode::kLegacyWrap) slot += c.geometry.capacity();
      if (slot >= 0) tokens_of_slot_[static_cast<std::size_t>(slot)].push_back(t);
    }
  }

  std::vector<std::pair<std::int64_t, std::int64_t>> operator()(
      const reference::CacheElement& e) const {
    const spec::DType dt = c_.kv.cache_dtype;
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    const auto as_ranges = [&](const std::vector<std::uint32_t>& codes) {
      for (std::uint32_t code : codes)
        ranges.emplace_back(ordered_code(code, dt), ordered_code(code, dt));
    };
    if (e.kv == 1) {
      as_ranges(reference::admissible_dense_codes(c_, in_, e));
      return ranges;
    }
    const spec::CacheGeometry& g = c_.geometry;
    const float s = in_.store_scale(0, e.head, c_.kv.per_head_scale);
    const auto extreme = [&](float x, bool highest) {
      std::int64_t best = 0;
      bool any = false;
      for (std::uint32_t code : reference::admissible_kv_codes(x, s, c_.kv, c_.act_dtype)) {
        const std::int64_t o = ordered_code(code, dt);
        if (!any || (highest ? o > best : o < best)) best = o;
        any = true;
      }
      return best;
    };
    for (std::size_t t :
         tokens_of_slot_[static_cast<std::size_t>(e.block * g.block_size + e.offset)]) {
      const auto at = static_cast<std::size_t>(
          (static_cast<std::int64_t>(t) * g.num_kv_heads + e.head) * g.head_dim + e.dim);
      if (!std::isfinite(truth_.k_bound[at])) {
        as_ranges(reference::admissible_dense_codes(c_, in_, e));
        continue;
      }
      const auto [lo, hi] = bracket(truth_.k[at], truth_.k_bound[at]);
      ranges.emplace_back(extreme(lo, false), extreme(hi, true));
    }
    return ranges;
  }

  const truth::DenseTruth& truth() const { return truth_; }

 private:
  const spec::ModelConfig& c_;
  const spec::DenseInsert& in_;
  truth::DenseTruth truth_;
  std::vector<std::vector<std::size_t>> tokens_of_slot_;  ///< [capacity]: tokens writing there
};

/// A foreign subject's q_out [T, nq, hd] against the truth: each element's code one of those of
/// the float32 values within its bound (rounded to the activation dtype). Empty: accepted;
/// otherwise how many elements are outside and the first with coordinates, both values and the
/// admitted range.
std::string diff_q_foreign(const truth::DenseTruth& truth, const spec::HostTensor& q,
                           const spec::HostTensor& expected) {
  if (q.dtype != expected.dtype || q.shape != expected.shape ||
      q.bytes.size() != expected.bytes.size())
    return "q_out: wrong dtype or shape";
  const auto eb = spec::dtype_bytes(q.dtype);
  const std::int64_t heads = q.shape[1], hd = q.shape[2];
  std::int64_t outside = 0;
  std::string first;
  for (std::int64_t i = 0; i < q.numel(); ++i) {
    const auto at = static_cast<std::size_t>(i);
    const std::uint32_t got = reference::load_code(&q.bytes[at * eb], q.dtype);
    const std::uint32_t want = reference::load_code(&expected.bytes[at * eb], q.dtype);
    if (got == want) continue;
    if (std::isfinite(truth.q_bound[at])) {
      const auto [lo, hi] = bracket(truth.q[at], truth.q_bound[at]);
      const std::int64_t o = ordered_code(got, q.dtype);
      const auto enc = [&](float x) {
        return ordered_code(reference::encode(x, q.dtype, spec::Saturation::kSatFinite), q.dtype);
      };
      if (o >= enc(lo) && o <= enc(hi)) continue;
    }
    if (outside++ == 0) {
      char text[256];
      std::snprintf(text, sizeof text,
                    "q_out: first outside its bound at token %lld head %lld dim %lld: truth %.9g "
                    "(bound %.3g), reference 0x%X, got 0x%X = %.9g",
                    static_cast<long long>(i / (heads * hd)),
                    static_cast<long long>((i / hd) % heads), static_cast<long long>(i % hd),
                    truth.q[at], truth.q_bound[at], want, got, reference::decode(got, q.dtype));
      first = text;
    }
  }
  if (outside == 0) return {};
  return std::to_string(outside) + " of " + std::to_string(q.numel()) +
         " q_out elements outside their bound; " + first;
}

}  // namespace

DenseJudgement judge_dense(const spec::ModelConfig& config,
                           const reference::PagedCacheLayout& layout, const spec::DenseInsert& in,
                           const spec::LayerCaches& expected, const spec::HostTensor& q_expected,
                           const spec::LayerCaches& actual, const spec::HostTensor& q_out,
                           spec::Ordering ordering, std::int64_t layer, std::size_t samples) {
  DenseJudgement j;
  CacheDiff cd;
  std::string q_report;
  if (ordering == spec::Ordering::kCanonical) {
    cd = diff_dense(config, layout, layer, in, expected, actual, samples);
    const AttentionDiff qd = diff_attention_exact(q_expected, q_out);
    if (!qd.pass()) q_report = "q_out: " + qd.report();
  } else {
    const ForeignDenseCodes codes(config, in);
    const AdmissibleRanges ranges = [&](const ElementCoord& at) { return codes(element_of(at)); };
    cd = diff_layer_caches(layout, layer, expected, actual, &in.kv, samples, nullptr, &ranges);
    q_report = diff_q_foreign(codes.truth(), q_out, q_expected);
  }
  if (!cd.equal()) j.report += cd.report() + "\n";
  j.report += q_report;
  j.pass = cd.equal() && q_report.empty();
  j.mismatch_size = cd.differing_bytes + (q_report.empty() ? 0 : 1);
  j.bytes_compared = cd.compared_bytes;
  j.failure_class = !cd.equal() ? cd.failure_class() : q_report.empty() ? "" : "q_out differs";
  if (j.report.empty()) j.report = cd.report();
  return j;
}

}  // namespace kvo::oracle
