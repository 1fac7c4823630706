// The read side, SPEC sections 5 and 6, line by line.
#include "kvo/reference/read_path.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "kvo/reference/canonical.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::reference {
namespace {

using spec::BufferKind;

const spec::CacheBuffer& buffer(const spec::LayerCaches& caches, BufferKind kind) {
  const spec::CacheBuffer* buf = caches.find(kind);
  if (buf == nullptr) {
    throw spec::InvalidInput("caches", -1, std::string(spec::name_of(kind)),
                             "the layer has no such buffer");
  }
  return *buf;
}

void check_tensor(const spec::HostTensor& t, const char* field, spec::DType dtype,
                  std::int64_t rows, std::int64_t heads, std::int64_t dim) {
  const std::vector<std::int64_t> want{rows, heads, dim};
  if (t.dtype != dtype || t.shape != want ||
      static_cast<std::int64_t>(t.bytes.size()) !=
          rows * heads * dim * static_cast<std::int64_t>(spec::dtype_bytes(dtype))) {
    throw spec::InvalidInput(field, -1, std::string(spec::name_of(t.dtype)) + " tensor",
                             "expected " + std::string(spec::name_of(dtype)) + " [" +
                                 std::to_string(rows) + ", " + std::to_string(heads) + ", " +
                                 std::to_string(dim) + "]");
  }
}

/// Row `row` (`width` elements) of a host tensor, widened to float32.
std::vector<float> row_of(const spec::HostTensor& t, std::int64_t row, std::int64_t width) {
  std::vector<float> out(static_cast<std::size_t>(width));
  for (std::int64_t i = 0; i < width; ++i)
    out[static_cast<std::size_t>(i)] = source_value(t, row * width + i);
  return out;
}

}  // namespace

std::pair<std::int64_t, std::int64_t> locate_token(const spec::ModelConfig& c,
                                                   const spec::ReadBatch& b, std::int64_t r,
                                                   std::int64_t t) {
  const std::int64_t bs = c.geometry.block_size;
  const std::int32_t block = b.block_table[static_cast<std::size_t>(r * b.max_blocks + t / bs)];
  return {block, t % bs};
}

std::vector<float> dequantize_index_row(const spec::ModelConfig& c, const std::uint8_t* row,
                                        const std::uint8_t* scales) {
  const std::int64_t dim = c.geometry.index_dim;
  std::vector<float> k(static_cast<std::size_t>(dim));
  if (c.index.layout == spec::IndexLayout::kFlat) {
    const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(c.index.flat_dtype));
    for (std::int64_t d = 0; d < dim; ++d) {
      k[static_cast<std::size_t>(d)] =
          decode(load_code(row + d * eb, c.index.flat_dtype), c.index.flat_dtype);
    }
    return k;
  }
  // Block scale: each 128-element group's values dequantized with the group's fp32 scale.
  for (std::int64_t g = 0; g < dim / spec::kScaleGroup; ++g) {
    const float s = float_of(load_code(scales + 4 * g, spec::DType::kF32));
    for (std::int64_t d = g * spec::kScaleGroup; d < (g + 1) * spec::kScaleGroup; ++d)
      k[static_cast<std::size_t>(d)] = dequantize(row[d], spec::DType::kFp8E4M3, s);
  }
  return k;
}

std::vector<float> read_index_k(const spec::ModelConfig& c, const spec::ReadBatch& b,
                                const spec::LayerCaches& caches, std::int64_t r, std::int64_t t) {
  const auto [block, offset] = locate_token(c, b, r, t);
  const std::uint8_t* body = buffer(caches, BufferKind::kIndexK).body();
  // The row and its group scales are contiguous in both index layouts (SPEC 3: d and g are the
  // innermost terms of their offsets).
  const std::uint8_t* scales = c.index.layout == spec::IndexLayout::kBlockScale
                                   ? body + index_scale_byte(c, block, offset, 0)
                                   : nullptr;
  return dequantize_index_row(c, body + index_value_byte(c, block, offset, 0), scales);
}

TopkSelection indexer_topk(const spec::ModelConfig& c, const spec::IndexerParams& p,
                           const spec::ReadBatch& b, const spec::HostTensor& index_q,
                           const spec::LayerCaches& caches) {
  spec::validate_batch(c, b);
  spec::validate_indexer(c, p);
  const std::vector<QueryRow> rows = query_rows(b);
  const auto tq = static_cast<std::int64_t>(rows.size());
  const std::int64_t nkv = c.geometry.num_kv_heads;
  const std::int64_t heads_per_group = p.num_index_heads / nkv;
  const std::int64_t lanes = spec::selection_lanes(p, nkv);
  const std::int64_t dim = c.geometry.index_dim;
  check_tensor(index_q, "index_q", spec::index_q_dtype(c, p), tq, p.num_index_heads, dim);
  const PagedCacheLayout layout(c);
  check_layer_caches(layout, spec::LayerKind::kSparse, caches);
  const float factor = spec::index_score_factor(p.score_scale, dim);

  TopkSelection sel;
  sel.num_queries = tq;
  sel.num_kv_heads = nkv;
  sel.topk = spec::selection_width(p, nkv);
  sel.lanes = lanes;
  sel.max_blocks = max_valid_blocks(rows, p.sparse_block);
  sel.ids.assign(static_cast<std::size_t>(tq * nkv * sel.topk), -1);
  sel.scores.assign(static_cast<std::size_t>(tq * nkv * lanes * sel.max_blocks), -INFINITY);
  sel.n_valid.assign(static_cast<std::size_t>(tq), 0);

  // The index-K rows of the request being read, t = 0, 1, ...: its query rows come in turn, each
  // seeing the rows t <= p of its position p, so each row is read once a request.
  std::int64_t ik_request = -1;
  std::vector<std::vector<float>> ik;
  for (std::int64_t q = 0; q < tq; ++q) {
    const QueryRow& row = rows[static_cast<std::size_t>(q)];
    if (b.seq_lens[static_cast<std::size_t>(row.request)] == 0) continue;  // padded row: all -1
    const std::int64_t pos = row.position;
    const std::int64_t n_valid = n_valid_blocks(pos, p.sparse_block);
    sel.n_valid[static_cast<std::size_t>(q)] = n_valid;
    // The index-K rows this query may see, t <= p.
    if (row.request != ik_request) {
      ik.clear();
      ik_request = row.request;
    }
    for (auto t = static_cast<std::int64_t>(ik.size()); t <= pos; ++t)
      ik.push_back(read_index_k(c, b, caches, row.request, t));

    for (std::int64_t g = 0; g < nkv; ++g) {
      // The score rows of KV head g, [lanes][n_valid]: under max one, the max over the group's
      // index heads of their block scores (ascending h, first max wins); under union one per
      // index head, its own block scores.
      std::vector<std::vector<GroupScore<float>>> lane_scores(
          static_cast<std::size_t>(lanes),
          std::vector<GroupScore<float>>(static_cast<std::size_t>(n_valid)));
      for (std::int64_t h = g * heads_per_group; h < (g + 1) * heads_per_group; ++h) {
        const std::vector<float> iq = row_of(index_q, head_row(q, h, p.num_index_heads), dim);
        auto& lane = lane_scores[static_cast<std::size_t>(lanes == 1 ? 0 : h - g * lanes)];
        for (std::int64_t j = 0; j < n_valid; ++j) {
          // Head h's block score: max of the token scores of block j's valid tokens, ascending t,
          // first max wins; NaN token scores by the index_nan rule. A token score is
          // fl(dot * factor), the factor 1 or fl(index_dim^-0.5) (index_score_scale).
          HeadBlockScore<float> head(p.index_nan);
          for (std::int64_t t = j * p.sparse_block; t < (j + 1) * p.sparse_block && t <= pos; ++t)
            head.add(canonical_dot(iq, ik[static_cast<std::size_t>(t)]) * factor);
          lane[static_cast<std::size_t>(j)].add(head.value());
        }
      }
      // Each lane: forcing, then its top-k: the k_eff highest scores, equal scores won by the
      // lower block id; under drop_neg_inf a chosen block scoring -inf is dropped. The KV head's
      // ids: the union of its lanes' choices, ascending, then -1.
      const std::int64_t k_eff = std::min(p.topk, n_valid);
      std::set<std::int32_t> chosen;
      for (std::int64_t l = 0; l < lanes; ++l) {
        std::vector<float> score(static_cast<std::size_t>(n_valid));
        for (std::int64_t j = 0; j < n_valid; ++j) {
          float& s = score[static_cast<std::size_t>(j)];
          s = forced_block_score(j, n_valid, p)
                  .value_or(lane_scores[static_cast<std::size_t>(l)][static_cast<std::size_t>(j)]
                                .value());
          sel.scores[score_index(q, g * lanes + l, j, nkv * lanes, sel.max_blocks)] = s;
        }
        std::vector<std::int32_t> order(static_cast<std::size_t>(n_valid));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](std::int32_t x, std::int32_t y) {
          return score[static_cast<std::size_t>(x)] > score[static_cast<std::size_t>(y)];
        });
        order.resize(static_cast<std::size_t>(k_eff));
        for (std::int32_t j : order) {
          const bool dropped = p.neg_inf == spec::IndexNegInf::kDrop &&
                               score[static_cast<std::size_t>(j)] == -INFINITY;
          if (!dropped) chosen.insert(j);
        }
      }
      std::copy(chosen.begin(), chosen.end(), sel.ids.begin() + (q * nkv + g) * sel.topk);
    }
  }
  return sel;
}

std::vector<float> dequantize_kv_row(const spec::ModelConfig& c, const std::uint8_t* row,
                                     float scale) {
  const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  std::vector<float> x(static_cast<std::size_t>(c.geometry.head_dim));
  for (std::int64_t d = 0; d < c.geometry.head_dim; ++d) {
    const std::uint32_t code = load_code(row + d * eb, c.kv.cache_dtype);
    x[static_cast<std::size_t>(d)] = c.kv.scale_mode == spec::ScaleMode::kNone
                                         ? decode(code, c.kv.cache_dtype)
                                         : dequantize(code, c.kv.cache_dtype, scale);
  }
  return x;
}

std::vector<float> read_kv(const spec::ModelConfig& c, const spec::ReadBatch& b,
                           const spec::LayerCaches& caches, const std::vector<float>& scales,
                           int kv, std::int64_t r, std::int64_t t, std::int64_t h) {
  const auto [block, offset] = locate_token(c, b, r, t);
  const std::uint8_t* body = buffer(caches, kv_buffer(c, kv)).body();
  const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  // The head's row is contiguous in every layout (SPEC 3: d is the innermost term of the offset).
  return dequantize_kv_row(c, body + kv_element(c, kv, block, offset, h, 0) * eb,
                           scales[c.kv.per_head_scale ? static_cast<std::size_t>(h) : 0]);
}

std::vector<std::int64_t> attention_chunks(const TopkSelection* selection, std::int64_t q,
                                           std::int64_t g, std::int64_t n_valid) {
  std::vector<std::int64_t> chunks;
  if (selection == nullptr) {
    for (std::int64_t j = 0; j < n_valid; ++j) chunks.push_back(j);
    return chunks;
  }
  std::vector<std::int32_t> seen;  // the row's ids >= 0, each once
  for (std::int64_t k = 0; k < selection->topk; ++k) {
    const std::int32_t id = selection->id(q, g, k);
    if (id < 0) continue;
    if (std::find(seen.begin(), seen.end(), id) != seen.end()) {
      throw spec::InvalidInput("selection", (q * selection->num_kv_heads + g) * selection->topk + k,
                               std::to_string(id), "the same block twice in one row");
    }
    seen.push_back(id);
    if (id < n_valid) chunks.push_back(id);  // past n_valid: selects nothing
  }
  std::sort(chunks.begin(), chunks.end());
  return chunks;
}

float default_sm_scale(std::int64_t head_dim) {
  const float root = std::sqrt(static_cast<float>(head_dim));
  return 1.0f / root;
}

AttentionResult attention(const spec::ModelConfig& c, const spec::AttentionParams& p,
                          const spec::ReadBatch& b, const spec::HostTensor& q,
                          const spec::LayerCaches& caches, const std::vector<float>& k_scale,
                          const std::vector<float>& v_scale, const TopkSelection* selection) {
  spec::validate_batch(c, b);
  spec::validate_attention(c, p);
  spec::validate_scales(c, k_scale, "k_scale");
  spec::validate_scales(c, v_scale, "v_scale");
  const std::vector<QueryRow> rows = query_rows(b);
  const auto tq = static_cast<std::int64_t>(rows.size());
  const std::int64_t nkv = c.geometry.num_kv_heads, hd = c.geometry.head_dim, sb = p.sparse_block;
  const std::int64_t group = p.num_q_heads / nkv;
  check_tensor(q, "q", c.act_dtype, tq, p.num_q_heads, hd);
  const PagedCacheLayout layout(c);
  for (const spec::CacheBuffer& buf : caches.buffers) {
    if (buf.kind != BufferKind::kIndexK && buf.body_bytes() != layout.buffer_bytes(buf.kind)) {
      throw spec::InvalidInput("caches", -1, std::string(spec::name_of(buf.kind)),
                               "wrong buffer size");
    }
  }
  if (selection != nullptr && (selection->num_queries != tq || selection->num_kv_heads != nkv)) {
    throw spec::InvalidInput(
        "selection", -1, std::to_string(selection->num_queries) + " rows",
        "expected [" + std::to_string(tq) + ", " + std::to_string(nkv) + ", topk]");
  }
  // SPEC 6: the same id twice in one row is invalid input, in a padded row too (before any work).
  for (std::int64_t qi = 0; selection != nullptr && qi < tq; ++qi)
    for (std::int64_t g = 0; g < nkv; ++g) attention_chunks(selection, qi, g, 0);
  const float sm_scale = p.sm_scale > 0.0f ? p.sm_scale : default_sm_scale(hd);

  AttentionResult res;
  res.out_f32.assign(static_cast<std::size_t>(tq * p.num_q_heads * hd), 0.0f);
  for (std::int64_t qi = 0; qi < tq; ++qi) {
    const QueryRow& row = rows[static_cast<std::size_t>(qi)];
    const std::int64_t pos = row.position;
    if (b.seq_lens[static_cast<std::size_t>(row.request)] == 0) continue;  // padded row: +0
    const std::int64_t n_valid = n_valid_blocks(pos, sb);
    for (std::int64_t hq = 0; hq < p.num_q_heads; ++hq) {
      const std::int64_t g = hq / group;
      // Chunks: the selected logical blocks (dense: all), ascending.
      const std::vector<std::int64_t> chunks = attention_chunks(selection, qi, g, n_valid);
      const std::vector<float> qv = row_of(q, head_row(qi, hq, p.num_q_heads), hd);
      bool started = false;
      float big_m = 0.0f, big_l = 0.0f;
      std::vector<float> big_o(static_cast<std::size_t>(hd), 0.0f);
      for (std::int64_t j : chunks) {
        // Per chunk: scores of the valid tokens, their max, p_t, l_c (tree over all sb positions,
        // masked ones +0) and o_c (fma over the tokens, ascending t).
        std::vector<float> s(static_cast<std::size_t>(sb), 0.0f),
            pt(static_cast<std::size_t>(sb), 0.0f);
        float m = -INFINITY;
        std::int64_t valid = 0;
        for (std::int64_t i = 0; i < sb && j * sb + i <= pos; ++i) {
          const std::vector<float> k =
              read_kv(c, b, caches, k_scale, 0, row.request, j * sb + i, g);
          s[static_cast<std::size_t>(i)] = canonical_dot(qv, k) * sm_scale;
          if (s[static_cast<std::size_t>(i)] > m) m = s[static_cast<std::size_t>(i)];
          ++valid;
        }
        if (valid == 0) continue;  // nothing of this block is visible to the query
        std::vector<float> o(static_cast<std::size_t>(hd), 0.0f);
        for (std::int64_t i = 0; i < valid; ++i) {
          pt[static_cast<std::size_t>(i)] = canonical_exp(s[static_cast<std::size_t>(i)] - m);
          const std::vector<float> v =
              read_kv(c, b, caches, v_scale, 1, row.request, j * sb + i, g);
          for (std::int64_t d = 0; d < hd; ++d) {
            o[static_cast<std::size_t>(d)] =
                std::fma(pt[static_cast<std::size_t>(i)], v[static_cast<std::size_t>(d)],
                         o[static_cast<std::size_t>(d)]);
          }
        }
        const float l = tree_sum(pt);
        if (!started) {
          big_m = m;
          big_l = l;
          big_o = o;
          started = true;
          continue;
        }
        // Combine with the running (M, L, O), ascending chunk order.
        const float m_new = m > big_m ? m : big_m;
        const float a = canonical_exp(big_m - m_new);
        const float bscale = canonical_exp(m - m_new);
        big_l = std::fma(big_l, a, l * bscale);
        for (std::int64_t d = 0; d < hd; ++d) {
          big_o[static_cast<std::size_t>(d)] = std::fma(big_o[static_cast<std::size_t>(d)], a,
                                                        o[static_cast<std::size_t>(d)] * bscale);
        }
        big_m = m_new;
      }
      if (!started) continue;  // no tokens: +0
      for (std::int64_t d = 0; d < hd; ++d) {
        res.out_f32[static_cast<std::size_t>(head_row(qi, hq, p.num_q_heads) * hd + d)] =
            big_o[static_cast<std::size_t>(d)] / big_l;
      }
    }
  }
  res.out.dtype = p.out_dtype;
  res.out.shape = {tq, p.num_q_heads, hd};
  const auto ob = spec::dtype_bytes(p.out_dtype);
  res.out.bytes.resize(res.out_f32.size() * ob);
  for (std::size_t i = 0; i < res.out_f32.size(); ++i) {
    store_code(encode(res.out_f32[i], p.out_dtype, spec::Saturation::kSatFinite), p.out_dtype,
               &res.out.bytes[i * ob]);
  }
  return res;
}

}  // namespace kvo::reference
