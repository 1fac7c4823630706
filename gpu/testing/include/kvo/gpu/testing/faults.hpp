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
};

/// Bugs planted in the fast read family (ReadKernel::kFast), which the foreign mode must reject.
enum class ReadFault : std::uint8_t {
  kIgnoreLocal,  ///< indexer: the local (current) block is not forced
  kExpNoLog2e,   ///< attention: exp2(s) where exp2(s * log2(e)) is meant (a base-2 softmax)
};

/// write_layer_host with `fault` planted in the fused kernel. WritePath::kUnfused has no planted
/// bugs: spec::Unsupported.
void write_layer_host_faulty(WriteFault fault, WritePath path, const spec::ModelConfig& config,
                             const spec::LayerWrite& write, spec::LayerCaches& caches);

/// indexer_topk_host with `fault` planted; `kernel` must be kFast (else spec::Unsupported).
std::vector<std::int32_t> indexer_topk_host_faulty(ReadFault fault, const spec::ModelConfig& config,
                                                   const spec::IndexerParams& params,
                                                   const spec::ReadBatch& batch,
                                                   const spec::HostTensor& index_q,
                                                   const spec::LayerCaches& caches,
                                                   ReadKernel kernel = ReadKernel::kFast);

/// attention_host with `fault` planted; `kernel` must be kFast (else spec::Unsupported).
spec::HostTensor attention_host_faulty(ReadFault fault, const spec::ModelConfig& config,
                                       const spec::AttentionParams& params,
                                       const spec::ReadBatch& batch, const spec::HostTensor& q,
                                       const spec::LayerCaches& caches,
                                       const std::vector<float>& k_scale,
                                       const std::vector<float>& v_scale,
                                       const std::vector<std::int32_t>& selection,
                                       std::int64_t topk, ReadKernel kernel = ReadKernel::kFast);

}  // namespace kvo::gpu::testing
