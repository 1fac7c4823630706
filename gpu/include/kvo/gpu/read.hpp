#pragma once
/// \file read.hpp
/// The read side on the GPU in the canonical order of SPEC 5-6 (bit-exact with the reference):
/// the indexer with block top-k, and sparse or dense attention, over the paged caches of one sparse
/// layer read through block tables. Host-memory entry points: inputs are validated on the host
/// before anything is copied or launched (spec::InvalidInput), CUDA errors become
/// spec::FailedToRun, and sizes past the kernels' limits are spec::Unsupported. No CUDA types in
/// this header.

#include <cstdint>
#include <vector>

#include "kvo/spec/read.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::gpu {

/// SPEC 5: ids [Tq, nkv, topk], the chosen logical blocks ascending, then -1.
/// index_q: [Tq, num_index_heads, index_dim] in the activation dtype; caches: the sparse layer's.
std::vector<std::int32_t> indexer_topk_host(const spec::ModelConfig& config,
                                            const spec::IndexerParams& params,
                                            const spec::ReadBatch& batch,
                                            const spec::HostTensor& index_q,
                                            const spec::LayerCaches& caches);

/// SPEC 6: out [Tq, nq, hd] in params.out_dtype. q: [Tq, nq, hd] in the activation dtype.
/// `selection`: [Tq, nkv, topk] logical block ids (-1 unused; distinct and below n_valid), or empty
/// for dense attention over every token t <= p.
spec::HostTensor attention_host(const spec::ModelConfig& config,
                                const spec::AttentionParams& params, const spec::ReadBatch& batch,
                                const spec::HostTensor& q, const spec::LayerCaches& caches,
                                const std::vector<float>& k_scale,
                                const std::vector<float>& v_scale,
                                const std::vector<std::int32_t>& selection, std::int64_t topk);

}  // namespace kvo::gpu
