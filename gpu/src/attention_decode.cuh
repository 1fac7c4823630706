#pragma once
/// \file attention_decode.cuh
/// Kernel 1 of attention (attention_kernels.cuh) specialised: the cache dtype, head_dim HD (64 or
/// 128) and the group's G query heads per KV head (1, 2, 4, 8 or 16) are template parameters, for
/// chunks of at most kDecodeMaxSbp tokens. The same canonical order, the same workspace (m, l,
/// o[hd] per chunk), the same combine kernel; attention_decode.cu says which calls take it.
/// One CUDA block of kDecodeAttnThreads per run of per_block consecutive chunk slots of the
/// flattened (query row, KV head, slot) order (decode_run_length), three per multiprocessor
/// (registers capped to fit), so that a block's latency hides behind the others'. Each slot is
/// computed exactly as alone; the slots of a run are pipelined through one K and one V buffer:
///   staging  the slot's K rows, then its V rows, by cp.async into shared memory (two commit
///            groups); the next slot's K rows are copied in once the scores are done, its V rows
///            once the chains are, and its table entries are loaded during the scores. A thread
///            copies one 16-byte piece of every kDecodeAttnThreads / pieces-th row. (Measured on
///            the H200 and kept out: one bulk copy per row on an mbarrier, 7% slower; V staged
///            into K's place after the scores, for more blocks a multiprocessor, 5% slower; the o
///            chains on all eight warps, one head a thread, 7% slower: more instructions.)
///   scores   HD / 8 lanes per token, lane j holding group j (8 elements) and the query's 8
///            matching elements of up to four heads in registers. Per head: the group's fma chain
///            of SPEC 6.1, then the tree over the groups as shuffle-downs; s = fl(dot * sm) stored
///            p[t][h] (token-major). A quarter warp's 16-byte loads (a half warp's 8-byte ones)
///            read 128 consecutive bytes of one or two rows: no bank is shared.
///   m, p, l  one warp per head: `>` maximum over the visible tokens, p = exp(s - m) (+0 masked),
///            l = tree_sum over sbp positions: lane i holds positions i + 32 k, levels above 32 in
///            registers, the last five as shuffle-downs; m and l go to the workspace.
///   o        thread (dim pair dp, head set) holds dims 2 dp, 2 dp + 1 of kValueHeads heads (two,
///            or four for 16 heads of 128 dims): 2 kValueHeads fma chains over the visible tokens
///            ascending, a V pair converted and a token's p read once for all of them.
/// The fast family (kCanonical false) differs in its exp (the hardware exp2, log2(e) folded into
/// sm) and in l (lane partial sums and an xor butterfly); its scores and chains are the canonical
/// ones, which foreign mode accepts as any other order.

#include "attention_kernels.cuh"

namespace kvo::gpu::detail {

inline constexpr int kDecodeAttnThreads = 256;  // 8 warps
inline constexpr int kDecodeAttnBlocksPerSm = 3;
inline constexpr int kDecodeMaxSbp = 128;      // sparse_block <= 128: at most 4 positions a lane
inline constexpr int kDecodeMaxPerBlock = 24;  // chunk slots a CUDA block runs, at most

/// Byte size of one element of dtype Dt, as a constant.
template <int Dt>
inline constexpr int kElemBytes = dtype_size(Dt);

/// Shared-memory sections of the decode chunk kernel (byte offsets, 16-byte aligned): q [G][HD]
/// floats; p [sb][G] floats (token-major: the o threads read a token's G values together); the
/// chunk's K and V row byte offsets [2][sb] long long (the staging's); the block's run
/// [kDecodeMaxPerBlock] DecodeRunSlot; K rows [sb][row_bytes]; V rows [sb][row_bytes].
struct DecodeAttnSmem {
  std::size_t q = 0, p = 0, rows = 0, run = 0, k = 0, v = 0, total = 0;
  __host__ __device__ DecodeAttnSmem(int group, int hd, int elem_bytes, int sb) {
    SmemCarver c;
    const auto row_bytes = static_cast<std::size_t>(hd) * elem_bytes;
    q = c.take(static_cast<std::size_t>(group) * hd * 4);
    p = c.take(static_cast<std::size_t>(sb) * group * 4);
    rows = c.take(static_cast<std::size_t>(2) * sb * 8);
    run = c.take(static_cast<std::size_t>(kDecodeMaxPerBlock) * 32);  // sizeof(DecodeRunSlot)
    k = c.take(static_cast<std::size_t>(sb) * row_bytes);
    v = c.take(static_cast<std::size_t>(sb) * row_bytes);
    total = c.at;
  }
};

__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ inline void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/// Stages n rows (byte offsets off[i] into `cache`) into dst [n][RowBytes], 16 bytes a copy:
/// thread t copies piece t % kUnits of rows t / kUnits, + kRowsPerPass, ... (unsigned and
/// power-of-two arithmetic: the loop is the offset's load, two adds and the copy).
template <int RowBytes>
__device__ inline void stage_decode_rows(unsigned char* dst, const unsigned char* cache,
                                         const long long* off, int n) {
  constexpr unsigned kUnits = RowBytes / 16, kRowsPerPass = kDecodeAttnThreads / kUnits;
  static_assert(kUnits >= 1 && kDecodeAttnThreads % kUnits == 0, "whole rows a pass");
  const unsigned piece = threadIdx.x % kUnits * 16;
#pragma unroll 4
  for (unsigned row = threadIdx.x / kUnits; row < static_cast<unsigned>(n); row += kRowsPerPass)
    cp_async(dst + row * RowBytes + piece, cache + off[row] + piece, 16);
}

/// The page and the offset in it of token t, in 32-bit arithmetic where it fits (a 64-bit division
/// is a long subroutine).
__device__ inline void page_of(long long t, long long block_size, long long& page, long long& off) {
  if (t <= 0x7FFFFFFF && block_size <= 0x7FFFFFFF) {
    const int ti = static_cast<int>(t), bs = static_cast<int>(block_size);
    page = ti / bs, off = ti % bs;
  } else {
    page = t / block_size, off = t % block_size;
  }
}

/// The scores of the chunk's `valid` tokens for every head: p[i][h] = fl(dot(q_h, k_i) * sm).
template <bool kCanonical, int KvDt, int HD, int G, bool kScaled>
__device__ inline void decode_scores(const float* q_s, const unsigned char* kraw, float* p_s,
                                     int valid, float ks, float sm) {
  constexpr int kLanes = HD / 8, kTokensPerWarp = 32 / kLanes;
  constexpr int kTokensPerPass = kTokensPerWarp * (kDecodeAttnThreads / 32);
  constexpr int kEb = kElemBytes<KvDt>, kRowBytes = HD * kEb;
  constexpr int kHeadsPerPass = G < 4 ? G : 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, j = lane % kLanes;
  const int token_in_warp = lane / kLanes;
  const int t0 = warp * kTokensPerWarp + token_in_warp;  // the thread's token in each pass
  const unsigned char* k_at = kraw + 8 * j * kEb;        // group j of row 0
  for (int h0 = 0; h0 < G; h0 += kHeadsPerPass) {
    float q[kHeadsPerPass][8];  // group j of heads h0 ..
#pragma unroll
    for (int u = 0; u < kHeadsPerPass; ++u) {
      const float4* src = reinterpret_cast<const float4*>(q_s + (h0 + u) * HD + 8 * j);
      const float4 a = src[0], b = src[1];
      q[u][0] = a.x, q[u][1] = a.y, q[u][2] = a.z, q[u][3] = a.w;
      q[u][4] = b.x, q[u][5] = b.y, q[u][6] = b.z, q[u][7] = b.w;
    }
    for (int i0 = 0; i0 < valid; i0 += kTokensPerPass) {
      const int i = i0 + t0;
      // A token past `valid` reads the last visible row instead (staged): its dots stay in its
      // own kLanes lanes (the tree's shuffles never cross a token's segment) and are not stored.
      float k[8];
      load8_scaled<KvDt>(k_at + (i < valid ? i : valid - 1) * kRowBytes, kScaled, ks, k);
      float d[kHeadsPerPass];
#pragma unroll
      for (int u = 0; u < kHeadsPerPass; ++u) {
        d[u] = 0.0f;  // group j's fma chain in element order
#pragma unroll
        for (int e = 0; e < 8; ++e) d[u] = __fmaf_rn(q[u][e], k[e], d[u]);
      }
#pragma unroll
      for (int off = kLanes / 2; off > 0; off /= 2)
#pragma unroll
        for (int u = 0; u < kHeadsPerPass; ++u)
          d[u] = __fadd_rn(d[u], __shfl_down_sync(0xFFFFFFFFu, d[u], off, kLanes));
      if (j == 0 && i < valid) {
#pragma unroll
        for (int u = 0; u < kHeadsPerPass; ++u)
          p_s[i * G + h0 + u] = kCanonical ? __fmul_rn(d[u], sm) : d[u] * sm;
      }
    }
  }
}

/// m, p and l of every head (one warp per head): p[i][h] becomes exp(s - m) for the visible i;
/// m and l go to head h's workspace entry, ws0 + h * ws_stride.
template <bool kCanonical, int G>
__device__ inline void decode_softmax(float* p_s, int valid, int sbp, float* ws0,
                                      long long ws_stride) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int h = warp; h < G; h += kDecodeAttnThreads / 32) {
    float x[4];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = lane + 32 * k;
      x[k] = i < valid ? p_s[i * G + h] : 0.0f;
      if (i < valid && x[k] > m) m = x[k];
    }
    m = warp_max(m);
    float l;
    if constexpr (kCanonical) {
      float v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = lane + 32 * k;
        v[k] = i < valid ? canonical_exp(__fsub_rn(x[k], m)) : 0.0f;
        if (i < valid) p_s[i * G + h] = v[k];
      }
      // tree_sum over sbp positions: lane holds positions lane + 32 k (k < sbp / 32).
      int off = sbp / 2;
      if (sbp == 128) v[0] = __fadd_rn(v[0], v[2]), v[1] = __fadd_rn(v[1], v[3]);
      if (sbp >= 64) v[0] = __fadd_rn(v[0], v[1]);
      if (off > 16) off = 16;
      for (; off > 0; off /= 2) v[0] = __fadd_rn(v[0], __shfl_down_sync(0xFFFFFFFFu, v[0], off));
      l = __shfl_sync(0xFFFFFFFFu, v[0], 0);
    } else {
      float part = 0.0f;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = lane + 32 * k;
        if (i < valid) {
          const float p = fast_exp2(x[k] - m);
          p_s[i * G + h] = p;
          part += p;
        }
      }
      for (int off = 1; off < 32; off *= 2) part += __shfl_xor_sync(0xFFFFFFFFu, part, off);
      l = part;
    }
    if (lane == 0) ws0[h * ws_stride] = m, ws0[h * ws_stride + 1] = l;
  }
}

/// Heads a thread of the o phase holds: two (a V pair's load and conversion and a token's p load
/// serve both chains), more where the block has fewer threads than (dim pair, two heads). Four
/// heads a thread run fewer instructions but measured slower on the H200 (136.7 against 129.7 us,
/// bf16, batch 64): half the warps carry the o chains.
template <int HD, int G>
inline constexpr int kValueHeads =
    G < 2                                  ? G
    : HD / 2 * G / 2 <= kDecodeAttnThreads ? 2
                                           : HD / 2 * G / kDecodeAttnThreads;

/// o[u][2 dp], o[u][2 dp + 1] of heads h0 + u, u < kValueHeads: fma chains over the visible tokens
/// ascending.
template <int KvDt, int HD, int G, bool kScaled>
__device__ inline void decode_values(const unsigned char* vraw, const float* p_s, int valid,
                                     float vs, int dp, int h0, float (&o0)[kValueHeads<HD, G>],
                                     float (&o1)[kValueHeads<HD, G>]) {
  constexpr int kEb = kElemBytes<KvDt>, kRowBytes = HD * kEb, kH = kValueHeads<HD, G>;
  const unsigned char* v_at = vraw + 2 * dp * kEb;
  const float* p_at = p_s + h0;
#pragma unroll 8
  for (int i = 0; i < valid; ++i) {
    float2 v = load2<KvDt>(v_at + i * kRowBytes);
    if constexpr (kScaled) v = make_float2(__fmul_rn(v.x, vs), __fmul_rn(v.y, vs));
    float p[kH];
    if constexpr (kH % 4 == 0) {
#pragma unroll
      for (int u = 0; u < kH; u += 4) {
        const float4 f = reinterpret_cast<const float4*>(p_at + i * G + u)[0];
        p[u] = f.x, p[u + 1] = f.y, p[u + 2] = f.z, p[u + 3] = f.w;
      }
    } else if constexpr (kH == 2) {
      const float2 f = reinterpret_cast<const float2*>(p_at + i * G)[0];
      p[0] = f.x, p[1] = f.y;
    } else {
      p[0] = p_at[i * G];
    }
#pragma unroll
    for (int u = 0; u < kH; ++u) {
      o0[u] = __fmaf_rn(p[u], v.x, o0[u]);
      o1[u] = __fmaf_rn(p[u], v.y, o1[u]);
    }
  }
}

/// A chunk slot of a CUDA block's run of the flattened (query row, KV head, slot) order, as the
/// block's start resolves it (decode_run_slot): the row, its request, the KV head and the slot, the
/// chunk's first token and its visible tokens n (0: the slot selects nothing). 32 bytes: the runs
/// sit in shared memory beside three blocks' rows.
struct DecodeRunSlot {
  long long first;
  int row, r, slot, kvh, n;
};
static_assert(sizeof(DecodeRunSlot) == 32, "DecodeAttnSmem's run section");

/// The query row, KV head and slot of flattened slot f = (row nkv + kvh) slots + slot, in 32-bit
/// arithmetic where it fits (a 64-bit division is a long subroutine on the block's first path).
__device__ inline void decode_pair_of(const AttnArgs& a, long long f, long long& row,
                                      long long& kvh, long long& slot) {
  if (f <= 0x7FFFFFFF && a.slots <= 0x7FFFFFFF && a.g.nkv <= 0x7FFFFFFF) {
    const unsigned fu = static_cast<unsigned>(f), su = static_cast<unsigned>(a.slots);
    const unsigned nu = static_cast<unsigned>(a.g.nkv), pair = fu / su, ru = pair / nu;
    row = ru, kvh = pair - ru * nu, slot = fu - pair * su;
  } else {
    const long long pair = f / a.slots;
    row = pair / a.g.nkv, kvh = pair - row * a.g.nkv, slot = f - pair * a.slots;
  }
}

/// The run entry of flattened slot f = (row nkv + kvh) slots + slot (chunk_of's rule: a negative
/// id, one past n_valid or a dense slot past n_valid selects nothing; a row of an empty request
/// selects nothing).
__device__ inline DecodeRunSlot decode_run_slot(const AttnArgs& a, long long f) {
  DecodeRunSlot s{-1, 0, 0, 0, 0, 0};
  long long row, slot, kvh;
  decode_pair_of(a, f, row, kvh, slot);
  s.row = static_cast<int>(row);
  s.slot = static_cast<int>(slot);
  s.kvh = static_cast<int>(kvh);
  s.r = static_cast<int>(a.row_req[row]);
  const long long pos = a.row_pos[row];
  long long pos_block, pos_in;  // pos / sb, in 32-bit arithmetic where it fits
  page_of(pos, a.sb, pos_block, pos_in);
  const long long n_valid = a.seq_lens[s.r] == 0 ? 0 : pos_block + 1;
  const long long id = a.selection == nullptr ? slot : selected_id(a, row, s.kvh, slot);
  if (id < 0 || id >= n_valid) return s;
  s.first = id * a.sb;
  s.n = static_cast<int>(pos - s.first + 1 < a.sb ? pos - s.first + 1 : a.sb);
  return s;
}

/// Flattened chunk slots a CUDA block runs, at most `most`, of `total`, on `sms` multiprocessors
/// holding `blocks_per_sm` blocks each: `forced` where given; else, where two blocks a
/// multiprocessor need runs of at most kDecodeShortRun slots, those; else as few waves of the
/// resident blocks as runs of at most `most` allow, with the shortest run that fits them (every
/// block runs that many slots but the last, which runs what is left).
/// On the H200 (bench_read_gpu, 16 slots, session 33, bf16): at batch 16 (1,024 slots) four slots
/// on 256 blocks ran 39.4-39.7 us against 40.8-41.0 for one part-filled wave of three a
/// multiprocessor (342 blocks of three); at batch 64 and 128 one wave of three a multiprocessor
/// (11 and 21 slots a block) is within 1% of the fastest forced count.
inline constexpr long long kDecodeShortRun = 4;
inline int decode_run_length(long long total, long long sms, int blocks_per_sm, int most,
                             int forced) {
  if (forced > 0) return forced < most ? forced : most;
  const long long two = (total + 2 * sms - 1) / (2 * sms);
  if (two <= kDecodeShortRun) return two < 1 ? 1 : static_cast<int>(two);
  const long long resident = sms * blocks_per_sm;
  const long long waves = (total + resident * most - 1) / (resident * most);
  const long long per = (total + resident * waves - 1) / (resident * waves);
  return per < 1 ? 1 : static_cast<int>(per);
}

/// The decode chunk kernel (see the top of this file). A CUDA block runs flattened slots [x
/// per_block, (x + 1) per_block) of `total` (rows x nkv x slots) in turn (the run may go on into
/// the next (row, KV head)), each slot exactly as alone (so any per_block gives the same bits),
/// pipelined through the one K and one V buffer: the next slot's K rows are copied in while a
/// slot's softmax and chains run, its V rows while its scores run, and its table entries are
/// loaded while a slot's scores run; q is loaded again where the next slot's (row, KV head)
/// differs, once the slot's scores are done.
template <bool kCanonical, int KvDt, int HD, int G>
__global__ void __launch_bounds__(kDecodeAttnThreads, kDecodeAttnBlocksPerSm)
    attention_decode_chunk_kernel(AttnArgs a, long long total) {
  extern __shared__ float4 smem4[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
  constexpr int kEb = kElemBytes<KvDt>, kRowBytes = HD * kEb;
  const long long f_begin = static_cast<long long>(blockIdx.x) * a.per_block;
  const int runs = static_cast<int>(f_begin + a.per_block < total ? a.per_block : total - f_begin);
  const ReadGeom& g = a.g;
  // The combine kernel may launch once every block of this one has started: it waits for this
  // grid's completion before it reads the workspace (launch_attention_combine).
  asm volatile("griddepcontrol.launch_dependents;");
  const int sb = static_cast<int>(a.sb);
  const DecodeAttnSmem lay(G, HD, kEb, sb);
  float* q_s = reinterpret_cast<float*>(smem + lay.q);
  float* p_s = reinterpret_cast<float*>(smem + lay.p);
  unsigned char* kraw = smem + lay.k;
  unsigned char* vraw = smem + lay.v;
  long long* koff_s = reinterpret_cast<long long*>(smem + lay.rows);
  long long* voff_s = koff_s + sb;
  DecodeRunSlot* run = reinterpret_cast<DecodeRunSlot*>(smem + lay.run);  // [runs]
  if (static_cast<int>(threadIdx.x) < runs)
    run[threadIdx.x] = decode_run_slot(a, f_begin + threadIdx.x);
  const int ab = dtype_size(g.act_dtype);
  // q of (row, kvh) into q_s [G][HD] floats.
  const auto load_q = [&](long long row, long long kvh) {
    for (int e = threadIdx.x; e < G * HD; e += kDecodeAttnThreads) {
      const long long hq = kvh * G + e / HD;
      q_s[e] = load_act(a.q + ((row * a.nq + hq) * HD + e % HD) * ab, g.act_dtype);
    }
  };
  static_assert(kDecodeMaxSbp <= kDecodeAttnThreads, "a thread for each row of a chunk");
  // Thread i < n owns token row i of a slot: its page's table entry and the row's offsets.
  const auto table_entry = [&](const DecodeRunSlot& s, long long& in_page) -> long long {
    long long page;
    page_of(s.first + threadIdx.x, g.block_size, page, in_page);
    return a.table[static_cast<long long>(s.r) * g.max_blocks + page];
  };
  const auto store_offsets = [&](long long b, long long in_page, long long kvh) {
    koff_s[threadIdx.x] = kv_offset(g, 0, b, in_page, kvh, 0) * kEb;
    voff_s[threadIdx.x] = kv_offset(g, 1, b, in_page, kvh, 0) * kEb;
  };
  __syncthreads();  // the run
  DecodeRunSlot cur = run[0];
  int q_row = cur.row, q_kvh = cur.kvh;  // whose q q_s holds
  load_q(q_row, q_kvh);
  if (static_cast<int>(threadIdx.x) < cur.n) {
    long long in_page;
    const long long b = table_entry(cur, in_page);
    store_offsets(b, in_page, cur.kvh);
  }
  __syncthreads();
  stage_decode_rows<kRowBytes>(kraw, a.k_cache, koff_s, cur.n);
  cp_async_commit();
  stage_decode_rows<kRowBytes>(vraw, a.v_cache, voff_s, cur.n);
  cp_async_commit();
  const bool scaled = !g.scale_none;
  constexpr int kH = kValueHeads<HD, G>;
  static_assert(HD / 2 * (G / kH) <= kDecodeAttnThreads, "a thread for every (pair, head set)");
  const int dp = threadIdx.x % (HD / 2), h0 = threadIdx.x / (HD / 2) * kH;
  // The group's workspace entries of a slot: head u's at ws_entry(.., slot) + u * ws_stride.
  const long long ws_stride = a.slots * (HD + 2);
  // Commit groups, per thread, in order: K(s), V(s), then per slot K(s + 1), V(s + 1) (empty
  // where there is no next slot), so that a slot's K and its V are each the last group but one
  // when waited for.
  for (int i = 0; i < runs; ++i) {
    const DecodeRunSlot next = i + 1 < runs ? run[i + 1] : DecodeRunSlot{-1, 0, 0, 0, 0, 0};
    const bool owns_next_row = static_cast<int>(threadIdx.x) < next.n;
    long long next_b = 0, next_in_page = 0;  // loaded here, waited for after the scores
    if (owns_next_row) next_b = table_entry(next, next_in_page);
    const int kv_sel = g.per_head_scale ? cur.kvh : 0;
    const float ks = scaled ? a.k_scale[kv_sel] : 1.0f;
    const float vs = scaled ? a.v_scale[kv_sel] : 1.0f;
    cp_async_wait_group<1>();  // this thread's K copies of the slot
    __syncthreads();           // every thread's; the previous slot's p and V rows are free; q in
    if (cur.n > 0) {
      if (scaled) {
        decode_scores<kCanonical, KvDt, HD, G, true>(q_s, kraw, p_s, cur.n, ks, a.sm);
      } else {
        decode_scores<kCanonical, KvDt, HD, G, false>(q_s, kraw, p_s, cur.n, ks, a.sm);
      }
    }
    if (owns_next_row) store_offsets(next_b, next_in_page, next.kvh);
    __syncthreads();  // the scores in; K's rows and q free; the next slot's offsets in
    stage_decode_rows<kRowBytes>(kraw, a.k_cache, koff_s, next.n);
    cp_async_commit();
    if (next.n > 0 && (next.row != q_row || next.kvh != q_kvh)) {
      q_row = next.row;
      q_kvh = next.kvh;
      load_q(q_row, q_kvh);
    }
    float* ws0 = ws_entry(a, cur.row, static_cast<long long>(cur.kvh) * G, cur.slot);
    if (cur.n > 0) decode_softmax<kCanonical, G>(p_s, cur.n, a.sbp, ws0, ws_stride);
    cp_async_wait_group<1>();  // this thread's V copies of the slot (the next K's may fly)
    __syncthreads();
    if (cur.n > 0 && h0 < G) {
      float o0[kH], o1[kH];
#pragma unroll
      for (int u = 0; u < kH; ++u) o0[u] = 0.0f, o1[u] = 0.0f;
      if (scaled) {
        decode_values<KvDt, HD, G, true>(vraw, p_s, cur.n, vs, dp, h0, o0, o1);
      } else {
        decode_values<KvDt, HD, G, false>(vraw, p_s, cur.n, vs, dp, h0, o0, o1);
      }
#pragma unroll
      for (int u = 0; u < kH; ++u)
        reinterpret_cast<float2*>(ws0 + (h0 + u) * ws_stride + 2)[dp] = make_float2(o0[u], o1[u]);
    }
    __syncthreads();  // V's rows and p free
    stage_decode_rows<kRowBytes>(vraw, a.v_cache, voff_s, next.n);
    cp_async_commit();
    cur = next;
  }
}

}  // namespace kvo::gpu::detail
