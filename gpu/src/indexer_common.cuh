#pragma once
/// \file indexer_common.cuh
/// What the indexer's launches share: the kernel arguments and the rule that turns a logical
/// block's per-head maxima into its score row value (SPEC 5), so that the two-launch score kernel
/// (indexer_kernels.cuh) and the fused kernel (indexer_fused.cuh) hold one definition of it.

#include <cuda_runtime.h>

#include "read_launch.cuh"

namespace kvo::gpu::detail {

struct IndexArgs : BatchView {
  const unsigned char* cache;    // the index-K view's first element (SPEC 3)
  long long ix_block, ix_token;  // the view's block and token-row strides in bytes
  const unsigned char* iq;       // [Tq, nih, idim] of iq_dtype
  float* scores;                 // [Tq, score_rows, max_nv]
  int* ids;                      // [Tq, nkv, topk * lanes]
  int nih;
  int iq_dtype;    // the activation dtype, or e4m3 (SPEC 5 fp8 index-Q)
  int score_rows;  // nkv * lanes: KV heads (index_group max) or index heads (union)
  long long lanes;
  bool drop_neg_inf;
  bool head_major;    // ids [nkv, Tq, width] (spec::TopkLayout::kHeadMajor)
  unsigned key_mask;  // the top spec::TopkForm::key_bits bits of each score's image (fast only)
  int id_mask;        // TopkArgs::id_mask
  unsigned tie_xor;   // TopkArgs::tie_xor
  int tile;           // tokens per staged tile
  int unit;           // bytes per staging copy: divides every index-K row's address and size
  long long sb, topk, init_blocks, local_blocks, max_nv;
  float score_factor;  // 1 or fl(index_dim^-0.5): token score = fl(dot * score_factor)
  int index_nan;       // spec::IndexNan
  unsigned* row_done;  // [Tq] the fused launch's finished CUDA blocks per row (DeviceIndexer)
  int span;            // the fused launch's logical blocks per CUDA block
  int split;           // the fused launch's lanes per token (1, 2)
};

/// The token-score flags of one (segment, head) of kernel 1: a NaN score seen, a number seen.
inline constexpr int kSawNan = 1, kSawNumber = 2;

/// Score row sr's value for logical block jb (SPEC 5): each index head h of the row has its `>`
/// maximum best_of(h) and flags saw_of(h) (kSawNan | kSawNumber), which the index_nan rule turns
/// into its block score (skip: NaNs ignored, a block of only NaN -1e30; first: +inf; lowest:
/// -1e30); the row takes the `>` maximum over its heads in ascending order (index_group max; one
/// head under union), then the init (1e30) and local (1e29, overriding init) forcing. Bug
/// kIgnoreLocal leaves the local blocks unforced.
template <ReadBug F, class BestOf, class SawOf>
__device__ inline float block_score(const IndexArgs& a, int sr, long long jb, long long n_valid,
                                    const BestOf& best_of, const SawOf& saw_of) {
  const int per_row = a.nih / a.score_rows;
  const bool skip = a.index_nan == static_cast<int>(spec::IndexNan::kSkip);
  float gs = 0.0f;
  for (int h = sr * per_row; h < (sr + 1) * per_row; ++h) {
    float best = best_of(h);
    const int saw = saw_of(h);
    if ((saw & kSawNan) != 0 && (!skip || (saw & kSawNumber) == 0)) {
      best = a.index_nan == static_cast<int>(spec::IndexNan::kFirst) ? INFINITY : -1e30f;
    }
    if (h == sr * per_row || best > gs) gs = best;
  }
  if (jb < a.init_blocks) gs = 1e30f;
  if (F != ReadBug::kIgnoreLocal && jb >= n_valid - a.local_blocks) gs = 1e29f;  // overrides init
  return gs;
}

}  // namespace kvo::gpu::detail
