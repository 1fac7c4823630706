#pragma once
/// \file write_fused.cuh
/// The fused layer write: ONE launch writes a layer's K, V and (sparse layers) index-K rows. The
/// kernel and its launch template; write_fused.cu instantiates it for production (WriteBug::kNone),
/// kvo_gpu_testing (gpu/testing/) with a planted bug.
///
/// Canonical order, per token t of the call (fp32 arithmetic correctly rounded, no contraction):
///   slot = slot_mapping[t]; legacy_wrap: slot < 0 -> slot + capacity; slot < 0 -> nothing written;
///   page = slot / bs, offset = slot - page * bs (once per token, into shared memory);
///   K/V element (h, d): s' = s, or act(s) with scale_in_model_dtype; y = scale(x) (divide
///     fl(x/s'), mul_recip fl(x * fl(1/s')), div_approx div.full.f32(x, s'), none x);
///     via_model_dtype: y = act(y); store cvt(y) at page*block + offset*token + h*head + d;
///   index-K (through index_slot_mapping when separate): flat: cvt(x) (bf16, or fp8 e4m3 with the
///     KV saturation mode); blockscale, per 128-group g: amax = max(max_i |x_i| (NaN ignored),
///     1e-4), s = fl(amax / 448) or (blockscale_scale mul_recip) fl(amax * fl(1/448)), ue8m0: s =
///     2^ceil by exponent bits; q_i = satfinite_e4m3(fl(x_i / s)), s stored as fp32 after the
///     block's values.
///   NaN: what the GPU's arithmetic gives (canonical 0x7FFFFFFF); scale none passes x as it is.
///
/// Work split: a thread block owns a tile of consecutive tokens. Threads first issue the 16-byte
/// source loads of their first items (which do not depend on the slot), then threads < tile compute
/// each token's destination bases into shared memory, a barrier, then convert and store (8
/// elements per item, one 8/16/32-byte store). Blockscale groups follow with 16 lanes per group
/// and a shuffle max over the half warp.

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <string>

#include "kvo/spec/outcome.hpp"
#include "launch.cuh"

namespace kvo::gpu::detail {

/// Items a thread keeps in flight between its loads and its stores (large calls; small calls use
/// the 1-item instantiation, whose code path is short: a small call's time is its latency).
inline constexpr int kUnroll = 4;

/// A destination element base that means "write nothing" (padding, or a rejected slot). No real
/// base is this negative, not even the one-token-before-page-0 base of kTruncDivNegativeSlot.
inline constexpr std::int64_t kSkip = INT64_MIN;

__device__ __forceinline__ std::int64_t load_slot(const void* slots, bool i64, std::int64_t t) {
  return i64 ? static_cast<const std::int64_t*>(slots)[t]
             : static_cast<std::int64_t>(static_cast<const std::int32_t*>(slots)[t]);
}

/// What one item (8 elements of one row) is: K, V or flat index-K, its head and chunk.
struct ItemInfo {
  std::uint32_t tt;   ///< token within the tile
  std::uint32_t c;    ///< chunk of 8 within the K/V row (h * hd/8 + d/8) or the index row
  std::int32_t part;  ///< 0 K, 1 V, 2 flat index-K, -1 none
  float s;            ///< the K or V scale of its head
};

/// Page and in-page offset of a resolved slot >= 0: a multiply-high when every slot is below 2^31
/// (FastDiv), else a 64-bit division. F = kOffsetPlusOne: the offset one further into the block.
template <WriteBug F>
__device__ __forceinline__ void page_offset(const FusedParams& p, std::int64_t slot,
                                            std::int64_t& page, std::int64_t& off) {
  page = p.bs_fast ? static_cast<std::int64_t>(p.bs_div.quo(static_cast<std::uint32_t>(slot)))
                   : slot / p.block_size;
  off = slot - page * p.block_size + (F == WriteBug::kOffsetPlusOne ? 1 : 0);
}

/// Page and offset of a padding slot < 0 under kTruncDivNegativeSlot: Triton's integer `//` and
/// `%` truncate toward zero, so slot -1 becomes page 0, offset -1: a write one token stride before
/// the first element of page 0 (into the guard band, or into the neighbouring head's or K's last
/// token in layouts whose token stride is not the outermost-but-one), exactly as the real kernel.
__device__ __forceinline__ void page_offset_truncated(const FusedParams& p, std::int64_t slot,
                                                      std::int64_t& page, std::int64_t& off) {
  page = slot / p.block_size;  // C++ division truncates toward zero, as Triton's does
  off = slot - page * p.block_size;
}

/// kDivApproxOneCodeBeyond's helpers: the cache code of y under `sat` (one element, the store's
/// own conversion), the value of a finite code, and the sign bit and largest finite magnitude of
/// the code of dtype C (sign-magnitude codes: magnitude + 1 is the next value away from zero).
template <DType C>
__device__ std::uint32_t code_of(float y, Saturation sat) {
  if constexpr (C == DType::kF32) {
    return __float_as_uint(y);
  } else if constexpr (C == DType::kBF16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(y));
  } else if constexpr (C == DType::kF16) {
    return __half_as_ushort(__float2half_rn(y));
  } else {
    return sat == Saturation::kSatFinite
               ? static_cast<std::uint32_t>(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, kFp8Kind<C>))
               : fp8_code_soft<C>(y, sat);
  }
}
template <DType C>
__device__ float value_of(std::uint32_t code) {
  if constexpr (C == DType::kF32) {
    return __uint_as_float(code);
  } else if constexpr (C == DType::kBF16) {
    return __uint_as_float(code << 16);
  } else if constexpr (C == DType::kF16) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(code)));
  } else {
    return __half2float(
        __half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), kFp8Kind<C>)));
  }
}

/// kDivApproxOneCodeBeyond: a value whose cache code lies one code outside div_approx's admissible
/// set for x / s (SPEC 2: the codes of cvt(act?(y)) for every fp32 y within 2 ulp of the correctly
/// rounded quotient q, never across zero). Rounding and the cast are monotone, so that set is the
/// contiguous run of codes from code(toward) to code(away), toward and away being q moved 2 ulp
/// toward zero (stopping short of it) and away from it (up to infinity). The planted code is
/// code(away) one magnitude further from zero, or, when that is no finite code (satfinite's max,
/// infinity, NaN), code(toward) one magnitude closer to zero. A zero quotient has the single code
/// of zero, so the smallest subnormal of its sign lies beyond it. Every element but a NaN quotient
/// (and a set that spans all finite codes, which 2 ulp never does) is moved off its set, by one
/// code: an oracle whose sets were one code too wide would let it pass.
template <DType A, DType C>
__device__ float one_code_beyond(float x, float s, bool via_model, Saturation sat) {
  const float q = __fdiv_rn(x, s);
  if (isnan(q)) return q;
  float away = q, toward = q;
  if (!isinf(q) && q != 0.0f) {
    for (int i = 0; i < 2; ++i) {
      away = nextafterf(away, copysignf(__int_as_float(0x7F800000), q));
      const float t = nextafterf(toward, 0.0f);
      if (t != 0.0f) toward = t;
    }
  }
  auto code = [&](float y) { return code_of<C>(via_model ? round_to_act<A>(y) : y, sat); };
  const std::uint32_t hi = code(away), lo = code(toward);
  std::uint32_t out = hi;
  if ((hi & ~kSignBit<C>) < kMaxFiniteMagnitude<C>) {
    out = hi + 1u;
  } else if ((lo & ~kSignBit<C>) >= 1u && (lo & ~kSignBit<C>) <= kMaxFiniteMagnitude<C> + 1u) {
    out = lo - 1u;
  }
  return value_of<C>(out);
}

/// kFp8FlushToZero and kRoundHalfAway: the fp8 code of y as the planted cast gives it: the
/// production code, then a subnormal code flushed to its signed zero, or a tie (y exactly halfway
/// between its code and the next one away from zero) given the code away from zero.
template <DType C, WriteBug F>
__device__ std::uint32_t planted_fp8_code(float y, Saturation sat) {
  const std::uint32_t code = code_of<C>(y, sat);
  if constexpr (F == WriteBug::kFp8FlushToZero) {
    const std::uint32_t magnitude = code & (kSignBit<C> - 1u);
    return magnitude != 0u && (magnitude >> kMantissaBits<C>) == 0u ? code & kSignBit<C> : code;
  } else {
    const std::uint32_t away =
        code_of<C>(nextafterf(y, copysignf(__int_as_float(0x7F800000), y)), sat);
    const bool tie =
        isfinite(y) && away != code && fabsf(value_of<C>(away) - y) == fabsf(value_of<C>(code) - y);
    return tie ? away : code;
  }
}

/// Bugs of the planted fp8 cast (planted_fp8_code): eight codes in one 8-byte store.
template <DType C, WriteBug F>
inline constexpr bool kPlantedFp8Cast = spec::is_fp8(C) && (F == WriteBug::kFp8FlushToZero ||
                                                            F == WriteBug::kRoundHalfAway);

/// 16-bit activations: 4 blocks of 256 per SM (64 registers, no spill); f32 ones need more.
/// F: the planted bug (kNone in production); kWrapNegativeSlots wraps -1 in strict mode too.
template <DType A, DType C, int U, WriteBug F>
__global__ void __launch_bounds__(kThreads, A == DType::kF32 ? 3 : 4)
    fused_write_kernel(const FusedParams p) {
  using Act = typename ActTraits<A>::T;
  // The K/V element type the stores encode: C, except that kE4m3IntoE5m2 writes e4m3 codes into
  // an e5m2 cache (vLLM's Triton wrapper maps every "fp8*" cache dtype to the platform's e4m3).
  constexpr DType kStored =
      F == WriteBug::kE4m3IntoE5m2 && C == DType::kFp8E5M2 ? DType::kFp8E4M3 : C;
  // Per token of the tile: element base of its (page, offset) in K and V (kSkip: nothing), and the
  // index-K destination: flat element base, or blockscale byte offsets of values and scales.
  __shared__ std::int64_t s_kv[kMaxTileTokens];
  __shared__ std::int64_t s_ix[kMaxTileTokens];
  __shared__ std::int64_t s_sc[kMaxTileTokens];
  // kTornWrapRace: per token, bit 0 set when no earlier token writes its K/V slot, bit 1 when no
  // later one does (a slot's only writer has both).
  __shared__ std::uint8_t s_role[F == WriteBug::kTornWrapRace ? kMaxTileTokens : 1];

  // Programmatic dependent launch: wait for the previous kernel of the stream (whose outputs may be
  // this layer's inputs) before the first read; let the next one start launching early when this
  // grid is resident at once (a large grid triggers at its end instead).
  if (p.pdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (p.pdl_early) asm volatile("griddepcontrol.launch_dependents;");
  }

  const std::int64_t t0 = static_cast<std::int64_t>(blockIdx.x) * p.tile_tokens;
  const std::int64_t left = p.num_tokens - t0;
  const auto n_tok = static_cast<std::uint32_t>(left < p.tile_tokens ? left : p.tile_tokens);
  const std::uint32_t ipt = p.items_per_token.div;
  const std::uint32_t n_items = n_tok * ipt;
  const std::int64_t row = static_cast<std::int64_t>(p.nkv) * p.hd;
  const Act* k = static_cast<const Act*>(p.k);
  const Act* v = static_cast<const Act*>(p.v);
  const Act* ik = static_cast<const Act*>(p.index_k);
  const bool wrap = p.legacy_wrap || F == WriteBug::kWrapNegativeSlots;

  // Blockscale groups: 16 lanes per 128-group, 16 groups per pass; the first pass's loads are
  // issued with the first K/V loads, before the barrier.
  const std::uint32_t lane16 = threadIdx.x & 15u;
  const std::uint32_t n_groups =
      p.index_mode == IndexMode::kBlockScale ? n_tok * static_cast<std::uint32_t>(p.groups) : 0u;
  auto group_src = [&](std::uint32_t gi, std::uint32_t& tt, std::uint32_t& g) {
    tt = p.groups_div.quo(gi);
    g = gi - tt * static_cast<std::uint32_t>(p.groups);
    return ik + (t0 + tt) * p.idim + g * spec::kScaleGroup + lane16 * kVec;
  };
  RawItem<A> group_raw;
  {
    const std::uint32_t gi = threadIdx.x / 16;
    std::uint32_t tt, g;
    if (gi < n_groups) load_raw<A>(group_src(gi, tt, g), group_raw);
  }

  for (std::uint32_t base = 0; base < n_items; base += kThreads * U) {
    ItemInfo info[U];
    RawItem<A> raw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::uint32_t j = base + threadIdx.x + u * kThreads;
      info[u].part = -1;
      if (j >= n_items) continue;
      const std::uint32_t tt = p.items_per_token.quo(j);
      const std::uint32_t r = j - tt * ipt;
      const std::int64_t t = t0 + tt;
      info[u].tt = tt;
      if (r < static_cast<std::uint32_t>(p.kv_items)) {
        const std::uint32_t kv = r >= p.row_items.div ? 1u : 0u;
        const std::uint32_t c = r - kv * p.row_items.div;
        info[u].part = static_cast<std::int32_t>(kv);
        info[u].c = c;
        const std::uint32_t h = p.per_head_scale ? p.head_items.quo(c) : 0u;
        info[u].s =
            effective_scale<A>(kv ? __ldg(p.v_scale + h) : __ldg(p.k_scale + h), p.scale_in_model);
        load_raw<A>((kv ? v : k) + t * row + c * kVec, raw[u]);
      } else {
        const std::uint32_t c = r - static_cast<std::uint32_t>(p.kv_items);
        info[u].part = 2;
        info[u].c = c;
        load_raw<A>(ik + t * p.idim + c * kVec, raw[u]);
      }
    }
    if (base == 0) {
      // Page and offset once per token (block-uniform branch: base is the same for all threads).
      if (threadIdx.x < n_tok) {
        const std::int64_t t = t0 + threadIdx.x;
        std::int64_t slot = load_slot(p.slots, p.slots_i64, t);
        if (wrap && slot < 0) slot += p.capacity;
        std::int64_t kv_base = kSkip;
        if (slot >= 0) {
          std::int64_t page, off;
          page_offset<F>(p, slot, page, off);
          kv_base = page * p.st.block + off * p.st.token;
        } else if constexpr (F == WriteBug::kTruncDivNegativeSlot) {
          std::int64_t page, off;
          page_offset_truncated(p, slot, page, off);
          kv_base = page * p.st.block + off * p.st.token;
        }
        s_kv[threadIdx.x] = kv_base;
        if constexpr (F == WriteBug::kTornWrapRace) {
          // Every other token's slot, resolved as this one's (quadratic: a planted bug only).
          std::uint8_t role = 3;
          for (std::int64_t t2 = 0; slot >= 0 && t2 < p.num_tokens; ++t2) {
            std::int64_t s2 = load_slot(p.slots, p.slots_i64, t2);
            if (wrap && s2 < 0) s2 += p.capacity;
            if (t2 != t && s2 == slot) role &= t2 < t ? 2 : 1;
          }
          s_role[threadIdx.x] = role;
        }
        std::int64_t ix = kSkip, sc = kSkip;
        if (p.index_mode != IndexMode::kNone) {
          std::int64_t islot =
              p.index_slots == p.slots ? slot : load_slot(p.index_slots, p.slots_i64, t);
          if (wrap && islot < 0) islot += p.capacity;
          if (islot >= 0 || F == WriteBug::kTruncDivNegativeSlot) {
            std::int64_t page, off;
            if (islot >= 0) {
              page_offset<F>(p, islot, page, off);
            } else {
              page_offset_truncated(p, islot, page, off);
            }
            // Blockscale: byte offsets of the row's values and scales; flat: element base.
            ix = page * p.index_block + off * p.index_token;
            if (p.index_mode == IndexMode::kBlockScale) {
              sc = page * p.index_block + p.block_size * p.idim + off * p.groups * 4;
            }
          }
        }
        s_ix[threadIdx.x] = ix;
        s_sc[threadIdx.x] = sc;
      }
      __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (info[u].part < 0) continue;
      float x[kVec];
      widen<A>(raw[u], x);
      if (info[u].part == 2) {
        const std::int64_t ix = s_ix[info[u].tt];
        if (ix == kSkip) continue;
        const std::int64_t e = ix + static_cast<std::int64_t>(info[u].c) * kVec;
        if (p.index_mode == IndexMode::kFlatBf16) {
          store8<DType::kBF16>(p.index_cache + e * 2, x, p.sat);
        } else {
          store8<DType::kFp8E4M3>(p.index_cache + e, x, p.sat);
        }
        continue;
      }
      const std::int64_t kvb = s_kv[info[u].tt];
      if (kvb == kSkip) continue;
      const std::uint32_t c = info[u].c;
      const std::uint32_t h = p.head_items.quo(c);
      const std::uint32_t d8 = c - h * p.head_items.div;
      std::int64_t e = kvb + h * p.st.head + d8 * kVec;
      if constexpr (F == WriteBug::kInt32Offset) {
        // int32 arithmetic: past element 2^31 the offset wraps negative, and the store would land
        // before the cache (another allocation, or a fault): dropped, as the CPU twin drops it.
        e = static_cast<std::int32_t>(static_cast<std::uint32_t>(e));
        if (e < 0) continue;
      }
      float y[kVec];
      scale8<A>(x, y, p.scale_mode, info[u].s, p.via_model);
      if constexpr (F == WriteBug::kDivApproxOneCodeBeyond) {
        if (p.scale_mode == ScaleMode::kDivApprox) {
#pragma unroll
          for (int i = 0; i < kVec; ++i)
            y[i] = one_code_beyond<A, C>(x[i], info[u].s, p.via_model, p.sat);
        }
      }
      std::uint8_t* dst =
          static_cast<std::uint8_t*>(info[u].part == 0 ? p.k_cache : p.v_cache) + e * kBytes<C>;
      if constexpr (kPlantedFp8Cast<C, F>) {
        std::uint32_t w[2] = {0u, 0u};
#pragma unroll
        for (int i = 0; i < kVec; ++i)
          w[i / 4] |= planted_fp8_code<C, F>(y[i], p.sat) << (8 * (i % 4));
        *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
        continue;
      }
      if constexpr (F == WriteBug::kTornWrapRace) {
        const std::uint8_t role = s_role[info[u].tt];
        if (role != 3) {  // a shared slot: the first writer's even bytes, the last writer's odd
          alignas(16) std::uint8_t whole[kVec * kBytes<C>];
          store8<kStored>(whole, y, p.sat);
          for (int b = 0; b < kVec * kBytes<C>; ++b) {
            if ((role >> (b % 2)) & 1) dst[b] = whole[b];
          }
          continue;
        }
      }
      store8<kStored>(dst, y, p.sat);
      if constexpr (F == WriteBug::kVectorTailOverrun) {
        // The head row's last item stored as a whole 16-byte vector: the bytes past the row's end
        // up to the next multiple of 16 (from the row's start) become zero.
        const auto tail = static_cast<int>(p.hd * kBytes<C> % 16);
        if (tail != 0 && d8 + 1 == p.head_items.div) {
          for (int b = 0; b < 16 - tail; ++b) dst[kVec * kBytes<C> + b] = 0;
        }
      }
    }
  }

  // Blockscale index-K: max over the half warp. The loop bound is block-uniform, so all 32 lanes of
  // every warp reach each shuffle.
  for (std::uint32_t gb = 0; gb < n_groups; gb += kThreads / 16) {
    const std::uint32_t gi = gb + threadIdx.x / 16;
    const bool active = gi < n_groups;
    float x[kVec];
    float amax = 0.0f;
    std::uint32_t tt = 0, g = 0;
    if (active) {
      const Act* src = group_src(gi, tt, g);
      if (gb != 0) load_raw<A>(src, group_raw);
      widen<A>(group_raw, x);
#pragma unroll
      for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, fabsf(x[i]));  // fmaxf drops NaN
    }
#pragma unroll
    for (int m = 8; m >= 1; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, m));
    if (!active) continue;
    const std::int64_t ix = s_ix[tt];
    if (ix == kSkip) continue;
    const float s =
        blockscale_scale(amax, p.blockscale_mul_recip, p.ue8m0, F != WriteBug::kZeroGroupScale);
    float y[kVec];
    divide8(x, y, s);
    store8_e4m3_words(p.index_cache + ix + g * spec::kScaleGroup + lane16 * kVec, y);
    if (lane16 == 0) *reinterpret_cast<float*>(p.index_cache + s_sc[tt] + g * 4) = s;
  }
  if (p.pdl && !p.pdl_early) asm volatile("griddepcontrol.launch_dependents;");
}

/// Launches one instantiation; with PDL through cudaLaunchKernelEx and the programmatic stream
/// serialization attribute (captured into a graph as a programmatic edge). A planted bug has the
/// kUnroll-item instantiation only (the 1-item one writes the same bytes, only sooner).
template <DType A, DType C, WriteBug F>
void launch_one(const FusedParams& p, dim3 grid, cudaStream_t stream) {
  auto kernel = fused_write_kernel<A, C, kUnroll, F>;
  if constexpr (F == WriteBug::kNone) {
    if (p.small) kernel = fused_write_kernel<A, C, 1, F>;
  }
  launch_kernel(kernel, p, grid, dim3(kThreads), stream);
}

template <DType A, WriteBug F>
void launch_for_act(const FusedParams& p, spec::DType cache, dim3 grid, cudaStream_t stream) {
  with_cache_format(cache, [&]<DType C>() { launch_one<A, C, F>(p, grid, stream); });
}

/// launch_fused_write (kvo/gpu/write.hpp) with bug F planted. F = kSwapHndNhd: the kernel is
/// given the strides of the layout with the token and head strides exchanged (HND for NHD, ...).
/// kSpecialised: production (F = kNone) sends the configurations decode_write_applies names to
/// the specialised kernel (write_decode.cuh); false keeps the generic one (the baseline it is
/// measured and tested against). Planted bugs live in the generic kernel.
template <WriteBug F, bool kSpecialised = true>
int launch_fused_write_t(const spec::ModelConfig& config, spec::LayerKind kind,
                         const DeviceWriteInputs& in, const DeviceLayerCaches& caches, void* stream,
                         bool pdl) {
  FusedParams p = make_params(config, kind, in, caches);
  if constexpr (F == WriteBug::kSwapHndNhd) {
    // kv_part, folded into v_cache by make_params, is the same in both layouts of a pair.
    const KvStrides swapped = kv_strides(config.geometry, spec::stride_swapped(config.layout));
    p.st.block = swapped.block;
    p.st.token = swapped.token;
    p.st.head = swapped.head;
  }
  if constexpr (F == WriteBug::kStridedAssumedDense) {
    // The view's strides and offset ignored: the layout's dense tensor from the buffer's start.
    const KvStrides dense = kv_strides(config.geometry, config.layout);
    const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(config.kv.cache_dtype));
    p.st = dense;
    p.k_cache = caches.k;
    // One allocation of nhd / hnd (no V pointer) taken for the dense [2, nb, ...] tensor.
    const std::int64_t v_part = spec::kv_in_one_tensor(config.layout) ? dense.kv_part
                                : caches.v == nullptr ? config.geometry.num_blocks * dense.block
                                                      : 0;
    p.v_cache = caches.v == nullptr
                    ? static_cast<void*>(static_cast<std::uint8_t*>(caches.k) + v_part * eb)
                    : caches.v;
    p.st.kv_part = 0;
    spec::ModelConfig dense_index = config;  // the index-K view's strides ignored likewise
    dense_index.index_strides = {};
    p.index_block = spec::index_view(dense_index).block;
    p.index_token = spec::index_view(dense_index).token;
  }
  if constexpr (F == WriteBug::kPerHeadScaleAsHead0) p.per_head_scale = false;
  // A bug of the host's arguments runs production's kernels.
  constexpr WriteBug kKernelBug =
      F == WriteBug::kStridedAssumedDense || F == WriteBug::kPerHeadScaleAsHead0 ? WriteBug::kNone
                                                                                 : F;
  if (p.num_tokens == 0) return 0;
  if constexpr (F == WriteBug::kNone && kSpecialised) {
    if (decode_write_applies(config, kind)) {
      p.pdl = pdl;
      launch_decode_write(config, p, static_cast<cudaStream_t>(stream));
      check_cuda(cudaGetLastError(), "launch of the fused write kernel");
      return 1;
    }
  }
  // Tile: enough tokens per block that each thread has a few items when the GPU is full, but no
  // more than one pass over the GPU's threads would give it (small calls: more, smaller blocks).
  const std::int64_t work = static_cast<std::int64_t>(p.items_per_token.div) +
                            (p.index_mode == IndexMode::kBlockScale ? p.groups * 16 : 0);
  const std::int64_t fill = static_cast<std::int64_t>(sm_count()) * 2048;
  const std::int64_t per_thread = std::clamp<std::int64_t>(p.num_tokens * work / fill, 1, kUnroll);
  p.tile_tokens = static_cast<std::int32_t>(
      std::clamp<std::int64_t>(kThreads * per_thread / work, 1, kMaxTileTokens));
  const std::int64_t blocks = (p.num_tokens + p.tile_tokens - 1) / p.tile_tokens;
  if (blocks > 0x7FFFFFFF) throw spec::Unsupported("more than 2^31 - 1 thread blocks");
  const dim3 grid(static_cast<unsigned>(blocks));
  p.pdl = pdl;
  p.small = per_thread == 1;
  p.pdl_early = blocks <= 2 * static_cast<std::int64_t>(sm_count());
  const auto s = static_cast<cudaStream_t>(stream);
  switch (config.act_dtype) {
    case DType::kF32:
      launch_for_act<DType::kF32, kKernelBug>(p, config.kv.cache_dtype, grid, s);
      break;
    case DType::kBF16:
      launch_for_act<DType::kBF16, kKernelBug>(p, config.kv.cache_dtype, grid, s);
      break;
    case DType::kF16:
      launch_for_act<DType::kF16, kKernelBug>(p, config.kv.cache_dtype, grid, s);
      break;
    default:
      throw spec::InvalidInput("act_dtype", -1, std::string(spec::name_of(config.act_dtype)),
                               "activations are f32, bf16 or fp16");
  }
  check_cuda(cudaGetLastError(), "launch of the fused write kernel");
  return 1;
}

}  // namespace kvo::gpu::detail
