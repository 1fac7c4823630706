// cpu-flash-bf16 / cpu-flash-fp16 (cpu_read.hpp): attention in the arithmetic of a flash-style
// kernel, written apart from the reference. Per (query row, query head): the row's tokens in
// 64-token tiles; per tile raw scores q'.k'_t (operands rounded to the profile's type), the running
// maximum m, the rescale a = 2^((m_old - m) c), p_t = 2^(fma(s_t, c, -fl(m c))) with c =
// fl(sm_scale * log2(e)) (FlashAttention's scale_apply_exp2), results below 2^-126 flushed as
// ex2.approx.ftz does; L = L a + sum of p in fp32 before P is rounded; P rounded to the profile's
// type; O = O a + sum_t p'_t v'_t by fma; at the end out = O * fl(1 / L).
#include <algorithm>
#include <cmath>

#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/read_rules.hpp"
#include "kvo/subjects/cpu_read.hpp"

namespace kvo::subjects {
namespace {

constexpr float kLog2e = 1.4426950408889634f;  // fl(log2(e))

/// [width] floats of row `row` of a [rows, width] tensor, rounded to `type` (f32: as given).
std::vector<float> operand_row(const spec::HostTensor& t, std::int64_t row, std::int64_t width,
                               spec::DType type) {
  std::vector<float> out(static_cast<std::size_t>(width));
  for (std::int64_t i = 0; i < width; ++i) {
    out[static_cast<std::size_t>(i)] =
        reference::round_to(reference::source_value(t, row * width + i), type);
  }
  return out;
}

std::vector<float> rounded(std::vector<float> x, spec::DType type) {
  for (float& e : x) e = reference::round_to(e, type);
  return x;
}

/// 2^x as ex2.approx.ftz.f32 returns it: results below the normal range flushed to +0.
float exp2_ftz(float x) {
  const float y = std::exp2(x);
  return y < 0x1p-126f ? 0.0f : y;
}

/// What query row `q` reads with KV head g: its tokens, chunk by chunk as the selection lists them
/// (a flash kernel need not sort them; ids outside [0, n_valid) select nothing), and whether the
/// row is poisoned. Bugs: kDropChunkLast skips the last visible token of every chunk;
/// kStopAtMinusOne ends the row at its first -1; kMaskedChunkNan keeps an id past n_valid as a
/// block of masked tokens, which before any visible token leaves the running maximum at -inf with
/// no Check_inf, so its p = exp2(-inf - -inf) is NaN and poisons L and O.
struct RowTokens {
  std::vector<std::int64_t> tokens;
  bool poisoned = false;
};
RowTokens row_tokens(const reference::TopkSelection* sel, std::int64_t q, std::int64_t g,
                     std::int64_t position, std::int64_t sb, spec::AttentionBug bug) {
  const std::int64_t n_valid = position / sb + 1;
  RowTokens row;
  std::vector<std::int64_t> chunks;
  if (sel == nullptr) {
    for (std::int64_t j = 0; j < n_valid; ++j) chunks.push_back(j);
  } else {
    for (std::int64_t k = 0; k < sel->topk; ++k) {
      const std::int32_t id = sel->id(q, g, k);
      if (bug == spec::AttentionBug::kStopAtMinusOne && id < 0) break;
      if (bug == spec::AttentionBug::kMaskedChunkNan && id >= n_valid && chunks.empty())
        row.poisoned = true;
      if (id >= 0 && id < n_valid) chunks.push_back(id);
    }
  }
  for (std::int64_t j : chunks) {
    std::int64_t end = std::min((j + 1) * sb, position + 1);
    if (bug == spec::AttentionBug::kDropChunkLast) --end;
    for (std::int64_t t = j * sb; t < end; ++t) row.tokens.push_back(t);
  }
  return row;
}

}  // namespace

spec::HostTensor flash_attention(const spec::ModelConfig& config, const spec::AttentionParams& p,
                                 const spec::ReadBatch& batch, const spec::HostTensor& q_in,
                                 const spec::LayerCaches& caches, const std::vector<float>& k_scale,
                                 const std::vector<float>& v_scale,
                                 const reference::TopkSelection* sel,
                                 spec::AttentionProfile profile, spec::AttentionBug bug) {
  const spec::AttentionProfileFacts& facts = spec::profile_facts(profile);
  const auto rows = reference::query_rows(batch);
  const std::int64_t nkv = config.geometry.num_kv_heads, hd = config.geometry.head_dim;
  const std::int64_t group = p.num_q_heads / nkv;
  float sm = p.sm_scale > 0.0f ? p.sm_scale : reference::default_sm_scale(hd);
  if (bug == spec::AttentionBug::kScaleOff) sm = sm * spec::kScaleOffFactor;
  const float c = sm * kLog2e;  // scores stay raw dots; the scale is folded into the exp2
  spec::HostTensor out = zero_attention_output(rows.size(), p, hd);
  const auto ob = spec::dtype_bytes(p.out_dtype);
  for (std::size_t qi = 0; qi < rows.size(); ++qi) {
    const auto& row = rows[qi];
    if (batch.seq_lens[static_cast<std::size_t>(row.request)] == 0) continue;
    for (std::int64_t g = 0; g < nkv; ++g) {
      const RowTokens read =
          row_tokens(sel, static_cast<std::int64_t>(qi), g, row.position, p.sparse_block, bug);
      const std::vector<std::int64_t>& tokens = read.tokens;
      const std::int64_t gv = bug == spec::AttentionBug::kNeighbourV ? (g + 1) % nkv : g;
      // The KV head's K' and V' rows [tokens][hd], read once for the group's query heads.
      std::vector<std::vector<float>> k, v;
      for (std::int64_t t : tokens) {
        k.push_back(
            rounded(reference::read_kv(config, batch, caches, k_scale, 0, row.request, t, g),
                    facts.operands));
        v.push_back(
            rounded(reference::read_kv(config, batch, caches, v_scale, 1, row.request, t, gv),
                    facts.operands));
      }
      for (std::int64_t hq = g * group; hq < (g + 1) * group; ++hq) {
        const std::int64_t q_row = static_cast<std::int64_t>(qi) * p.num_q_heads + hq;
        const std::vector<float> q = operand_row(q_in, q_row, hd, facts.operands);
        // A poisoned row starts from the masked block's NaN (see RowTokens).
        const float start = read.poisoned ? exp2_ftz(std::fma(-INFINITY, c, INFINITY)) : 0.0f;
        float m = -INFINITY, l = start;
        std::vector<float> o(static_cast<std::size_t>(hd), start);
        const auto n = static_cast<std::int64_t>(tokens.size());
        for (std::int64_t t0 = 0; t0 < n; t0 += kFlashTile) {
          const std::int64_t t1 = std::min(n, t0 + kFlashTile);
          std::vector<float> s;  // raw dots of the tile, fma in dim order
          float m_new = m;
          for (std::int64_t i = t0; i < t1; ++i) {
            float acc = 0.0f;
            for (std::int64_t d = 0; d < hd; ++d)
              acc = std::fma(q[static_cast<std::size_t>(d)],
                             k[static_cast<std::size_t>(i)][static_cast<std::size_t>(d)], acc);
            s.push_back(acc);
            m_new = std::max(m_new, acc);
          }
          // FlashAttention's Check_inf: a maximum of -inf scales as 0 (m = -inf at the first
          // tile, so a = 0 there).
          const float m_use = m_new == -INFINITY ? 0.0f : m_new;
          const float a = exp2_ftz((m - m_use) * c);
          const float m_scaled = m_use * c;
          float sum = 0.0f;
          std::vector<float> p_low;  // P in the profile's type
          for (float x : s) {
            const float pt = exp2_ftz(std::fma(x, c, -m_scaled));
            sum = sum + pt;
            p_low.push_back(reference::round_to(pt, facts.p));
          }
          l = l * a + sum;
          for (std::int64_t d = 0; d < hd; ++d) {
            float acc = o[static_cast<std::size_t>(d)] * a;
            for (std::int64_t i = t0; i < t1; ++i) {
              acc = std::fma(p_low[static_cast<std::size_t>(i - t0)],
                             v[static_cast<std::size_t>(i)][static_cast<std::size_t>(d)], acc);
            }
            o[static_cast<std::size_t>(d)] = acc;
          }
          m = m_new;
        }
        const float inv = l > 0.0f || std::isnan(l) ? 1.0f / l : 0.0f;  // no tokens: +0
        for (std::int64_t d = 0; d < hd; ++d) {
          const float y = o[static_cast<std::size_t>(d)] * inv;
          reference::store_code(reference::encode(y, p.out_dtype, spec::Saturation::kSatFinite),
                                p.out_dtype,
                                &out.bytes[static_cast<std::size_t>(q_row * hd + d) * ob]);
        }
      }
    }
  }
  return out;
}

}  // namespace kvo::subjects
