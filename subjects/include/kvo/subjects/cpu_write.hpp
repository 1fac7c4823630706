#pragma once
/// \file cpu_write.hpp
/// CPU emulations of the two write kernels of SPEC 4, written independently of the reference's
/// write and judged against it like any other subject (registered as `cpu-fused` and
/// `cpu-unfused`); all three must give identical bytes for every valid input:
///  - write_layer_fused: the fused kernel's structure (page and offset once per token, one stride
///    descriptor per layout, K, V and index-K in one pass);
///  - write_layer_unfused: the pre-fusion torch path (per tensor: division, remainder, index cast,
///    then an index_put through a strided view of the cache; 12 ops on a sparse layer, 8 on a
///    dense).
/// Each validates the whole call first (spec::validate_write, reference::check_layer_caches) and
/// writes nothing on bad input.

#include <cstdint>

#include "kvo/spec/config.hpp"
#include "kvo/spec/types.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::subjects {

/// Element strides of a K/V cache in the fused kernels' terms: element(b, o, h, kv, d) =
/// b*block + o*token + h*head + kv*kv_part + d, the innermost dimension contiguous (kv_part 0 where
/// K and V are separate tensors).
struct KvStrides {
  std::int64_t block, token, head, kv_part;
};
KvStrides kv_strides(const spec::CacheGeometry& geometry, spec::KvLayout layout);

/// The K and V bases of a layer's caches with their strides, as a fused kernel holds them: K of
/// (slot, h) at k + (token_offset(slot) + h*strides.head) elements, V at v + (token_offset(slot) +
/// h*strides.head + v_part).
struct KvView {
  std::uint8_t* k = nullptr;
  std::uint8_t* v = nullptr;  ///< == k where K and V share one tensor
  KvStrides strides{0, 0, 0, 0};
  std::int64_t v_part = 0;  ///< strides.kv_part where K and V share one tensor, else 0
  std::int64_t block_size = 1;

  /// Element offset of a (resolved, non-negative) slot's token: page and in-page offset once.
  std::int64_t token_offset(std::int64_t slot) const {
    const std::int64_t page = slot / block_size;
    return page * strides.block + (slot - page * block_size) * strides.token;
  }
};
/// Throws spec::InvalidInput when `caches` lacks the layout's K/V buffers.
KvView kv_view(const spec::ModelConfig& config, spec::LayerCaches& caches);

/// The slot a token writes: legacy_wrap sends a negative slot to slot + capacity; otherwise the
/// slot itself (negative: padding, nothing written).
std::int64_t resolve_slot(std::int64_t slot, std::int64_t capacity, spec::SlotMode mode);

/// What a real write kernel got wrong, or does differently (peer_findings.md), planted in the
/// fused model: the mutants' subjects, and kApproxDivision a legitimate div_approx kernel.
enum class WriteMutation : std::uint8_t {
  kNone,
  /// The quotient x / s moved by a deterministic 0..2 ulp (Triton's `/`, div.full.f32): correct
  /// under div_approx, a bug where exact division (divide) is promised.
  kApproxDivision,
  /// vLLM's Triton wrapper: e4m3 codes written into an fp8_e5m2 cache.
  kE4m3IntoE5m2,
  /// Triton's truncating `//` and `%` on slot -1 (no slot < 0 check): page 0, offset -1, so the
  /// padding rows land one token stride before page 0 (the guard band, or another head).
  kTruncatingMinusOne,
  /// SGLang's DeepSeek index-K quantizer: a NaN element becomes -448 (clamped before the cast)
  /// instead of the NaN code.
  kBlockscaleNanToMin,
  /// A kernel whose token loop returns at the first padding slot (`if (slot < 0) return;` written
  /// as a loop exit): the real tokens after a -1 are never written.
  kMinusOneStopsWrite,
  /// Per-head K/V scales read as head 0's (a scalar-scale kernel handed a per-head scale tensor).
  kPerHeadScaleAsHead0,
  /// fp8 subnormal results flushed to signed zero (a conversion compiled with flush-to-zero).
  kFp8FlushToZero,
  /// fp8 conversion rounding ties away from zero (round-half-away) where SPEC 2 rounds to even.
  kRoundHalfAway,
  /// A quantizer without the amax floor: an all-zero blockscale group gets scale 0 (the ue8m0
  /// floor class, vllm#53339), so its codes are 0/0 = NaN.
  kZeroGroupScale,
  /// Each K/V head row stored in 16-byte vectors with no tail case: where the row's bytes are not a
  /// multiple of 16, its last vector also stores zeros (the register's unused lanes) over the bytes
  /// past the row's end, which belong to the next head, token, V or the guard band.
  kVectorTailOverrun,
  /// A strided cache view (SPEC 3: padded blocks, tokens or heads, a sub-range of a pool) taken
  /// for the layout's dense tensor: its strides and offset ignored (flashinfer#527 class).
  kStridedAssumedDense,
  /// The token and head strides exchanged (flashinfer PR #527, LMCache#4463: HND taken for NHD),
  /// on dense layouts and strided views alike.
  kSwapTokenHeadStrides,
  /// K/V element offsets computed in int32 (a Triton kernel's `slot * stride` with int32 operands:
  /// vllm#50427, tokenspeed#501, ROCm/aiter#5765): past element 2^31 an offset wraps negative and
  /// the store lands before the cache (dropped here, as a store outside the buffer always is).
  kInt32Offset,
};

/// The CPU model of the fused one-launch kernel.
void write_layer_fused(const spec::ModelConfig& config, const spec::LayerWrite& write,
                       spec::LayerCaches& caches);
/// The same with a planted mutation.
void write_layer_fused_mutated(const spec::ModelConfig& config, const spec::LayerWrite& write,
                               spec::LayerCaches& caches, WriteMutation mutation);

/// The CPU model of the unfused path. Returns the number of tensor ops (launches) it modelled.
int write_layer_unfused(const spec::ModelConfig& config, const spec::LayerWrite& write,
                        spec::LayerCaches& caches);

}  // namespace kvo::subjects
