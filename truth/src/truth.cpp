// Float64 truth (Eigen) and the derived error bounds of the read side.
//
// Attention bound, per output element d of a row with true scores s_t, weights w_t = softmax(s)_t,
// output o_d and M = max_t s_t (u = 2^-24, gamma_n = n u / (1 - n u)):
//   score error     eps_t <= sm * dot_bound_t * (1 + u) + u * |s_t|      (dot, then one product)
//   B_score         = (exp(2 max_t eps_t) - 1) * sum_t w_t |v_td - o_d|
//                     (the weights move by that factor)
//   rho_t           = u * (6 |s_t - M| + 4 C + 8)
//                     (exp arguments and the exp itself, per chunk max, combine factors and their
//                     products; C chunks)
//   B_eval          = sum_t w_t rho_t (|v_td| + |o_d|) + gamma_A sum_t w_t |v_td| + gamma_B |o_d|
//                     (A: fma chain over a chunk's tokens, B: tree over sparse_block positions)
//   bound           = 2 * (B_score + B_eval + u |o_d|) + 2^-126
// The factor 2 covers second-order terms. Foreign ordering: dots bounded by gamma_n, exp by 4u plus
// its arguments, one rescale per token (C = tokens) and sums in any order (A = B = tokens).
#include "kvo/truth/truth.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/read_rules.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::truth {
namespace {

using reference::QueryRow;
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

double ceil_log2(double n) { return n <= 1 ? 0.0 : std::ceil(std::log2(n)); }

}  // namespace

double gamma_n(double n) { return n * kUnitRoundoff / (1.0 - n * kUnitRoundoff); }

double dot_error_bound(std::int64_t n, double sum_abs, Ordering ordering) {
  const double depth = ordering == Ordering::kCanonical
                           ? 8.0 + ceil_log2(static_cast<double>(n) / 8.0)
                           : static_cast<double>(n);
  return gamma_n(depth) * sum_abs;
}

AttentionTruth attention_truth(const spec::ModelConfig& c, const spec::AttentionParams& p,
                               const spec::ReadBatch& b, const spec::HostTensor& q,
                               const spec::LayerCaches& caches, const std::vector<float>& k_scale,
                               const std::vector<float>& v_scale,
                               const reference::TopkSelection* selection, Ordering ordering) {
  spec::validate_batch(c, b);
  spec::validate_attention(c, p);
  const std::vector<QueryRow> rows = reference::query_rows(b);
  const auto tq = static_cast<std::int64_t>(rows.size());
  const std::int64_t nkv = c.geometry.num_kv_heads, hd = c.geometry.head_dim, sb = p.sparse_block;
  const std::int64_t group = p.num_q_heads / nkv;
  const double sm = p.sm_scale > 0.0f ? p.sm_scale : reference::default_sm_scale(hd);
  const double u = kUnitRoundoff;
  const bool canonical = ordering == Ordering::kCanonical;

  AttentionTruth truth;
  truth.out.assign(static_cast<std::size_t>(tq * p.num_q_heads * hd), 0.0);
  truth.bound.assign(truth.out.size(), 0.0);
  for (std::int64_t qi = 0; qi < tq; ++qi) {
    const QueryRow& row = rows[static_cast<std::size_t>(qi)];
    if (b.seq_lens[static_cast<std::size_t>(row.request)] == 0) continue;
    const std::int64_t n_valid = reference::n_valid_blocks(row.position, sb);
    for (std::int64_t hq = 0; hq < p.num_q_heads; ++hq) {
      const std::int64_t g = hq / group;
      const std::vector<std::int64_t> chunks =
          reference::attention_chunks(selection, qi, g, n_valid);
      std::vector<std::int64_t> tokens;
      for (std::int64_t j : chunks) {
        for (std::int64_t t = j * sb; t < (j + 1) * sb && t <= row.position; ++t)
          tokens.push_back(t);
      }
      if (tokens.empty()) continue;
      const Eigen::VectorXd qv = widen(row_of(q, reference::head_row(qi, hq, p.num_q_heads), hd));
      const auto n = static_cast<Eigen::Index>(tokens.size());
      Eigen::VectorXd s(n), eps(n);
      Eigen::MatrixXd v(n, hd);
      for (Eigen::Index i = 0; i < n; ++i) {
        const std::int64_t t = tokens[static_cast<std::size_t>(i)];
        const Eigen::VectorXd k =
            widen(reference::read_kv(c, b, caches, k_scale, 0, row.request, t, g));
        v.row(i) =
            widen(reference::read_kv(c, b, caches, v_scale, 1, row.request, t, g)).transpose();
        s(i) = qv.dot(k) * sm;
        const double sum_abs = qv.cwiseAbs().dot(k.cwiseAbs());
        eps(i) = sm * dot_error_bound(hd, sum_abs, ordering) * (1.0 + u) + u * std::fabs(s(i));
      }
      const double big_m = s.maxCoeff();
      const Eigen::VectorXd w_unnorm = (s.array() - big_m).exp().matrix();
      const Eigen::VectorXd w = w_unnorm / w_unnorm.sum();
      const Eigen::VectorXd out = v.transpose() * w;
      const double chunks_n =
          canonical ? static_cast<double>(chunks.size()) : static_cast<double>(n);
      const double exp_err = canonical ? 2.0 : 4.0;
      const Eigen::VectorXd rho =
          (u * (6.0 * (big_m - s.array()) + 4.0 * chunks_n + 4.0 + 2.0 * exp_err)).matrix();
      const double gamma_a = gamma_n(canonical ? static_cast<double>(sb) : static_cast<double>(n));
      const double gamma_b =
          gamma_n(canonical ? ceil_log2(static_cast<double>(sb)) : static_cast<double>(n));
      const double score_factor = std::expm1(2.0 * eps.maxCoeff());
      for (std::int64_t d = 0; d < hd; ++d) {
        const double o = out(d);
        const Eigen::ArrayXd abs_v = v.col(d).array().abs();
        const double b_score = score_factor * (w.array() * (v.col(d).array() - o).abs()).sum();
        const double b_eval = (w.array() * rho.array() * (abs_v + std::fabs(o))).sum() +
                              gamma_a * (w.array() * abs_v).sum() + gamma_b * std::fabs(o);
        const auto at =
            static_cast<std::size_t>(reference::head_row(qi, hq, p.num_q_heads) * hd + d);
        truth.out[at] = o;
        truth.bound[at] = 2.0 * (b_score + b_eval + u * std::fabs(o)) + 0x1p-126;
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
  const std::int64_t max_blocks = reference::max_valid_blocks(rows, p.sparse_block);
  ScoreTruth truth;
  truth.scores.assign(static_cast<std::size_t>(tq * nkv * max_blocks), -INFINITY);
  truth.bound.assign(truth.scores.size(), 0.0);
  for (std::int64_t qi = 0; qi < tq; ++qi) {
    const QueryRow& row = rows[static_cast<std::size_t>(qi)];
    if (b.seq_lens[static_cast<std::size_t>(row.request)] == 0) continue;
    const std::int64_t n_valid = reference::n_valid_blocks(row.position, p.sparse_block);
    std::vector<Eigen::VectorXd> ik, iq;
    for (std::int64_t t = 0; t <= row.position; ++t)
      ik.push_back(widen(reference::read_index_k(c, b, caches, row.request, t)));
    for (std::int64_t h = 0; h < p.num_index_heads; ++h)
      iq.push_back(widen(row_of(index_q, reference::head_row(qi, h, p.num_index_heads), dim)));
    for (std::int64_t g = 0; g < nkv; ++g) {
      for (std::int64_t j = 0; j < n_valid; ++j) {
        // Per index head: its block score (the NaN rule is the head's) and the bound of its
        // float32 token scores; then the group's max over its heads, whose error is at most the
        // largest of theirs.
        reference::GroupScore<double> group;
        double bound = 0.0;
        for (std::int64_t h = g * per_group; h < (g + 1) * per_group; ++h) {
          reference::HeadBlockScore<double> head;
          double head_bound = 0.0;
          for (std::int64_t t = j * p.sparse_block;
               t < (j + 1) * p.sparse_block && t <= row.position; ++t) {
            const Eigen::VectorXd& k = ik[static_cast<std::size_t>(t)];
            const Eigen::VectorXd& qh = iq[static_cast<std::size_t>(h)];
            head.add(qh.dot(k));
            head_bound = std::max(head_bound,
                                  dot_error_bound(dim, qh.cwiseAbs().dot(k.cwiseAbs()), ordering));
          }
          group.add(head.value());
          if (!head.has_nan()) bound = std::max(bound, head_bound);
        }
        double score = group.value();
        if (const auto forced = reference::forced_block_score(j, n_valid, p)) {
          score = *forced;
          bound = 0.0;
        }
        const std::size_t at = reference::score_index(qi, g, j, nkv, max_blocks);
        truth.scores[at] = score;
        truth.bound[at] = bound;
      }
    }
  }
  return truth;
}

}  // namespace kvo::truth
