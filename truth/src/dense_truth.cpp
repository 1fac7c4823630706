// The float64 truth of the dense insert and a foreign kernel's bound.
//
// Per head vector x (hd float32 values, exact in double), weights w, eps and a cos/sin row (c, s),
// u = 2^-24 and gamma_n = n u / (1 - n u):
//   ms = sum x_i^2 / hd             fp32, squares and sum in any order: relative error
//                                   e_ms = gamma_(hd + 1) (hd - 1 additions, hd squares' and the
//                                   division's roundings, all on non-negative terms)
//   a = ms + eps                    e_a = e_ms + u (the sum of non-negative terms rounded once)
//   r = 1 / sqrt(a)                 rsqrtf within 2 ulp (CUDA), or sqrt then divide (2 roundings):
//                                   e_r = (1 + e_a)^(1/2) - 1 + 4u (2 ulp <= 4u relative), with
//                                   the square root of the error below e_a / 2 (1 + e_a)
//   y_i = x_i r (1 + w_i)           two products and (1 + w_i): e_y = (1 + e_r)(1 + u)^3 - 1
//   rope, i < rotary_dim / 2, j = i + rotary_dim / 2:
//     y_i' = y_i c - y_j s          B = (e_y + 2u)(|y_i c| + |y_j s|) (1 + u) + u |y_i'| (the two
//     y_j' = y_j c + y_i s          products, with or without fma, and the sum)
//   other dims: B = e_y |y_i|.
// Every relative error is a first-order sum made an upper bound by gamma's denominator and the
// (1 + u) factors; a NaN or infinite truth gets an infinite bound (the judge then wants the
// reference's code).
#include "kvo/truth/dense_truth.hpp"

#include <cmath>
#include <limits>

#include "kvo/reference/layer_write.hpp"
#include "kvo/truth/truth.hpp"

namespace kvo::truth {
namespace {

/// Norm and rope of one head vector in float64: the values and their bounds, appended.
void norm_rope(const std::vector<double>& x, const std::vector<float>& w,
               const spec::DenseInsert& in, std::int64_t pos, std::vector<double>& value,
               std::vector<double>& bound) {
  const double u = kUnitRoundoff;
  const auto hd = static_cast<std::int64_t>(x.size());
  double sum = 0.0;
  for (double v : x) sum += v * v;
  const double ms = sum / static_cast<double>(hd);
  const double r = 1.0 / std::sqrt(ms + static_cast<double>(in.eps));
  const double e_a = gamma_n(static_cast<double>(hd + 1)) + u;
  const double e_r = e_a / (2.0 * (1.0 - e_a)) + 4.0 * u;
  const double e_y = (1.0 + e_r) * std::pow(1.0 + u, 3) - 1.0;
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * (1.0 + static_cast<double>(w[i]));
  std::vector<double> b(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) b[i] = e_y * std::fabs(y[i]);
  const std::int64_t half = in.rotary_dim / 2;
  const float* row = in.cos_sin.data() + pos * in.rotary_dim;
  for (std::int64_t i = 0; i < half; ++i) {
    const auto a = static_cast<std::size_t>(i), j = static_cast<std::size_t>(i + half);
    const double c = row[i], s = row[half + i];
    const double yi = y[a] * c - y[j] * s, yj = y[j] * c + y[a] * s;
    b[a] = (e_y + 2.0 * u) * (std::fabs(y[a] * c) + std::fabs(y[j] * s)) * (1.0 + u) +
           u * std::fabs(yi);
    b[j] = (e_y + 2.0 * u) * (std::fabs(y[j] * c) + std::fabs(y[a] * s)) * (1.0 + u) +
           u * std::fabs(yj);
    y[a] = yi;
    y[j] = yj;
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    value.push_back(y[i]);
    bound.push_back(std::isfinite(y[i]) ? b[i] : std::numeric_limits<double>::infinity());
  }
}

}  // namespace

DenseTruth dense_truth(const spec::ModelConfig& c, const spec::DenseInsert& in) {
  spec::validate_dense_insert(c, in);
  const std::int64_t hd = c.geometry.head_dim, nkv = c.geometry.num_kv_heads, nq = in.q.shape[1];
  const auto tokens = static_cast<std::int64_t>(in.kv.slots.slots.size());
  DenseTruth truth;
  std::vector<double> x(static_cast<std::size_t>(hd));
  const auto head = [&](const spec::HostTensor& t, std::int64_t first) {
    for (std::int64_t d = 0; d < hd; ++d)
      x[static_cast<std::size_t>(d)] = reference::source_value(t, first + d);
  };
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t pos = in.positions[static_cast<std::size_t>(t)];
    for (std::int64_t h = 0; h < nq; ++h) {
      head(in.q, (t * nq + h) * hd);
      norm_rope(x, in.q_norm_weight, in, pos, truth.q, truth.q_bound);
    }
    for (std::int64_t h = 0; h < nkv; ++h) {
      head(in.kv.k, (t * nkv + h) * hd);
      norm_rope(x, in.k_norm_weight, in, pos, truth.k, truth.k_bound);
    }
  }
  return truth;
}

}  // namespace kvo::truth
