#pragma once
/// \file indexer_kernels.cuh
/// The indexer's score kernel, canonical and fast, and the launch template of the whole indexer
/// (scores, then the block top-k of topk.cuh); indexer_kernels.cu instantiates it for production.
///
/// Kernel 1 has one CUDA block per (query row, logical block) and scores the block for every KV
/// group at once (the index-K rows are shared by all index heads): per index head the `>` maximum
/// of its token scores fl(dot * factor), NaN scores by the index_nan rule (skip: ignored, a block
/// of only NaN -1e30; first: +inf; lowest: -1e30), per group the `>` maximum over its heads in
/// ascending order, then the init (1e30) and local (1e29) forcing. Under index_group union a score
/// row is one index head (no group max). Kernel 2 (topk.cuh) has one CUDA block per (row, KV head)
/// and selects the top k of each of its score rows (their union under union).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "indexer_common.cuh"
#include "indexer_fused.cuh"
#include "read_launch.cuh"
#include "topk.cuh"

namespace kvo::gpu::detail {

/// Shared-memory sections of kernel 1 of the indexer: iq [nih][idim] floats, per segment and
/// head the running maximum and the score flags (kSawNan | kSawNumber) [segs][nih] each, the byte
/// offsets of the block's index-K rows and of their scales [2][sb] (long long), staged index-K
/// token rows [tile][row_bytes] and (block-scaled) their group scales [tile][idim / 128] floats.
struct IndexSmem {
  std::size_t iq = 0, best = 0, nan = 0, rows = 0, raw = 0, scales = 0, total = 0;
  __host__ __device__ IndexSmem(int nih, int idim, int segs, int sb, int tile, int row_bytes,
                                int scale_groups) {
    SmemCarver c;
    iq = c.take(static_cast<std::size_t>(nih) * idim * 4);
    best = c.take(static_cast<std::size_t>(segs) * nih * 4);
    nan = c.take(static_cast<std::size_t>(segs) * nih * 4);
    rows = c.take(static_cast<std::size_t>(sb) * 16);
    raw = c.take(static_cast<std::size_t>(tile) * row_bytes);
    scales = c.take(static_cast<std::size_t>(tile) * scale_groups * 4);
    total = c.at;
  }
};

/// Kernel 1 of the indexer (see the top of this file). Index-K rows (and their scales) are staged
/// in shared memory in tiles of a.tile tokens. Flat: [nb, bs, idim] of dtype Dt; block-scaled:
/// per page bs * idim e4m3 bytes token-major, then bs * (idim / 128) fp32 scales.
template <bool kCanonical, int Dt, bool kBlockScale, int L, ReadBug F>
__global__ void __launch_bounds__(kScoreThreads) index_score_kernel(IndexArgs a) {
  extern __shared__ float4 smem4[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
  const long long jb = blockIdx.x, row = blockIdx.y;
  const long long r = a.row_req[row], pos = a.row_pos[row];
  if (a.seq_lens[r] == 0) return;
  const long long n_valid = pos / a.sb + 1;
  if (jb >= n_valid) return;
  const ReadGeom& g = a.g;
  constexpr int eb = kBlockScale ? 1 : Dt == kDtF32 ? 4 : Dt <= kDtF16 ? 2 : 1;
  const int idim = static_cast<int>(g.index_dim), nih = a.nih, row_bytes = idim * eb;
  const int scale_groups = kBlockScale ? idim / 128 : 1;  // 1: unused, never a divisor of 0
  const int groups = idim / 8;  // L = next_pow2(groups), the segment width
  const int lane_in = threadIdx.x % L, seg = threadIdx.x / L, segs = blockDim.x / L;
  const IndexSmem lay(nih, idim, segs, static_cast<int>(a.sb), a.tile, row_bytes,
                      kBlockScale ? scale_groups : 0);
  float* iq_s = reinterpret_cast<float*>(smem + lay.iq);
  float* best_s = reinterpret_cast<float*>(smem + lay.best);
  int* nan_s = reinterpret_cast<int*>(smem + lay.nan);
  long long* voff_s = reinterpret_cast<long long*>(smem + lay.rows);
  long long* soff_s = voff_s + a.sb;
  unsigned char* raw = smem + lay.raw;
  float* sc_s = reinterpret_cast<float*>(smem + lay.scales);
  const long long first = jb * a.sb;
  const int visible = static_cast<int>(pos - first + 1 < a.sb ? pos - first + 1 : a.sb);
  for (int i = threadIdx.x; i < visible; i += blockDim.x) {
    const long long t = first + i, o = t % g.block_size;
    const long long page = a.table[r * g.max_blocks + t / g.block_size] * a.ix_block;
    voff_s[i] = page + o * a.ix_token;
    soff_s[i] = page + g.block_size * idim + o * scale_groups * 4;
  }
  const int ab = dtype_size(a.iq_dtype);
  for (int e = threadIdx.x; e < nih * idim; e += blockDim.x)
    iq_s[e] = load_act(a.iq + (row * nih * idim + e) * ab, a.iq_dtype);
  for (int e = threadIdx.x; e < segs * nih; e += blockDim.x) best_s[e] = -INFINITY, nan_s[e] = 0;
  __syncthreads();
  // Pages of 3 or 17 block-scaled rows start at 4-byte boundaries: the unit (the launch's
  // copy_unit of row, token and block strides and the view's start) divides every row's offset.
  const int unit = a.unit;
  for (int t0 = 0; t0 < visible; t0 += a.tile) {
    const int n = visible - t0 < a.tile ? visible - t0 : a.tile;
    stage_rows(raw, a.cache, voff_s, t0, n, row_bytes, unit);
    if constexpr (kBlockScale)
      stage_rows(reinterpret_cast<unsigned char*>(sc_s), a.cache, soff_s, t0, n, scale_groups * 4,
                 4);
    cp_async_wait_all();
    __syncthreads();
    for (int i0 = 0; i0 < n; i0 += segs) {
      const int i = i0 + seg;
      float k[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (i < n && lane_in < groups) {
        const float sc = kBlockScale ? sc_s[i * scale_groups + (8 * lane_in) / 128] : 1.0f;
        load8_scaled<kBlockScale ? kDtE4m3 : Dt>(raw + i * row_bytes + 8 * lane_in * eb,
                                                 kBlockScale, sc, k);
      }
      for (int h0 = 0; h0 < nih; h0 += 4) {  // four heads at a time (padded with the last)
        float d[4];
        four_head_dots<kCanonical, L>(iq_s, h0, nih, idim, k, lane_in, groups, d);
        if (i < n && lane_in == 0) {
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int at = seg * nih + h0 + u;
            if (h0 + u >= nih) break;
            const float score = __fmul_rn(d[u], a.score_factor);
            if (isnan(score)) {
              nan_s[at] |= kSawNan;
            } else {
              nan_s[at] |= kSawNumber;
              if (score > best_s[at]) best_s[at] = score;
            }
          }
        }
      }
    }
    __syncthreads();  // raw is staged again by the next tile
  }
  // Score row sr: KV head sr over its index heads (index_group max), or index head sr (union).
  const auto best_of = [&](int h) {
    float best = -INFINITY;
    for (int sg = 0; sg < segs; ++sg)
      if (best_s[sg * nih + h] > best) best = best_s[sg * nih + h];
    return best;
  };
  const auto saw_of = [&](int h) {
    int saw = 0;
    for (int sg = 0; sg < segs; ++sg) saw |= nan_s[sg * nih + h];
    return saw;
  };
  for (int sr = threadIdx.x; sr < a.score_rows; sr += blockDim.x)
    a.scores[(row * a.score_rows + sr) * a.max_nv + jb] =
        block_score<F>(a, sr, jb, n_valid, best_of, saw_of);
}

template <bool kCanonical, int Dt, bool kBlockScale, int L, ReadBug F>
void run_indexer(const IndexArgs& a, std::int64_t rows, std::size_t smem, cudaStream_t s) {
  allow_smem(index_score_kernel<kCanonical, Dt, kBlockScale, L, F>, smem);
  index_score_kernel<kCanonical, Dt, kBlockScale, L, F>
      <<<dim3(static_cast<unsigned>(a.max_nv), static_cast<unsigned>(rows)), kScoreThreads, smem,
         s>>>(a);
  check_cuda(cudaGetLastError(), "index_score_kernel launch");
  launch_batch_topk({a.scores, a.ids, a.g.nkv, a.max_nv, a.topk, a.lanes, a.drop_neg_inf,
                     a.head_major, a.key_mask, a.id_mask, a.tie_xor},
                    rows, {a.row_req, a.row_pos, a.seq_lens, a.sb}, kCanonical, s);
}

template <bool kCanonical, int Dt, bool kBlockScale, ReadBug F>
void run_indexer_lanes(const IndexArgs& a, std::int64_t rows, std::size_t smem, cudaStream_t s) {
  switch (next_pow2(a.g.index_dim / 8)) {
    case 1:
      return run_indexer<kCanonical, Dt, kBlockScale, 1, F>(a, rows, smem, s);
    case 2:
      return run_indexer<kCanonical, Dt, kBlockScale, 2, F>(a, rows, smem, s);
    case 4:
      return run_indexer<kCanonical, Dt, kBlockScale, 4, F>(a, rows, smem, s);
    case 8:
      return run_indexer<kCanonical, Dt, kBlockScale, 8, F>(a, rows, smem, s);
    case 16:
      return run_indexer<kCanonical, Dt, kBlockScale, 16, F>(a, rows, smem, s);
    default:
      return run_indexer<kCanonical, Dt, kBlockScale, 32, F>(a, rows, smem, s);
  }
}

/// The fused kernel's dispatch over the lanes a token (IndexArgs::split).
template <bool kCanonical, int Dt, bool kBlockScale, int L, ReadBug F>
void run_fused_split(const IndexArgs& a, std::int64_t rows, std::size_t smem, cudaStream_t s) {
  if (a.split == 1)
    return run_fused_indexer<kCanonical, Dt, kBlockScale, L, 1, F>(a, rows, smem, s);
  run_fused_indexer<kCanonical, Dt, kBlockScale, L, 2, F>(a, rows, smem, s);
}

/// The fused kernel's dispatch over L (index_dim 64 .. 256: 8, 16 or 32 groups' lanes).
template <bool kCanonical, int Dt, bool kBlockScale, ReadBug F>
void run_fused_lanes(const IndexArgs& a, std::int64_t rows, std::size_t smem, cudaStream_t s) {
  switch (next_pow2(a.g.index_dim / 8)) {
    case 8:
      return run_fused_split<kCanonical, Dt, kBlockScale, 8, F>(a, rows, smem, s);
    case 16:
      return run_fused_split<kCanonical, Dt, kBlockScale, 16, F>(a, rows, smem, s);
    default:
      return run_fused_split<kCanonical, Dt, kBlockScale, 32, F>(a, rows, smem, s);
  }
}

template <bool kCanonical, ReadBug F>
void dispatch_fused_indexer(const IndexArgs& a, std::int64_t rows, std::size_t smem,
                            cudaStream_t s) {
  if (a.g.index_layout == static_cast<int>(spec::IndexLayout::kBlockScale))
    return run_fused_lanes<kCanonical, kDtE4m3, true, F>(a, rows, smem, s);
  switch (a.g.index_dtype) {
    case kDtF32:
      return run_fused_lanes<kCanonical, kDtF32, false, F>(a, rows, smem, s);
    case kDtBf16:
      return run_fused_lanes<kCanonical, kDtBf16, false, F>(a, rows, smem, s);
    case kDtF16:
      return run_fused_lanes<kCanonical, kDtF16, false, F>(a, rows, smem, s);
    case kDtE4m3:
      return run_fused_lanes<kCanonical, kDtE4m3, false, F>(a, rows, smem, s);
    default:
      return run_fused_lanes<kCanonical, kDtE5m2, false, F>(a, rows, smem, s);
  }
}

template <bool kCanonical, ReadBug F>
void dispatch_indexer(const IndexArgs& a, std::int64_t rows, std::size_t smem, cudaStream_t s) {
  if (a.g.index_layout == static_cast<int>(spec::IndexLayout::kBlockScale))
    return run_indexer_lanes<kCanonical, kDtE4m3, true, F>(a, rows, smem, s);
  switch (a.g.index_dtype) {
    case kDtF32:
      return run_indexer_lanes<kCanonical, kDtF32, false, F>(a, rows, smem, s);
    case kDtBf16:
      return run_indexer_lanes<kCanonical, kDtBf16, false, F>(a, rows, smem, s);
    case kDtF16:
      return run_indexer_lanes<kCanonical, kDtF16, false, F>(a, rows, smem, s);
    case kDtE4m3:
      return run_indexer_lanes<kCanonical, kDtE4m3, false, F>(a, rows, smem, s);
    default:
      return run_indexer_lanes<kCanonical, kDtE5m2, false, F>(a, rows, smem, s);
  }
}

// Instantiated once, in indexer_kernels.cu (kvo_gpu); kvo_gpu_testing's selection bugs reuse them.
extern template void dispatch_indexer<true, ReadBug::kNone>(const IndexArgs&, std::int64_t,
                                                            std::size_t, cudaStream_t);
extern template void dispatch_indexer<false, ReadBug::kNone>(const IndexArgs&, std::int64_t,
                                                             std::size_t, cudaStream_t);
extern template void dispatch_fused_indexer<true, ReadBug::kNone>(const IndexArgs&, std::int64_t,
                                                                  std::size_t, cudaStream_t);
extern template void dispatch_fused_indexer<false, ReadBug::kNone>(const IndexArgs&, std::int64_t,
                                                                   std::size_t, cudaStream_t);

/// launch_indexer_topk (kvo/gpu/read.hpp) with bug F planted. F = kIgnoreLocal: the score kernel
/// leaves the local blocks unforced; kIdsWrapAt1024: the fast selection keeps 10 bits of each id;
/// these run in the fast family only (spec::Unsupported for kCanonical). kTiesToHigherId lives in
/// the selection of either family (TopkArgs::tie_xor), the score kernels as in production.
template <ReadBug F>
void launch_indexer_topk_t(const spec::ModelConfig& c, const spec::IndexerParams& p,
                           const DeviceReadBatch& b, const DeviceIndexer& ix, ReadKernel kernel,
                           void* stream) {
  // The score kernels' bug: none where the bug lives in the selection alone.
  constexpr ReadBug kScoreBug = F == ReadBug::kTiesToHigherId ? ReadBug::kNone : F;
  require(kScoreBug == ReadBug::kNone || kernel == ReadKernel::kFast,
          "indexer: planted score and id bugs live in the fast family only");
  const std::int64_t idim = c.geometry.index_dim;
  require(idim % 8 == 0 && idim <= kMaxHeadDim,
          "indexer: index_dim must be a multiple of 8 and <= " + std::to_string(kMaxHeadDim));
  require(p.topk <= kMaxTopk, "indexer: topk above " + std::to_string(kMaxTopk));
  require(ix.form.key_bits >= spec::TopkForm::kMinKeyBits && ix.form.key_bits <= 32,
          "indexer: key_bits outside 9..32");
  require(ix.form.key_bits == 32 || kernel == ReadKernel::kFast,
          "indexer: the canonical family ranks by exact scores (key_bits 32)");
  require(ix.max_n_valid <= kMaxNValid,
          "indexer: more than " + std::to_string(kMaxNValid) + " logical blocks");
  const int segs = kScoreThreads / next_pow2(idim / 8);
  const bool block_scale = c.index.layout == spec::IndexLayout::kBlockScale;
  const int row_bytes =
      static_cast<int>(idim) * (block_scale ? 1 : dtype_size(static_cast<int>(c.index.flat_dtype)));
  const int scale_groups = block_scale ? static_cast<int>(idim / 128) : 0;
  const int tile = static_cast<int>(
      std::min<std::int64_t>(p.sparse_block, kStageBytes / (row_bytes + 4 * scale_groups)));
  const std::size_t smem =
      IndexSmem(static_cast<int>(p.num_index_heads), static_cast<int>(idim), segs,
                static_cast<int>(p.sparse_block), tile, row_bytes, scale_groups)
          .total;
  require(smem <= kMaxSmem, "indexer: too many index heads");
  require(b.num_rows <= 65535, "indexer: more than 65535 query rows");
  if (b.num_rows == 0) return;
  IndexArgs a{};
  static_cast<BatchView&>(a) = batch_view(c, b);
  a.cache = static_cast<const unsigned char*>(ix.index_cache);
  // SPEC 3: the index-K view's strides, in bytes.
  const spec::IndexStrides view = spec::index_view(c);
  a.ix_block = view.block * spec::index_stride_bytes(c);
  a.ix_token = view.token * spec::index_stride_bytes(c);
  const auto start = static_cast<long long>(reinterpret_cast<std::uintptr_t>(ix.index_cache));
  require(start % 4 == 0 && a.ix_block % 4 == 0 && a.ix_token % 4 == 0,
          "indexer: the index-K view's start and strides must be multiples of 4 bytes");
  a.unit = std::min(
      {copy_unit(row_bytes), copy_unit(a.ix_block), copy_unit(a.ix_token), copy_unit(start)});
  a.iq = static_cast<const unsigned char*>(ix.index_q);
  a.scores = ix.scores;
  a.ids = ix.ids;
  a.nih = static_cast<int>(p.num_index_heads);
  a.tile = tile;
  a.sb = p.sparse_block;
  a.topk = p.topk;
  a.init_blocks = p.init_blocks;
  a.local_blocks = p.local_blocks;
  a.max_nv = ix.max_n_valid;
  a.score_factor = spec::index_score_factor(p.score_scale, idim);
  a.index_nan = static_cast<int>(p.index_nan);
  a.iq_dtype = static_cast<int>(spec::index_q_dtype(c, p));
  a.lanes = spec::selection_lanes(p, c.geometry.num_kv_heads);
  a.score_rows = static_cast<int>(c.geometry.num_kv_heads * a.lanes);
  a.drop_neg_inf = p.neg_inf == spec::IndexNegInf::kDrop;
  a.head_major = ix.form.layout == spec::TopkLayout::kHeadMajor;
  a.key_mask = ~0u << (32 - ix.form.key_bits);
  a.id_mask = F == ReadBug::kIdsWrapAt1024 ? 1023 : ~0;
  a.tie_xor = F == ReadBug::kTiesToHigherId ? 0u : ~0u;
  const auto s = static_cast<cudaStream_t>(stream);
  FusedPlan plan;
  if (ix.row_done != nullptr) {
    int dev = 0, sms = 1;  // the current device's multiprocessors (the runtime caches them)
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
               "cudaDeviceGetAttribute");
    plan = fused_indexer_plan(c, p, kernel, b.num_rows, a.max_nv, start, sms, ix.fused);
  }
  if (plan.span > 0) {  // one launch: scores and selection
    a.row_done = ix.row_done;
    a.span = plan.span;
    a.split = plan.split;
    if constexpr (kScoreBug == ReadBug::kNone) {
      if (kernel == ReadKernel::kCanonical) {
        return dispatch_fused_indexer<true, kScoreBug>(a, b.num_rows, plan.smem, s);
      }
    }
    return dispatch_fused_indexer<false, kScoreBug>(a, b.num_rows, plan.smem, s);
  }
  if constexpr (kScoreBug == ReadBug::kNone) {  // score bugs: the fast family only is instantiated
    if (kernel == ReadKernel::kCanonical) {
      return dispatch_indexer<true, kScoreBug>(a, b.num_rows, smem, s);
    }
  }
  dispatch_indexer<false, kScoreBug>(a, b.num_rows, smem, s);
}

}  // namespace kvo::gpu::detail
