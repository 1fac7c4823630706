#pragma once
/// \file write_bench_setup.hpp
/// What every write benchmark point is, in one place: the flavours (cache dtype, scale mode, scale
/// value), the model configuration, the slot pattern and the bytes a fused write moves. Used by
/// bench_write_gpu (Google Benchmark) and by libkvo_bench_write (the C entry points through which
/// bench_write_peer.py times kvoracle's kernel next to the Triton peer), so both time the same
/// thing. Host code only.
///
/// Shape: 60 layers (3D57S), NKV 4, HD 128, index 1 x 128, block 128, bf16 activations, packed_hnd
/// caches ([nb, nkv, bs, 2*hd], the vLLM MiniMax-M3 layout), int64 slots.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string_view>
#include <vector>

#include "kvo/spec/config.hpp"

namespace kvo::bench {

/// One kind of write the benchmarks time. bf16: bf16 K/V, flat bf16 index-K. fp8: e4m3 K/V
/// (satfinite, the scale mode named, one per-tensor scale), blockscale ue8m0 fp8 index-K.
struct WriteFlavour {
  std::string_view name;
  bool fp8;
  spec::ScaleMode scale_mode;
  float scale;  ///< the K and V scale (0.37: a calibrated-looking one; 1.0: vLLM's default)
};

/// Every flavour, by index (bench_write_gpu's first argument, the C entry points' `flavour`):
/// the three scale modes a kernel may implement (different contracts: x / s, x * (1/s), x), and
/// divide by 1.0 (a power of two: the exact multiply path).
inline constexpr WriteFlavour kWriteFlavours[] = {
    {"bf16", false, spec::ScaleMode::kNone, 1.0f},
    {"fp8_divide", true, spec::ScaleMode::kDivide, 0.37f},
    {"fp8_divide_s1", true, spec::ScaleMode::kDivide, 1.0f},
    {"fp8_mul_recip", true, spec::ScaleMode::kMulRecip, 0.37f},
    {"fp8_none", true, spec::ScaleMode::kNone, 1.0f},
};
inline constexpr int kNumWriteFlavours = static_cast<int>(std::size(kWriteFlavours));
inline constexpr std::int64_t kBenchBlockSize = 128;
inline constexpr std::int64_t kBenchKvHeads = 4;
inline constexpr std::int64_t kBenchHeadDim = 128;
inline constexpr std::int64_t kBenchIndexDim = 128;

/// Blocks per layer cache at `tokens`: >= 512 (caches as cold as a serving engine's), enough for
/// prefill runs; `hot`: 16 (4.5 MB bf16), a diagnostic of how much of a small call is cold pages.
inline std::int64_t bench_num_blocks(std::int64_t tokens, bool hot = false) {
  if (hot) return 16;
  return std::max<std::int64_t>(512, (tokens + kBenchBlockSize - 1) / kBenchBlockSize + 32);
}

inline spec::ModelConfig write_bench_config(const WriteFlavour& f, std::int64_t num_blocks) {
  spec::ModelConfig c;
  c.layers = spec::parse_layer_mix(spec::kDefaultLayerMix);
  c.geometry = {num_blocks, kBenchBlockSize, kBenchKvHeads, kBenchHeadDim, kBenchIndexDim};
  c.act_dtype = spec::DType::kBF16;
  c.layout = spec::KvLayout::kPackedHnd;
  c.slot_type = spec::SlotType::kI64;
  if (f.fp8) {
    c.kv.cache_dtype = spec::DType::kFp8E4M3;
    c.kv.scale_mode = f.scale_mode;
    c.index.layout = spec::IndexLayout::kBlockScale;
    c.index.ue8m0 = true;
  } else {
    c.kv.cache_dtype = spec::DType::kBF16;
    c.kv.scale_mode = f.scale_mode;
    c.index.layout = spec::IndexLayout::kFlat;
    c.index.flat_dtype = spec::DType::kBF16;
  }
  spec::validate(c);
  return c;
}

/// The slot of each of `tokens` tokens in a cache of `num_blocks` blocks: decode-like (each token
/// its own block, offsets scattered) up to 256 tokens, prefill-like (runs of 128 consecutive
/// slots in shuffled blocks) beyond; `hot`: round-robin over the 16 blocks.
inline std::vector<std::int64_t> bench_slots(std::int64_t tokens, std::int64_t num_blocks,
                                             bool hot = false) {
  const std::int64_t bs = kBenchBlockSize;
  std::vector<std::int64_t> perm(static_cast<std::size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(42));
  std::vector<std::int64_t> slots(static_cast<std::size_t>(tokens));
  for (std::int64_t t = 0; t < tokens; ++t) {
    slots[static_cast<std::size_t>(t)] =
        hot             ? perm[static_cast<std::size_t>(t % num_blocks)] * bs + t / num_blocks
        : tokens <= 256 ? perm[static_cast<std::size_t>(t)] * bs + (t * 37) % bs
                        : perm[static_cast<std::size_t>(t / bs)] * bs + t % bs;
  }
  return slots;
}

/// Bytes a fused write of one layer reads and writes: K and V rows (bf16) and their slots read,
/// the cache rows written; on a sparse layer the index-K row read and its row (and scale) written.
inline double bench_layer_bytes(const WriteFlavour& f, spec::LayerKind kind, std::int64_t tokens) {
  const double row = static_cast<double>(kBenchKvHeads * kBenchHeadDim);
  const double cache_elem = f.fp8 ? 1.0 : 2.0;
  const double t = static_cast<double>(tokens);
  double bytes = t * (2.0 * row * 2.0 + 8.0) + t * 2.0 * row * cache_elem;
  if (kind == spec::LayerKind::kSparse) {
    const double index_written = f.fp8 ? t * (kBenchIndexDim + 4.0) : t * kBenchIndexDim * 2.0;
    bytes += t * kBenchIndexDim * 2.0 + index_written;
  }
  return bytes;
}

}  // namespace kvo::bench
