#pragma once
/// \file indexer_fused.cuh
/// The indexer in one launch (issue 16): block scores and the top-k selection, for the calls
/// fused_indexer_applies accepts, with the ids, and the scores workspace, the two-launch path
/// (indexer_kernels.cuh, topk.cuh) writes.
///
/// Grid (CUDA blocks per row, Tq) of kFusedThreads threads. CUDA block c of query row `row` scores
/// the row's logical blocks [c * span, min((c + 1) * span, n_valid)) with kSplit adjacent lanes
/// per token (1 or 2: IndexArgs::split; the range's visible tokens in order, kFusedThreads /
/// kSplit at a time; whole warps step together):
/// - each token's dot with every index head, four heads at a time, in one thread (kSplit 1) or in
///   kSplit lanes, each a subtree, joined by shuffles (split_token_dots): SPEC 6.1's canonical
///   order as one thread evaluates it, the group fma chains (8 elements each, from +0)
///   and then the tree over the L = next_pow2(groups) group results (padded with +0) that the
///   shuffle-down tree of segment_dots computes: P(r, m) = P(r, 2m) + P(r + m, 2m), P(r, L) =
///   group r, the dot P(0, 1), evaluated depth first (a few partials live at a time). The fast
///   family: two interleaved accumulators per group and the xor butterfly's association, the
///   halves of each range added, as segment_dots. q is read from shared memory (every lane the
///   same address: a broadcast), the token's index-K row from global memory, a pass ahead where a
///   lane's share fits 64 bytes (LaneGroups: the loads of the next pass's rows, and the block-table
///   entries of the pass after it, are in flight while this pass's dots run);
/// - token scores fl(dot * factor) fold into each (logical block, index head)'s `>` maximum as an
///   order-preserving key (atomicMax in shared memory: a maximum does not depend on the order, up
///   to the sign of a zero, which the selection's keys do not see) and its NaN flags, a warp at a
///   time where the warp's tokens share a logical block;
/// - block_score (indexer_common.cuh) turns them into the score rows, written to the workspace.
/// The last CUDA block of a row to finish (a counter per row, IndexArgs::row_done, which it resets
/// to 0) selects the row's top k for every KV head, reading the rows' scores through L2
/// (fused_select: topk.cuh's select_row_heads, the threshold selection or the tournament over
/// several heads at once where k <= 16, else select_best head by head); write_selection writes
/// the ids in the family's order.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "indexer_common.cuh"
#include "read_launch.cuh"
#include "topk.cuh"

namespace kvo::gpu::detail {

inline constexpr int kFusedThreads = 256;
inline constexpr int kFusedSplit = 2;  // lanes a token, unless forced (IndexArgs::split)
// CUDA blocks a multiprocessor (__launch_bounds__), whatever the lanes a token: two, a cap of 128
// registers (four heads' chains and the next pass's rows in flight; ptxas, sm_90: 96-128, 0-4 bytes
// of spills by the instantiation). Three (80) measured 4-7% slower at 16k-64k tokens, batch 16
// (session 31: the rows' loads then waited on a pass of their own).
inline constexpr int kFusedMinBlocks = 2;
// The selection's chunks a warp at once (tournament_best): 8 warps sort up to four KV heads'
// chunks of a row, 128 in the first round at 1,024 logical blocks.
inline constexpr int kFusedTourneyIlp = 4;

/// Shared-memory sections of the fused kernel (dynamic): iq [nih][idim] floats, then per (logical
/// block of the span, index head) the maximum's key and the flags [span][nih] each.
struct FusedSmem {
  std::size_t iq = 0, key = 0, saw = 0, total = 0;
  __host__ __device__ FusedSmem(int nih, int idim, int span) {
    SmemCarver c;
    iq = c.take(static_cast<std::size_t>(nih) * idim * 4);
    key = c.take(static_cast<std::size_t>(span) * nih * 4);
    saw = c.take(static_cast<std::size_t>(span) * nih * 4);
    total = c.at;
  }
};

/// A float's order-preserving key (larger float, larger key; -0 below +0); 0 is below every key of
/// a number, so it stands for "no number seen".
__device__ inline unsigned max_key(float s) {
  const unsigned u = __float_as_uint(s);
  return (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u;
}
__device__ inline float key_value(unsigned key) {
  return key == 0 ? -INFINITY
                  : __uint_as_float((key & 0x80000000u) != 0 ? key & 0x7FFFFFFFu : ~key);
}

/// One token's index-K row: its bytes (row) and, block-scaled, its group scales (scales).
struct TokenRow {
  const unsigned char* row;
  const float* scales;
};

/// The groups of one token's row that one of its kSplit lanes evaluates (sub = lane % kSplit):
/// canonical, groups base + kSplit * i (base = sub: the groups congruent to sub); fast, base + i
/// (base = sub * L / kSplit: its range), i < kGroups; a group past the row's (L pads the groups to
/// a power of two) is +0. Where the lane's groups fit 64 bytes (kAhead: the fp8 rows of index_dim
/// <= 128 under two lanes) load() reads their bytes and the row's scales at once, so that the
/// kernel has them in flight a pass before their dots; else each group is loaded where the tree
/// reaches it (registers: 16-bit rows would take 32-64).
template <bool kCanonical, int Dt, bool kBlockScale, int L, int kSplit>
struct LaneGroups {
  static constexpr int kRawDt = kBlockScale ? kDtE4m3 : Dt;  // block-scaled rows are e4m3
  static constexpr int kGroups = L / kSplit, kScaleBlocks = kMaxHeadDim / 128;
  static constexpr bool kAhead = kGroups * Raw8<kRawDt>::kWords <= 16;
  TokenRow t{nullptr, nullptr};
  int base, groups;
  Raw8<kRawDt> raw[kAhead ? kGroups : 1];
  float scale[kBlockScale ? kScaleBlocks : 1];  // the row's 128-element blocks' scales

  __device__ LaneGroups(int n_groups, int sub)
      : base(kCanonical ? sub : sub * kGroups), groups(n_groups) {}
  /// The lane's token's row (valid: the token exists; else nothing is read).
  __device__ void load(const TokenRow& row, bool valid) {
    t = row;
    if constexpr (kAhead) {
      if (!valid) return;
#pragma unroll
      for (int i = 0; i < kGroups; ++i) {
        const int x = group(i);
        if (x < groups) raw[i] = load_raw8<kRawDt>(t.row + 8 * x * dtype_size(kRawDt));
      }
      if constexpr (kBlockScale) {
#pragma unroll
        for (int b = 0; b < kScaleBlocks; ++b)
          if (16 * b < groups) scale[b] = t.scales[b];
      }
    }
  }
  __device__ int group(int i) const { return kCanonical ? base + kSplit * i : base + i; }
  /// Group base + `at`'s eight values, dequantized (block-scaled: times its block's scale); `at`
  /// is the lane's i (fast) or kSplit * i (canonical).
  template <int kAt>
  __device__ void values(float (&k)[8]) const {
    const int x = base + kAt;
    if constexpr (kAhead) {
      convert8<kRawDt>(raw[kCanonical ? kAt / kSplit : kAt], k);
      if constexpr (kBlockScale) {
        float s = scale[0];
#pragma unroll
        for (int b = 1; b < kScaleBlocks; ++b)
          if (x >= 16 * b) s = scale[b];
        for (float& v : k) v = __fmul_rn(v, s);
      }
    } else {
      load8_scaled<kRawDt>(t.row + 8 * x * dtype_size(kRawDt), kBlockScale,
                           kBlockScale ? t.scales[x / 16] : 1.0f, k);
    }
  }
};

/// The four dots (heads h0 .. h0 + 3 of q [heads][idim], past the last head its row) of one
/// token's index-K row over the tree node of the lane's groups at offset kAt from its base and Y
/// (canonical: the stride m, the node P(base + kAt, m); fast: the range length, the node over
/// [base + kAt, base + kAt + Y)), into out.
template <bool kCanonical, int Dt, bool kBlockScale, int L, int kSplit, int Y, int kAt>
__device__ inline void token_dots(const LaneGroups<kCanonical, Dt, kBlockScale, L, kSplit>& lg,
                                  const float* const (&q)[4], float (&out)[4]) {
  constexpr bool kLeaf = kCanonical ? Y == L : Y == 1;
  if constexpr (kLeaf) {
    // Group x: elements 8x .. 8x + 7.
    const int x = lg.base + kAt;
    if (x >= lg.groups) {  // a padding group's +0
#pragma unroll
      for (int u = 0; u < 4; ++u) out[u] = 0.0f;
      return;
    }
    float k[8];
    lg.template values<kAt>(k);
#pragma unroll
    for (int u = 0; u < 4; ++u) out[u] = group_dot<kCanonical>(q[u] + 8 * x, k);
  } else {
    // Canonical: P(x, m) = P(x, 2m) + P(x + m, 2m); fast: [x, x + Y) = its halves.
    constexpr int kChildY = kCanonical ? 2 * Y : Y / 2, kRight = kCanonical ? Y : Y / 2;
    float left[4], right[4];
    token_dots<kCanonical, Dt, kBlockScale, L, kSplit, kChildY, kAt>(lg, q, left);
    token_dots<kCanonical, Dt, kBlockScale, L, kSplit, kChildY, kAt + kRight>(lg, q, right);
#pragma unroll
    for (int u = 0; u < 4; ++u)
      out[u] = kCanonical ? __fadd_rn(left[u], right[u]) : left[u] + right[u];
  }
}

/// The four dots of a token whose row kSplit adjacent lanes share (sub = lane % kSplit): each lane
/// evaluates one subtree of the token's tree and the top log2(kSplit) levels are shuffles, so the
/// association is the one-thread tree's. Canonical: lane sub holds P(sub, kSplit) (the groups
/// congruent to sub), then P(r, m) = P(r, 2m) + P(r + m, 2m) by shuffle-down for m = kSplit / 2 ..
/// 1; fast: lane sub holds the range [sub * L / kSplit, (sub + 1) * L / kSplit), then each pair of
/// adjacent ranges is added by xor (commutative: both lanes get the same bits). Lane sub 0 holds
/// the dots; every lane of the warp takes part (valid: whether this lane's token exists).
template <bool kCanonical, int Dt, bool kBlockScale, int L, int kSplit>
__device__ inline void split_token_dots(
    const LaneGroups<kCanonical, Dt, kBlockScale, L, kSplit>& lg, const float* const (&q)[4],
    bool valid, float (&d)[4]) {
#pragma unroll
  for (int u = 0; u < 4; ++u) d[u] = 0.0f;
  if (valid)
    token_dots<kCanonical, Dt, kBlockScale, L, kSplit, kCanonical ? kSplit : L / kSplit, 0>(lg, q,
                                                                                            d);
  if constexpr (kCanonical) {
#pragma unroll
    for (int m = kSplit / 2; m > 0; m /= 2) {
#pragma unroll
      for (int u = 0; u < 4; ++u)
        d[u] = __fadd_rn(d[u], __shfl_down_sync(0xFFFFFFFFu, d[u], m, kSplit));
    }
  } else {
#pragma unroll
    for (int m = 1; m < kSplit; m *= 2) {
#pragma unroll
      for (int u = 0; u < 4; ++u) d[u] = d[u] + __shfl_xor_sync(0xFFFFFFFFu, d[u], m, kSplit);
    }
  }
}

/// The fused kernel's selection of a query row's heads by its last CUDA block (kvo_gpu_testing's
/// launch_block_topk runs it alone, on given scores).
template <bool kCanonical>
__device__ inline void fused_select(const TopkArgs& t, const ScoreRows& sc, long long row,
                                    long long rows, long long n_valid, unsigned long long* keys,
                                    int* best) {
  select_row_heads<kCanonical, kFusedThreads, kFusedTourneyIlp>(t, sc, row, rows, n_valid, keys,
                                                                best);
}

/// The fused indexer kernel (see the top of this file).
template <bool kCanonical, int Dt, bool kBlockScale, int L, int kSplit, ReadBug F>
__global__ void __launch_bounds__(kFusedThreads, kFusedMinBlocks)
    indexer_fused_kernel(IndexArgs a) {
  extern __shared__ float4 smem4[];
  __shared__ unsigned long long keys[kKeyTile];
  __shared__ int best[kMaxTopk];
  __shared__ bool last;
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
  const long long c = blockIdx.x, row = blockIdx.y, rows = gridDim.y;
  const long long r = a.row_req[row], pos = a.row_pos[row];
  const long long n_valid = a.seq_lens[r] == 0 ? 0 : pos / a.sb + 1;
  const TopkArgs t{a.scores,       a.ids,        a.score_rows, a.max_nv,  a.topk,   1,
                   a.drop_neg_inf, a.head_major, a.key_mask,   a.id_mask, a.tie_xor};
  if (n_valid == 0) {  // a padded request: its rows are -1
    if (c == 0) {
      for (int h = 0; h < a.score_rows; ++h) {
        int* out = selection_out(t, row, h, rows);
        for (long long k = threadIdx.x; k < a.topk; k += blockDim.x) out[k] = -1;
      }
    }
    return;
  }
  const long long ctas = (n_valid + a.span - 1) / a.span;
  if (c >= ctas) return;  // past this row's blocks: not counted
  const ReadGeom& g = a.g;
  const int idim = static_cast<int>(g.index_dim), nih = a.nih, groups = idim / 8;
  const FusedSmem lay(nih, idim, a.span);
  float* iq_s = reinterpret_cast<float*>(smem + lay.iq);
  unsigned* key_s = reinterpret_cast<unsigned*>(smem + lay.key);
  int* saw_s = reinterpret_cast<int*>(smem + lay.saw);
  const long long jb0 = c * a.span, jb1 = jb0 + a.span < n_valid ? jb0 + a.span : n_valid;
  const int ab = dtype_size(a.iq_dtype);
  for (int e = threadIdx.x; e < nih * idim; e += blockDim.x)
    iq_s[e] = load_act(a.iq + (row * nih * idim + e) * ab, a.iq_dtype);
  for (int e = threadIdx.x; e < a.span * nih; e += blockDim.x) key_s[e] = 0, saw_s[e] = 0;
  __syncthreads();

  // kSplit adjacent lanes a token (sub: which of them); the warp's 32 / kSplit tokens consecutive.
  constexpr int kWarpTokens = 32 / kSplit, kPassTokens = kFusedThreads / kSplit;
  const int lane = threadIdx.x % 32, sub = lane % kSplit, sb = static_cast<int>(a.sb);
  const int bs = static_cast<int>(g.block_size), scale_groups = kBlockScale ? idim / 128 : 0;
  const long long t_end = jb1 * a.sb < pos + 1 ? jb1 * a.sb : pos + 1;
  // A lane's token in the pass from b (past t_end: the pass's first, in bounds, with no dots);
  // positions past 2^31 do not occur (kMaxNValid blocks): 32-bit divisions.
  const auto token_in = [&](long long b) {
    const long long tok = b + lane / kSplit;
    return static_cast<int>(tok < t_end ? tok : b);
  };
  const int* const table = a.table + r * g.max_blocks;
  // Token tk's row, its page's block-table entry given.
  const auto row_of = [&](int tk, int entry) -> TokenRow {
    const long long page = entry * a.ix_block;
    const int o = tk % bs;
    return {a.cache + page + o * a.ix_token,
            reinterpret_cast<const float*>(a.cache + page + g.block_size * idim +
                                           o * scale_groups * 4)};
  };
  // Software pipelined: a pass's rows are loaded during the pass before (`next`), and their
  // block-table entries the pass before that (`entry`), so that neither latency waits on the dots.
  const long long first = jb0 * a.sb + threadIdx.x / 32 * kWarpTokens;
  LaneGroups<kCanonical, Dt, kBlockScale, L, kSplit> cur(groups, sub), next(groups, sub);
  int entry = 0;  // the block-table entry of the pass after the next one
  if (first < t_end) {
    const int tk = token_in(first);
    cur.load(row_of(tk, table[tk / bs]), first + lane / kSplit < t_end);
    if (first + kPassTokens < t_end) entry = table[token_in(first + kPassTokens) / bs];
  }
  for (long long base = first; base < t_end; base += kPassTokens) {
    const bool valid = base + lane / kSplit < t_end;
    const int tk = token_in(base);
    const long long after = base + kPassTokens;
    if (after < t_end) {
      next.load(row_of(token_in(after), entry), after + lane / kSplit < t_end);
      if (after + kPassTokens < t_end) entry = table[token_in(after + kPassTokens) / bs];
    }
    const int lb = tk / sb - static_cast<int>(jb0);
    const int lb0 = __shfl_sync(0xFFFFFFFFu, lb, 0);
    const bool uniform = __all_sync(0xFFFFFFFFu, !valid || lb == lb0);
    const bool owner = valid && sub == 0;  // the lane whose dots are the token's
    for (int h0 = 0; h0 < nih; h0 += 4) {  // four heads at a time (padded with the last)
      const float* qs[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) qs[u] = iq_s + (h0 + u < nih ? h0 + u : nih - 1) * idim;
      float d[4];
      split_token_dots(cur, qs, valid, d);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (h0 + u >= nih) break;
        const float score = __fmul_rn(d[u], a.score_factor);
        const unsigned key = !owner || isnan(score) ? 0u : max_key(score);
        const int saw = !owner ? 0 : isnan(score) ? kSawNan : kSawNumber;
        const int at = lb0 * nih + h0 + u;
        if (uniform) {
          const unsigned wkey = __reduce_max_sync(0xFFFFFFFFu, key);
          const int wsaw = static_cast<int>(__reduce_or_sync(0xFFFFFFFFu, saw));
          if (lane == 0) atomicMax(&key_s[at], wkey), atomicOr(&saw_s[at], wsaw);
        } else if (owner) {
          atomicMax(&key_s[lb * nih + h0 + u], key);
          atomicOr(&saw_s[lb * nih + h0 + u], saw);
        }
      }
    }
    cur = next;
  }
  __syncthreads();
  const int nb = static_cast<int>(jb1 - jb0);
  for (int e = threadIdx.x; e < nb * a.score_rows; e += blockDim.x) {
    const int lb = e / a.score_rows, sr = e - lb * a.score_rows;
    const auto best_of = [&](int h) { return key_value(key_s[lb * nih + h]); };
    const auto saw_of = [&](int h) { return saw_s[lb * nih + h]; };
    a.scores[(row * a.score_rows + sr) * a.max_nv + jb0 + lb] =
        block_score<F>(a, sr, jb0 + lb, n_valid, best_of, saw_of);
  }

  // Last block done: the scores of every CUDA block of the row are visible to the last one.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&a.row_done[row], 1u) == static_cast<unsigned>(ctas - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) a.row_done[row] = 0;  // ready for the next launch
  fused_select<kCanonical>(t, {a.scores + row * a.score_rows * a.max_nv, a.max_nv, true}, row, rows,
                           n_valid, keys, best);
}

/// Whether the fused kernel takes a call (host): one score row per KV head (index_group max), the
/// canonical drop_neg_inf at topk <= kTourney only (write_selection), at most kKeyTile logical
/// blocks, topk within best[], index-K rows whose 8-element groups are aligned for load8 (`unit`:
/// the largest of 16, 8, 4 dividing the view's start, strides and row size), the shared memory in
/// bounds.
inline bool fused_indexer_applies(long long lanes, bool canonical, bool drop_neg_inf,
                                  long long max_nv, long long topk, int group_bytes, int unit,
                                  std::size_t smem) {
  return lanes == 1 && !(canonical && drop_neg_inf && topk > kTourney) && max_nv <= kKeyTile &&
         topk <= kMaxTopk && unit >= std::min(group_bytes, 16) && smem <= kMaxSmem - 48 * 1024;
}

/// Launches the fused kernel over (CUDA blocks per row, rows); a.span and a.split set.
template <bool kCanonical, int Dt, bool kBlockScale, int L, int kSplit, ReadBug F>
void run_fused_indexer(const IndexArgs& a, std::int64_t rows, std::size_t smem, cudaStream_t s) {
  allow_smem(indexer_fused_kernel<kCanonical, Dt, kBlockScale, L, kSplit, F>, smem);
  const long long per_row = (a.max_nv + a.span - 1) / a.span;
  indexer_fused_kernel<kCanonical, Dt, kBlockScale, L, kSplit, F>
      <<<dim3(static_cast<unsigned>(per_row), static_cast<unsigned>(rows)), kFusedThreads, smem,
         s>>>(a);
  check_cuda(cudaGetLastError(), "indexer_fused_kernel launch");
}

}  // namespace kvo::gpu::detail
