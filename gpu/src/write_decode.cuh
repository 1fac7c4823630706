#pragma once
/// \file write_decode.cuh
/// The fused layer write's specialised kernel: the same canonical order as write_fused.cuh (each
/// element's bytes identical, same helpers: widen, divide8_by, store8, blockscale_scale), for the
/// configurations serving engines run (16-bit activations; bf16 or satfinite e4m3 caches; scale
/// none, divide or mul_recip; strict slots; index-K none, flat bf16 or blockscale), with the
/// activation, cache dtype, scale mode and index layout as template parameters, so a thread runs a
/// straight path of a few dozen instructions per item instead of the generic kernel's runtime
/// branches. decode_write_applies() says which calls take it; launch_fused_write
/// (write_fused.cuh) routes them here.
///
/// Work split (no shared memory, no barrier): a thread block owns `tile_tokens` (1-4) consecutive
/// tokens. Its K/V warps, round_up(2 * nkv * hd / 8, 32) threads, each own one 8-element item of
/// every token's K or V row (x < nkv*hd/8: K, else V; head h and dims d8*8.. from x, once); on a
/// layer with an index-K row, its index warps, round_up(idim / 8, 32) threads after them, each own
/// one 8-element item of every token's index-K row (blockscale: the 16 items of a 128-group are one
/// half-warp, whose shuffle max gives amax). The two run side by side, so that a one-token call
/// waits for the longer of the two chains, not their sum, and neither thread holds the other's
/// loads. A thread first loads every token's slot and source items (all independent), then
/// resolves each slot (every thread of the token loads the same slot: one broadcast), converts and
/// stores. On bf16 activations with 4 tokens a thread, the divide mode first checks each scale
/// for the two-operation division (warp_recip_pair_exact: a vote among the lanes that share it).

#include <cuda_runtime.h>

#include <type_traits>

#include "write_fused.cuh"  // load_slot, page_offset

namespace kvo::gpu::detail {

/// Tokens one thread handles at most (FusedParams::tile_tokens on this path).
inline constexpr int kDecodeMaxTile = 4;

/// The divide mode's check of this lane's scale s (r = fl(1 / s)) for the two-operation division:
/// whether s is in range_ok_s, not a power of two (one multiply is exact there), and its RecipPair
/// divides all 128 bf16 significands exactly as div_by_recip (recip_pair_exact_at): every
/// recip_pair_trial of s. The lanes of `lanes` (every lane that calls, the same call
/// site) that hold the same s share its 128 trials (a lane of rank k among g runs k, k + g, ...)
/// and vote, so a warp whose lanes share one scale runs 4 trials a lane, without a barrier.
__device__ __forceinline__ bool warp_recip_pair_exact(float s, float r, std::uint32_t lanes) {
  const std::uint32_t same = __match_any_sync(lanes, __float_as_uint(s));
  const std::uint32_t below = (1u << (threadIdx.x & 31u)) - 1u;
  const int g = __popc(same), k = __popc(same & below);
  const RecipPair pair = recip_pair(s, r);
  bool ok = range_ok_s(s) && !is_pow2_normal(s);
  for (int j = k; ok && j < kBf16Significands; j += g) ok = recip_pair_exact_at(s, r, pair, j);
  return (__ballot_sync(lanes, ok) & same) == same;
}

/// The K/V warps' part: thread x < kv_items writes its 8-element item of each of the tile's
/// n_tok tokens (t0 ..). kCheck (divide on bf16 only): check the scale for the two-operation
/// division first; kv_lanes: the lanes of this warp that run this.
template <DType A, DType C, ScaleMode S, bool kCheck>
__device__ __forceinline__ void decode_write_kv(const FusedParams& p, std::uint32_t x,
                                                std::int64_t t0, int n_tok,
                                                std::uint32_t kv_lanes) {
  using Act = typename ActTraits<A>::T;
  const std::int64_t row = static_cast<std::int64_t>(p.nkv) * p.hd;
  // This thread's item: part (0 K, 1 V), head h, dims d8*8..d8*8+7.
  const std::uint32_t part = x >= p.row_items.div ? 1u : 0u;
  const std::uint32_t c = x - part * p.row_items.div;
  const std::uint32_t h = p.head_items.quo(c);
  const std::int64_t in_block = static_cast<std::int64_t>(h) * p.st.head +
                                static_cast<std::int64_t>(c - h * p.head_items.div) * kVec;
  std::uint8_t* const cache = static_cast<std::uint8_t*>(part ? p.v_cache : p.k_cache);
  const Act* const src = static_cast<const Act*>(part ? p.v : p.k) + c * kVec;

  // The scale (per head or per tensor) and its reciprocal, once per thread. (Measured with the
  // reciprocal after the loads below: 0.04 us faster at one token, 0.1 us slower with PDL.)
  float s = 1.0f, r = 1.0f;
  if constexpr (S != ScaleMode::kNone) {
    s = __ldg((part ? p.v_scale : p.k_scale) + (p.per_head_scale ? h : 0u));
    r = __fdiv_rn(1.0f, s);
  }
  // Every load first: the slots, then the tokens' items.
  std::int64_t slot[kDecodeMaxTile];
  RawItem<A> raw[kDecodeMaxTile];
#pragma unroll
  for (int u = 0; u < kDecodeMaxTile; ++u) {
    if (u >= n_tok) break;
    slot[u] = load_slot(p.slots, p.slots_i64, t0 + u);
  }
#pragma unroll
  for (int u = 0; u < kDecodeMaxTile; ++u) {
    if (u >= n_tok) break;
    load_raw<A>(src + (t0 + u) * row, raw[u]);
  }
  // Convert and store each token's item; kPair: this thread's scale passed the check below.
  const auto convert_store = [&](auto pair) {
    [[maybe_unused]] constexpr bool kPair = decltype(pair)::value;
#pragma unroll
    for (int u = 0; u < kDecodeMaxTile; ++u) {
      if (u >= n_tok) break;
      if (slot[u] < 0) continue;
      std::int64_t page, off;
      page_offset<WriteBug::kNone>(p, slot[u], page, off);
      float v[kVec], y[kVec];
      widen<A>(raw[u], v);
      if constexpr (S == ScaleMode::kDivide && A == DType::kBF16) {
        divide8_bf16(raw[u].a, v, y, s, r, kPair);
      } else if constexpr (S == ScaleMode::kDivide) {
        divide8_by(v, y, s, r);
      } else if constexpr (S == ScaleMode::kMulRecip) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) y[i] = __fmul_rn(v[i], r);
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) y[i] = v[i];
      }
      const std::int64_t e = page * p.st.block + off * p.st.token + in_block;
      store8<C>(cache + e * kBytes<C>, y, Saturation::kSatFinite);
    }
  };
  // divide on bf16, 4 tokens a thread: the scale's check for the two-operation division, while
  // the loads are in flight; the conversion is compiled once for each answer (no per-item test of
  // the answer, no pair range test where it failed).
  if constexpr (kCheck) {
    static_assert(S == ScaleMode::kDivide && A == DType::kBF16);
    if (warp_recip_pair_exact(s, r, kv_lanes)) {
      convert_store(std::true_type{});
      return;
    }
  }
  convert_store(std::false_type{});
}

/// The index warps' part: thread xi < idim / 8 writes dims xi*8..xi*8+7 of each token's index-K
/// row (X flat bf16 or blockscale).
template <DType A, IndexMode X>
__device__ __forceinline__ void decode_write_index(const FusedParams& p, std::uint32_t xi,
                                                   std::int64_t t0, int n_tok) {
  using Act = typename ActTraits<A>::T;
  const Act* const isrc = static_cast<const Act*>(p.index_k) + xi * kVec;
  std::int64_t islot[kDecodeMaxTile];
  RawItem<A> iraw[kDecodeMaxTile];
#pragma unroll
  for (int u = 0; u < kDecodeMaxTile; ++u) {
    if (u >= n_tok) break;
    islot[u] = load_slot(p.index_slots, p.slots_i64, t0 + u);
  }
#pragma unroll
  for (int u = 0; u < kDecodeMaxTile; ++u) {
    if (u >= n_tok) break;
    load_raw<A>(isrc + (t0 + u) * p.idim, iraw[u]);
  }

#pragma unroll
  for (int u = 0; u < kDecodeMaxTile; ++u) {
    if (u >= n_tok) break;
    if (islot[u] < 0) continue;
    float v[kVec];
    widen<A>(iraw[u], v);
    if constexpr (X == IndexMode::kFlatBf16) {
      std::int64_t page, off;
      page_offset<WriteBug::kNone>(p, islot[u], page, off);
      const std::int64_t e = page * p.index_block + off * p.index_token + xi * kVec;
      store8<DType::kBF16>(p.index_cache + e * 2, v, p.sat);
    } else {
      // A 128-group is the half-warp of lanes xi = 16g .. 16g+15 (the index warps start at a
      // warp boundary and idim / 8 is a multiple of 16): its lanes agree on the token and the
      // slot, so each shuffles with its half.
      float amax = 0.0f, y[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, fabsf(v[i]));  // fmaxf drops NaN
      const std::uint32_t half = 0xFFFFu << (xi & 16u);
#pragma unroll
      for (int m = 8; m >= 1; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(half, amax, m));
      std::int64_t page, off;
      page_offset<WriteBug::kNone>(p, islot[u], page, off);
      const float gs = blockscale_scale(amax, p.blockscale_mul_recip, p.ue8m0);
      divide8_by_block_scale(v, y, gs, p.ue8m0);
      const std::int64_t values = page * p.index_block + off * p.index_token;
      store8_e4m3_words(p.index_cache + values + xi * kVec, y);
      if ((xi & 15u) == 0u) {
        const std::int64_t scales =
            page * p.index_block + p.block_size * p.idim + off * p.groups * 4;
        *reinterpret_cast<float*>(p.index_cache + scales + (xi / 16u) * 4) = gs;
      }
    }
  }
}

/// A: act (bf16/f16), C: cache (bf16/e4m3), S: none/divide/mul_recip, X: none/flat bf16/blockscale;
/// kCheck: divide on bf16 with 4 tokens a thread, each warp checking its scales for the
/// two-operation division (FusedParams::recip_pair_check).
template <DType A, DType C, ScaleMode S, IndexMode X, bool kCheck>
__global__ void __launch_bounds__(1024) fused_write_decode_kernel(const FusedParams p) {
  if (p.pdl) {  // as the generic kernel: wait before the first read, trigger early when small
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (p.pdl_early) asm volatile("griddepcontrol.launch_dependents;");
  }
  const std::uint32_t x = threadIdx.x;
  const std::int64_t t0 = static_cast<std::int64_t>(blockIdx.x) * p.tile_tokens;
  const std::int64_t left = p.num_tokens - t0;
  const int n_tok = static_cast<int>(left < p.tile_tokens ? left : p.tile_tokens);
  // The K/V warps, then (X != kNone) the index warps from the next warp boundary.
  const std::uint32_t index_x0 = (static_cast<std::uint32_t>(p.kv_items) + 31u) & ~31u;
  const bool kv = x < static_cast<std::uint32_t>(p.kv_items);
  std::uint32_t kv_lanes = 0;
  if constexpr (kCheck) kv_lanes = __ballot_sync(~0u, kv);
  if (kv) {
    decode_write_kv<A, C, S, kCheck>(p, x, t0, n_tok, kv_lanes);
  } else if constexpr (X != IndexMode::kNone) {
    if (x >= index_x0 && x - index_x0 < static_cast<std::uint32_t>(p.idim / kVec))
      decode_write_index<A, X>(p, x - index_x0, t0, n_tok);
  }
  if (p.pdl && !p.pdl_early) asm volatile("griddepcontrol.launch_dependents;");
}

}  // namespace kvo::gpu::detail
