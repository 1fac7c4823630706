#pragma once
/// \file faults.hpp
/// Bugs planted in the CUDA kernels, for the oracle's self-tests (its mutants, tests/gpu): the
/// oracle must reject each, and name the right layer, buffer, block, offset, head and dim for the
/// write bugs. Target kvo_gpu_testing (built with CUDA only); production code links kvo_gpu, whose
/// public API (kvo/gpu/write.hpp, kvo/gpu/read.hpp) has no fault parameter. Each bug is a template
/// parameter of its kernel, instantiated here and not in kvo_gpu.
///
/// Each entry point is its production twin (same validation, copies and errors) with the bug
/// planted; a bug outside the called op (kExpNoLog2e on the indexer, kIgnoreLocal on attention)
/// leaves it as in production. No CUDA types in this header.

#include <cstdint>
#include <vector>

#include "kvo/gpu/read.hpp"
#include "kvo/gpu/write.hpp"

namespace kvo::gpu::testing {

/// Bugs planted in the fused write kernel.
enum class WriteFault : std::uint8_t {
  kWrapNegativeSlots,  ///< a padding slot -1 wraps to the last slot, as torch indexing does
  kOffsetPlusOne,      ///< K/V/index rows land one offset further into the block
  kSwapHndNhd,         ///< the kernel uses the HND strides for an NHD cache and vice versa
  /// "div_approx_one_code_beyond": in div_approx mode every K/V element (but a NaN quotient) is
  /// stored one code outside its admissible set: the code of the quotient 2 ulp away from zero,
  /// one magnitude further out (or, where that is no finite code, the code of the quotient 2 ulp
  /// toward zero, one magnitude further in). Passes a judge whose sets are one code too wide;
  /// other scale modes as in production.
  kDivApproxOneCodeBeyond,
  /// "e4m3_into_e5m2": an fp8_e5m2 K/V cache receives e4m3 codes (vLLM's Triton KV write maps
  /// every "fp8*" cache dtype to the platform's e4m3); other cache dtypes as in production.
  kE4m3IntoE5m2,
  /// "trunc_div_negative_slot": a padding slot (< 0) is decoded with truncating division, as
  /// Triton's `//` and `%` do: slot -1 is page 0, offset -1, so its K/V (and index-K) row is
  /// written one token stride before page 0's first token: into the leading guard band (NHD), or
  /// over the previous head's last token (HND) or K's last token (V of split layouts).
  kTruncDivNegativeSlot,
  /// "strided_assumed_dense": a strided cache view (SPEC 3) addressed as the layout's dense
  /// tensor from the buffer's start (its strides and offset ignored); dense caches as in
  /// production.
  kStridedAssumedDense,
  /// "per_head_scale_as_head_0": per-head K/V scales read as head 0's (a kernel written for one
  /// scale per tensor handed a per-head scale tensor); per-tensor scales as in production.
  kPerHeadScaleAsHead0,
  /// "int32_offset": K/V element offsets computed in int32 (vllm#50427 class): a store past
  /// element 2^31 of a huge cache wraps negative and is lost; smaller caches as in production.
  kInt32Offset,
  /// "zero_group_scale": the blockscale index-K quantizer without the amax floor (vllm#53339's
  /// class): an all-zero group gets scale 0 and NaN codes.
  kZeroGroupScale,
  /// "minus_one_stops_write": a token loop that exits at the first padding slot: the tokens after
  /// the first -1 are never written (the call's mapping cut there on the host, production's
  /// kernel run on the rest: the same bytes).
  kMinusOneStopsWrite,
  /// "fp8_flush_to_zero": an fp8 K/V cast compiled with flush-to-zero: a subnormal code becomes
  /// the signed zero; other cache dtypes as in production.
  kFp8FlushToZero,
  /// "round_half_away": an fp8 K/V cast that rounds a tie away from zero where SPEC 2 rounds to
  /// even; other cache dtypes as in production.
  kRoundHalfAway,
  /// "vector_tail_overrun": a head row stored with 16-byte vectors and no tail case: a row whose
  /// bytes are 8 modulo 16 (fp8, head_dim 8 modulo 16) also stores 8 zero bytes past its end.
  kVectorTailOverrun,
  /// "torn_wrap_race": a K/V slot that several tokens write (legacy_wrap's -1 onto a real slot) is
  /// settled per byte, not per element: its even bytes the first writer's (token order), its odd
  /// bytes the last writer's. SPEC 3 admits any one writer per element; a 16-bit or f32 element
  /// with bytes of two writers is none of them. (Production resolves a colliding mapping on the
  /// host, write_host.cu; this fault hands it to the kernel unresolved.)
  kTornWrapRace,
};

/// Bugs planted in the fast read family (ReadKernel::kFast) and in the flash family
/// (flash_attention_host), which the foreign mode must reject, and in the selection of either
/// family (kTiesToHigherId: the canonical one is judged bit for bit).
enum class ReadFault : std::uint8_t {
  kIgnoreLocal,          ///< indexer: the local (current) block is not forced
  kTiesToHigherId,       ///< top-k: an exact tie won by the higher block id (SPEC 5: the lower)
  kExpNoLog2e,           ///< attention: exp2(s) where exp2(s * log2(e)) is meant (a base-2 softmax)
  kIdsWrapAt1024,        ///< indexer: ids stored in 10 bits (a short path past 1024 blocks)
  kFlashDropChunkLast,   ///< flash: spec::AttentionBug::kDropChunkLast
  kFlashScaleOff,        ///< flash: spec::AttentionBug::kScaleOff
  kFlashNeighbourV,      ///< flash: spec::AttentionBug::kNeighbourV
  kFlashStopAtMinusOne,  ///< flash: spec::AttentionBug::kStopAtMinusOne
  kFlashMaskedChunkNan,  ///< flash: spec::AttentionBug::kMaskedChunkNan
};

/// Bugs planted in the dense insert kernel (the twins of the CPU subjects' DenseMutation).
enum class DenseFault : std::uint8_t {
  kGptjRope,          ///< GPT-J pairs (2i, 2i + 1) where NeoX is declared
  kNormWithoutOne,    ///< x * r * w where Gemma's x * r * (1 + w) is declared
  kEpsOff,            ///< eps times 10
  kFp8StoreUnscaled,  ///< K and V stored with scale 1 whatever the scales say
  kRopeOverTailDims,  ///< the rope over the last rotary_dim dims
};

/// dense_insert_host (`engine` false) or dense_insert_engine_host (true) with `fault` planted.
spec::HostTensor dense_insert_host_faulty(DenseFault fault, bool engine,
                                          const spec::ModelConfig& config,
                                          const spec::DenseInsert& in, spec::LayerCaches& caches);

/// write_layer_host with `fault` planted in the fused kernel. WritePath::kUnfused has no planted
/// bugs: spec::Unsupported.
void write_layer_host_faulty(WriteFault fault, WritePath path, const spec::ModelConfig& config,
                             const spec::LayerWrite& write, spec::LayerCaches& caches);

/// indexer_topk_host with `fault` planted; `kernel` must be kFast (else spec::Unsupported) but for
/// kTiesToHigherId. `scores`: the block scores too, as indexer_selection_host gives them.
std::vector<std::int32_t> indexer_topk_host_faulty(
    ReadFault fault, const spec::ModelConfig& config, const spec::IndexerParams& params,
    const spec::ReadBatch& batch, const spec::HostTensor& index_q, const spec::LayerCaches& caches,
    ReadKernel kernel = ReadKernel::kFast, BlockScores* scores = nullptr);

/// attention_host with `fault` planted: an attention bug of the fast family (`kernel` must be
/// kFast) or, for the indexer's bugs, attention as in production; a flash fault is
/// spec::Unsupported.
spec::HostTensor attention_host_faulty(ReadFault fault, const spec::ModelConfig& config,
                                       const spec::AttentionParams& params,
                                       const spec::ReadBatch& batch, const spec::HostTensor& q,
                                       const spec::LayerCaches& caches,
                                       const std::vector<float>& k_scale,
                                       const std::vector<float>& v_scale,
                                       const std::vector<std::int32_t>& selection,
                                       std::int64_t topk, ReadKernel kernel = ReadKernel::kFast);

/// flash_attention_host with `fault` planted; `fault` must be a kFlash one (else
/// spec::Unsupported).
spec::HostTensor flash_attention_host_faulty(
    ReadFault fault, const spec::ModelConfig& config, const spec::AttentionParams& params,
    const spec::ReadBatch& batch, const spec::HostTensor& q, const spec::LayerCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk);

/// flash_attention_host with the decode kernels running `per_block` (>= 1, clamped to the
/// kernel's most, else spec::Unsupported) chunk slots a CUDA block, pipelined, whatever the launch
/// would choose: the output must be the same bits as the production launch's (each slot's partial
/// result is computed alone whichever block runs it).
spec::HostTensor flash_attention_host_slots_per_block(
    int per_block, const spec::ModelConfig& config, const spec::AttentionParams& params,
    const spec::ReadBatch& batch, const spec::HostTensor& q, const spec::LayerCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk);

/// The specialised chunk kernel's run length (attention_decode.cuh's decode_run_length): flattened
/// chunk slots a CUDA block runs, of `total`, on `sms` multiprocessors of `blocks_per_sm` blocks,
/// at most `most`, `forced` where > 0.
int decode_run_length(long long total, long long sms, int blocks_per_sm, int most, int forced);

/// attention_host (canonical or fast family) likewise, for the specialised chunk kernel
/// (attention_decode.cuh); calls it does not take run as in production.
spec::HostTensor attention_host_slots_per_block(
    int per_block, const spec::ModelConfig& config, const spec::AttentionParams& params,
    const spec::ReadBatch& batch, const spec::HostTensor& q, const spec::LayerCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk, ReadKernel kernel);

}  // namespace kvo::gpu::testing
