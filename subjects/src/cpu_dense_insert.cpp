// cpu-dense (cpu_dense.hpp): the dense-layer fused insert (SPEC 4) in the structure of a fused
// kernel, canonical and written apart from the reference. One pass per token: each head vector is
// held by 32 lanes (lane l owns elements l, l + 32, ...), the squares are summed in each lane in
// the tree's order and then across lanes by shuffle-downs, which is SPEC 6.1's tree_sum exactly for
// the non-negative squares; the page and offset are computed once per token and K and V are stored
// through one stride descriptor. Planted bugs (DenseMutation) model real engines' confusions.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/subjects/cpu_dense.hpp"
#include "kvo/subjects/cpu_write.hpp"

namespace kvo::subjects {
namespace {

constexpr std::int64_t kLanes = 32;

/// SPEC 6.1 tree_sum of x[0..n) (x >= +0) as a warp computes it: within each lane over its own
/// elements while the tree's stride is a multiple of 32, then shuffle-downs 16, 8, 4, 2, 1.
float warp_tree_sum(const std::vector<float>& x) {
  std::int64_t m = 1;
  while (m < static_cast<std::int64_t>(x.size())) m *= 2;
  std::vector<float> lane(static_cast<std::size_t>(std::max(m, kLanes)), 0.0f);
  for (std::size_t i = 0; i < x.size(); ++i) lane[i] = x[i];
  for (; m > kLanes; m /= 2) {
    for (std::int64_t i = 0; i < m / 2; ++i)
      lane[static_cast<std::size_t>(i)] += lane[static_cast<std::size_t>(i + m / 2)];
  }
  for (std::int64_t offset = kLanes / 2; offset >= 1; offset /= 2) {
    for (std::int64_t l = 0; l < offset; ++l)
      lane[static_cast<std::size_t>(l)] += lane[static_cast<std::size_t>(l + offset)];
  }
  return lane[0];
}

/// The engine's sum of squares: lane l of 32 squares its contiguous elements with fma, then an xor
/// butterfly (offsets 16, 8, 4, 2, 1) leaves the total in every lane.
float engine_sum_squares(const std::vector<float>& x) {
  const auto n = static_cast<std::int64_t>(x.size());
  const std::int64_t per = (n + kLanes - 1) / kLanes;
  std::vector<float> lane(static_cast<std::size_t>(kLanes), 0.0f);
  for (std::int64_t l = 0; l < kLanes; ++l) {
    for (std::int64_t i = l * per; i < std::min(n, (l + 1) * per); ++i) {
      lane[static_cast<std::size_t>(l)] =
          std::fma(x[static_cast<std::size_t>(i)], x[static_cast<std::size_t>(i)],
                   lane[static_cast<std::size_t>(l)]);
    }
  }
  for (std::int64_t offset = kLanes / 2; offset >= 1; offset /= 2) {
    std::vector<float> next(lane.size());
    for (std::int64_t l = 0; l < kLanes; ++l) {
      next[static_cast<std::size_t>(l)] =
          lane[static_cast<std::size_t>(l)] + lane[static_cast<std::size_t>(l ^ offset)];
    }
    lane = next;
  }
  return lane[0];
}

/// rsqrtf emulated within its 2 ulp: the correctly rounded 1 / sqrt(a), one ulp up when the last
/// bit of a is set.
float approx_rsqrt(float a) {
  const auto r = static_cast<float>(1.0 / std::sqrt(static_cast<double>(a)));
  std::uint32_t bits = 0;
  std::memcpy(&bits, &a, sizeof bits);
  return (bits & 1u) != 0 ? std::nextafter(r, INFINITY) : r;
}

/// Gemma RMSNorm, then partial RoPE over [0, rotary_dim) with the row `cs` (cos, then sin).
void norm_rope(std::vector<float>& x, const std::vector<float>& w, const spec::DenseInsert& in,
               const float* cs, const DenseMutation& m, DenseArithmetic arithmetic) {
  const bool engine = arithmetic == DenseArithmetic::kEngine;
  const auto squares = [&] {
    std::vector<float> sq(x.size());
    for (std::size_t k = 0; k < x.size(); ++k) sq[k] = x[k] * x[k];
    return sq;
  };
  const float ms =
      (engine ? engine_sum_squares(x) : warp_tree_sum(squares())) / static_cast<float>(x.size());
  const float eps = in.eps * m.eps_factor;
  const float r = m.eps_outside_sqrt ? 1.0f / (std::sqrt(ms) + eps)
                  : engine           ? approx_rsqrt(ms + eps)
                                     : 1.0f / std::sqrt(ms + eps);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = (x[i] * r) * (m.norm_without_one ? w[i] : 1.0f + w[i]);
  const std::int64_t half = in.rotary_dim / 2;
  const std::int64_t first =
      m.rope_over_tail_dims ? static_cast<std::int64_t>(x.size()) - in.rotary_dim : 0;
  for (std::int64_t i = 0; i < half; ++i) {
    // NeoX pairs (i, i + half); GPT-J pairs (2i, 2i + 1), both with cos/sin entry i.
    const auto a = static_cast<std::size_t>(first + (m.gptj_rope ? 2 * i : i));
    const auto b = static_cast<std::size_t>(first + (m.gptj_rope ? 2 * i + 1 : i + half));
    const float c = cs[i], s = cs[half + i];
    const float x1 = x[a], x2 = x[b];
    if (engine) {
      const float x1c = x1 * c, x2s = x2 * s, x2c = x2 * c, x1s = x1 * s;
      x[a] = x1c - x2s;
      x[b] = x2c + x1s;
    } else {
      x[a] = std::fma(x1, c, -(x2 * s));
      x[b] = std::fma(x2, c, x1 * s);
    }
  }
}

void load(const spec::HostTensor& t, std::int64_t first, std::vector<float>& x) {
  for (std::size_t d = 0; d < x.size(); ++d)
    x[d] = reference::source_value(t, first + static_cast<std::int64_t>(d));
}

}  // namespace

spec::HostTensor dense_insert_fused(const spec::ModelConfig& c, const spec::DenseInsert& in,
                                    spec::LayerCaches& caches, const DenseMutation& m,
                                    DenseArithmetic arithmetic) {
  spec::validate(c);
  spec::validate_dense_insert(c, in);
  const spec::CacheGeometry& g = c.geometry;
  const std::int64_t hd = g.head_dim, nkv = g.num_kv_heads, nq = in.q.shape[1];
  const auto tokens = static_cast<std::int64_t>(in.kv.slots.slots.size());
  const auto ab = static_cast<std::int64_t>(spec::dtype_bytes(c.act_dtype));
  const auto cb = static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  const KvView view = kv_view(c, caches);
  spec::HostTensor q_out;
  q_out.dtype = c.act_dtype;
  q_out.shape = {tokens, nq, hd};
  q_out.bytes.resize(static_cast<std::size_t>(tokens * nq * hd * ab));
  std::vector<float> x(static_cast<std::size_t>(hd)), v(static_cast<std::size_t>(hd));
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float* cs = in.cos_sin.data() + in.positions[static_cast<std::size_t>(t)] * in.rotary_dim;
    for (std::int64_t h = 0; h < nq; ++h) {
      load(in.q, (t * nq + h) * hd, x);
      norm_rope(x, in.q_norm_weight, in, cs, m, arithmetic);
      std::uint8_t* out = q_out.bytes.data() + (t * nq + h) * hd * ab;
      for (std::int64_t d = 0; d < hd; ++d) {
        reference::store_code(reference::encode(x[static_cast<std::size_t>(d)], c.act_dtype,
                                                spec::Saturation::kSatFinite),
                              c.act_dtype, out + d * ab);
      }
    }
    const std::int64_t slot =
        resolve_slot(in.kv.slots.slots[static_cast<std::size_t>(t)], g.capacity(), c.slot_mode);
    if (slot < 0) continue;
    const std::int64_t token_base = view.token_offset(slot);
    for (std::int64_t h = 0; h < nkv; ++h) {
      load(in.kv.k, (t * nkv + h) * hd, x);
      load(in.kv.v, (t * nkv + h) * hd, v);
      norm_rope(x, in.k_norm_weight, in, cs, m, arithmetic);
      const std::size_t si = c.kv.per_head_scale ? static_cast<std::size_t>(h) : 0;
      // dense_fp8_store identity stores with scale 1 (the mutation: whatever is declared).
      const bool unscaled = m.fp8_store_unscaled || in.fp8_store == spec::DenseFp8Store::kIdentity;
      const float ks = unscaled ? 1.0f : in.kv.k_scale[si];
      const float vs = unscaled ? 1.0f : in.kv.v_scale[si];
      std::uint8_t* kd = view.k + (token_base + h * view.strides.head) * cb;
      std::uint8_t* vd = view.v + (token_base + h * view.strides.head + view.v_part) * cb;
      for (std::int64_t d = 0; d < hd; ++d) {
        const auto i = static_cast<std::size_t>(d);
        reference::store_code(reference::quantize_kv(x[i], ks, c.kv, c.act_dtype), c.kv.cache_dtype,
                              kd + d * cb);
        reference::store_code(reference::quantize_kv(v[i], vs, c.kv, c.act_dtype), c.kv.cache_dtype,
                              vd + d * cb);
      }
    }
  }
  return q_out;
}

}  // namespace kvo::subjects
