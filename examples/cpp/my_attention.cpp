// The user's sparse attention (my_kernels.hpp): float32, a naive softmax per (row, query head).
#include <algorithm>
#include <cmath>
#include <vector>

#include "my_kernels.hpp"

namespace my {
namespace {

void attend(const SparseAttention& a, bool sees_own_token) {
  const std::int64_t group = a.q_heads / a.kv_heads, hd = a.head_dim;
  for (std::int64_t r = 0; r < a.requests; ++r) {
    const std::int64_t first = a.query_start_loc[r], rows = a.query_start_loc[r + 1] - first;
    for (std::int64_t i = first; i < first + rows; ++i) {
      const std::int64_t position = a.seq_lens[r] - rows + (i - first);
      for (std::int64_t hq = 0; hq < a.q_heads; ++hq) {
        const std::int64_t g = hq / group;
        const std::uint16_t* q = a.q + (i * a.q_heads + hq) * hd;
        float* out = a.out + (i * a.q_heads + hq) * hd;
        std::fill(out, out + hd, 0.0f);
        if (a.seq_lens[r] == 0) continue;  // a padded row
        // The visible tokens of the selected blocks, their K and V rows, and their scores.
        std::vector<const std::uint16_t*> v_rows;
        std::vector<float> scores;
        const std::int64_t last = sees_own_token ? position : position - 1;
        for (std::int64_t t = 0; t <= last; ++t) {
          bool chosen = a.selected == nullptr;
          for (std::int64_t k = 0; !chosen && k < a.topk; ++k)
            chosen = a.selected[(i * a.kv_heads + g) * a.topk + k] == t / a.sparse_block;
          if (!chosen) continue;
          const std::int64_t block = a.block_table[r * a.max_blocks + t / a.block_size];
          const std::int64_t row = (block * a.block_size + t % a.block_size) * a.kv_heads + g;
          float dot = 0.0f;
          for (std::int64_t d = 0; d < hd; ++d)
            dot += bf16_to_float(q[d]) * bf16_to_float(a.k_cache[row * hd + d]);
          scores.push_back(dot * a.sm_scale);
          v_rows.push_back(a.v_cache + row * hd);
        }
        if (scores.empty()) continue;
        const float top = *std::max_element(scores.begin(), scores.end());
        float sum = 0.0f;
        for (std::size_t j = 0; j < scores.size(); ++j) {
          const float p = std::exp(scores[j] - top);
          sum += p;
          for (std::int64_t d = 0; d < hd; ++d) out[d] += p * bf16_to_float(v_rows[j][d]);
        }
        for (std::int64_t d = 0; d < hd; ++d) out[d] /= sum;
      }
    }
  }
}

}  // namespace

void sparse_attention(const SparseAttention& args) { attend(args, true); }
void sparse_attention_planted_bug(const SparseAttention& args) { attend(args, false); }

}  // namespace my
