// cpu-naive-f32 (cpu_read.hpp): float32 in a plain loop's order, written apart from the reference.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/reference/read_path.hpp"
#include "kvo/reference/read_rules.hpp"
#include "kvo/subjects/cpu_read.hpp"

namespace kvo::subjects {
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

/// A cache byte offset as a reader with m.offset_bits-bit offsets computes it (0: all bits).
std::int64_t offset_as(const ReadMutation& m, std::int64_t byte) {
  return m.offset_bits == 0 ? byte : byte & ((std::int64_t{1} << m.offset_bits) - 1);
}

/// reference::read_index_k, its byte offsets computed as m says.
std::vector<float> read_index_k_as(const ReadMutation& m, const spec::ModelConfig& c,
                                   const spec::ReadBatch& b, const spec::LayerCaches& caches,
                                   std::int64_t r, std::int64_t t) {
  if (m.offset_bits == 0) return reference::read_index_k(c, b, caches, r, t);
  const auto [block, offset] = reference::locate_token(c, b, r, t);
  const std::uint8_t* body = caches.find(spec::BufferKind::kIndexK)->body();
  const std::uint8_t* scales =
      c.index.layout == spec::IndexLayout::kBlockScale
          ? body + offset_as(m, reference::index_scale_byte(c, block, offset, 0))
          : nullptr;
  return reference::dequantize_index_row(
      c, body + offset_as(m, reference::index_value_byte(c, block, offset, 0)), scales);
}

/// reference::read_kv, its byte offsets computed as m says.
std::vector<float> read_kv_as(const ReadMutation& m, const spec::ModelConfig& c,
                              const spec::ReadBatch& b, const spec::LayerCaches& caches,
                              const std::vector<float>& scales, int kv, std::int64_t r,
                              std::int64_t t, std::int64_t h) {
  if (m.offset_bits == 0) return reference::read_kv(c, b, caches, scales, kv, r, t, h);
  const auto [block, offset] = reference::locate_token(c, b, r, t);
  const std::uint8_t* body = caches.find(reference::kv_buffer(c, kv))->body();
  const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  return reference::dequantize_kv_row(
      c, body + offset_as(m, reference::kv_element(c, kv, block, offset, h, 0) * eb),
      scales[c.kv.per_head_scale ? static_cast<std::size_t>(h) : 0]);
}

}  // namespace

std::vector<std::int32_t> select_topk(const std::vector<float>& scores, std::int64_t topk,
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

std::vector<std::int32_t> naive_indexer(const spec::ModelConfig& config,
                                        const spec::IndexerParams& p, const spec::ReadBatch& batch,
                                        const spec::HostTensor& index_q,
                                        const spec::LayerCaches& caches, const ReadMutation& m,
                                        int key_bits) {
  const auto rows = reference::query_rows(batch);
  const std::int64_t nkv = config.geometry.num_kv_heads, dim = config.geometry.index_dim;
  const std::int64_t per_group = p.num_index_heads / nkv;
  const std::int64_t width = spec::selection_width(p, nkv);
  const std::int64_t lanes = m.union_where_max ? per_group : spec::selection_lanes(p, nkv);
  const bool drop = m.drop_neg_inf_always || p.neg_inf == spec::IndexNegInf::kDrop;
  const float factor = spec::index_score_factor(p.score_scale, dim);
  const spec::IndexNan nan_rule = m.nan_first ? spec::IndexNan::kFirst : p.index_nan;
  std::vector<std::int32_t> ids;
  for (std::size_t qi = 0; qi < rows.size(); ++qi) {
    const auto& row = rows[qi];
    const bool padded = batch.seq_lens[static_cast<std::size_t>(row.request)] == 0;
    const std::int64_t n_valid =
        padded ? 0 : reference::n_valid_blocks(row.position, p.sparse_block) + m.n_valid_offset;
    // The row's visible index-K rows, read once for every head.
    const std::int64_t visible =
        padded ? 0
               : std::min(row.position + 1, std::max<std::int64_t>(n_valid, 0) * p.sparse_block);
    std::vector<std::vector<float>> ik;
    for (std::int64_t t = 0; t < visible; ++t)
      ik.push_back(read_index_k_as(m, config, batch, caches, row.request, t));
    for (std::int64_t g = 0; g < nkv; ++g) {
      const auto blocks = static_cast<std::size_t>(std::max<std::int64_t>(n_valid, 0));
      // One row of scores per lane: the group's max (index_group max) or each head's (union).
      std::vector<std::vector<float>> lane_scores(static_cast<std::size_t>(lanes),
                                                  std::vector<float>(blocks, -INFINITY));
      for (std::int64_t h = g * per_group; h < (g + 1) * per_group; ++h) {
        std::vector<float>& scores =
            lane_scores[static_cast<std::size_t>(lanes == 1 ? 0 : h - g * per_group)];
        const std::vector<float> iq =
            row_of(index_q, static_cast<std::int64_t>(qi) * p.num_index_heads + h, dim);
        // This head's block maxima over its finite-or-infinite token scores, and which blocks saw
        // a NaN token score; then the index_nan rule, then the max into the group's scores.
        std::vector<float> best(blocks, -INFINITY);
        std::vector<char> saw_nan(blocks, 0), saw_number(blocks, 0);
        for (std::int64_t t = 0; t < visible; ++t) {
          const float s = naive_dot(iq, ik[static_cast<std::size_t>(t)]) * factor;
          const auto j = static_cast<std::size_t>(t / p.sparse_block);
          if (std::isnan(s)) {
            saw_nan[j] = 1;
          } else {
            saw_number[j] = 1;
            best[j] = std::max(best[j], s);
          }
        }
        for (std::size_t j = 0; j < blocks; ++j) {
          float b = best[j];
          if (saw_nan[j] && (nan_rule != spec::IndexNan::kSkip || !saw_number[j])) {
            b = nan_rule == spec::IndexNan::kFirst ? INFINITY : -1e30f;
          }
          scores[j] = std::max(scores[j], b);
        }
      }
      // Each lane's top-k best first (drop_neg_inf: without its -inf blocks); the KV head's ids
      // are the lanes' in turn, each id once, then -1.
      std::vector<std::int32_t> row_ids;
      for (std::vector<float>& scores : lane_scores) {
        for (std::int64_t j = 0; j < n_valid; ++j) {
          if (j < p.init_blocks) scores[static_cast<std::size_t>(j)] = reference::kInitBlockScore;
          if (!m.ignore_local && j >= n_valid - p.local_blocks)
            scores[static_cast<std::size_t>(j)] = reference::kLocalBlockScore;
        }
        std::vector<float> keys = scores;
        for (float& k : keys) k = spec::topk_score_key(k, key_bits);
        for (std::int32_t id : select_topk(keys, p.topk, true, false)) {
          const bool dropped = id >= 0 && drop && scores[static_cast<std::size_t>(id)] == -INFINITY;
          if (id >= 0 && !dropped && std::find(row_ids.begin(), row_ids.end(), id) == row_ids.end())
            row_ids.push_back(id);
        }
      }
      row_ids.resize(static_cast<std::size_t>(width), -1);
      if (m.id_bits > 0) {
        for (std::int32_t& id : row_ids)
          if (id >= 0) id &= (std::int32_t{1} << m.id_bits) - 1;
      }
      ids.insert(ids.end(), row_ids.begin(), row_ids.end());
    }
  }
  return ids;
}

spec::HostTensor zero_attention_output(std::size_t rows, const spec::AttentionParams& p,
                                       std::int64_t head_dim) {
  spec::HostTensor out;
  out.dtype = p.out_dtype;
  out.shape = {static_cast<std::int64_t>(rows), p.num_q_heads, head_dim};
  out.bytes.assign(static_cast<std::size_t>(out.numel()) * spec::dtype_bytes(p.out_dtype), 0);
  return out;
}

spec::HostTensor naive_attention(const spec::ModelConfig& config, const spec::AttentionParams& p,
                                 const spec::ReadBatch& batch, const spec::HostTensor& q_in,
                                 const spec::LayerCaches& caches, const std::vector<float>& k_scale,
                                 const std::vector<float>& v_scale,
                                 const reference::TopkSelection* sel, const ReadMutation& m) {
  const auto rows = reference::query_rows(batch);
  const std::int64_t nkv = config.geometry.num_kv_heads, hd = config.geometry.head_dim,
                     sb = p.sparse_block;
  const std::int64_t group = p.num_q_heads / nkv;
  const float sm = p.sm_scale > 0.0f ? p.sm_scale : reference::default_sm_scale(hd);
  spec::HostTensor out = zero_attention_output(rows.size(), p, hd);
  const auto ob = spec::dtype_bytes(p.out_dtype);
  for (std::size_t qi = 0; qi < rows.size(); ++qi) {
    const auto& row = rows[qi];
    const std::int64_t seq = batch.seq_lens[static_cast<std::size_t>(row.request)];
    if (seq == 0) continue;
    for (std::int64_t hq = 0; hq < p.num_q_heads; ++hq) {
      const std::int64_t g = hq / group;
      std::vector<std::int64_t> tokens;
      const std::int64_t last = m.no_causal_mask ? seq - 1 : row.position;
      for (std::int64_t t = 0; t <= last; ++t) {
        bool chosen = sel == nullptr;
        for (std::int64_t k = 0; sel != nullptr && k < sel->topk; ++k)
          chosen |= sel->id(static_cast<std::int64_t>(qi), g, k) == t / sb;
        if (chosen) tokens.push_back(t);
      }
      const std::vector<float> q =
          row_of(q_in, static_cast<std::int64_t>(qi) * p.num_q_heads + hq, hd);
      std::vector<float> s;
      for (std::int64_t t : tokens) {
        float x =
            naive_dot(q, read_kv_as(m, config, batch, caches, k_scale, 0, row.request, t, g)) * sm;
        if (m.scale_twice) x = x * sm;
        s.push_back(x);
      }
      if (s.empty()) continue;  // nothing visible: +0
      const float mx = *std::max_element(s.begin(), s.end());
      float denom = 0.0f;
      std::vector<float> acc(static_cast<std::size_t>(hd), 0.0f);
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        const float w = std::exp(s[i] - mx);
        denom = denom + w;
        const auto v = read_kv_as(m, config, batch, caches, v_scale, 1, row.request, tokens[i], g);
        for (std::int64_t d = 0; d < hd; ++d) {
          const float prod = w * v[static_cast<std::size_t>(d)];
          acc[static_cast<std::size_t>(d)] = acc[static_cast<std::size_t>(d)] + prod;
        }
      }
      for (std::int64_t d = 0; d < hd; ++d) {
        const float o = acc[static_cast<std::size_t>(d)] / denom;
        const std::size_t at =
            static_cast<std::size_t>((static_cast<std::int64_t>(qi) * p.num_q_heads + hq) * hd + d);
        reference::store_code(reference::encode(o, p.out_dtype, spec::Saturation::kSatFinite),
                              p.out_dtype, &out.bytes[at * ob]);
      }
    }
  }
  return out;
}

}  // namespace kvo::subjects
