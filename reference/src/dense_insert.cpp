// The dense-layer fused insert, SPEC 4 read line by line.
#include "kvo/reference/dense_insert.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvo/reference/canonical.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"

namespace kvo::reference {
namespace {

/// Gemma RMSNorm then partial NeoX RoPE of one head vector x (hd values), in place.
void norm_rope(std::vector<float>& x, const std::vector<float>& w, const spec::DenseInsert& in,
               std::int64_t pos) {
  const auto hd = static_cast<std::int64_t>(x.size());
  std::vector<float> sq(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) sq[i] = x[i] * x[i];
  const float ms = tree_sum(sq) / static_cast<float>(hd);
  const float r = 1.0f / std::sqrt(ms + in.eps);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = (x[i] * r) * (1.0f + w[i]);
  const std::int64_t half = in.rotary_dim / 2;
  const float* row = in.cos_sin.data() + pos * in.rotary_dim;
  for (std::int64_t i = 0; i < half; ++i) {
    const float c = row[i], s = row[half + i];
    const float x1 = x[static_cast<std::size_t>(i)], x2 = x[static_cast<std::size_t>(i + half)];
    x[static_cast<std::size_t>(i)] = std::fma(x1, c, -(x2 * s));
    x[static_cast<std::size_t>(i + half)] = std::fma(x2, c, x1 * s);
  }
  // SPEC 2: a NaN out of this arithmetic is the GPU's canonical NaN, whatever the input's sign.
  for (float& v : x) v = arithmetic_result(v);
}

}  // namespace

spec::HostTensor dense_insert(const spec::ModelConfig& c, const spec::DenseInsert& in,
                              spec::LayerCaches& caches) {
  spec::validate(c);
  spec::validate_dense_insert(c, in);
  const PagedCacheLayout layout(c);
  const spec::CacheGeometry& g = c.geometry;
  const std::int64_t hd = g.head_dim, nkv = g.num_kv_heads, nq = in.q.shape[1];
  const auto tokens = static_cast<std::int64_t>(in.kv.slots.slots.size());
  const auto ab = static_cast<std::int64_t>(spec::dtype_bytes(c.act_dtype));
  const auto cb = static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  spec::HostTensor q_out;
  q_out.dtype = c.act_dtype;
  q_out.shape = {tokens, nq, hd};
  q_out.bytes.resize(static_cast<std::size_t>(tokens * nq * hd * ab));
  std::vector<float> x(static_cast<std::size_t>(hd));
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t pos = in.positions[static_cast<std::size_t>(t)];
    for (std::int64_t h = 0; h < nq; ++h) {
      for (std::int64_t d = 0; d < hd; ++d)
        x[static_cast<std::size_t>(d)] = source_value(in.q, (t * nq + h) * hd + d);
      norm_rope(x, in.q_norm_weight, in, pos);
      for (std::int64_t d = 0; d < hd; ++d) {
        store_code(
            encode(x[static_cast<std::size_t>(d)], c.act_dtype, spec::Saturation::kSatFinite),
            c.act_dtype, q_out.bytes.data() + ((t * nq + h) * hd + d) * ab);
      }
    }
    std::int64_t slot = in.kv.slots.slots[static_cast<std::size_t>(t)];
    if (slot < 0 && c.slot_mode == spec::SlotMode::kLegacyWrap) slot += g.capacity();
    if (slot < 0) continue;
    const std::int64_t b = slot / g.block_size, o = slot % g.block_size;
    for (int kv = 0; kv < 2; ++kv) {
      const spec::HostTensor& src = kv == 0 ? in.kv.k : in.kv.v;
      std::uint8_t* dst = caches.find(layout.kv_buffer(kv))->body();
      for (std::int64_t h = 0; h < nkv; ++h) {
        for (std::int64_t d = 0; d < hd; ++d)
          x[static_cast<std::size_t>(d)] = source_value(src, (t * nkv + h) * hd + d);
        if (kv == 0) norm_rope(x, in.k_norm_weight, in, pos);
        // The scale, or 1 under dense_fp8_store identity (SPEC 4).
        const float s = in.store_scale(kv, h, c.kv.per_head_scale);
        for (std::int64_t d = 0; d < hd; ++d) {
          store_code(quantize_kv(x[static_cast<std::size_t>(d)], s, c.kv, c.act_dtype),
                     c.kv.cache_dtype, dst + layout.kv_element(kv, b, o, h, d) * cb);
        }
      }
    }
  }
  return q_out;
}

std::vector<std::uint32_t> admissible_dense_codes(const spec::ModelConfig& c,
                                                  const spec::DenseInsert& in,
                                                  const CacheElement& e) {
  const spec::CacheGeometry& g = c.geometry;
  const std::int64_t hd = g.head_dim, nkv = g.num_kv_heads;
  const std::int64_t slot = e.block * g.block_size + e.offset;
  const spec::HostTensor& src = e.kv == 0 ? in.kv.k : in.kv.v;
  const float s = in.store_scale(e.kv, e.head, c.kv.per_head_scale);
  std::vector<std::uint32_t> codes;
  std::vector<float> x(static_cast<std::size_t>(hd));
  for (std::size_t t = 0; t < in.kv.slots.slots.size(); ++t) {
    std::int64_t target = in.kv.slots.slots[t];
    if (target < 0 && c.slot_mode == spec::SlotMode::kLegacyWrap) target += g.capacity();
    if (target != slot) continue;
    const auto ti = static_cast<std::int64_t>(t);
    for (std::int64_t d = 0; d < hd; ++d)
      x[static_cast<std::size_t>(d)] = source_value(src, (ti * nkv + e.head) * hd + d);
    if (e.kv == 0) norm_rope(x, in.k_norm_weight, in, in.positions[t]);
    for (std::uint32_t code :
         admissible_kv_codes(x[static_cast<std::size_t>(e.dim)], s, c.kv, c.act_dtype))
      codes.push_back(code);
  }
  std::sort(codes.begin(), codes.end());
  codes.erase(std::unique(codes.begin(), codes.end()), codes.end());
  return codes;
}

}  // namespace kvo::reference
