#pragma once
/// \file attention_kernels.cuh
/// The attention kernels, canonical, fast and flash (kvo/gpu/read.hpp says what each family
/// promises), and their launch templates; attention_kernels.cu instantiates them for production.
///
/// Kernel 1 has one CUDA block per (query row, KV head, chunk slot) and computes, for each query
/// head of the KV head's group, the chunk's (m, l, o[hd]) of SPEC 6.3 into a workspace; kernel 2
/// has one CUDA block per (query row, query head) and combines the chunks in ascending chunk
/// order. SPEC 6.3 computes every chunk independently before the sequential combine, so splitting
/// there changes no bit. Canonical order inside kernel 1:
///   scores  s_i = fl(dot(q, k_i) * sm): one warp segment per token (segment_dots), tokens spread
///           over segments; every query head of the group reuses the token's decoded K;
///   m       `>` maximum over the visible tokens (NaN never wins; m is only used through s - m and
///           M - M', where the sign of a zero maximum cannot change a bit);
///   p, l    p_i = exp(s_i - m) for visible i, +0 for masked positions, l = tree_sum over the
///           next power of two >= sparse_block positions (levels above 32 in shared memory, the
///           last five as shuffle-downs), one warp per query head;
///   o[d]    fma chain over the visible tokens ascending, one thread per (dim pair, head).
/// The fast family instead folds log2(e) into the scale and uses the hardware exp2, butterfly
/// reductions, lane-strided sums for l, two interleaved accumulators for o, and a reciprocal-free
/// fast division at the end.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "read_launch.cuh"

namespace kvo::gpu::detail {

struct AttnArgs : BatchView {
  const unsigned char* k_cache;
  const unsigned char* v_cache;
  const unsigned char* q;
  const float* k_scale;
  const float* v_scale;
  const int* selection;  // null: dense
  float* ws;             // [Tq, nq, slots, hd + 2]: m, l, o (not used by the flash family)
  unsigned char* out;    // [Tq, nq, hd]
  int nq, group, sbp, out_dtype;
  int tile;       // tokens per staged tile
  int per_block;  // DeviceAttention::slots_per_block (decode kernels; 0: the launch's choice)
  long long topk, slots, sb;
  float sm;  // canonical: sm_scale; fast and flash: sm_scale * log2(e) (kExpNoLog2e: sm_scale)
};

/// Entry `slot` of the selection row of (row, kvh) as given (SPEC 6: any order, -1 anywhere).
__device__ inline long long selected_id(const AttnArgs& a, long long row, long long kvh,
                                        long long slot) {
  return a.selection[(row * a.g.nkv + kvh) * a.topk + slot];
}

/// The logical block of chunk slot `slot` of row `row` for KV head `kvh`, or negative when the slot
/// selects nothing (a negative entry or one past n_valid, SPEC 6; a dense slot past n_valid).
__device__ inline long long chunk_of(const AttnArgs& a, long long row, long long kvh,
                                     long long slot, long long n_valid) {
  if (a.selection == nullptr) return slot < n_valid ? slot : -1;
  const long long id = selected_id(a, row, kvh, slot);
  return id < n_valid ? id : -1;
}

__device__ inline float* ws_entry(const AttnArgs& a, long long row, long long hq, long long slot) {
  return a.ws + ((row * a.nq + hq) * a.slots + slot) * (a.g.head_dim + 2);
}

/// Shared-memory sections (byte offsets, each 16-byte aligned) of kernel 1 of attention: q
/// [group][hd] floats, p [group][sbp] floats, tree scratch [8 warps][sbp / 2] floats, the byte
/// offsets of the chunk's K and V token rows [2][sb] (long long), and the staged token rows
/// [tile][row_bytes] (K for the scores, then V in the same place).
struct AttnSmem {
  std::size_t q = 0, p = 0, scratch = 0, rows = 0, raw = 0, total = 0;
  __host__ __device__ AttnSmem(int group, int hd, int sbp, int sb, int tile, int row_bytes) {
    SmemCarver c;
    q = c.take(static_cast<std::size_t>(group) * hd * 4);
    p = c.take(static_cast<std::size_t>(group) * sbp * 4);
    scratch = c.take(static_cast<std::size_t>(kReadThreads / 32) * (sbp / 2) * 4);
    rows = c.take(static_cast<std::size_t>(sb) * 16);
    raw = c.take(static_cast<std::size_t>(tile) * row_bytes);
    total = c.at;
  }
};

/// o[u][2 dp, 2 dp + 1] += p_u[t0 + i] * v_i over the staged rows i < n, for NH heads: canonical
/// fma chains in ascending token order; the fast family splits even and odd tokens (e).
template <bool kCanonical, int KvDt, int NH, bool kScaled>
__device__ inline void accumulate_v(const unsigned char* vraw, int row_bytes, int dp, int n, int t0,
                                    const float* const (&pr)[4], float vs, float (&o0)[4],
                                    float (&o1)[4], float (&e0)[4], float (&e1)[4]) {
  constexpr int eb = KvDt == kDtF32 ? 4 : KvDt <= kDtF16 ? 2 : 1;
  const unsigned char* v_at = vraw + 2 * dp * eb;
#pragma unroll 4
  for (int i = 0; i < n; ++i) {
    float2 v = load2<KvDt>(v_at + i * row_bytes);
    if constexpr (kScaled) v = make_float2(__fmul_rn(v.x, vs), __fmul_rn(v.y, vs));
#pragma unroll
    for (int u = 0; u < NH; ++u) {
      const float p = pr[u][t0 + i];
      if constexpr (kCanonical) {
        o0[u] = __fmaf_rn(p, v.x, o0[u]);
        o1[u] = __fmaf_rn(p, v.y, o1[u]);
      } else if ((t0 + i) % 2 == 0) {
        o0[u] = fmaf(p, v.x, o0[u]);
        o1[u] = fmaf(p, v.y, o1[u]);
      } else {
        e0[u] = fmaf(p, v.x, e0[u]);
        e1[u] = fmaf(p, v.y, e1[u]);
      }
    }
  }
}

/// accumulate_v with its head count (1..4) and scaling as compile-time arguments, so that the
/// chains test nothing per token.
template <bool kCanonical, int KvDt, int NH = 1>
__device__ inline void accumulate_v_for(int nh, bool scaled, const unsigned char* vraw,
                                        int row_bytes, int dp, int n, int t0,
                                        const float* const (&pr)[4], float vs, float (&o0)[4],
                                        float (&o1)[4], float (&e0)[4], float (&e1)[4]) {
  if constexpr (NH <= 4) {
    if (nh != NH) {
      accumulate_v_for<kCanonical, KvDt, NH + 1>(nh, scaled, vraw, row_bytes, dp, n, t0, pr, vs, o0,
                                                 o1, e0, e1);
    } else if (scaled) {
      accumulate_v<kCanonical, KvDt, NH, true>(vraw, row_bytes, dp, n, t0, pr, vs, o0, o1, e0, e1);
    } else {
      accumulate_v<kCanonical, KvDt, NH, false>(vraw, row_bytes, dp, n, t0, pr, vs, o0, o1, e0, e1);
    }
  }
}

/// Kernel 1 of attention (see the top of this file). The chunk's K and V rows are staged in
/// shared memory in tiles of a.tile tokens; when the chunk fits in one tile, V is fetched into
/// K's place as soon as the scores are done, while m, p and l are computed.
template <bool kCanonical, int KvDt, int L>
__global__ void __launch_bounds__(kReadThreads) attention_chunk_kernel(AttnArgs a) {
  extern __shared__ float4 smem4[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
  const long long slot = blockIdx.x, kvh = blockIdx.y, row = blockIdx.z;
  const ReadGeom& g = a.g;
  const long long r = a.row_req[row], pos = a.row_pos[row];
  if (a.seq_lens[r] == 0) return;
  const long long n_valid = pos / a.sb + 1;
  const long long j = chunk_of(a, row, kvh, slot, n_valid);
  if (j < 0) return;
  constexpr int eb = KvDt == kDtF32 ? 4 : KvDt <= kDtF16 ? 2 : 1;
  const int hd = static_cast<int>(g.head_dim), group = a.group, row_bytes = hd * eb;
  const AttnSmem lay(group, hd, a.sbp, static_cast<int>(a.sb), a.tile, row_bytes);
  float* q_s = reinterpret_cast<float*>(smem + lay.q);
  float* p_s = reinterpret_cast<float*>(smem + lay.p);
  float* scratch = reinterpret_cast<float*>(smem + lay.scratch);
  long long* koff_s = reinterpret_cast<long long*>(smem + lay.rows);
  long long* voff_s = koff_s + a.sb;
  unsigned char* kraw = smem + lay.raw;  // K rows, then (after the scores) V rows
  unsigned char* vraw = kraw;
  const long long first = j * a.sb;
  const int valid = static_cast<int>(pos - first + 1 < a.sb ? pos - first + 1 : a.sb);
  const int* table_row = a.table + r * g.max_blocks;
  for (int i = threadIdx.x; i < valid; i += blockDim.x) {
    const long long t = first + i, b = table_row[t / g.block_size], o = t % g.block_size;
    koff_s[i] = kv_offset(g, 0, b, o, kvh, 0) * eb;
    voff_s[i] = kv_offset(g, 1, b, o, kvh, 0) * eb;
  }
  const int unit = copy_unit(row_bytes);
  const int ab = dtype_size(g.act_dtype);
  for (int e = threadIdx.x; e < group * hd; e += blockDim.x) {
    const long long hq = kvh * group + e / hd;
    q_s[e] = load_act(a.q + ((row * a.nq + hq) * hd + e % hd) * ab, g.act_dtype);
  }
  __syncthreads();
  const int groups = hd / 8;  // L = next_pow2(groups), the segment width
  const int lane_in = threadIdx.x % L, seg = threadIdx.x / L, segs = blockDim.x / L;
  const float ks = g.scale_none ? 1.0f : a.k_scale[g.per_head_scale ? kvh : 0];
  const float vs = g.scale_none ? 1.0f : a.v_scale[g.per_head_scale ? kvh : 0];
  const bool single = valid <= a.tile;
  // Scores: p_s[h][i] = s_i for the group's heads.
  for (int t0 = 0; t0 < valid; t0 += a.tile) {
    const int n = valid - t0 < a.tile ? valid - t0 : a.tile;
    stage_rows(kraw, a.k_cache, koff_s, t0, n, row_bytes, unit);
    cp_async_wait_all();
    __syncthreads();
    for (int i0 = 0; i0 < n; i0 += segs) {
      const int i = i0 + seg;
      float k[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (i < n && lane_in < groups)
        load8_scaled<KvDt>(kraw + i * row_bytes + 8 * lane_in * eb, !g.scale_none, ks, k);
      for (int h0 = 0; h0 < group; h0 += 4) {  // four heads at a time (padded with the last)
        float d[4];
        four_head_dots<kCanonical, L>(q_s, h0, group, hd, k, lane_in, groups, d);
        if (i < n && lane_in == 0) {
#pragma unroll
          for (int u = 0; u < 4; ++u)
            if (h0 + u < group)
              p_s[(h0 + u) * a.sbp + t0 + i] = kCanonical ? __fmul_rn(d[u], a.sm) : d[u] * a.sm;
        }
      }
    }
    __syncthreads();  // kraw is staged again by the next tile
  }
  // One tile: V replaces K now and arrives while m, p and l are computed.
  if (single) stage_rows(vraw, a.v_cache, voff_s, 0, valid, row_bytes, unit);
  // m, p and l: one warp per head.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __shared__ float m_s[64], l_s[64];
  for (int h = warp; h < group; h += warps) {
    float* p = p_s + h * a.sbp;
    float m = -INFINITY;
    for (int i = lane; i < valid; i += 32)
      if (p[i] > m) m = p[i];
    m = warp_max(m);
    float l;
    if constexpr (kCanonical) {
      for (int i = lane; i < a.sbp; i += 32)
        p[i] = i < valid ? canonical_exp(__fsub_rn(p[i], m)) : 0.0f;
      __syncwarp();
      int size = a.sbp;
      const float* src = p;
      float* tmp = scratch + warp * (a.sbp / 2);
      while (size > 32) {
        const int half = size / 2;
        for (int i = lane; i < half; i += 32) tmp[i] = __fadd_rn(src[i], src[i + half]);
        __syncwarp();
        src = tmp;
        size = half;
      }
      float v = lane < size ? src[lane] : 0.0f;
      for (int off = size / 2; off > 0; off /= 2)
        v = __fadd_rn(v, __shfl_down_sync(0xFFFFFFFFu, v, off));
      l = __shfl_sync(0xFFFFFFFFu, v, 0);
    } else {
      float part = 0.0f;
      for (int i = lane; i < valid; i += 32) {
        p[i] = fast_exp2(p[i] - m);
        part += p[i];
      }
      for (int off = 1; off < 32; off *= 2) part += __shfl_xor_sync(0xFFFFFFFFu, part, off);
      l = part;
    }
    if (lane == 0) m_s[h] = m, l_s[h] = l;
  }
  __syncthreads();
  // o[h][d, d + 1]: thread (dim pair dp, head set hs) for heads hb * 4 * sets + u * sets + hs, up
  // to four per batch. Every thread runs the same batches and tiles, so that all take part in
  // staging V.
  const int pairs = hd / 2, sets = blockDim.x / pairs, dp = threadIdx.x % pairs;
  const int hs = threadIdx.x / pairs;
  const int batches = (group + 4 * sets - 1) / (4 * sets);
  if (single) {
    cp_async_wait_all();
    __syncthreads();
  }
  for (int hb = 0; hb < batches; ++hb) {
    const float* pr[4];
    int nh = 0;
    for (int u = 0; u < 4; ++u) {
      const int h = hb * 4 * sets + u * sets + hs;
      pr[u] = p_s + (h < group ? h : 0) * a.sbp;
      if (hs < sets && h < group) nh = u + 1;
    }
    float o0[4] = {0, 0, 0, 0}, o1[4] = {0, 0, 0, 0};  // dims 2 dp, 2 dp + 1
    float e0[4] = {0, 0, 0, 0}, e1[4] = {0, 0, 0, 0};  // fast family: the odd tokens
    for (int t0 = 0; t0 < valid; t0 += a.tile) {
      const int n = valid - t0 < a.tile ? valid - t0 : a.tile;
      if (!single) {
        stage_rows(vraw, a.v_cache, voff_s, t0, n, row_bytes, unit);
        cp_async_wait_all();
        __syncthreads();
      }
      accumulate_v_for<kCanonical, KvDt>(nh, !g.scale_none, vraw, row_bytes, dp, n, t0, pr, vs, o0,
                                         o1, e0, e1);
      if (!single) __syncthreads();  // vraw is staged again by the next tile
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (u >= nh) break;
      const int h = hb * 4 * sets + u * sets + hs;
      float* w = ws_entry(a, row, kvh * group + h, slot);
      if (dp == 0) w[0] = m_s[h], w[1] = l_s[h];
      w[2 + 2 * dp] = kCanonical ? o0[u] : o0[u] + e0[u];
      w[3 + 2 * dp] = kCanonical ? o1[u] : o1[u] + e1[u];
    }
  }
}

/// Element i of the output [Tq, nq, hd] := y rounded to the output dtype (NaN: 0x7FFF in 16 bits).
__device__ inline void store_out(const AttnArgs& a, long long i, float y) {
  unsigned char* dst = a.out + i * dtype_size(a.out_dtype);
  unsigned code;
  if (a.out_dtype == kDtF32) {
    code = __float_as_uint(y);
  } else if (a.out_dtype == kDtBf16) {
    code = isnan(y) ? 0x7FFFu : __bfloat16_as_ushort(__float2bfloat16_rn(y));
  } else {
    code = isnan(y) ? 0x7FFFu : __half_as_ushort(__float2half_rn(y));
  }
  for (int b = 0; b < dtype_size(a.out_dtype); ++b)
    dst[b] = static_cast<unsigned char>(code >> (8 * b));
}

/// Kernel 2 of attention: one CUDA block per (row, query head), thread d per output dim. The
/// chunk order is found in parallel (a sparse slot's position is the number of selected blocks
/// below its own); the exps of the recurrence are computed once per chunk for the block (every
/// output dim shares them), and each thread loads eight chunks' partial results before combining
/// them, so that the loads overlap instead of waiting on the combine chain.
template <bool kCanonical>
__global__ void attention_combine_kernel(AttnArgs a) {
  __shared__ int ids[kMaxSelectionWidth];
  __shared__ int order[kMaxSelectionWidth];
  __shared__ int n_sel;
  const long long row = blockIdx.x, hq = blockIdx.y;
  const long long r = a.row_req[row], pos = a.row_pos[row];
  const long long kvh = hq / a.group;
  const long long n_valid = a.seq_lens[r] == 0 ? 0 : pos / a.sb + 1;
  int n_chunks = 0;
  if (a.selection == nullptr) {
    n_chunks = static_cast<int>(n_valid < a.slots ? n_valid : a.slots);  // slot j is block j
  } else {
    if (threadIdx.x == 0) n_sel = 0;
    for (int s = threadIdx.x; s < a.slots; s += blockDim.x)
      ids[s] = n_valid > 0 ? static_cast<int>(chunk_of(a, row, kvh, s, n_valid)) : -1;
    __syncthreads();
    for (int s = threadIdx.x; s < a.slots; s += blockDim.x) {
      if (ids[s] < 0) continue;
      int at = 0;
      for (int o = 0; o < a.slots; ++o) at += ids[o] >= 0 && ids[o] < ids[s];
      order[at] = s;
      atomicAdd(&n_sel, 1);
    }
    __syncthreads();
    n_chunks = n_sel;
  }
  // Per batch of up to kCombineBatch chunks: the chunks' maxima m_c loaded by every thread, the
  // running maxima M (SPEC 6.3: M' = max(M, m_c), a `>` compare) by thread 0 in chunk order, then
  // each chunk's exp(M - M') and exp(m_c - M') once for the block (the output dims share them),
  // then thread d's L and O chains. The same operations on the same operands as the recurrence.
  // (Batches of 512: ids and order above and these four stay within 48 KiB.)
  constexpr int kCombineBatch = 512;
  __shared__ float m_s[kCombineBatch], big_m_s[kCombineBatch], x_s[kCombineBatch],
      y_s[kCombineBatch];
  // Launched as a programmatic dependent of kernel 1 (launch_attention_combine): what comes
  // before ran beside kernel 1's last blocks; the workspace is read only after it completed.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int d = threadIdx.x;
  const bool active = d < a.g.head_dim;
  const auto chunk_at = [&](int c) { return a.selection == nullptr ? c : order[c]; };
  // Slot s's entry of (row, hq) is at ws_row + s * entry (ws_entry's layout, the product once).
  const float* ws_row = ws_entry(a, row, hq, 0);
  const int entry = a.g.head_dim + 2;
  float big_m = 0.0f, big_l = 0.0f, big_o = 0.0f;
  for (int c0 = 0; c0 < n_chunks; c0 += kCombineBatch) {
    const int n = n_chunks - c0 < kCombineBatch ? n_chunks - c0 : kCombineBatch;
    for (int u = threadIdx.x; u < n; u += blockDim.x)
      m_s[u] = ws_row[static_cast<long long>(chunk_at(c0 + u)) * entry];
    __syncthreads();
    if (threadIdx.x == 0) {
      float run = big_m;
      for (int u = 0; u < n; ++u) {
        const float m = m_s[u];
        run = c0 + u == 0 ? m : m > run ? m : run;
        big_m_s[u] = run;
      }
    }
    __syncthreads();
    for (int u = threadIdx.x; u < n; u += blockDim.x) {
      if (c0 + u == 0) continue;  // the first chunk starts the recurrence: no exp
      const float prev = u == 0 ? big_m : big_m_s[u - 1], now = big_m_s[u];
      if constexpr (kCanonical) {
        x_s[u] = canonical_exp(__fsub_rn(prev, now));
        y_s[u] = canonical_exp(__fsub_rn(m_s[u], now));
      } else {
        x_s[u] = fast_exp2(prev - now), y_s[u] = fast_exp2(m_s[u] - now);
      }
    }
    __syncthreads();
    if (active) {
      constexpr int kBatch = 8;  // eight chunks' loads issued before their combine steps
      for (int u0 = 0; u0 < n; u0 += kBatch) {
        float l[kBatch], o[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
          if (u0 + k >= n) break;
          const float* w = ws_row + static_cast<long long>(chunk_at(c0 + u0 + k)) * entry;
          l[k] = w[1], o[k] = w[2 + d];
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
          const int u = u0 + k;
          if (u >= n) break;
          if (c0 + u == 0) {
            big_l = l[k], big_o = o[k];
          } else if constexpr (kCanonical) {
            big_l = __fmaf_rn(big_l, x_s[u], __fmul_rn(l[k], y_s[u]));
            big_o = __fmaf_rn(big_o, x_s[u], __fmul_rn(o[k], y_s[u]));
          } else {
            big_l = big_l * x_s[u] + l[k] * y_s[u];
            big_o = big_o * x_s[u] + o[k] * y_s[u];
          }
        }
      }
    }
    big_m = big_m_s[n - 1];
    __syncthreads();  // m_s, big_m_s, x_s, y_s are refilled by the next batch
  }
  if (!active) return;
  float y = 0.0f;
  if (n_chunks > 0) y = kCanonical ? __fdiv_rn(big_o, big_l) : __fdividef(big_o, big_l);
  store_out(a, (row * a.nq + hq) * a.g.head_dim + d, y);
}

/// Kernel 2 over the chunk results kernel 1 (generic or specialised) left in a.ws, launched as a
/// programmatic dependent (programmatic stream serialization; a programmatic edge when captured
/// into a graph): its launch and its selection's order overlap kernel 1's last blocks, and its
/// griddepcontrol.wait holds every read of the workspace until kernel 1 has completed and its
/// writes are visible.
template <bool kCanonical>
void launch_attention_combine(const AttnArgs& a, std::int64_t rows, cudaStream_t s) {
  launch_programmatic(attention_combine_kernel<kCanonical>,
                      dim3(static_cast<unsigned>(rows), static_cast<unsigned>(a.nq)),
                      dim3(static_cast<unsigned>((a.g.head_dim + 31) / 32 * 32)), s,
                      "attention_combine_kernel launch", a);
}

template <bool kCanonical, int KvDt, int L>
void run_attention(const AttnArgs& a, std::int64_t rows, std::size_t smem, cudaStream_t s) {
  allow_smem(attention_chunk_kernel<kCanonical, KvDt, L>, smem);
  attention_chunk_kernel<kCanonical, KvDt, L>
      <<<dim3(static_cast<unsigned>(a.slots), static_cast<unsigned>(a.g.nkv),
              static_cast<unsigned>(rows)),
         kReadThreads, smem, s>>>(a);
  check_cuda(cudaGetLastError(), "attention_chunk_kernel launch");
  launch_attention_combine<kCanonical>(a, rows, s);
}

/// Whether attention's chunks of this call can run through the specialised kernel
/// (attention_decode.cuh): head_dim 64 or 128, 1, 2, 4, 8 or 16 query heads per KV head,
/// sparse_block <= 128, a 16- or 8-bit cache whose rows start 16-byte aligned. Host-only.
bool attention_decode_applies(const spec::ModelConfig& c, const spec::AttentionParams& p);
/// Whether every K and V row of the layer's caches starts 16 bytes past a 16-byte-aligned view
/// start (the strides and the view offset; the pointers are checked at the launch). Host-only.
bool kv_rows_aligned16(const spec::ModelConfig& c);
/// Whether a pointer is 16-byte aligned.
inline bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }
/// Both kernels of attention with the specialised chunk kernel (attention_decode.cu).
void run_attention_decode(const AttnArgs& a, std::int64_t rows, bool canonical,
                          cudaStream_t stream);

/// The segment width L (lanes per dot) as a template argument: head_dim / 8 groups, rounded up.
template <bool kCanonical, int KvDt>
void run_attention_lanes(const AttnArgs& a, std::int64_t rows, std::size_t smem, cudaStream_t s) {
  switch (next_pow2(a.g.head_dim / 8)) {
    case 1:
      return run_attention<kCanonical, KvDt, 1>(a, rows, smem, s);
    case 2:
      return run_attention<kCanonical, KvDt, 2>(a, rows, smem, s);
    case 4:
      return run_attention<kCanonical, KvDt, 4>(a, rows, smem, s);
    case 8:
      return run_attention<kCanonical, KvDt, 8>(a, rows, smem, s);
    case 16:
      return run_attention<kCanonical, KvDt, 16>(a, rows, smem, s);
    default:
      return run_attention<kCanonical, KvDt, 32>(a, rows, smem, s);
  }
}

template <bool kCanonical>
void dispatch_attention(const AttnArgs& a, std::int64_t rows, std::size_t smem, cudaStream_t s) {
  switch (a.g.kv_dtype) {
    case kDtF32:
      return run_attention_lanes<kCanonical, kDtF32>(a, rows, smem, s);
    case kDtBf16:
      return run_attention_lanes<kCanonical, kDtBf16>(a, rows, smem, s);
    case kDtF16:
      return run_attention_lanes<kCanonical, kDtF16>(a, rows, smem, s);
    case kDtE4m3:
      return run_attention_lanes<kCanonical, kDtE4m3>(a, rows, smem, s);
    default:
      return run_attention_lanes<kCanonical, kDtE5m2>(a, rows, smem, s);
  }
}

/// The arguments both attention families take from the call: the batch, the device buffers, the
/// head counts and the output (the family's own fields follow at its launch).
inline AttnArgs attention_args(const spec::ModelConfig& c, const spec::AttentionParams& p,
                               const DeviceReadBatch& b, const DeviceAttention& d) {
  AttnArgs a{};
  static_cast<BatchView&>(a) = batch_view(c, b);
  a.k_cache = static_cast<const unsigned char*>(d.k_cache);
  a.v_cache = static_cast<const unsigned char*>(d.v_cache);
  a.q = static_cast<const unsigned char*>(d.q);
  a.k_scale = d.k_scale;
  a.v_scale = d.v_scale;
  a.selection = d.selection;
  a.out = static_cast<unsigned char*>(d.out);
  a.nq = static_cast<int>(p.num_q_heads);
  a.group = static_cast<int>(p.num_q_heads / c.geometry.num_kv_heads);
  a.out_dtype = static_cast<int>(p.out_dtype);
  a.topk = d.topk;
  a.slots = d.slots;
  a.sb = p.sparse_block;
  a.per_block = d.slots_per_block;
  return a;
}

/// The softmax scale: the given one, or the default fl(1 / fl(sqrt(hd))), on the host in IEEE
/// arithmetic.
inline float default_or_given_sm(const spec::AttentionParams& p, std::int64_t hd) {
  return p.sm_scale > 0.0f ? p.sm_scale : 1.0f / std::sqrt(static_cast<float>(hd));
}

/// launch_attention (kvo/gpu/read.hpp; launch_attention_generic with kPath kGeneric) with bug F
/// planted. F = kExpNoLog2e: the fast family's
/// scale is sm_scale where sm_scale * log2(e) is meant (the kernels' exp2 then computes a base-2
/// softmax); a planted bug runs in the fast family only (spec::Unsupported for kCanonical).
template <ReadBug F, AttentionPath kPath = AttentionPath::kAuto>
void launch_attention_t(const spec::ModelConfig& c, const spec::AttentionParams& p,
                        const DeviceReadBatch& b, const DeviceAttention& d, ReadKernel kernel,
                        void* stream) {
  require(F == ReadBug::kNone || kernel == ReadKernel::kFast,
          "attention: planted bugs live in the fast family only");
  const std::int64_t hd = c.geometry.head_dim, nkv = c.geometry.num_kv_heads;
  const std::int64_t group = p.num_q_heads / nkv;
  require(hd % 8 == 0 && hd <= kMaxHeadDim,
          "attention: head_dim must be a multiple of 8 and <= " + std::to_string(kMaxHeadDim));
  require(group <= 64, "attention: more than 64 query heads per KV head");
  require(d.slots >= 1 && d.slots < (1ll << 31), "attention: chunk slots out of range");
  require(b.num_rows <= 65535 && p.num_q_heads <= 65535 && nkv <= 65535,
          "attention: more than 65535 query rows or heads");
  require(d.selection == nullptr || d.topk <= kMaxSelectionWidth,
          "attention: a selection row wider than " + std::to_string(kMaxSelectionWidth));
  require(d.workspace != nullptr, "attention: no workspace given (attention_workspace_floats)");
  const int sbp = next_pow2(p.sparse_block);
  const int row_bytes = static_cast<int>(hd) * dtype_size(static_cast<int>(c.kv.cache_dtype));
  const int tile =
      static_cast<int>(std::min<std::int64_t>(p.sparse_block, kStageBytes / row_bytes));
  const std::size_t smem = AttnSmem(static_cast<int>(group), static_cast<int>(hd), sbp,
                                    static_cast<int>(p.sparse_block), tile, row_bytes)
                               .total;
  require(smem <= kMaxSmem, "attention: sparse_block x query heads per KV head too large");
  if (b.num_rows == 0) return;
  AttnArgs a = attention_args(c, p, b, d);
  a.ws = d.workspace;
  a.sbp = sbp;
  a.tile = tile;
  const float sm = default_or_given_sm(p, hd);
  const auto s = static_cast<cudaStream_t>(stream);
  if constexpr (F == ReadBug::kNone) {  // planted bugs: the fast family and generic kernel only
    const bool decode = kPath == AttentionPath::kAuto && attention_decode_applies(c, p) &&
                        aligned16(d.k_cache) && aligned16(d.v_cache);
    const bool canonical = kernel == ReadKernel::kCanonical;
    a.sm = canonical ? sm : sm * kLog2e;
    if (decode) return run_attention_decode(a, b.num_rows, canonical, s);
    if (canonical) return dispatch_attention<true>(a, b.num_rows, smem, s);
  }
  a.sm = F == ReadBug::kExpNoLog2e ? sm : sm * kLog2e;
  dispatch_attention<false>(a, b.num_rows, smem, s);
}

// The flash family (kvo/gpu/read.hpp: flash_attention_host), FlashAttention's arithmetic without
// tensor cores: one CUDA block of kFlashThreads per (query row, KV head) runs the row's tokens,
// chunk by chunk as the selection lists them, through kFlashTile-token tiles. Per tile:
//   K'      the tile's K rows dequantized and rounded to bf16 (the operands of a tensor-core QK^T);
//   s       raw dots q'.k' by fp32 fma, one warp per token with lanes over the dims, xor butterfly;
//   softmax one warp per query head: m' = max(m, tile max); a = ex2((m - m') c); p = ex2(fma(s, c,
//           -fl(m' c))) with c = fl(sm_scale log2(e)) (scale_apply_exp2); L = L a + sum of p in
//           fp32; P rounded to bf16 (what the P.V tensor-core product reads);
//   V'      the tile's V rows in K's place, rounded to bf16;
//   O       O a + sum_i p'_i v'_i by fp32 fma, one thread per (head, dim), in shared memory;
// and at the end out = O * rcp.approx(L) (+0 for a row without tokens). Bug B (spec::AttentionBug)
// is planted by kvo_gpu_testing only.

inline constexpr int kFlashThreads = 128;  // 4 warps
inline constexpr int kFlashTile = 64;      // tokens per tile (FlashAttention's kBlockN)

/// Shared-memory sections of the flash kernel (byte offsets, 16-byte aligned): q' [group][hd]
/// floats, O [group][hd] floats, scores then P' [group][kFlashTile] floats, per query head m, L and
/// the tile's rescale a [3][group] floats, the tile's K and V row byte offsets [2][kFlashTile]
/// long long, and the tile's K' then V' rows [kFlashTile][hd] bf16.
struct FlashSmem {
  std::size_t q = 0, o = 0, p = 0, mla = 0, rows = 0, kv = 0, total = 0;
  __host__ __device__ FlashSmem(int group, int hd) {
    SmemCarver c;
    q = c.take(static_cast<std::size_t>(group) * hd * 4);
    o = c.take(static_cast<std::size_t>(group) * hd * 4);
    p = c.take(static_cast<std::size_t>(group) * kFlashTile * 4);
    mla = c.take(static_cast<std::size_t>(3) * group * 4);
    rows = c.take(static_cast<std::size_t>(2) * kFlashTile * 8);
    kv = c.take(static_cast<std::size_t>(kFlashTile) * hd * 2);
    total = c.at;
  }
};

/// The flash kernel's shared memory, carved.
struct FlashView {
  float* q;           // [group][hd]
  float* o;           // [group][hd]
  float* p;           // [group][kFlashTile]
  float* m;           // [group]
  float* l;           // [group]
  float* a;           // [group]
  long long* koff;    // [kFlashTile]
  long long* voff;    // [kFlashTile]
  __nv_bfloat16* kv;  // [kFlashTile][hd]
};

/// n cache rows (byte offsets off[i] into `cache`, dtype Dt) into dst [n][hd] bf16: dequantized
/// (times `scale` when `scaled`, rounded as the reference's read) and rounded to bf16.
template <int Dt>
__device__ inline void stage_bf16_rows(__nv_bfloat16* dst, const unsigned char* cache,
                                       const long long* off, int n, int hd, bool scaled,
                                       float scale) {
  constexpr int eb = Dt == kDtF32 ? 4 : Dt <= kDtF16 ? 2 : 1;
  const int pairs = hd / 2;
  for (int e = threadIdx.x; e < n * pairs; e += blockDim.x) {
    const int i = e / pairs, dp = e % pairs;
    float2 v = load2<Dt>(cache + off[i] + 2 * dp * eb);
    if (scaled) v = make_float2(__fmul_rn(v.x, scale), __fmul_rn(v.y, scale));
    reinterpret_cast<__nv_bfloat162*>(dst)[i * pairs + dp] = __floats2bfloat162_rn(v.x, v.y);
  }
}

/// One tile of n tokens (their row offsets in s.koff, s.voff) through the online softmax of every
/// query head of the group (see above). Ends with the block synchronised.
template <int KvDt>
__device__ void flash_tile(const AttnArgs& a, const FlashView& s, int n, float ks, float vs) {
  const int hd = static_cast<int>(a.g.head_dim), group = a.group;
  const bool scaled = !a.g.scale_none;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  stage_bf16_rows<KvDt>(s.kv, a.k_cache, s.koff, n, hd, scaled, ks);
  __syncthreads();
  for (int i = warp; i < n; i += warps) {
    float k[kMaxHeadDim / 32];
#pragma unroll
    for (int u = 0; u < kMaxHeadDim / 32; ++u) {
      const int d = lane + 32 * u;
      k[u] = d < hd ? __bfloat162float(s.kv[i * hd + d]) : 0.0f;
    }
    for (int h = 0; h < group; ++h) {
      float acc = 0.0f;
#pragma unroll
      for (int u = 0; u < kMaxHeadDim / 32; ++u) {
        const int d = lane + 32 * u;
        if (d < hd) acc = fmaf(s.q[h * hd + d], k[u], acc);
      }
      for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, off);
      if (lane == 0) s.p[h * kFlashTile + i] = acc;
    }
  }
  __syncthreads();
  const float c = a.sm;  // sm_scale * log2(e)
  for (int h = warp; h < group; h += warps) {
    float* p = s.p + h * kFlashTile;
    const float x0 = lane < n ? p[lane] : -INFINITY;
    const float x1 = lane + 32 < n ? p[lane + 32] : -INFINITY;
    const float m_old = s.m[h];
    const float m_new = fmaxf(m_old, warp_max(fmaxf(x0, x1)));
    // FlashAttention's Check_inf: a maximum of -inf scales as 0 (m = -inf before the first tile,
    // so a = 0 there).
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float rescale = fast_exp2((m_old - m_use) * c);
    const float m_scaled = m_use * c;
    const float p0 = lane < n ? fast_exp2(fmaf(x0, c, -m_scaled)) : 0.0f;
    const float p1 = lane + 32 < n ? fast_exp2(fmaf(x1, c, -m_scaled)) : 0.0f;
    float sum = p0 + p1;
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
    if (lane < n) p[lane] = bf16_value(p0);
    if (lane + 32 < n) p[lane + 32] = bf16_value(p1);
    __syncwarp();  // every lane has read m[h] before lane 0 replaces it
    if (lane == 0) {
      s.l[h] = s.l[h] * rescale + sum;
      s.m[h] = m_new;
      s.a[h] = rescale;
    }
  }
  stage_bf16_rows<KvDt>(s.kv, a.v_cache, s.voff, n, hd, scaled, vs);  // the scores are done
  __syncthreads();
  for (int e = threadIdx.x; e < group * hd; e += blockDim.x) {
    const int h = e / hd, d = e % hd;
    const float* p = s.p + h * kFlashTile;
    float acc = s.o[e] * s.a[h];
    for (int i = 0; i < n; ++i) acc = fmaf(p[i], __bfloat162float(s.kv[i * hd + d]), acc);
    s.o[e] = acc;
  }
  __syncthreads();
}

template <int KvDt, spec::AttentionBug B>
__global__ void __launch_bounds__(kFlashThreads) flash_attention_kernel(AttnArgs a) {
  extern __shared__ float4 smem4[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
  const long long kvh = blockIdx.x, row = blockIdx.y;
  const ReadGeom& g = a.g;
  const int hd = static_cast<int>(g.head_dim), group = a.group;
  const FlashSmem lay(group, hd);
  FlashView s;
  s.q = reinterpret_cast<float*>(smem + lay.q);
  s.o = reinterpret_cast<float*>(smem + lay.o);
  s.p = reinterpret_cast<float*>(smem + lay.p);
  s.m = reinterpret_cast<float*>(smem + lay.mla);
  s.l = s.m + group;
  s.a = s.l + group;
  s.koff = reinterpret_cast<long long*>(smem + lay.rows);
  s.voff = s.koff + kFlashTile;
  s.kv = reinterpret_cast<__nv_bfloat16*>(smem + lay.kv);
  constexpr int eb = KvDt == kDtF32 ? 4 : KvDt <= kDtF16 ? 2 : 1;
  const long long r = a.row_req[row], pos = a.row_pos[row];
  const long long kvh_v = B == spec::AttentionBug::kNeighbourV ? (kvh + 1) % g.nkv : kvh;
  const int ab = dtype_size(g.act_dtype);
  for (int e = threadIdx.x; e < group * hd; e += blockDim.x) {
    const long long hq = kvh * group + e / hd;
    s.q[e] = bf16_value(load_act(a.q + ((row * a.nq + hq) * hd + e % hd) * ab, g.act_dtype));
    s.o[e] = 0.0f;
  }
  for (int h = threadIdx.x; h < group; h += blockDim.x) s.m[h] = -INFINITY, s.l[h] = 0.0f;
  __syncthreads();
  const float ks = g.scale_none ? 1.0f : a.k_scale[g.per_head_scale ? kvh : 0];
  const float vs = g.scale_none ? 1.0f : a.v_scale[g.per_head_scale ? kvh_v : 0];
  const long long n_valid = a.seq_lens[r] == 0 ? 0 : pos / a.sb + 1;
  const long long slots = n_valid == 0 ? 0 : a.selection == nullptr ? n_valid : a.slots;
  const int* table_row = a.table + r * g.max_blocks;
  // Fill tiles with the chunks' visible tokens, in selection order, across chunk boundaries.
  int fill = 0;
  bool seen_visible = false, poisoned = false;  // kMaskedChunkNan's state
  for (long long slot = 0; slot < slots; ++slot) {
    if constexpr (B == spec::AttentionBug::kStopAtMinusOne) {
      if (a.selection != nullptr && selected_id(a, row, kvh, slot) < 0) break;
    }
    // kMaskedChunkNan: an id past n_valid kept as an all-masked block; first in the row, its
    // tile's maximum is -inf and exp2(-inf - -inf) = NaN reaches L and O.
    if (B == spec::AttentionBug::kMaskedChunkNan && a.selection != nullptr && !seen_visible &&
        selected_id(a, row, kvh, slot) >= n_valid)
      poisoned = true;
    const long long j = chunk_of(a, row, kvh, slot, n_valid);
    if (j < 0) continue;
    seen_visible = true;
    const long long first = j * a.sb;
    long long count = pos - first + 1 < a.sb ? pos - first + 1 : a.sb;
    if constexpr (B == spec::AttentionBug::kDropChunkLast) --count;
    for (long long done = 0; done < count;) {
      const int take =
          static_cast<int>(kFlashTile - fill < count - done ? kFlashTile - fill : count - done);
      for (int i = threadIdx.x; i < take; i += blockDim.x) {
        const long long t = first + done + i, b = table_row[t / g.block_size];
        const long long o = t % g.block_size;
        s.koff[fill + i] = kv_offset(g, 0, b, o, kvh, 0) * eb;
        s.voff[fill + i] = kv_offset(g, 1, b, o, kvh_v, 0) * eb;
      }
      fill += take;
      done += take;
      if (fill == kFlashTile) {
        __syncthreads();
        flash_tile<KvDt>(a, s, fill, ks, vs);
        fill = 0;
      }
    }
  }
  if (fill > 0) {
    __syncthreads();
    flash_tile<KvDt>(a, s, fill, ks, vs);
  }
  for (int e = threadIdx.x; e < group * hd; e += blockDim.x) {
    const int h = e / hd;
    const float l = s.l[h];
    float y = l > 0.0f ? s.o[e] * fast_rcp(l) : 0.0f;  // a row without tokens is +0
    if (B == spec::AttentionBug::kMaskedChunkNan && poisoned) y = __int_as_float(0x7fc00000);
    store_out(a, (row * a.nq + kvh * group + h) * hd + e % hd, y);
  }
}

/// Whether the flash family's decode kernels (flash_decode.cuh) run this call, given a workspace
/// and 16-byte-aligned K and V pointers: head_dim 64 or 128, at most 16 query heads per KV head,
/// sparse_block <= 128, a 16- or 8-bit cache whose rows start 16-byte aligned. Host-only.
bool flash_decode_applies(const spec::ModelConfig& c, const spec::AttentionParams& p);
/// Both decode kernels of the flash family (flash_decode.cu); a.ws: the workspace; a.per_block:
/// chunk slots a CUDA block runs (decode_slots_per_block).
void run_flash_decode(const AttnArgs& a, std::int64_t rows, cudaStream_t stream);

template <int KvDt, spec::AttentionBug B>
void run_flash(const AttnArgs& a, std::int64_t rows, std::size_t smem, cudaStream_t s) {
  allow_smem(flash_attention_kernel<KvDt, B>, smem);
  flash_attention_kernel<KvDt, B>
      <<<dim3(static_cast<unsigned>(a.g.nkv), static_cast<unsigned>(rows)), kFlashThreads, smem,
         s>>>(a);
  check_cuda(cudaGetLastError(), "flash_attention_kernel launch");
}

/// launch_flash_attention (kvo/gpu/read.hpp; launch_flash_attention_generic with kPath kGeneric)
/// with bug B planted (kNone in production). The decode kernels take a call where
/// flash_decode_applies and a workspace is given; planted bugs run in the one-block kernel only.
template <spec::AttentionBug B, AttentionPath kPath = AttentionPath::kAuto>
void launch_flash_attention_t(const spec::ModelConfig& c, const spec::AttentionParams& p,
                              const DeviceReadBatch& b, const DeviceAttention& d, void* stream) {
  const std::int64_t hd = c.geometry.head_dim, nkv = c.geometry.num_kv_heads;
  const std::int64_t group = p.num_q_heads / nkv;
  require(
      hd % 8 == 0 && hd <= kMaxHeadDim,
      "flash attention: head_dim must be a multiple of 8 and <= " + std::to_string(kMaxHeadDim));
  require(group <= 64, "flash attention: more than 64 query heads per KV head");
  require(d.slots >= 1 && d.slots < (1ll << 31), "flash attention: chunk slots out of range");
  require(b.num_rows <= 65535 && nkv <= 65535,
          "flash attention: more than 65535 query rows or KV heads");
  const std::size_t smem = FlashSmem(static_cast<int>(group), static_cast<int>(hd)).total;
  require(smem <= kMaxSmem, "flash attention: query heads per KV head x head_dim too large");
  if (b.num_rows == 0) return;
  AttnArgs a = attention_args(c, p, b, d);
  // sm_scale * log2(e) on the host in IEEE arithmetic, as FlashAttention's softmax_scale_log2.
  float sm = default_or_given_sm(p, hd);
  if constexpr (B == spec::AttentionBug::kScaleOff) sm = sm * spec::kScaleOffFactor;
  a.sm = sm * kLog2e;
  const auto s = static_cast<cudaStream_t>(stream);
  if constexpr (B == spec::AttentionBug::kNone && kPath == AttentionPath::kAuto) {
    if (d.workspace != nullptr && flash_decode_applies(c, p) && aligned16(d.k_cache) &&
        aligned16(d.v_cache)) {
      a.ws = d.workspace;
      return run_flash_decode(a, b.num_rows, s);
    }
  }
  switch (a.g.kv_dtype) {
    case kDtF32:
      return run_flash<kDtF32, B>(a, b.num_rows, smem, s);
    case kDtBf16:
      return run_flash<kDtBf16, B>(a, b.num_rows, smem, s);
    case kDtF16:
      return run_flash<kDtF16, B>(a, b.num_rows, smem, s);
    case kDtE4m3:
      return run_flash<kDtE4m3, B>(a, b.num_rows, smem, s);
    default:
      return run_flash<kDtE5m2, B>(a, b.num_rows, smem, s);
  }
}

}  // namespace kvo::gpu::detail
