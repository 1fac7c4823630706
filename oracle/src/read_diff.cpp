#include "kvo/oracle/read_diff.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "kvo/reference/numbers.hpp"

namespace kvo::oracle {
namespace {

constexpr std::size_t kSamples = 8;

std::string ids_text(const std::vector<std::int32_t>& ids) {
  std::string s = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s + "]";
}

std::vector<std::int32_t> row_ids(const std::vector<std::int32_t>& all, std::int64_t row,
                                  std::int64_t topk) {
  return {all.begin() + row * topk, all.begin() + (row + 1) * topk};
}

/// The reference scores of a row's (lane's) valid blocks, sorted descending, and the k_eff-th.
float kth_score(const reference::TopkSelection& s, std::int64_t q, std::int64_t g,
                std::int64_t n_valid, std::int64_t k_eff, std::int64_t lane = 0) {
  std::vector<float> v;
  for (std::int64_t j = 0; j < n_valid; ++j) v.push_back(s.score(q, g, j, lane));
  std::sort(v.begin(), v.end(), std::greater<>());
  return k_eff > 0 ? v[static_cast<std::size_t>(k_eff - 1)] : -INFINITY;
}

void fill_set_difference(const reference::TopkSelection& s, TopkRowDiff& d) {
  std::set<std::int32_t> want, got;
  for (std::int32_t id : d.expected)
    if (id >= 0) want.insert(id);
  for (std::int32_t id : d.actual)
    if (id >= 0) got.insert(id);
  for (std::int32_t id : want) {
    if (!got.count(id)) {
      d.missing.push_back(id);
      d.missing_scores.push_back(s.score(d.query, d.kv_head, id));
    }
  }
  for (std::int32_t id : got) {
    if (!want.count(id)) {
      d.extra.push_back(id);
      d.extra_scores.push_back(id < d.n_valid ? s.score(d.query, d.kv_head, id) : NAN);
    }
  }
}

/// Why the first `count` ids of a (token-major) row break the declared order, or "": ascending
/// ids, or (with one lane only: a union has no one score order) descending reference scores,
/// where a later block may score above an earlier one by at most slack(later, earlier).
template <class Slack>
std::string order_problem(const reference::TopkSelection& e, std::int64_t q, std::int64_t g,
                          const std::vector<std::int32_t>& row, std::int64_t count, TopkOrder order,
                          Slack slack) {
  const bool by_score = order == TopkOrder::kDescendingScore && e.lanes == 1;
  if (order != TopkOrder::kAscendingIds && !by_score) return {};
  for (std::int64_t k = 1; k < count; ++k) {
    const std::int32_t prev = row[static_cast<std::size_t>(k - 1)],
                       cur = row[static_cast<std::size_t>(k)];
    const bool ok = !by_score ? cur > prev
                              : static_cast<double>(e.score(q, g, cur)) <=
                                    static_cast<double>(e.score(q, g, prev)) + slack(cur, prev);
    if (!ok) {
      return "ids " + std::to_string(prev) + ", " + std::to_string(cur) +
             " not in the declared order (" + (by_score ? "descending score" : "ascending ids") +
             ")";
    }
  }
  return {};
}

/// An order-preserving integer image of a float code, for ulp distances.
std::int64_t ordered(std::uint32_t code, spec::DType dtype) {
  const int bits = static_cast<int>(8 * spec::dtype_bytes(dtype));
  const std::uint32_t sign = 1u << (bits - 1);
  const std::int64_t mag = code & (sign - 1);
  return (code & sign) ? -mag : mag;
}

/// The histogram bucket of an ulp distance: 0, 1, 2, 3-4, 5-8, 9-16, 17-256, more.
std::size_t ulp_bucket(std::uint64_t ulps) {
  if (ulps <= 2) return static_cast<std::size_t>(ulps);
  if (ulps <= 4) return 3;
  if (ulps <= 8) return 4;
  if (ulps <= 16) return 5;
  return ulps <= 256 ? 6 : 7;
}

double ulp_at(double x, spec::DType dtype) {
  const int mantissa = dtype == spec::DType::kF32 ? 23 : dtype == spec::DType::kBF16 ? 7 : 10;
  const int emin = dtype == spec::DType::kF16 ? -14 : -126;
  const int e = x == 0.0 ? emin : std::max(std::ilogb(x), emin);
  return std::ldexp(1.0, e - mantissa);
}

}  // namespace

std::uint64_t ulp_distance(std::uint32_t a, std::uint32_t b, spec::DType dtype) {
  const std::int64_t d = ordered(a, dtype) - ordered(b, dtype);
  return static_cast<std::uint64_t>(d < 0 ? -d : d);
}

std::string TopkDiff::report() const {
  std::ostringstream s;
  if (equal()) {
    s << "top-k identical (" << rows << " rows)";
    return s.str();
  }
  s << differing << " of " << rows << " top-k rows differ";
  for (const TopkRowDiff& d : samples) {
    s << "\n  query " << d.query << " kv_head " << d.kv_head << " (n_valid " << d.n_valid
      << ", k_eff " << d.k_eff << ", k_eff-th score " << d.kth_score << "): expected "
      << ids_text(d.expected) << ", got " << ids_text(d.actual);
    for (std::size_t i = 0; i < d.missing.size(); ++i)
      s << "; missing " << d.missing[i] << " (score " << d.missing_scores[i] << ")";
    for (std::size_t i = 0; i < d.extra.size(); ++i)
      s << "; extra " << d.extra[i] << " (score " << d.extra_scores[i] << ")";
    if (!d.problem.empty()) s << "; " << d.problem;
  }
  return s.str();
}

std::string diff_selection_exact(const reference::TopkSelection& e,
                                 const reference::TopkSelection& a) {
  const auto shape = [](const reference::TopkSelection& s) {
    return "[Tq " + std::to_string(s.num_queries) + ", nkv " + std::to_string(s.num_kv_heads) +
           ", width " + std::to_string(s.topk) + ", lanes " + std::to_string(s.lanes) + "]";
  };
  if (shape(e) != shape(a) || a.n_valid.size() != e.n_valid.size())
    return "selection shape " + shape(a) + ", expected " + shape(e);
  for (std::size_t q = 0; q < e.n_valid.size(); ++q) {
    if (a.n_valid[q] != e.n_valid[q]) {
      return "n_valid of query row " + std::to_string(q) + ": " + std::to_string(a.n_valid[q]) +
             ", expected " + std::to_string(e.n_valid[q]);
    }
  }
  if (const TopkDiff d = diff_topk_exact(e, a.ids); !d.equal()) return d.report();
  const std::int64_t rows = e.num_kv_heads * e.lanes;
  for (std::int64_t q = 0; q < e.num_queries; ++q) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < e.n_valid[static_cast<std::size_t>(q)]; ++j) {
        const float want = e.scores[reference::score_index(q, r, j, rows, e.max_blocks)];
        const float got = a.scores.size() == e.scores.size() && a.max_blocks == e.max_blocks
                              ? a.scores[reference::score_index(q, r, j, rows, a.max_blocks)]
                              : NAN;
        if (std::bit_cast<std::uint32_t>(want) == std::bit_cast<std::uint32_t>(got)) continue;
        char text[320];
        std::snprintf(text, sizeof text,
                      "block score of query row %lld, score row %lld (KV head %lld, lane %lld), "
                      "block %lld: %.9g (0x%08x), expected %.9g (0x%08x)",
                      static_cast<long long>(q), static_cast<long long>(r),
                      static_cast<long long>(r / e.lanes), static_cast<long long>(r % e.lanes),
                      static_cast<long long>(j), static_cast<double>(got),
                      std::bit_cast<std::uint32_t>(got), static_cast<double>(want),
                      std::bit_cast<std::uint32_t>(want));
        return text;
      }
    }
  }
  return {};
}

TopkDiff diff_topk_exact(const reference::TopkSelection& e,
                         const std::vector<std::int32_t>& actual) {
  TopkDiff diff;
  diff.rows = e.num_queries * e.num_kv_heads;
  if (actual.size() != e.ids.size()) {
    diff.differing = diff.rows;
    TopkRowDiff d;
    d.problem = "output has " + std::to_string(actual.size()) + " ids, expected " +
                std::to_string(e.ids.size());
    diff.samples.push_back(d);
    return diff;
  }
  for (std::int64_t q = 0; q < e.num_queries; ++q) {
    for (std::int64_t g = 0; g < e.num_kv_heads; ++g) {
      const std::int64_t row = q * e.num_kv_heads + g;
      TopkRowDiff d;
      d.expected = row_ids(e.ids, row, e.topk);
      d.actual = row_ids(actual, row, e.topk);
      if (d.expected == d.actual) continue;
      ++diff.differing;
      if (diff.samples.size() >= kSamples) continue;
      d.query = q;
      d.kv_head = g;
      d.n_valid = e.n_valid[static_cast<std::size_t>(q)];
      d.k_eff = std::min(e.topk / e.lanes, d.n_valid);
      d.kth_score = kth_score(e, q, g, d.n_valid, d.k_eff);
      fill_set_difference(e, d);
      diff.samples.push_back(d);
    }
  }
  return diff;
}

std::vector<std::int32_t> token_major_ids(const reference::TopkSelection& e,
                                          const std::vector<std::int32_t>& actual,
                                          spec::TopkLayout layout) {
  if (layout == spec::TopkLayout::kTokenMajor || actual.size() != e.ids.size()) return actual;
  std::vector<std::int32_t> rows(actual.size());
  for (std::int64_t q = 0; q < e.num_queries; ++q)
    for (std::int64_t g = 0; g < e.num_kv_heads; ++g)
      for (std::int64_t k = 0; k < e.topk; ++k)
        rows[static_cast<std::size_t>((q * e.num_kv_heads + g) * e.topk + k)] =
            actual[static_cast<std::size_t>(
                spec::topk_offset(layout, q, g, k, e.num_queries, e.num_kv_heads, e.topk))];
  return rows;
}

TopkDiff diff_topk_declared(const reference::TopkSelection& e, const truth::ScoreTruth* truth,
                            const spec::IndexerParams& p, const std::vector<std::int32_t>& actual,
                            spec::Ordering ordering, const TopkForm& form) {
  const std::vector<std::int32_t> rows = token_major_ids(e, actual, form.layout);
  if (ordering == spec::Ordering::kForeign) return diff_topk_tie_aware(e, *truth, p, rows, form);
  // Canonical: the reference's rows exactly, and in the declared order with exact scores (rows
  // that equal the reference's are ascending ids: another declared order holds only over ties).
  TopkDiff d = diff_topk_exact(e, rows);
  if (!d.equal()) return d;
  for (std::int64_t r = 0; r < d.rows; ++r) {
    const std::int64_t q = r / e.num_kv_heads, g = r % e.num_kv_heads;
    const std::vector<std::int32_t> row = row_ids(rows, r, e.topk);
    const auto count =
        static_cast<std::int64_t>(std::find(row.begin(), row.end(), -1) - row.begin());
    std::string problem = order_problem(e, q, g, row, count, form.order,
                                        [](std::int64_t, std::int64_t) { return 0.0; });
    if (problem.empty()) continue;
    ++d.differing;
    if (d.samples.size() < kSamples) {
      TopkRowDiff s;
      s.query = q;
      s.kv_head = g;
      s.n_valid = e.n_valid[static_cast<std::size_t>(q)];
      s.k_eff = std::min(e.topk / e.lanes, s.n_valid);
      s.expected = s.actual = row;
      s.kth_score = kth_score(e, q, g, s.n_valid, s.k_eff);
      s.problem = std::move(problem);
      d.samples.push_back(std::move(s));
    }
  }
  return d;
}

TopkDiff diff_topk_tie_aware(const reference::TopkSelection& e, const truth::ScoreTruth& truth,
                             const spec::IndexerParams& p, const std::vector<std::int32_t>& actual,
                             const TopkForm& form) {
  const TopkOrder order = form.order;
  TopkDiff diff;
  diff.rows = e.num_queries * e.num_kv_heads;
  if (actual.size() != e.ids.size()) return diff_topk_exact(e, actual);
  const bool drop = p.neg_inf == spec::IndexNegInf::kDrop;
  for (std::int64_t q = 0; q < e.num_queries; ++q) {
    for (std::int64_t g = 0; g < e.num_kv_heads; ++g) {
      const std::int64_t row = q * e.num_kv_heads + g;
      TopkRowDiff d;
      d.query = q;
      d.kv_head = g;
      d.n_valid = e.n_valid[static_cast<std::size_t>(q)];
      d.k_eff = std::min(p.topk, d.n_valid);
      d.expected = row_ids(e.ids, row, e.topk);
      d.actual = row_ids(actual, row, e.topk);
      d.kth_score = kth_score(e, q, g, d.n_valid, d.k_eff);
      // Per lane (score row; one under index_group max): its k_eff-th score, a block holding it
      // (for its bound), and the bound of each block's score.
      auto bound_of = [&](std::int64_t l, std::int64_t j) {
        return truth.bound[reference::score_index(q, g * e.lanes + l, j, e.num_kv_heads * e.lanes,
                                                  e.max_blocks)];
      };
      std::vector<float> kth(static_cast<std::size_t>(e.lanes));
      std::vector<std::int64_t> kth_block(static_cast<std::size_t>(e.lanes), -1);
      for (std::int64_t l = 0; l < e.lanes; ++l) {
        kth[static_cast<std::size_t>(l)] = kth_score(e, q, g, d.n_valid, d.k_eff, l);
        for (std::int64_t j = 0; j < d.n_valid && d.k_eff > 0; ++j)
          if (e.score(q, g, j, l) == kth[static_cast<std::size_t>(l)])
            kth_block[static_cast<std::size_t>(l)] = j;
      }
      // Slack of two scores of lane l: both bounds, and one key step at the larger magnitude
      // (SPEC 5: keys of the declared precision may tie scores that far apart).
      auto pair_slack = [&](std::int64_t l, std::int64_t a, std::int64_t b) {
        const double bounds = bound_of(l, a) + bound_of(l, b);
        const double reach = std::max(std::fabs(static_cast<double>(e.score(q, g, a, l))),
                                      std::fabs(static_cast<double>(e.score(q, g, b, l))));
        return bounds + spec::topk_key_step(reach + bounds, form.key_bits);
      };
      // Score slack of block j in lane l against the lane's cut.
      auto slack = [&](std::int64_t l, std::int64_t j) {
        const std::int64_t kb = kth_block[static_cast<std::size_t>(l)];
        return kb >= 0 ? pair_slack(l, j, kb) : bound_of(l, j);
      };
      auto droppable = [&](std::int64_t l, std::int64_t j) {
        return drop && e.score(q, g, j, l) == -INFINITY;
      };
      // May lane l have chosen block j: at least its cut less the slack (not dropped).
      auto admissible = [&](std::int64_t l, std::int64_t j) {
        return !droppable(l, j) &&
               static_cast<double>(e.score(q, g, j, l)) >=
                   static_cast<double>(kth[static_cast<std::size_t>(l)]) - slack(l, j);
      };
      std::set<std::int32_t> chosen;
      std::int64_t valid_count = 0;
      bool seen_pad = false;
      for (std::size_t k = 0; k < d.actual.size() && d.problem.empty(); ++k) {
        const std::int32_t id = d.actual[k];
        if (id < 0) {
          seen_pad = true;
          continue;
        }
        if (seen_pad && order != TopkOrder::kUnordered) d.problem = "an id after a -1 entry";
        ++valid_count;
        bool any_lane = false;
        for (std::int64_t l = 0; l < e.lanes && id < d.n_valid; ++l) any_lane |= admissible(l, id);
        if (id >= d.n_valid)
          d.problem =
              "id " + std::to_string(id) + " is not below n_valid " + std::to_string(d.n_valid);
        else if (!chosen.insert(id).second)
          d.problem = "duplicate id " + std::to_string(id);
        else if (!any_lane) {
          d.problem = "block " + std::to_string(id) + " scores " +
                      std::to_string(e.score(q, g, id)) +
                      (droppable(0, id) ? ", -inf, which drop_neg_inf drops"
                                        : ", below the k_eff-th score less the bounds");
        }
      }
      // How many ids a row holds: k_eff per lane (fewer where drop_neg_inf drops -inf blocks),
      // exactly under max, between the largest lane's and their sum under union.
      std::int64_t fewest = 0, most = 0;
      for (std::int64_t l = 0; l < e.lanes; ++l) {
        std::int64_t keep = d.k_eff;
        if (drop) {
          std::int64_t finite = 0;
          for (std::int64_t j = 0; j < d.n_valid; ++j) finite += !droppable(l, j);
          keep = std::min(keep, finite);
        }
        fewest = std::max(fewest, keep);
        most += keep;
      }
      if (d.problem.empty() && (valid_count < fewest || valid_count > most)) {
        d.problem = std::to_string(valid_count) + " ids chosen, expected " +
                    (fewest == most ? std::to_string(fewest)
                                    : std::to_string(fewest) + " to " + std::to_string(most));
      }
      // Every lane's certain blocks (above its cut by more than the slack) and forced blocks.
      for (std::int64_t l = 0; l < e.lanes && d.problem.empty(); ++l) {
        const reference::ForcedBlocks f = reference::forced_blocks(
            d.n_valid, d.k_eff, p, [&](std::int64_t j) { return e.score(q, g, j, l); });
        for (std::int64_t j = 0; j < d.n_valid && d.problem.empty(); ++j) {
          const auto id = static_cast<std::int32_t>(j);
          if (chosen.count(id) || droppable(l, j)) continue;
          if (f.room && f.forced.count(id)) {
            d.problem = "forced block " + std::to_string(j) + " missing";
          } else if (static_cast<double>(e.score(q, g, j, l)) >
                     static_cast<double>(kth[static_cast<std::size_t>(l)]) + slack(l, j)) {
            d.problem = "block " + std::to_string(j) + " (score " +
                        std::to_string(e.score(q, g, j, l)) +
                        ") is above the k_eff-th score by more than the bounds, yet missing";
          }
        }
      }
      if (d.problem.empty())
        d.problem =
            order_problem(e, q, g, d.actual, valid_count, order,
                          [&](std::int64_t a, std::int64_t b) { return pair_slack(0, a, b); });
      if (d.problem.empty()) continue;
      ++diff.differing;
      if (diff.samples.size() < kSamples) {
        fill_set_difference(e, d);
        diff.samples.push_back(d);
      }
    }
  }
  return diff;
}

std::string AttentionDiff::report() const {
  std::ostringstream s;
  s.precision(9);
  if (bounded) {
    s << "profile " << spec::name_of(profile) << ": ";
    s << differing << " of " << elements << " elements past their bound; max abs error "
      << max_abs_error << ", max rel error " << max_rel_error << ", worst error / allowed "
      << max_error_ratio << "; ulp histogram [0,1,2,3-4,5-8,9-16,17-256,>256] =";
    for (std::int64_t c : ulp_histogram) s << " " << c;
  } else {
    s << differing << " of " << elements << " elements differ";
  }
  if (first) {
    char bits[64];
    std::snprintf(bits, sizeof bits, "0x%X vs 0x%X", first->expected_bits, first->actual_bits);
    s << "\n  first: query " << first->query << " head " << first->head << " dim " << first->dim
      << ": expected " << first->expected << ", got " << first->actual << " (" << bits << ", "
      << first->ulps << " ulp)";
    if (bounded) s << ", allowed error " << first->bound;
  }
  for (const BlindSpot& b : blind) {
    s << "\n  profile " << spec::name_of(profile)
      << " is too loose for this case to catch planted bug " << spec::name_of(b.bug)
      << " (its largest effect is " << b.reach << " of the allowed error)";
  }
  return s.str();
}

AttentionDiff diff_attention_exact(const spec::HostTensor& e, const spec::HostTensor& a) {
  AttentionDiff diff;
  diff.elements = e.numel();
  const auto eb = spec::dtype_bytes(e.dtype);
  if (a.dtype != e.dtype || a.shape != e.shape || a.bytes.size() != e.bytes.size()) {
    diff.differing = diff.elements;
    return diff;
  }
  const std::int64_t heads = e.shape[1], hd = e.shape[2];
  for (std::int64_t i = 0; i < diff.elements; ++i) {
    const std::uint32_t x =
        reference::load_code(&e.bytes[static_cast<std::size_t>(i) * eb], e.dtype);
    const std::uint32_t y =
        reference::load_code(&a.bytes[static_cast<std::size_t>(i) * eb], e.dtype);
    const std::uint64_t ulps = ulp_distance(x, y, e.dtype);
    ++diff.ulp_histogram[ulp_bucket(ulps)];
    if (x == y) continue;
    ++diff.differing;
    if (!diff.first) {
      diff.first = AttentionMismatch{i / (heads * hd),
                                     (i / hd) % heads,
                                     i % hd,
                                     x,
                                     y,
                                     reference::decode(x, e.dtype),
                                     reference::decode(y, e.dtype),
                                     ulps,
                                     0.0};
    }
  }
  return diff;
}

AttentionDiff diff_attention_bounded(const truth::AttentionTruth& truth,
                                     const spec::HostTensor& a) {
  AttentionDiff diff;
  diff.bounded = true;
  diff.profile = truth.profile;
  diff.elements = a.numel();
  const auto eb = spec::dtype_bytes(a.dtype);
  if (static_cast<std::size_t>(diff.elements) != truth.out.size() || a.shape.size() != 3) {
    diff.differing = diff.elements;
    return diff;
  }
  const std::int64_t heads = a.shape[1], hd = a.shape[2];
  std::vector<double> reach(truth.planted.size(), 0.0);  // per planted bug: max effect / allowed
  for (std::int64_t i = 0; i < diff.elements; ++i) {
    const auto at = static_cast<std::size_t>(i);
    const std::uint32_t code = reference::load_code(&a.bytes[at * eb], a.dtype);
    const double got = reference::decode(code, a.dtype);
    const double want = truth.out[at];
    const double bound = truth.bound[at];
    const double err = std::fabs(got - want);
    const double allowed = bound + ulp_at(std::fabs(want) + bound, a.dtype);
    for (std::size_t b = 0; b < reach.size(); ++b)
      reach[b] = std::max(reach[b], std::fabs(truth.planted[b].out[at] - want) / allowed);
    const std::uint32_t want_code =
        reference::encode(static_cast<float>(want), a.dtype, spec::Saturation::kSatFinite);
    const std::uint64_t ulps = ulp_distance(want_code, code, a.dtype);
    ++diff.ulp_histogram[ulp_bucket(ulps)];
    if (!std::isnan(err)) {
      diff.max_abs_error = std::max(diff.max_abs_error, err);
      if (want != 0.0) diff.max_rel_error = std::max(diff.max_rel_error, err / std::fabs(want));
      diff.max_error_ratio = std::max(diff.max_error_ratio, err / allowed);
    }
    if (err <= allowed) continue;  // NaN fails here
    ++diff.differing;
    if (!diff.first) {
      diff.first = AttentionMismatch{
          i / (heads * hd), (i / hd) % heads, i % hd, want_code, code, want, got, ulps, allowed};
    }
  }
  // A bug that moves nothing (V of the neighbouring head with one KV head) is not a blind spot.
  for (std::size_t b = 0; b < reach.size(); ++b) {
    if (reach[b] > 0.0 && reach[b] <= 1.0) diff.blind.push_back({truth.planted[b].bug, reach[b]});
  }
  return diff;
}

}  // namespace kvo::oracle
