#pragma once
/// \file topk.cuh
/// The block top-k selection of the indexer (SPEC 5), kernel 2 of launch_indexer_topk: one CUDA
/// block per (row, head) orders the logical blocks [0, n_valid) by (score descending, id
/// ascending) as one 64-bit key per block (select_best: a tournament of warp sorts, a bitonic sort,
/// or counted ranks, by size) and writes the first k_eff = min(topk, n_valid) ids ascending
/// (canonical) or best first (fast), then -1 up to topk. Every way of selecting yields the same
/// set: the keys are distinct.
///
/// Where n_valid comes from is a template argument: the indexer's batch (BatchNValid, instantiated
/// in topk_kernels.cu) or a list per row (ListNValid: kvo_gpu_testing's launch_block_topk, which
/// tests the selection alone).

#include <cuda_runtime.h>

#include "read_launch.cuh"

namespace kvo::gpu::detail {

inline constexpr int kTopkThreads = 1024;
inline constexpr int kRanksPerThread = 16;
inline constexpr int kMaxNValid = kTopkThreads * kRanksPerThread;
inline constexpr int kKeyTile = 4096;  // keys sorted in shared memory (32 KiB)
inline constexpr int kTourney = 16;    // k_eff up to this: the tournament top-k

/// One selection launch. Each (row, head) has `lanes` score rows (SPEC 5 index_group: 1 under max,
/// the head's index heads under union): lane l's scores are
/// scores[((row * heads + head) * lanes + l) * stride + j] for blocks j < n_valid(row) (never NaN).
/// The ids go to ids[(row * heads + head) * topk * lanes + k]: each lane's top k, their union.
/// drop_neg_inf: a chosen block whose score is -inf is left out (SPEC 5 drop_neg_inf).
struct TopkArgs {
  const float* scores;
  int* ids;
  long long heads, stride, topk;
  long long lanes = 1;
  bool drop_neg_inf = false;
  bool head_major = false;  // ids [heads, rows, width] (spec::TopkLayout), else [rows, heads, ..]
  unsigned key_mask = ~0u;  // the score keys' kept bits (spec::TopkForm::key_bits; fast only)
  int id_mask = ~0;         // ids stored & id_mask: all bits (ReadBug::kIdsWrapAt1024 plants 1023)
  unsigned tie_xor = ~0u;   // a key's low word is id ^ tie_xor: ~id, the lower id wins a tie
                            // (SPEC 5); ReadBug::kTiesToHigherId plants 0
};

/// n_valid of an indexer query row: 0 for a padded request, else pos / sparse_block + 1.
struct BatchNValid {
  const long long* row_req;   // [Tq]
  const long long* row_pos;   // [Tq]
  const long long* seq_lens;  // [R]
  long long sb;
  __device__ long long operator()(long long row) const {
    const long long r = row_req[row], pos = row_pos[row];
    return seq_lens[r] == 0 ? 0 : pos / sb + 1;
  }
};

/// n_valid given per row.
struct ListNValid {
  const int* n_valid;  // [rows]
  __device__ long long operator()(long long row) const { return n_valid[row]; }
};

/// How a selection turns a (score, id) into its key: TopkArgs::key_mask and TopkArgs::tie_xor.
struct KeyForm {
  unsigned key_mask = ~0u, tie_xor = ~0u;
};

/// Score rows of one selection: row h's block j at p[h * stride + j]. `coherent`: loaded through
/// L2 (__ldcg), for rows that other CUDA blocks of the same launch wrote (the fused indexer's last
/// CUDA block of a row, indexer_fused.cuh); else plain loads.
struct ScoreRows {
  const float* p;
  long long stride = 0;
  bool coherent = false;
  __device__ float operator()(long long h, long long j) const {
    const float* at = p + h * stride + j;
    return coherent ? __ldcg(at) : *at;
  }
  __device__ ScoreRows from(long long h) const { return {p + h * stride, stride, coherent}; }
};

/// (score descending, id ascending) as one unsigned key, larger is better. Scores are never NaN
/// here (a NaN block scores -1e30); -0 and +0 are one score.
/// `f.key_mask` keeps the top bits of the order-preserving image (spec::topk_score_key's keys; all
/// of them in the canonical family); the low word is id ^ f.tie_xor (~id: the lower id wins).
__device__ inline unsigned long long rank_key(float s, long long id, KeyForm f) {
  unsigned bits = __float_as_uint(s == 0.0f ? 0.0f : s);
  bits = ((bits & 0x80000000u) ? ~bits : bits | 0x80000000u) & f.key_mask;
  return (static_cast<unsigned long long>(bits) << 32) | (static_cast<unsigned>(id) ^ f.tie_xor);
}

/// The block id of a key made by rank_key with the same form.
__device__ inline int key_id(unsigned long long key, KeyForm f) {
  return static_cast<int>(static_cast<unsigned>(key) ^ f.tie_xor);
}

/// Bitonic steps k = k_first .. 32 on U independent warp-wide sequences of one key a lane (xor
/// shuffles; after step k, every run of k lanes is sorted descending). k_first 2 sorts any 32
/// keys; k_first 32 (the last step alone, j = 16 .. 1) sorts a bitonic sequence: two lists sorted
/// descending, the second in reverse order.
template <class Key, int U>
__device__ inline void warp_bitonic_desc(Key (&v)[U], int lane, int k_first) {
  for (int k = k_first; k <= 32; k *= 2) {
    for (int j = k / 2; j > 0; j /= 2) {
      const bool keep_max = ((lane & j) == 0) == ((lane & k) == 0);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const Key o = __shfl_xor_sync(0xFFFFFFFFu, v[u], j);
        // One comparison: keep this lane's key where it is the one the lane keeps (equal keys
        // are padding: either).
        if ((v[u] > o) != keep_max) v[u] = o;
      }
    }
  }
}

/// The tournament top-k of `heads` score rows at once (rows 0 .. heads - 1 of sc, n blocks each):
/// round 1 sorts every chunk of 32 keys of a row across a warp and keeps the best 16 (a sorted
/// list); each later round merges two lists a chunk (the second read in reverse: a bitonic
/// sequence, sorted by the network's last step alone) and keeps the best 16, alternating between
/// the two halves of `keys`, until one list per row remains. A warp takes kIlp chunks at a time:
/// their networks are independent, so their shuffles interleave (one network waits on each
/// shuffle); worth its registers where a round has more chunks than warps. Row h's k_eff best
/// (k_eff <= kTourney), best first, go to best[h * k_eff, (h + 1) * k_eff). Needs heads *
/// tourney_region(n) <= kKeyTile / 2.
__device__ inline long long tourney_region(long long n) { return (n + 31) / 32 * kTourney; }
template <int kIlp = 1>
__device__ inline void tournament_best(const ScoreRows& sc, int heads, long long n, long long k_eff,
                                       unsigned long long* keys, int* best, KeyForm f) {
  // 32-bit indices (heads * region <= kKeyTile / 2): a 64-bit division is a long subroutine.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int region = static_cast<int>(tourney_region(n));
  int field = static_cast<int>(n);
  const unsigned long long* in = nullptr;
  unsigned long long* out = keys;
  for (;;) {
    const int chunks = (field + 31) / 32, total = heads * chunks;
    const bool merge = in != nullptr;
    // A list's lane in its chunk: the second of two lists reversed where they merge.
    const int at_lane = merge && lane >= kTourney ? 3 * kTourney - 1 - lane : lane;
    for (int c0 = warp; c0 < total; c0 += warps * kIlp) {
      unsigned long long v[kIlp];
      int head_of[kIlp], chunk_of[kIlp];
#pragma unroll
      for (int u = 0; u < kIlp; ++u) {
        const int c = c0 + u * warps;
        head_of[u] = static_cast<int>(static_cast<unsigned>(c) / static_cast<unsigned>(chunks));
        chunk_of[u] = c - head_of[u] * chunks;
        const int at = chunk_of[u] * 32 + at_lane;
        v[u] = 0;  // below every real key
        if (c < total && at < field)
          v[u] = merge ? in[head_of[u] * region + at] : rank_key(sc(head_of[u], at), at, f);
      }
      warp_bitonic_desc(v, lane, merge ? 32 : 2);
#pragma unroll
      for (int u = 0; u < kIlp; ++u) {
        if (c0 + u * warps < total && lane < kTourney)
          out[head_of[u] * region + chunk_of[u] * kTourney + lane] = v[u];
      }
    }
    __syncthreads();
    if (chunks == 1) break;
    field = chunks * kTourney;
    in = out;
    out = out == keys ? keys + kKeyTile / 2 : keys;
  }
  const int k = static_cast<int>(k_eff);
  for (int e = threadIdx.x; e < heads * k; e += blockDim.x)
    best[e] = key_id(out[e / k * region + e % k], f);
}

/// The tournament's result by a threshold (the one-launch indexer's selection, k_eff <= kTourney):
/// the kThreads / 32 warps split the `heads` rows (rows 0 .. heads - 1 of sc, n blocks each)
/// evenly, per_head = warps / heads warps a row, lane l of a row's warp p holding the keys of
/// blocks p * 32
/// + l + i * 32 * per_head, i < kThresholdKeys (strided: a run of good neighbouring blocks spreads
/// over lanes). A warp's k_eff best keys are all at least T, the k_eff-th largest of its lanes'
/// largest high words (k_eff lanes hold a key whose high word is at least T), so the warp sorts
/// only its candidates (nonzero keys with high word >= T; usually under 32 of its 512: one warp
/// sort) 32 at a time into its best 16, and the row's warps merge their lists in a tree (the
/// bitonic network's last step) in shared memory, the tournament's rounds without its first
/// 15-stage sorts of every chunk. Any number of candidates is right (all tied: every key). Row h's
/// k_eff best, best first, go to best[h * k_eff, (h + 1) * k_eff). Needs threshold_fits.
template <int kThreads>
inline constexpr int kThresholdKeys = kKeyTile / kThreads;  // a warp's candidates fit its region
template <int kThreads>
__device__ inline bool threshold_fits(int heads, long long n) {
  const int per_head = kThreads / 32 / heads;
  return per_head >= 1 && n <= 32LL * per_head * kThresholdKeys<kThreads>;
}
template <int kThreads>
__device__ inline void threshold_best(const ScoreRows& sc, int heads, long long n, long long k_eff,
                                      unsigned long long* keys, int* best, KeyForm f) {
  constexpr int kKeys = kThresholdKeys<kThreads>, kRegion = 32 * kKeys;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int per_head = kThreads / 32 / heads, head = warp / per_head, part = warp % per_head;
  const int nn = static_cast<int>(n), k = static_cast<int>(k_eff);
  unsigned long long* region = keys + warp * kRegion;  // this warp's candidates, then its list
  unsigned long long v[kKeys];
  unsigned top[1] = {0};  // the largest high word of this lane's keys (0: none)
#pragma unroll
  for (int i = 0; i < kKeys; ++i) {
    const int j = part * 32 + lane + i * 32 * per_head;
    v[i] = head < heads && j < nn ? rank_key(sc(head, j), j, f) : 0;
    top[0] = max(top[0], static_cast<unsigned>(v[i] >> 32));
  }
  warp_bitonic_desc(top, lane, 2);
  const unsigned t = __shfl_sync(0xFFFFFFFFu, top[0], k - 1);
  unsigned mask = 0;
#pragma unroll
  for (int i = 0; i < kKeys; ++i)
    mask |= (v[i] != 0 && static_cast<unsigned>(v[i] >> 32) >= t ? 1u : 0u) << i;
  // This lane's candidates go to region[at, at + popc(mask)): an inclusive scan of the counts.
  int at = __popc(mask);
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int o = __shfl_up_sync(0xFFFFFFFFu, at, d);
    if (lane >= d) at += o;
  }
  const int candidates = __shfl_sync(0xFFFFFFFFu, at, 31);
  at -= __popc(mask);
#pragma unroll
  for (int i = 0; i < kKeys; ++i) {
    if ((mask >> i) & 1u) region[at++] = v[i];
  }
  __syncwarp();
  unsigned long long list = 0;  // lanes 0 .. 15: the warp's best 16 so far, best first
  for (int b = 0; b < candidates; b += 32) {
    unsigned long long x[1] = {b + lane < candidates ? region[b + lane] : 0};
    warp_bitonic_desc(x, lane, 2);
    if (b == 0) {
      list = x[0];
    } else {  // the batch's best 16 reversed after the list: a bitonic sequence
      const unsigned long long rev = __shfl_sync(0xFFFFFFFFu, x[0], 31 - lane);
      x[0] = lane < kTourney ? list : rev;
      warp_bitonic_desc(x, lane, 32);
      list = x[0];
    }
  }
  __syncwarp();
  if (lane < kTourney) region[lane] = list;
  // A row's warps' lists merged in a tree: warp p takes p + step's where p is a multiple of 2 step.
  for (int step = 1; step < per_head; step *= 2) {
    __syncthreads();
    if (head < heads && part % (2 * step) == 0 && part + step < per_head) {
      const unsigned long long* other = region + step * kRegion;
      unsigned long long x[1] = {lane < kTourney ? region[lane] : other[2 * kTourney - 1 - lane]};
      warp_bitonic_desc(x, lane, 32);
      __syncwarp();
      if (lane < kTourney) region[lane] = x[0];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < heads * k; e += kThreads)
    best[e] = key_id(keys[e / k * per_head * kRegion + e % k], f);
}

/// Best first: the k_eff largest keys of row 0 of sc's blocks [0, n) into best[0, k_eff). k_eff
/// <= 16 and up to kKeyTile blocks (decode with the MSA defaults): the tournament. Otherwise up to
/// kKeyTile blocks: a bitonic sort of the keys in shared memory. More: each block's rank is counted
/// against every other, tile by tile (quadratic, for small sparse blocks over long sequences),
/// where kLong (a caller whose n never passes kKeyTile leaves it out: its registers).
template <bool kLong = true>
__device__ inline void select_best(const ScoreRows& sc, long long n, long long k_eff,
                                   unsigned long long* keys, int* best, KeyForm f) {
  if (n == 0) return;  // a padded row: nothing to select
  if (k_eff <= kTourney && n <= kKeyTile) return tournament_best(sc, 1, n, k_eff, keys, best, f);
  if (n <= kKeyTile) {
    const int width = next_pow2(n);
    for (int e = threadIdx.x; e < width; e += blockDim.x)
      keys[e] = e < n ? rank_key(sc(0, e), e, f) : 0;
    __syncthreads();
    for (int k = 2; k <= width; k *= 2) {
      for (int j = k / 2; j > 0; j /= 2) {
        for (int i = threadIdx.x; i < width; i += blockDim.x) {
          const int partner = i ^ j;
          if (partner <= i) continue;
          const unsigned long long x = keys[i], y = keys[partner];
          if ((i & k) == 0 ? x < y : x > y) keys[i] = y, keys[partner] = x;  // descending
        }
        __syncthreads();
      }
    }
    for (int e = threadIdx.x; e < k_eff; e += blockDim.x) best[e] = key_id(keys[e], f);
    return;
  }
  if constexpr (kLong) {
    int rank[kRanksPerThread];
    unsigned long long mine[kRanksPerThread];
    for (int u = 0; u < kRanksPerThread; ++u) {
      const long long jj = threadIdx.x + static_cast<long long>(u) * blockDim.x;
      rank[u] = 0;
      mine[u] = jj < n ? rank_key(sc(0, jj), jj, f) : 0;
    }
    for (long long t0 = 0; t0 < n; t0 += kKeyTile) {
      __syncthreads();
      for (long long e = threadIdx.x; e < kKeyTile && t0 + e < n; e += blockDim.x)
        keys[e] = rank_key(sc(0, t0 + e), t0 + e, f);
      __syncthreads();
      const int m = static_cast<int>(n - t0 < kKeyTile ? n - t0 : kKeyTile);
      for (int u = 0; u < kRanksPerThread; ++u) {
        if (threadIdx.x + static_cast<long long>(u) * blockDim.x >= n) break;
        int c = 0;
        for (int e = 0; e < m; ++e) c += keys[e] > mine[u];
        rank[u] += c;
      }
    }
    for (int u = 0; u < kRanksPerThread; ++u) {
      const long long jj = threadIdx.x + static_cast<long long>(u) * blockDim.x;
      if (jj < n && rank[u] < k_eff) best[rank[u]] = static_cast<int>(jj);
    }
  }
}

/// The union of every lane's chosen blocks (less the -inf ones under drop_neg_inf), written
/// ascending to out[0, width) and padded with -1 (canonical; the fast family's order too when
/// there are several lanes). A bitmap of the row's blocks in shared memory, then a scan of its
/// words' counts.
__device__ inline void select_union(const TopkArgs& a, long long row, long long grp,
                                    long long n_valid, long long k_eff, unsigned long long* keys,
                                    int* best, int* out) {
  __shared__ unsigned chosen[kMaxNValid / 32];
  __shared__ int before[kMaxNValid / 32 + 1];  // chosen blocks in the words before each word
  const int words = static_cast<int>((n_valid + 31) / 32);
  for (int w = threadIdx.x; w < words; w += blockDim.x) chosen[w] = 0;
  for (long long l = 0; l < a.lanes; ++l) {
    const ScoreRows sc{a.scores + ((row * a.heads + grp) * a.lanes + l) * a.stride};
    __syncthreads();  // best and keys are reused lane after lane
    select_best(sc, n_valid, k_eff, keys, best, {a.key_mask, a.tie_xor});
    __syncthreads();
    for (int e = threadIdx.x; e < k_eff; e += blockDim.x) {
      const int id = best[e];
      if (!(a.drop_neg_inf && sc(0, id) == -INFINITY)) atomicOr(&chosen[id / 32], 1u << (id % 32));
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    for (int w = 0; w < words; ++w) before[w] = total, total += __popc(chosen[w]);
    before[words] = total;
  }
  __syncthreads();
  for (int w = threadIdx.x; w < words; w += blockDim.x) {
    int at = before[w];
    for (unsigned bits = chosen[w]; bits != 0; bits &= bits - 1)
      out[at++] = (w * 32 + __ffs(bits) - 1) & a.id_mask;
  }
  for (long long k = before[words] + threadIdx.x; k < a.topk * a.lanes; k += blockDim.x)
    out[k] = -1;
}

/// Writes one (row, head)'s selection to out[0, topk): best[0, k_eff) holds its chosen blocks best
/// first; sc (row 0) their scores. Canonical: ascending ids; fast: best first; the -inf blocks
/// left out under drop_neg_inf (the fast family's are the last chosen; the canonical family's
/// ranks are counted among the kept, k_eff^2 score loads: the fused indexer's k_eff <= kTourney
/// only, topk_kernel takes select_union). Then -1. Every thread takes part.
template <bool kCanonical>
__device__ inline void write_selection(const TopkArgs& a, const ScoreRows& sc, long long k_eff,
                                       const int* best, int* out) {
  if (kCanonical && a.drop_neg_inf) {
    const auto kept = [&](int id) { return sc(0, id) != -INFINITY; };
    int n_kept = 0;
    for (int f = 0; f < k_eff; ++f) n_kept += kept(best[f]);
    for (int e = threadIdx.x; e < k_eff; e += blockDim.x) {
      if (!kept(best[e])) continue;
      int at = 0;
      for (int f = 0; f < k_eff; ++f) at += best[f] < best[e] && kept(best[f]);
      out[at] = best[e];
    }
    for (long long k = n_kept + threadIdx.x; k < a.topk; k += blockDim.x) out[k] = -1;
    return;
  }
  if (!kCanonical && a.drop_neg_inf) {
    long long kept = k_eff;
    while (kept > 0 && sc(0, best[kept - 1]) == -INFINITY) --kept;
    for (long long k = threadIdx.x; k < a.topk; k += blockDim.x)
      out[k] = k < kept ? best[k] & a.id_mask : -1;
    return;
  }
  for (int e = threadIdx.x; e < k_eff; e += blockDim.x) {
    if constexpr (kCanonical) {  // ascending ids
      int at = 0;
      for (int f = 0; f < k_eff; ++f) at += best[f] < best[e];
      out[at] = best[e];
    } else {
      out[e] = best[e] & a.id_mask;  // best first
    }
  }
  for (long long k = k_eff + threadIdx.x; k < a.topk; k += blockDim.x) out[k] = -1;
}

/// Row `row`, head `grp`'s output: a.ids + its offset (TopkArgs::head_major), of `rows` rows.
__device__ inline int* selection_out(const TopkArgs& a, long long row, long long grp,
                                     long long rows) {
  return a.ids + (a.head_major ? grp * rows + row : row * a.heads + grp) * a.topk * a.lanes;
}

/// Every head's selection of one query row by one CUDA block of kThreads threads (the one-launch
/// indexer's last CUDA block of a row, indexer_fused.cuh; kvo_gpu_testing launches it alone): rows
/// h < t.heads of sc, n_valid blocks each (n_valid >= 1, <= kKeyTile), their ids to
/// selection_out(t, row, h, rows). k_eff <= kTourney: from kThresholdFrom blocks the threshold
/// selection (as many heads a pass as threshold_fits), below it the tournament (kIlp chunks a warp
/// at once; its first round is one sort a chunk, as cheap as the threshold's sorts there); larger
/// k_eff: select_best head by head (without its counted ranks: n <= kKeyTile).
inline constexpr long long kThresholdFrom = 256;
template <bool kCanonical, int kThreads, int kIlp>
__device__ inline void select_row_heads(const TopkArgs& t, const ScoreRows& sc, long long row,
                                        long long rows, long long n_valid, unsigned long long* keys,
                                        int* best) {
  const long long k_eff = t.topk < n_valid ? t.topk : n_valid;
  const KeyForm f{t.key_mask, t.tie_xor};
  const int heads = static_cast<int>(t.heads);
  const bool threshold = k_eff <= kTourney && n_valid >= kThresholdFrom;
  int per_pass = 1;
  if (threshold) {
    per_pass = min(heads, kThreads / 32);
    while (per_pass > 1 && !threshold_fits<kThreads>(per_pass, n_valid)) --per_pass;
  } else if (k_eff <= kTourney) {
    per_pass = static_cast<int>(min(
        static_cast<long long>(heads),
        min(kKeyTile / 2 / tourney_region(n_valid), static_cast<long long>(kMaxTopk / kTourney))));
  }
  for (int h0 = 0; h0 < heads; h0 += per_pass) {
    const int hp = h0 + per_pass < heads ? per_pass : heads - h0;
    if (threshold) {
      threshold_best<kThreads>(sc.from(h0), hp, n_valid, k_eff, keys, best, f);
    } else if (k_eff <= kTourney) {
      tournament_best<kIlp>(sc.from(h0), hp, n_valid, k_eff, keys, best, f);
    } else {
      select_best<false>(sc.from(h0), n_valid, k_eff, keys, best, f);
    }
    __syncthreads();
    for (int h = 0; h < hp; ++h)
      write_selection<kCanonical>(t, sc.from(h0 + h), k_eff, best + h * k_eff,
                                  selection_out(t, row, h0 + h, rows));
    __syncthreads();  // keys and best serve the next pass
  }
}

/// Kernel 2 of the indexer: one CUDA block per (head, row); n_valid(row) blocks of scores.
template <bool kCanonical, class NValid>
__global__ void __launch_bounds__(kTopkThreads) topk_kernel(TopkArgs a, NValid n_valid_of) {
  __shared__ unsigned long long keys[kKeyTile];
  __shared__ int best[kMaxTopk];
  const long long grp = blockIdx.x, row = blockIdx.y;
  int* out = selection_out(a, row, grp, gridDim.y);
  const long long n_valid = n_valid_of(row);
  const long long k_eff = a.topk < n_valid ? a.topk : n_valid;
  if (a.lanes > 1 || (kCanonical && a.drop_neg_inf)) {
    select_union(a, row, grp, n_valid, k_eff, keys, best, out);
    return;
  }
  const ScoreRows sc{a.scores + (row * a.heads + grp) * a.stride};
  select_best(sc, n_valid, k_eff, keys, best, {a.key_mask, a.tie_xor});
  __syncthreads();
  write_selection<kCanonical>(a, sc, k_eff, best, out);
}

/// Launches topk_kernel over a grid of (heads, rows) on `s`.
template <class NValid>
void launch_topk(const TopkArgs& a, long long rows, const NValid& nv, bool canonical,
                 cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(rows));
  if (canonical) {
    topk_kernel<true, NValid><<<grid, kTopkThreads, 0, s>>>(a, nv);
  } else {
    topk_kernel<false, NValid><<<grid, kTopkThreads, 0, s>>>(a, nv);
  }
  check_cuda(cudaGetLastError(), "topk_kernel launch");
}

/// The indexer's selection (topk_kernels.cu): launch_topk with BatchNValid.
void launch_batch_topk(const TopkArgs& a, long long rows, const BatchNValid& nv, bool canonical,
                       cudaStream_t s);

}  // namespace kvo::gpu::detail
