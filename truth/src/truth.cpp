// Float64 truth (Eigen) and the derived error bounds of the read side.
//
// Attention bound, per output element d of a row with true scores s_t, weights w_t = softmax(s)_t,
// output o_d, M = max_t s_t and L = sum_t exp(s_t - M) (u = 2^-24, gamma_n = n u / (1 - n u)):
//   score error     eps_t <= sm * dot_bound_t * (1 + u) + u |s_t| + |ds_t|
//                     (the dot, then one product; ds_t = sm (q'.k'_t - q.k_t) is the exact effect
//                     of the profile rounding the operands to q', k', 0 when they are not rounded)
//   B_score         = (exp(2 max_t eps_t) - 1) * sum_t w_t |v_td - o_d|
//                     (the weights move by that factor)
//   rho_t           = u * (6 |s_t - M| + 4 C + 4 + 2 E)
//                     (exp arguments, the exp itself within E u, per chunk max, combine factors and
//                     their products; C chunks)
//   B_eval          = sum_t w_t rho_t (|v_td| + |o_d|) + gamma_A sum_t w_t |v_td| + gamma_B |o_d|
//                     (A: the chain accumulating o over tokens, B: the sum L)
//   rest            = 2 * (B_score + B_eval + N u |o_d|)
//                     (N u: the final O / L; the factor 2 covers the second-order terms)
// Canonical (SPEC 6): dots in 8-wide fma groups and a tree, E = 2, C chunks, A = sparse_block,
// B = log2(sparse_block), N = 1, and bound = rest + 2^-126.
//
// Foreign, profile F (spec::profile_facts): dots of any order, u per step (kFp32) or 2u per
// tensor-core step, E and N as F says, C = A = B = tokens (one rescale and one add per token); F
// may round the operands (above: ds_t; V below) and P. P rounded to a type of unit roundoff u_P
// (2^-8 bf16, 2^-11 fp16) is p_t (1 + delta_t) with |delta_t| <= u_P, or an absolute error of at
// most a_P on a p in units of its running maximum m <= M (the exp's flush below 2^-126, P's
// subnormals): in units of M, |p_t delta_t| <= max(u_P exp(s_t - M), a_P). First order:
//   L from P before its rounding (FA2, FA3, FlashMLA, Triton):
//     out = sum_t p_t (1 + delta_t) v_t / L        = o + sum_t w_t delta_t v_t
//   L from P after it:
//     out = sum_t p_t (1 + delta_t) v_t / L (1 + sum_t w_t delta_t)
//                                                  = o + sum_t w_t delta_t (v_t - o) / (1 + ...)
// so with e_t = max(u_P w_t, a_P / L), both are covered by
//   B_P = sum_t e_t (max(|v_td|, |v_td - o_d|) + dv_td)
//   B_V = sum_t w_t dv_td          (dv_td = |v'_td - v_td|, V rounded as an operand)
//   kappa = (exp(2 max_t eps_t) - 1) + max_t rho_t   (the weights P's rounding scales are the
//                                                     kernel's, not the true ones)
//   bound = ((B_P + B_V)(1 + kappa) + rest) / (1 - sum_t e_t) + 2^-126
// where the division covers the kernel's own output standing in for o in the second form. The P
// terms stay outside the factor 2: they are first order and exact, and the factor would halve
// what the flash profiles can catch. profile fp32: u_P = 0, a_P = 2^-126 and no operand rounding.
#include "kvo/truth/truth.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/read_rules.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::truth {
namespace {

using reference::QueryRow;
using spec::AttentionBug;
using spec::Ordering;

Eigen::VectorXd widen(const std::vector<float>& x) {
  return Eigen::Map<const Eigen::VectorXf>(x.data(), static_cast<Eigen::Index>(x.size()))
      .cast<double>();
}

std::vector<float> row_of(const spec::HostTensor& t, std::int64_t row, std::int64_t width) {
  std::vector<float> out(static_cast<std::size_t>(width));
  for (std::int64_t i = 0; i < width; ++i)
    out[static_cast<std::size_t>(i)] = reference::source_value(t, row * width + i);
  return out;
}

/// x with every element rounded to `type` (f32: unchanged), as a profile's operands.
std::vector<float> rounded(std::vector<float> x, spec::DType type) {
  for (float& e : x) e = reference::round_to(e, type);
  return x;
}

double ceil_log2(double n) { return n <= 1 ? 0.0 : std::ceil(std::log2(n)); }

/// dot_error_bound with `unit` u per accumulation step (1, or 2 on tensor cores).
double dot_bound(std::int64_t n, double sum_abs, Ordering ordering, double unit) {
  const double depth = ordering == Ordering::kCanonical
                           ? 8.0 + ceil_log2(static_cast<double>(n) / 8.0)
                           : static_cast<double>(n);
  return gamma_n(unit * depth) * sum_abs;
}

/// What rounding P costs under a profile, from the codec of P's type: u_P (0 when P stays fp32)
/// and a_P, the absolute error of one p in units of its running maximum.
struct PRounding {
  double unit = 0.0;
  double floor = 0x1p-126;  // ex2.approx.ftz and the canonical exp give +0 below 2^-126
};
PRounding p_rounding(spec::DType p) {
  PRounding r;
  if (p == spec::DType::kF32) return r;
  const std::uint32_t one = reference::encode(1.0f, p, spec::Saturation::kSatFinite);
  r.unit = (static_cast<double>(reference::decode(one + 1, p)) - 1.0) / 2.0;
  r.floor = std::max(r.floor, static_cast<double>(reference::decode(1, p)) / 2.0);
  return r;
}

/// sum_t softmax(s)_t v_t over the tokens with keep[t] (+0 when none is kept).
Eigen::VectorXd softmax_sum(const Eigen::VectorXd& s, const Eigen::MatrixXd& v,
                            const std::vector<bool>& keep) {
  double m = -INFINITY;
  for (Eigen::Index i = 0; i < s.size(); ++i)
    if (keep[static_cast<std::size_t>(i)]) m = std::max(m, s(i));
  Eigen::VectorXd w = Eigen::VectorXd::Zero(s.size());
  for (Eigen::Index i = 0; i < s.size(); ++i)
    if (keep[static_cast<std::size_t>(i)]) w(i) = std::exp(s(i) - m);
  const double l = w.sum();
  if (l == 0.0) return Eigen::VectorXd::Zero(v.cols());
  return v.transpose() * (w / l);
}

}  // namespace

double gamma_n(double n) { return n * kUnitRoundoff / (1.0 - n * kUnitRoundoff); }

double dot_error_bound(std::int64_t n, double sum_abs, Ordering ordering) {
  return dot_bound(n, sum_abs, ordering, 1.0);
}

AttentionTruth attention_truth(const spec::ModelConfig& c, const spec::AttentionParams& p,
                               const spec::ReadBatch& b, const spec::HostTensor& q,
                               const spec::LayerCaches& caches, const std::vector<float>& k_scale,
                               const std::vector<float>& v_scale,
                               const reference::TopkSelection* selection, Ordering ordering,
                               spec::AttentionProfile profile) {
  spec::validate_batch(c, b);
  spec::validate_attention(c, p);
  const bool canonical = ordering == Ordering::kCanonical;
  if (canonical && profile != spec::AttentionProfile::kFp32)
    throw std::invalid_argument("attention_truth: a canonical ordering has no profile");
  const spec::AttentionProfileFacts& f = spec::profile_facts(profile);
  const PRounding pr = p_rounding(f.p);
  const double unit = f.dots == spec::Accumulation::kTensorCore ? 2.0 : 1.0;
  const std::vector<QueryRow> rows = reference::query_rows(b);
  const auto tq = static_cast<std::int64_t>(rows.size());
  const std::int64_t nkv = c.geometry.num_kv_heads, hd = c.geometry.head_dim, sb = p.sparse_block;
  const std::int64_t group = p.num_q_heads / nkv;
  const double sm = p.sm_scale > 0.0f ? p.sm_scale : reference::default_sm_scale(hd);
  const double u = kUnitRoundoff;

  AttentionTruth truth;
  truth.ordering = ordering;
  truth.profile = profile;
  truth.out.assign(static_cast<std::size_t>(tq * p.num_q_heads * hd), 0.0);
  truth.bound.assign(truth.out.size(), 0.0);
  if (!canonical) {
    for (const auto& entry : spec::EnumInfo<AttentionBug>::kNames) {
      if (spec::bug_is_numeric(entry.value)) truth.planted.push_back({entry.value, truth.out});
    }
  }
  for (std::int64_t qi = 0; qi < tq; ++qi) {
    const QueryRow& row = rows[static_cast<std::size_t>(qi)];
    if (b.seq_lens[static_cast<std::size_t>(row.request)] == 0) continue;
    const std::int64_t n_valid = reference::n_valid_blocks(row.position, sb);
    for (std::int64_t g = 0; g < nkv; ++g) {
      const std::vector<std::int64_t> chunks =
          reference::attention_chunks(selection, qi, g, n_valid);
      std::vector<std::int64_t> tokens;
      std::vector<bool> not_chunk_last;  // kDropChunkLast keeps these
      for (std::int64_t j : chunks) {
        const std::int64_t end = std::min((j + 1) * sb, row.position + 1);
        for (std::int64_t t = j * sb; t < end; ++t) {
          tokens.push_back(t);
          not_chunk_last.push_back(t + 1 < end);
        }
      }
      if (tokens.empty()) continue;
      // K and V of the KV head, as given (k, v) and as the profile's operands (kr, vr); V of the
      // neighbouring head for kNeighbourV.
      const auto n = static_cast<Eigen::Index>(tokens.size());
      std::vector<std::vector<float>> k(tokens.size()), kr(tokens.size());
      Eigen::MatrixXd v(n, hd), dv(n, hd), v_next(n, hd);
      for (Eigen::Index i = 0; i < n; ++i) {
        const std::int64_t t = tokens[static_cast<std::size_t>(i)];
        const auto at = static_cast<std::size_t>(i);
        k[at] = reference::read_kv(c, b, caches, k_scale, 0, row.request, t, g);
        kr[at] = rounded(k[at], f.operands);
        const std::vector<float> vf =
            reference::read_kv(c, b, caches, v_scale, 1, row.request, t, g);
        v.row(i) = widen(vf).transpose();
        dv.row(i) = (widen(rounded(vf, f.operands)) - widen(vf)).cwiseAbs().transpose();
        if (!canonical) {
          v_next.row(i) =
              widen(reference::read_kv(c, b, caches, v_scale, 1, row.request, t, (g + 1) % nkv))
                  .transpose();
        }
      }
      for (std::int64_t hq = g * group; hq < (g + 1) * group; ++hq) {
        const std::vector<float> qf = row_of(q, reference::head_row(qi, hq, p.num_q_heads), hd);
        const Eigen::VectorXd qv = widen(qf), qr = widen(rounded(qf, f.operands));
        Eigen::VectorXd s(n), eps(n);
        for (Eigen::Index i = 0; i < n; ++i) {
          const auto at = static_cast<std::size_t>(i);
          const Eigen::VectorXd kv = widen(k[at]), krv = widen(kr[at]);
          s(i) = qv.dot(kv) * sm;
          const double ds = sm * std::fabs(qr.dot(krv) - qv.dot(kv));
          const double sum_abs =
              std::max(qv.cwiseAbs().dot(kv.cwiseAbs()), qr.cwiseAbs().dot(krv.cwiseAbs()));
          eps(i) =
              sm * dot_bound(hd, sum_abs, ordering, unit) * (1.0 + u) + u * std::fabs(s(i)) + ds;
        }
        const double big_m = s.maxCoeff();
        const Eigen::VectorXd w_unnorm = (s.array() - big_m).exp().matrix();
        const double big_l = w_unnorm.sum();
        const Eigen::VectorXd w = w_unnorm / big_l;
        const Eigen::VectorXd out = v.transpose() * w;
        const double n_d = static_cast<double>(n);
        const double chunks_n = canonical ? static_cast<double>(chunks.size()) : n_d;
        const double exp_err = canonical ? 2.0 : f.exp_error_u;
        const Eigen::VectorXd rho =
            (u * (6.0 * (big_m - s.array()) + 4.0 * chunks_n + 4.0 + 2.0 * exp_err)).matrix();
        const double gamma_a = gamma_n(canonical ? static_cast<double>(sb) : unit * n_d);
        const double gamma_b = gamma_n(canonical ? ceil_log2(static_cast<double>(sb)) : n_d);
        const double normalize = canonical ? 1.0 : f.normalize_error_u;
        const double score_factor = std::expm1(2.0 * eps.maxCoeff());
        const double kappa = score_factor + rho.maxCoeff();
        // e_t = max(u_P w_t, a_P / L): the error P's rounding puts on each weight.
        const Eigen::ArrayXd e = (pr.unit * w.array()).max(pr.floor / big_l);
        const double shrink = canonical ? 1.0 : 1.0 - e.sum();
        for (std::int64_t d = 0; d < hd; ++d) {
          const double o = out(d);
          const Eigen::ArrayXd abs_v = v.col(d).array().abs();
          const Eigen::ArrayXd dev = (v.col(d).array() - o).abs();
          const double b_score = score_factor * (w.array() * dev).sum();
          const double b_eval = (w.array() * rho.array() * (abs_v + std::fabs(o))).sum() +
                                gamma_a * (w.array() * abs_v).sum() + gamma_b * std::fabs(o);
          const double rest = 2.0 * (b_score + b_eval + normalize * u * std::fabs(o));
          double bound = rest;
          if (!canonical) {
            const double b_p = (e * (abs_v.max(dev) + dv.col(d).array())).sum();
            const double b_v = (w.array() * dv.col(d).array()).sum();
            bound = ((b_p + b_v) * (1.0 + kappa) + rest) / shrink;
          }
          const auto at =
              static_cast<std::size_t>(reference::head_row(qi, hq, p.num_q_heads) * hd + d);
          truth.out[at] = o;
          truth.bound[at] = bound + 0x1p-126;
        }
        // The planted bugs, each in the same float64 arithmetic as `out`.
        const std::vector<bool> all(tokens.size(), true);
        for (PlantedOutput& planted : truth.planted) {
          Eigen::VectorXd bug_out;
          switch (planted.bug) {
            case AttentionBug::kDropChunkLast:
              bug_out = softmax_sum(s, v, not_chunk_last);
              break;
            case AttentionBug::kScaleOff:
              bug_out = softmax_sum(s * static_cast<double>(spec::kScaleOffFactor), v, all);
              break;
            case AttentionBug::kNeighbourV:  // one KV head: its own V, no bug at all
              bug_out = nkv == 1 ? out : softmax_sum(s, v_next, all);
              break;
            case AttentionBug::kNone:
            case AttentionBug::kStopAtMinusOne:  // selection bugs: never planted (bug_is_numeric)
            case AttentionBug::kMaskedChunkNan:
              bug_out = out;
              break;
          }
          for (std::int64_t d = 0; d < hd; ++d) {
            planted.out[static_cast<std::size_t>(reference::head_row(qi, hq, p.num_q_heads) * hd +
                                                 d)] = bug_out(d);
          }
        }
      }
    }
  }
  return truth;
}

ScoreTruth indexer_truth(const spec::ModelConfig& c, const spec::IndexerParams& p,
                         const spec::ReadBatch& b, const spec::HostTensor& index_q,
                         const spec::LayerCaches& caches, Ordering ordering) {
  spec::validate_batch(c, b);
  spec::validate_indexer(c, p);
  const std::vector<QueryRow> rows = reference::query_rows(b);
  const auto tq = static_cast<std::int64_t>(rows.size());
  const std::int64_t nkv = c.geometry.num_kv_heads, dim = c.geometry.index_dim;
  const std::int64_t per_group = p.num_index_heads / nkv;
  // Score rows per KV head: 1 (max: the group's score) or its index heads (union).
  const std::int64_t lanes = spec::selection_lanes(p, nkv);
  const std::int64_t max_blocks = reference::max_valid_blocks(rows, p.sparse_block);
  const double factor = spec::index_score_factor(p.score_scale, dim);
  ScoreTruth truth;
  truth.scores.assign(static_cast<std::size_t>(tq * nkv * lanes * max_blocks), -INFINITY);
  truth.bound.assign(truth.scores.size(), 0.0);
  // The index-K rows of the request being read, t = 0, 1, ...: each read once a request (its
  // query rows see the rows t <= p of their positions p).
  std::int64_t ik_request = -1;
  std::vector<Eigen::VectorXd> ik;
  for (std::int64_t qi = 0; qi < tq; ++qi) {
    const QueryRow& row = rows[static_cast<std::size_t>(qi)];
    if (b.seq_lens[static_cast<std::size_t>(row.request)] == 0) continue;
    const std::int64_t n_valid = reference::n_valid_blocks(row.position, p.sparse_block);
    if (row.request != ik_request) {
      ik.clear();
      ik_request = row.request;
    }
    for (auto t = static_cast<std::int64_t>(ik.size()); t <= row.position; ++t)
      ik.push_back(widen(reference::read_index_k(c, b, caches, row.request, t)));
    std::vector<Eigen::VectorXd> iq;
    for (std::int64_t h = 0; h < p.num_index_heads; ++h)
      iq.push_back(widen(row_of(index_q, reference::head_row(qi, h, p.num_index_heads), dim)));
    for (std::int64_t r = 0; r < nkv * lanes; ++r) {
      // Score row r: KV head r under max (its index heads), index head r under union.
      const std::int64_t first_head = lanes == 1 ? r * per_group : r;
      const std::int64_t end_head = lanes == 1 ? (r + 1) * per_group : r + 1;
      for (std::int64_t j = 0; j < n_valid; ++j) {
        // Per index head: its block score (the NaN rule is the head's) and the bound of its
        // float32 token scores; then the row's max over its heads, whose error is at most the
        // largest of theirs.
        reference::GroupScore<double> group;
        double bound = 0.0;
        for (std::int64_t h = first_head; h < end_head; ++h) {
          reference::HeadBlockScore<double> head(p.index_nan);
          double head_bound = 0.0;
          for (std::int64_t t = j * p.sparse_block;
               t < (j + 1) * p.sparse_block && t <= row.position; ++t) {
            const Eigen::VectorXd& k = ik[static_cast<std::size_t>(t)];
            const Eigen::VectorXd& qh = iq[static_cast<std::size_t>(h)];
            // The fp32 token score is fl(dot * factor): the dot's error scaled, plus the
            // multiply's rounding (none for the factor 1).
            const double dot = qh.dot(k);
            const double dot_bound =
                dot_error_bound(dim, qh.cwiseAbs().dot(k.cwiseAbs()), ordering);
            head.add(factor * dot);
            head_bound = std::max(
                head_bound,
                factor * dot_bound +
                    (factor == 1.0 ? 0.0 : factor * (std::abs(dot) + dot_bound) * 0x1p-24));
          }
          group.add(head.value());
          if (!head.ruled_by_nan()) bound = std::max(bound, head_bound);
        }
        double score = group.value();
        if (const auto forced = reference::forced_block_score(j, n_valid, p)) {
          score = *forced;
          bound = 0.0;
        }
        const std::size_t at = reference::score_index(qi, r, j, nkv * lanes, max_blocks);
        truth.scores[at] = score;
        truth.bound[at] = bound;
      }
    }
  }
  return truth;
}

}  // namespace kvo::truth
