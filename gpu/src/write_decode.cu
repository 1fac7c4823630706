// The fused write's specialised kernel (write_decode.cuh): which calls take it, its tile, and the
// 36 instantiations (activation x cache dtype x scale mode x index layout), plus the 6 of divide
// on bf16 that check their scales for the two-operation division.
#include <algorithm>

#include "write_decode.cuh"

namespace kvo::gpu::detail {

namespace {

/// Threads of one block: one per K/V item of a token, rounded up to whole warps, then (a layer with
/// an index-K row) one per index-K item, rounded up likewise: the index warps.
std::int64_t decode_threads(std::int64_t kv_items, std::int64_t index_items) {
  return (kv_items + 31) / 32 * 32 + (index_items + 31) / 32 * 32;
}

}  // namespace

bool decode_write_applies(const spec::ModelConfig& c, spec::LayerKind kind) {
  const bool sparse = kind == spec::LayerKind::kSparse;
  const bool index_ok = !sparse || c.index.layout == spec::IndexLayout::kBlockScale ||
                        c.index.flat_dtype == spec::DType::kBF16;
  const spec::CacheGeometry& g = c.geometry;
  const std::int64_t threads =
      decode_threads(2 * g.num_kv_heads * g.head_dim / kVec, sparse ? g.index_dim / kVec : 0);
  return (c.act_dtype == DType::kBF16 || c.act_dtype == DType::kF16) &&
         (c.kv.cache_dtype == DType::kBF16 ||
          (c.kv.cache_dtype == DType::kFp8E4M3 && c.kv.saturation == Saturation::kSatFinite)) &&
         (c.kv.scale_mode == ScaleMode::kNone || c.kv.scale_mode == ScaleMode::kDivide ||
          c.kv.scale_mode == ScaleMode::kMulRecip) &&
         !c.kv.via_model_dtype && !c.kv.scale_in_model_dtype &&
         c.slot_mode == spec::SlotMode::kStrict && index_ok && threads <= 1024;
}

namespace {

/// The instantiation of (A, C, S, X): divide on bf16 with p.recip_pair_check takes the one that
/// checks its scales first.
template <DType A, DType C, ScaleMode S, IndexMode X>
void launch_instance(const FusedParams& p, dim3 grid, dim3 block, cudaStream_t s) {
  if constexpr (S == ScaleMode::kDivide && A == DType::kBF16) {
    if (p.recip_pair_check)
      return launch_kernel(fused_write_decode_kernel<A, C, S, X, true>, p, grid, block, s);
  }
  launch_kernel(fused_write_decode_kernel<A, C, S, X, false>, p, grid, block, s);
}

template <DType A, DType C, ScaleMode S>
void by_index(const FusedParams& p, dim3 grid, dim3 block, cudaStream_t s) {
  switch (p.index_mode) {
    case IndexMode::kNone:
      return launch_instance<A, C, S, IndexMode::kNone>(p, grid, block, s);
    case IndexMode::kFlatBf16:
      return launch_instance<A, C, S, IndexMode::kFlatBf16>(p, grid, block, s);
    case IndexMode::kBlockScale:
      return launch_instance<A, C, S, IndexMode::kBlockScale>(p, grid, block, s);
    case IndexMode::kFlatFp8:
      break;  // not an instantiation (decode_write_applies)
  }
  throw spec::Unsupported("the specialised fused write has no fp8 flat index-K instantiation");
}

template <DType A, DType C>
void by_scale(const FusedParams& p, dim3 grid, dim3 block, cudaStream_t s) {
  switch (p.scale_mode) {
    case ScaleMode::kNone:
      return by_index<A, C, ScaleMode::kNone>(p, grid, block, s);
    case ScaleMode::kDivide:
      return by_index<A, C, ScaleMode::kDivide>(p, grid, block, s);
    case ScaleMode::kMulRecip:
      return by_index<A, C, ScaleMode::kMulRecip>(p, grid, block, s);
    case ScaleMode::kDivApprox:
      break;
  }
  throw spec::Unsupported("the specialised fused write has no div_approx instantiation");
}

template <DType A>
void by_cache(DType cache, const FusedParams& p, dim3 grid, dim3 block, cudaStream_t s) {
  if (cache == DType::kFp8E4M3) return by_scale<A, DType::kFp8E4M3>(p, grid, block, s);
  return by_scale<A, DType::kBF16>(p, grid, block, s);
}

}  // namespace

void launch_decode_write(const spec::ModelConfig& config, FusedParams p, cudaStream_t stream) {
  const std::int64_t threads =
      decode_threads(p.kv_items, p.index_mode == IndexMode::kNone ? 0 : p.idim / kVec);
  // Tokens per block: one while the grid is at most one GPU-full of blocks; past that up to
  // kDecodeMaxTile, so each thread keeps several 16-byte loads in flight.
  const std::int64_t resident = static_cast<std::int64_t>(sm_count()) * (2048 / threads);
  p.tile_tokens = static_cast<std::int32_t>(
      std::clamp<std::int64_t>((p.num_tokens + resident - 1) / resident, 1, kDecodeMaxTile));
  const std::int64_t blocks = (p.num_tokens + p.tile_tokens - 1) / p.tile_tokens;
  if (blocks > 0x7FFFFFFF) throw spec::Unsupported("more than 2^31 - 1 thread blocks");
  // divide on bf16 activations, 4 tokens a thread: each warp checks its scales once (4 trials a
  // lane where its lanes share one) and then divides in two operations an element instead of
  // five, a saving that one token a thread would not repay.
  p.recip_pair_check = p.scale_mode == ScaleMode::kDivide && config.act_dtype == DType::kBF16 &&
                       p.tile_tokens == kDecodeMaxTile;
  p.pdl_early = blocks <= 2 * static_cast<std::int64_t>(sm_count());
  const dim3 grid(static_cast<unsigned>(blocks)), block(static_cast<unsigned>(threads));
  if (config.act_dtype == DType::kF16) {
    by_cache<DType::kF16>(config.kv.cache_dtype, p, grid, block, stream);
  } else {
    by_cache<DType::kBF16>(config.kv.cache_dtype, p, grid, block, stream);
  }
}

}  // namespace kvo::gpu::detail
