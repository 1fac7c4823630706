#pragma once
/// \file flash_decode.cuh
/// The flash family's decode kernels (kvo/gpu/read.hpp: flash_attention_host, profile bf16_p): the
/// same arithmetic as the one-block flash kernel (attention_kernels.cuh) with the products on
/// tensor cores and a row's selected blocks spread over CUDA blocks, for head_dim HD (64 or 128)
/// and cache dtype KvDt as template parameters, at most 16 query heads per KV head and chunks of
/// at most kFlashDecodeTokens tokens (flash_decode.cu says which calls take it).
///
/// Kernel 1, one CUDA block of four warps per run of up to kFlashDecodeMaxPerBlock consecutive
/// chunk slots of a (query row, KV head), the next slot's rows in flight while a slot computes
/// (flash_decode_kernel); for each slot:
///   staging  the chunk's V rows by cp.async into shared memory (the other of two buffers):
///            bf16 [token][HD] whose 16-byte pieces are swizzled (piece ^ (token & 7)) so that an
///            8-row ldmatrix touches every bank once. A bf16 cache without a scale lands there as
///            it is; any other is turned into bf16(fl(x * scale)) there (the operand the profile
///            models: the flash kernel's stage_bf16_rows).
///   scores   S = Q' K'^T on tensor cores (mma m16n8k16, bf16 in, fp32 accumulation): the 16 rows
///            of A are the group's query heads (rows past G zero), Q' = bf16(q) held in registers;
///            warp w takes tokens 32 w .. 32 w + 31, each lane reading its token's K row straight
///            into registers (flash_decode_kernel says in which order the dims are summed) and
///            turning it into K' = bf16(fl(x * scale)) there.
///   softmax  m = the chunk's `>` maximum of every head (the four warps' maxima through shared
///            memory; -inf scales as 0, FlashAttention's Check_inf), p = ex2.approx(fma(s, c,
///            -fl(m c))) with c = sm_scale * log2(e), l = the sum of p in fp32, P' = bf16(p) into
///            shared memory [16][kFlashDecodeTokens + 8] (rows padded: conflict-free ldmatrix).
///   P.V      O = P' V' on tensor cores, warp w taking dims HD/4 w .. HD/4 (w + 1) - 1 over every
///            token, V' fragments by ldmatrix.trans.
///   result   (fl(m c), l, O) of each head into the workspace entry (row, head, slot), as the fast
///            family's kernel 1 leaves them; a slot that selects nothing stores m = -inf.
/// Kernel 2, one CUDA block per (query row, query head): M = the largest chunk m, L = sum of l 2^(m
/// - M), O = sum of o 2^(m - M) over the non-empty chunks, out = O * rcp.approx(L) (+0 without
/// tokens). Any order: the profile is foreign (SPEC principle 4), its bound counts a rescale and
/// an add per token.

#include <cuda_bf16.h>

#include "attention_decode.cuh"

namespace kvo::gpu::detail {

inline constexpr int kFlashDecodeThreads = 128;  // 4 warps
inline constexpr int kFlashDecodeTokens = 128;   // a chunk's tokens at most: 32 a warp
inline constexpr int kFlashDecodePRow = kFlashDecodeTokens + 8;  // P' row, bf16 elements
inline constexpr int kFlashDecodeHeads = 16;                     // the mma's A rows
inline constexpr int kFlashDecodeBlocksPerSm = 3;
inline constexpr int kFlashDecodeMaxPerBlock = 8;  // slots a CUDA block runs, at most

/// Shared-memory sections of kernel 1 (byte offsets, 16-byte aligned), two buffers for two slots
/// in flight: the K and V row byte offsets [2][2][kFlashDecodeTokens] long long and the block's
/// selection entries [kFlashDecodeMaxPerBlock] long long; V' [2][tokens][hd] bf16 (swizzled
/// pieces), or one V' tile and the raw 8-bit V rows [2][tokens][hd] bytes for an 8-bit cache; P'
/// [16][kFlashDecodePRow] bf16; each warp's row maxima and row sums [2][4][16] floats. About 75 KB
/// (hd 128): three blocks a multiprocessor.
struct FlashDecodeSmem {
  std::size_t rows = 0, v = 0, raw = 0, p = 0, red = 0, total = 0;
  __host__ __device__ FlashDecodeSmem(int hd, int elem_bytes) {
    SmemCarver c;
    const auto tile = static_cast<std::size_t>(kFlashDecodeTokens) * hd * 2;
    rows = c.take((static_cast<std::size_t>(4) * kFlashDecodeTokens + kFlashDecodeMaxPerBlock) * 8);
    v = c.take(elem_bytes == 2 ? 2 * tile : tile);
    raw = elem_bytes == 1 ? c.take(static_cast<std::size_t>(2) * kFlashDecodeTokens * hd) : 0;
    p = c.take(static_cast<std::size_t>(kFlashDecodeHeads) * kFlashDecodePRow * 2);
    red = c.take(static_cast<std::size_t>(2) * 4 * kFlashDecodeHeads * 4);
    total = c.at;
  }
};

/// Byte offset of 16-byte piece `piece` of row `token` in a swizzled bf16 tile of HD columns.
template <int HD>
__device__ inline int swizzled(int token, int piece) {
  return token * (HD * 2) + ((piece ^ (token & 7)) << 4);
}

/// 16 bytes global -> shared, or 16 zero bytes where !valid (src is then not read).
__device__ inline void cp_async16_or_zero(void* dst_shared, const void* src, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst_shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

/// Four 8x8 b16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
__device__ inline void ldmatrix_x4(unsigned (&r)[4], const void* row) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
/// The same, each matrix transposed.
__device__ inline void ldmatrix_x4_trans(unsigned (&r)[4], const void* row) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

/// d += A B on tensor cores: A 16x16 bf16 (row-major fragments a), B 16x8 bf16 (b0, b1), d 16x8
/// fp32. Lane l holds d[0..1] at (row l / 4, cols 2 (l % 4) + {0, 1}), d[2..3] at row l / 4 + 8.
__device__ inline void mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats as a bf16 pair (x in the low half), each rounded to nearest even.
__device__ inline unsigned bf16_pair(float x, float y) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const unsigned*>(&b);
}

/// Four bf16 pairs of the profile's operands bf16(fl(x * scale)) from 8 elements of dtype Dt held
/// in `raw` (16-bit: four words; 8-bit: the first two): raw as it is for a bf16 cache without a
/// scale.
template <int Dt>
__device__ inline uint4 operand_pairs(uint4 raw, bool scaled, float scale) {
  if (Dt == kDtBf16 && !scaled) return raw;
  unsigned w[4];
  const unsigned in[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 v;
    if constexpr (Dt == kDtBf16 || Dt == kDtF16) {
      v = load2<Dt>(reinterpret_cast<const unsigned char*>(&in[i]));
    } else {
      v = fp8x2_value<Dt>(static_cast<unsigned short>(in[i / 2] >> (16 * (i % 2))));
    }
    if (scaled) v = make_float2(__fmul_rn(v.x, scale), __fmul_rn(v.y, scale));
    w[i] = bf16_pair(v.x, v.y);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/// 8 elements of dtype Dt at p (16 bytes of a 16-bit cache, 8 of an 8-bit one), raw.
template <int Dt>
__device__ inline uint4 load8_raw(const unsigned char* p) {
  if constexpr (kElemBytes<Dt> == 2) {
    return *reinterpret_cast<const uint4*>(p);
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    return make_uint4(u.x, u.y, 0u, 0u);
  }
}

/// V rows [0, n) of a chunk by cp.async: a 16-bit cache into the bf16 tile `tile` [tokens][HD]
/// (swizzled; converted in place by v_to_bf16 where it must be), an 8-bit one into `raw`
/// [tokens][HD] bytes. Rows [n, n16) are zeros (P.V reads them with p = 0: a NaN would spread).
/// Thread t copies piece t % kPieces of rows t / kPieces, + kRowsPerPass, ...: a pass is a whole
/// number of 8-row swizzle periods, so the thread's piece sits at one column of every row it
/// copies and its address only steps (no division a copy).
template <int KvDt, int HD>
__device__ inline void stage_v(unsigned char* tile, unsigned char* raw, const unsigned char* cache,
                               const long long* off, int n, int n16) {
  constexpr unsigned kEb = kElemBytes<KvDt>, kPieces = HD * kEb / 16;
  constexpr unsigned kRowsPerPass = kFlashDecodeThreads / kPieces;
  constexpr unsigned kDstRow = kEb == 2 ? HD * 2 : HD;  // bytes a row of the tile or of raw
  static_assert(kRowsPerPass % 8 == 0, "whole swizzle periods a pass");
  const unsigned piece = threadIdx.x % kPieces, r0 = threadIdx.x / kPieces;
  unsigned char* dst = kEb == 2 ? tile + swizzled<HD>(static_cast<int>(r0), static_cast<int>(piece))
                                : raw + r0 * HD + piece * 16;
  const unsigned char* src = cache + piece * 16;
  for (unsigned i = r0; i < static_cast<unsigned>(n16);
       i += kRowsPerPass, dst += kRowsPerPass * kDstRow) {
    const bool valid = i < static_cast<unsigned>(n);
    cp_async16_or_zero(dst, valid ? src + off[i] : cache, valid);
  }
}

/// The staged V rows [0, n16) as the profile's bf16 operands in `tile`: nothing for a bf16 cache
/// without a scale; in place for 16-bit caches; from `raw` for 8-bit ones. Thread t converts
/// piece t % kPieces of rows t / kPieces, + kRowsPerPass, ... (as stage_v).
template <int KvDt, int HD>
__device__ inline void v_to_bf16(unsigned char* tile, const unsigned char* raw, int n16,
                                 bool scaled, float scale) {
  constexpr unsigned kPieces = HD / 8;  // 16-byte pieces of a bf16 row
  constexpr unsigned kRowsPerPass = kFlashDecodeThreads / kPieces;
  static_assert(kRowsPerPass % 8 == 0, "whole swizzle periods a pass");
  const unsigned piece = threadIdx.x % kPieces, r0 = threadIdx.x / kPieces;
  unsigned char* dst = tile + swizzled<HD>(static_cast<int>(r0), static_cast<int>(piece));
  const unsigned char* src = kElemBytes<KvDt> == 2 ? dst : raw + r0 * HD + piece * 8;
  constexpr unsigned kSrcRow = kElemBytes<KvDt> == 2 ? HD * 2 : HD;
  for (unsigned i = r0; i < static_cast<unsigned>(n16);
       i += kRowsPerPass, dst += kRowsPerPass * HD * 2, src += kRowsPerPass * kSrcRow)
    *reinterpret_cast<uint4*>(dst) = operand_pairs<KvDt>(load8_raw<KvDt>(src), scaled, scale);
}

/// Where a chunk slot's rows are: its logical block j (negative: the slot selects nothing), its
/// visible tokens n, and the thread's token's block-table entry b (when the thread's token is
/// visible) and offset in the page.
struct FlashSlot {
  long long j = -1, b = 0, offset = 0;
  int n = 0;
};

/// Slot `slot` of (row, kvh) for request r at position pos, its selection entry `id` already read:
/// issues the block-table load of the thread's token (flash_slot_offsets waits for it).
__device__ inline FlashSlot flash_slot(const AttnArgs& a, long long id, long long r, long long pos,
                                       long long n_valid) {
  FlashSlot f;
  f.j = id < n_valid ? id : -1;  // chunk_of: -1 and ids past n_valid select nothing
  if (f.j < 0) return f;
  const long long first = f.j * a.sb;
  f.n = static_cast<int>(pos - first + 1 < a.sb ? pos - first + 1 : a.sb);
  if (static_cast<int>(threadIdx.x) < f.n) {
    long long page;
    page_of(first + threadIdx.x, a.g.block_size, page, f.offset);
    f.b = a.table[r * a.g.max_blocks + page];
  }
  return f;
}

/// The slot's K and V row byte offsets of the thread's token into off[0][t], off[1][t]
/// ([2][tokens]).
__device__ inline void flash_slot_offsets(const AttnArgs& a, const FlashSlot& f, long long kvh,
                                          int elem_bytes, long long* off) {
  if (static_cast<int>(threadIdx.x) >= f.n) return;
  off[threadIdx.x] = kv_offset(a.g, 0, f.b, f.offset, kvh, 0) * elem_bytes;
  off[kFlashDecodeTokens + threadIdx.x] = kv_offset(a.g, 1, f.b, f.offset, kvh, 0) * elem_bytes;
}

/// The thread's K words of a slot for the warp's tokens (see flash_decode_kernel): kw[t][p], token
/// t0 + 8 t + lane / 4, dims 32 p + 8 (lane % 4) .. + 7, raw. A token past n reads row n - 1 (its
/// score is masked to -inf: no select a word); a warp without tokens reads nothing (its scores
/// are skipped).
template <int KvDt, int HD>
__device__ inline void load_k_words(const AttnArgs& a, const long long* koff, int n, int t0,
                                    uint4 (&kw)[4][HD / 32]) {
  constexpr int kEb = kElemBytes<KvDt>;
  if (t0 >= n) return;
  const int lane = threadIdx.x % 32;
  const unsigned char* base = a.k_cache + 8 * (lane % 4) * kEb;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const int token = t0 + 8 * t + lane / 4;
    const unsigned char* row = base + koff[token < n ? token : n - 1];
#pragma unroll
    for (int p = 0; p < HD / 32; ++p) kw[t][p] = load8_raw<KvDt>(row + 32 * p * kEb);
  }
}

/// Kernel 1 (see the file comment). K never enters shared memory: the score mma's dims are summed
/// in a permuted order, so that lane (g, q) (g = lane / 4, q = lane % 4) of k-step ks holds, as
/// both its B fragment (token g) and its A fragment (heads g, g + 8), the four consecutive dims
/// 32 (ks / 2) + 8 q + 4 (ks % 2) + {0, 1, 2, 3} in place of the mma's k = 2q, 2q + 1, 2q + 8,
/// 2q + 9: a lane reads 8 consecutive dims of its token's K row for two k-steps at once.
/// A CUDA block runs `per_block` consecutive slots of one (row, KV head), pipelined: slot s + 1's
/// V rows (cp.async, the other buffer) and K words (registers) are in flight while slot s's
/// softmax and P.V run, and slot s + 2's table entries while slot s + 1's scores run.
template <int KvDt, int HD>
__global__ void __launch_bounds__(kFlashDecodeThreads, kFlashDecodeBlocksPerSm)
    flash_decode_kernel(AttnArgs a, int per_block) {
  constexpr int kEb = kElemBytes<KvDt>;
  constexpr int kKSteps = HD / 16;       // mma k-steps over the dims
  constexpr int kDimTiles = HD / 8 / 4;  // a warp's 8-dim n-tiles of O
  constexpr int kTile = kFlashDecodeTokens * HD * 2;
  extern __shared__ float4 smem4[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
  const FlashDecodeSmem lay(HD, kEb);
  long long* offs = reinterpret_cast<long long*>(smem + lay.rows);  // [2 buffers][K, V][tokens]
  unsigned char* p_tile = smem + lay.p;                             // [16][kFlashDecodePRow] bf16
  float* row_max = reinterpret_cast<float*>(smem + lay.red);        // [4 warps][16]
  float* row_sum = row_max + 4 * kFlashDecodeHeads;                 // [4 warps][16]
  // buffer b's V' tile: 16-bit caches stage into it; 8-bit ones into raw buffer b, converted into
  // the one V' tile.
  const auto v_tile = [&](int b) { return smem + lay.v + (kEb == 2 ? b * kTile : 0); };
  const auto v_raw = [&](int b) { return smem + lay.raw + b * kFlashDecodeTokens * HD; };
  const auto koff = [&](int b) { return offs + 2 * b * kFlashDecodeTokens; };

  const long long kvh = blockIdx.y, row = blockIdx.z;
  const long long s_begin = static_cast<long long>(blockIdx.x) * per_block;
  const long long s_end = s_begin + per_block < a.slots ? s_begin + per_block : a.slots;
  const ReadGeom& g = a.g;
  const int group = a.group, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad = lane % 4;  // mma fragment coordinates
  // The block's selection entries, read once: ids [kFlashDecodeMaxPerBlock] in shared memory.
  long long* ids = offs + 4 * kFlashDecodeTokens;
  if (threadIdx.x < s_end - s_begin) {
    const long long sl = s_begin + threadIdx.x;
    ids[threadIdx.x] = a.selection == nullptr ? sl : selected_id(a, row, kvh, sl);
  }
  const long long r = a.row_req[row], pos = a.row_pos[row];
  const long long n_valid = a.seq_lens[r] == 0 ? 0 : pos / a.sb + 1;
  __syncthreads();  // the ids
  FlashSlot cur = flash_slot(a, ids[0], r, pos, n_valid);
  flash_slot_offsets(a, cur, kvh, kEb, koff(0));

  const bool scaled = !g.scale_none;
  const float ks_scale = scaled ? a.k_scale[g.per_head_scale ? kvh : 0] : 1.0f;
  const float vs_scale = scaled ? a.v_scale[g.per_head_scale ? kvh : 0] : 1.0f;
  // Q' fragments of every k-step (rows: heads quad_row and quad_row + 8; dims permuted as above).
  unsigned qa[kKSteps][4];
  {
    const int ab = dtype_size(g.act_dtype);
    const auto q_at = [&](int h, int d) {
      return h < group ? load_act(a.q + ((row * a.nq + kvh * group + h) * HD + d) * ab, g.act_dtype)
                       : 0.0f;
    };
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const int d = 32 * (ks / 2) + 8 * quad + 4 * (ks % 2);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int h = quad_row + 8 * (u % 2), e = d + 2 * (u / 2);
        qa[ks][u] = bf16_pair(q_at(h, e), q_at(h, e + 1));
      }
    }
  }
  const int t0 = 32 * warp;        // the warp's tokens in the scores
  const int d0 = warp * (HD / 4);  // the warp's dims in P.V
  const float c = a.sm;            // sm_scale * log2(e)
  uint4 kw[4][HD / 32];
  __syncthreads();  // slot s_begin's offsets
  if (cur.j >= 0) {
    stage_v<KvDt, HD>(v_tile(0), v_raw(0), a.v_cache, koff(0) + kFlashDecodeTokens, cur.n,
                      (cur.n + 15) & ~15);
    load_k_words<KvDt, HD>(a, koff(0), cur.n, t0, kw);
  }
  cp_async_commit();

  for (long long slot = s_begin; slot < s_end; ++slot) {
    const int buf = static_cast<int>((slot - s_begin) % 2);
    const int n = cur.n, n16 = (n + 15) & ~15;
    const bool has_next = slot + 1 < s_end;
    // The next slot's table entries: loads issued here, waited for after the scores.
    const FlashSlot next =
        has_next ? flash_slot(a, ids[slot + 1 - s_begin], r, pos, n_valid) : FlashSlot{};
    // S for the warp's 32 tokens: four n-tiles of 8 tokens; s[t][0..1] heads quad_row, s[t][2..3]
    // heads quad_row + 8, tokens t0 + 8 t + 2 quad + {0, 1}.
    float s[4][4];
#pragma unroll
    for (int t = 0; t < 4; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
    if (t0 < n) {
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int p = 0; p < HD / 32; ++p) {
          const uint4 b = operand_pairs<KvDt>(kw[t][p], scaled, ks_scale);
          mma_bf16(s[t], qa[2 * p], b.x, b.y);
          mma_bf16(s[t], qa[2 * p + 1], b.z, b.w);
        }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (t0 + 8 * t + 2 * quad + e % 2 >= n) s[t][e] = -INFINITY;  // masked
        if (s[t][e] > mx[e / 2]) mx[e / 2] = s[t][e];
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int o = 1; o <= 2; o *= 2) {
        const float other = __shfl_xor_sync(0xFFFFFFFFu, mx[h], o);
        if (other > mx[h]) mx[h] = other;
      }
      if (quad == 0) row_max[warp * kFlashDecodeHeads + quad_row + 8 * h] = mx[h];
    }
    flash_slot_offsets(a, next, kvh, kEb, koff(buf ^ 1));
    __syncthreads();    // the maxima, and the next slot's offsets
    if (next.j >= 0) {  // the next slot's V rows and K words, in flight from here
      stage_v<KvDt, HD>(v_tile(buf ^ 1), v_raw(buf ^ 1), a.v_cache,
                        koff(buf ^ 1) + kFlashDecodeTokens, next.n, (next.n + 15) & ~15);
      load_k_words<KvDt, HD>(a, koff(buf ^ 1), next.n, t0, kw);
    }
    cp_async_commit();
    float mc[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m = -INFINITY;
      for (int w = 0; w < 4; ++w) {
        const float x = row_max[w * kFlashDecodeHeads + quad_row + 8 * h];
        if (x > m) m = x;
      }
      mc[h] = (m == -INFINITY ? 0.0f : m) * c;  // Check_inf: a maximum of -inf scales as 0
    }
    if (t0 < n) {
#pragma unroll
      for (int t = 0; t < 4; ++t) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int tok = t0 + 8 * t + 2 * quad;
          const float p0 = tok < n ? fast_exp2(fmaf(s[t][2 * h], c, -mc[h])) : 0.0f;
          const float p1 = tok + 1 < n ? fast_exp2(fmaf(s[t][2 * h + 1], c, -mc[h])) : 0.0f;
          sum[h] += p0 + p1;
          *reinterpret_cast<unsigned*>(p_tile + ((quad_row + 8 * h) * kFlashDecodePRow + tok) * 2) =
              bf16_pair(p0, p1);
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      for (int o = 1; o <= 2; o *= 2) sum[h] += __shfl_xor_sync(0xFFFFFFFFu, sum[h], o);
      if (quad == 0) row_sum[warp * kFlashDecodeHeads + quad_row + 8 * h] = sum[h];
    }
    cp_async_wait_group<1>();  // this slot's V rows (the next slot's may still be in flight)
    __syncthreads();           // P', the sums and this slot's V rows are in
    if (n > 0 && !(KvDt == kDtBf16 && !scaled)) {
      v_to_bf16<KvDt, HD>(v_tile(buf), v_raw(buf), n16, scaled, vs_scale);
      __syncthreads();
    }
    // O for the warp's dims d0 .. d0 + HD / 4 - 1 over every token: o[u][0..1] head quad_row,
    // o[u][2..3] head quad_row + 8, dims d0 + 8 u + 2 quad + {0, 1}.
    float o[kDimTiles][4];
#pragma unroll
    for (int u = 0; u < kDimTiles; ++u) o[u][0] = o[u][1] = o[u][2] = o[u][3] = 0.0f;
    // k-step k0's fragments sit k0 P' columns and k0 V' rows on from k-step 0's: the swizzle of
    // V' row k0 + r is that of row r (k0 is a multiple of 16), so a lane's addresses are fixed
    // here and only step.
    const unsigned char* pa_at =  // P' rows lane % 8 (+ 8 for matrices 1, 3), tokens + 8 for 2, 3
        p_tile + ((lane % 8 + 8 * ((lane / 8) % 2)) * kFlashDecodePRow + 8 * (lane / 16)) * 2;
    const int v_row = lane % 8 + 8 * ((lane / 8) % 2);  // V' row of the lane (+ k0)
    int v_col[kDimTiles / 2];  // byte offsets in V' row v_row of dims d0 + 8 u (+ 8 for 2, 3)
#pragma unroll
    for (int u = 0; u < kDimTiles; u += 2)
      v_col[u / 2] = swizzled<HD>(v_row, (d0 + 8 * u) / 8 + lane / 16);
    const unsigned char* vt = v_tile(buf);
#pragma unroll 2
    for (int k0 = 0; k0 < n16; k0 += 16) {
      unsigned pa[4];
      ldmatrix_x4(pa, pa_at + k0 * 2);
#pragma unroll
      for (int u = 0; u < kDimTiles; u += 2) {
        unsigned b[4];
        ldmatrix_x4_trans(b, vt + k0 * (HD * 2) + v_col[u / 2]);
        mma_bf16(o[u], pa, b[0], b[1]);
        mma_bf16(o[u + 1], pa, b[2], b[3]);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = quad_row + 8 * h;
      if (head >= group) continue;
      float* w = ws_entry(a, row, kvh * group + head, slot);
      if (cur.j < 0) {  // the slot selects nothing: m = -inf tells the combine
        if (warp == 0 && quad == 0) w[0] = -INFINITY;
        continue;
      }
#pragma unroll
      for (int u = 0; u < kDimTiles; ++u)
        *reinterpret_cast<float2*>(w + 2 + d0 + 8 * u + 2 * quad) =
            make_float2(o[u][2 * h], o[u][2 * h + 1]);
      if (warp == 0 && quad == 0) {
        float l = 0.0f;
        for (int x = 0; x < 4; ++x) l += row_sum[x * kFlashDecodeHeads + head];
        w[0] = mc[h];
        w[1] = l;
      }
    }
    cur = next;
    __syncthreads();  // P', the maxima and sums and this slot's buffers are free again
  }
}

/// Kernel 2 (see the file comment), one CUDA block of HD threads per (query row, query head):
/// the largest m over the slots (one pass, a block-wide `>` maximum); then, kFlashCombineSlots
/// slots a pass, thread u finds slot u's weight 2^(m - M) (-1 marks an empty slot) and adds its
/// l 2^(m - M) to its share of L, and thread d sums dim d over the pass's slots, eight slots'
/// loads issued before their adds; out = O * rcp.approx(L), +0 without tokens.
inline constexpr int kFlashCombineSlots = 64;

/// A block-wide reduction of one value a thread (`>` maximum, or sum), every thread getting it;
/// scratch: [32] floats of shared memory. Starts and ends with the block synchronised.
template <bool kMax>
__device__ inline float block_reduce(float x, float* scratch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if constexpr (kMax) {
    x = warp_max(x);
  } else {
    for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xFFFFFFFFu, x, o);
  }
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < warps; ++w) {
    const float y = scratch[w];
    if constexpr (kMax) {
      if (y > x) x = y;
    } else {
      x += y;
    }
  }
  return x;
}

template <int HD>
__global__ void __launch_bounds__(HD) flash_decode_combine_kernel(AttnArgs a) {
  __shared__ float weight[kFlashCombineSlots];
  __shared__ float scratch[32];
  const long long row = blockIdx.x, hq = blockIdx.y;
  const int d = threadIdx.x;
  float m = -INFINITY;
  for (long long sl = d; sl < a.slots; sl += HD) {
    const float x = ws_entry(a, row, hq, sl)[0];
    if (x > m) m = x;
  }
  m = block_reduce<true>(m, scratch);
  const float* o_at = ws_entry(a, row, hq, 0) + 2 + d;  // slot s: o_at[s * (HD + 2)]
  float acc = 0.0f, l_part = 0.0f;
  for (long long s0 = 0; s0 < a.slots; s0 += kFlashCombineSlots) {
    const int ns =
        static_cast<int>(a.slots - s0 < kFlashCombineSlots ? a.slots - s0 : kFlashCombineSlots);
    __syncthreads();  // the last pass's weights are read
    for (int u = d; u < ns; u += HD) {
      const float* w = ws_entry(a, row, hq, s0 + u);
      const float x = w[0];
      const float wt = x == -INFINITY ? -1.0f : fast_exp2(x - m);
      weight[u] = wt;
      if (wt != -1.0f) l_part += w[1] * wt;
    }
    __syncthreads();
    const float* o0 = o_at + s0 * (HD + 2);
    for (int u0 = 0; u0 < ns; u0 += 8) {
      float ov[8];
#pragma unroll
      for (int u = 0; u < 8; ++u)
        ov[u] = u0 + u < ns && weight[u0 + u] != -1.0f ? o0[(u0 + u) * (HD + 2)] : 0.0f;
#pragma unroll
      for (int u = 0; u < 8; ++u)
        if (u0 + u < ns && weight[u0 + u] != -1.0f) acc += ov[u] * weight[u0 + u];
    }
  }
  const float l = block_reduce<false>(l_part, scratch);
  store_out(a, (row * a.nq + hq) * HD + d, l > 0.0f ? acc * fast_rcp(l) : 0.0f);
}

}  // namespace kvo::gpu::detail
