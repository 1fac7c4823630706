#include "kvo/oracle/read_subject.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"

namespace kvo::oracle {
namespace {

std::vector<float> row_of(const spec::HostTensor& t, std::int64_t row, std::int64_t width) {
  std::vector<float> out(static_cast<std::size_t>(width));
  for (std::int64_t i = 0; i < width; ++i)
    out[static_cast<std::size_t>(i)] = reference::source_value(t, row * width + i);
  return out;
}

/// Sequential float sum of products: the order of a plain loop (no fma).
float naive_dot(const std::vector<float>& a, const std::vector<float>& b) {
  float acc = 0.0f;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float prod = a[i] * b[i];
    acc = acc + prod;
  }
  return acc;
}

/// Top-k of one row from its block scores: descending score; `higher_wins` breaks ties by the
/// higher id, otherwise the lower; ascending output when `ascending`, else best first; -1 padding.
std::vector<std::int32_t> select(const std::vector<float>& scores, std::int64_t topk,
                                 bool higher_wins, bool ascending) {
  std::vector<std::int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t x, std::int32_t y) {
    const float sx = scores[static_cast<std::size_t>(x)], sy = scores[static_cast<std::size_t>(y)];
    if (sx != sy) return sx > sy;
    return higher_wins ? x > y : x < y;
  });
  order.resize(std::min<std::size_t>(order.size(), static_cast<std::size_t>(topk)));
  if (ascending) std::sort(order.begin(), order.end());
  order.resize(static_cast<std::size_t>(topk), -1);
  return order;
}

class NaiveSubject final : public ReadSubject {
 public:
  NaiveSubject(ReadMutation m, std::string name) : m_(m), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  reference::Ordering ordering() const override { return reference::Ordering::kForeign; }
  TopkOrder topk_order() const override { return TopkOrder::kDescendingScore; }

  std::vector<std::int32_t> indexer(const ReadCase& c) override {
    const auto rows = reference::query_rows(c.batch);
    const spec::IndexerParams& p = c.indexer;
    const std::int64_t nkv = c.config.geometry.num_kv_heads, dim = c.config.geometry.index_dim;
    const std::int64_t per_group = p.num_index_heads / nkv;
    std::vector<std::int32_t> ids;
    for (std::size_t qi = 0; qi < rows.size(); ++qi) {
      const auto& row = rows[qi];
      const bool padded = c.batch.seq_lens[static_cast<std::size_t>(row.request)] == 0;
      const std::int64_t n_valid =
          padded ? 0 : row.position / p.sparse_block + 1 + m_.n_valid_offset;
      for (std::int64_t g = 0; g < nkv; ++g) {
        std::vector<float> scores(static_cast<std::size_t>(std::max<std::int64_t>(n_valid, 0)),
                                  -INFINITY);
        for (std::int64_t h = g * per_group; h < (g + 1) * per_group; ++h) {
          const std::vector<float> iq =
              row_of(c.index_q, static_cast<std::int64_t>(qi) * p.num_index_heads + h, dim);
          for (std::int64_t t = 0; t <= row.position && t < n_valid * p.sparse_block; ++t) {
            const float s =
                naive_dot(iq, reference::read_index_k(c.config, c.batch, c.caches, row.request, t));
            float& b = scores[static_cast<std::size_t>(t / p.sparse_block)];
            b = std::isnan(s) ? reference::kNanBlockScore : std::max(b, s);
          }
        }
        for (std::int64_t j = 0; j < n_valid; ++j) {
          if (j < p.init_blocks) scores[static_cast<std::size_t>(j)] = reference::kInitBlockScore;
          if (!m_.ignore_local && j >= n_valid - p.local_blocks)
            scores[static_cast<std::size_t>(j)] = reference::kLocalBlockScore;
        }
        const auto row_ids = select(scores, p.topk, true, false);
        ids.insert(ids.end(), row_ids.begin(), row_ids.end());
      }
    }
    return ids;
  }

  spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* sel) override {
    const auto rows = reference::query_rows(c.batch);
    const spec::AttentionParams& p = c.attention;
    const std::int64_t nkv = c.config.geometry.num_kv_heads, hd = c.config.geometry.head_dim,
                       sb = p.sparse_block;
    const std::int64_t group = p.num_q_heads / nkv;
    float sm = p.sm_scale > 0.0f ? p.sm_scale : reference::default_sm_scale(hd);
    spec::HostTensor out;
    out.dtype = p.out_dtype;
    out.shape = {static_cast<std::int64_t>(rows.size()), p.num_q_heads, hd};
    const auto ob = spec::dtype_bytes(p.out_dtype);
    out.bytes.assign(static_cast<std::size_t>(out.numel()) * ob, 0);
    for (std::size_t qi = 0; qi < rows.size(); ++qi) {
      const auto& row = rows[qi];
      const std::int64_t seq = c.batch.seq_lens[static_cast<std::size_t>(row.request)];
      if (seq == 0) continue;
      for (std::int64_t hq = 0; hq < p.num_q_heads; ++hq) {
        const std::int64_t g = hq / group;
        std::vector<std::int64_t> tokens;
        const std::int64_t last = m_.no_causal_mask ? seq - 1 : row.position;
        for (std::int64_t t = 0; t <= last; ++t) {
          bool chosen = sel == nullptr;
          for (std::int64_t k = 0; sel != nullptr && k < sel->topk; ++k)
            chosen |= sel->id(static_cast<std::int64_t>(qi), g, k) == t / sb;
          if (chosen) tokens.push_back(t);
        }
        const std::vector<float> q =
            row_of(c.q, static_cast<std::int64_t>(qi) * p.num_q_heads + hq, hd);
        std::vector<float> s;
        for (std::int64_t t : tokens) {
          float x = naive_dot(q, reference::read_kv(c.config, c.batch, c.caches, c.k_scale, 0,
                                                    row.request, t, g)) *
                    sm;
          if (m_.scale_twice) x = x * sm;
          s.push_back(x);
        }
        if (s.empty()) continue;  // nothing visible: +0
        const float mx = *std::max_element(s.begin(), s.end());
        float denom = 0.0f;
        std::vector<float> acc(static_cast<std::size_t>(hd), 0.0f);
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          const float w = std::exp(s[i] - mx);
          denom = denom + w;
          const auto v = reference::read_kv(c.config, c.batch, c.caches, c.v_scale, 1, row.request,
                                            tokens[i], g);
          for (std::int64_t d = 0; d < hd; ++d) {
            const float prod = w * v[static_cast<std::size_t>(d)];
            acc[static_cast<std::size_t>(d)] = acc[static_cast<std::size_t>(d)] + prod;
          }
        }
        for (std::int64_t d = 0; d < hd; ++d) {
          const float o = acc[static_cast<std::size_t>(d)] / denom;
          const std::size_t at = static_cast<std::size_t>(
              (static_cast<std::int64_t>(qi) * p.num_q_heads + hq) * hd + d);
          reference::store_code(reference::encode(o, p.out_dtype, spec::Saturation::kSatFinite),
                                p.out_dtype, &out.bytes[at * ob]);
        }
      }
    }
    return out;
  }

 private:
  ReadMutation m_;
  std::string name_;
};

/// The reference with one planted bug: the indexer's tie rule reversed (from the reference's own
/// scores) or the local block unforced; attention with sm_scale applied twice.
class CanonicalMutant final : public ReadSubject {
 public:
  CanonicalMutant(ReadMutation m, std::string name) : m_(m), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  reference::Ordering ordering() const override { return reference::Ordering::kCanonical; }

  std::vector<std::int32_t> indexer(const ReadCase& c) override {
    const reference::TopkSelection s =
        reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches);
    if (!m_.ties_to_higher_id) return s.ids;
    std::vector<std::int32_t> ids;
    for (std::int64_t q = 0; q < s.num_queries; ++q) {
      for (std::int64_t g = 0; g < s.num_kv_heads; ++g) {
        std::vector<float> scores;
        for (std::int64_t j = 0; j < s.n_valid[static_cast<std::size_t>(q)]; ++j)
          scores.push_back(s.score(q, g, j));
        const auto row = select(scores, s.topk, true, true);
        ids.insert(ids.end(), row.begin(), row.end());
      }
    }
    return ids;
  }

  spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* sel) override {
    spec::AttentionParams p = c.attention;
    if (m_.scale_twice) {
      const float sm = reference::default_sm_scale(c.config.geometry.head_dim);
      p.sm_scale = sm * sm;
    }
    return reference::attention(c.config, p, c.batch, c.q, c.caches, c.k_scale, c.v_scale, sel).out;
  }

 private:
  ReadMutation m_;
  std::string name_;
};

}  // namespace

std::unique_ptr<ReadSubject> make_cpu_naive_subject(ReadMutation mutation, std::string name) {
  return std::make_unique<NaiveSubject>(mutation, std::move(name));
}

std::unique_ptr<ReadSubject> make_canonical_mutant(ReadMutation mutation, std::string name) {
  return std::make_unique<CanonicalMutant>(mutation, std::move(name));
}

#ifdef KVO_HAVE_CUDA
std::vector<std::unique_ptr<ReadSubject>> make_cuda_read_subjects();  // cuda_subjects.cpp
#endif

std::vector<std::unique_ptr<ReadSubject>> make_read_subjects() {
  std::vector<std::unique_ptr<ReadSubject>> out;
  out.push_back(make_cpu_naive_subject());
#ifdef KVO_HAVE_CUDA
  for (auto& s : make_cuda_read_subjects()) out.push_back(std::move(s));
#endif
  return out;
}

}  // namespace kvo::oracle
