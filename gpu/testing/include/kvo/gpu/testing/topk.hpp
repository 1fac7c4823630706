#pragma once
/// \file topk.hpp
/// The indexer's block top-k selection (gpu/src/topk.cuh) launched alone, on given scores, so that
/// it can be tested without the score kernel. Target kvo_gpu_testing. No CUDA types here.
///
/// Per row r: the blocks j < n_valid[r] of scores [rows, n] are ordered by (score descending, id
/// ascending; -0 equals +0); the first k_eff = min(topk, n_valid[r]) are written to ids [rows,
/// topk] ascending (kCanonical, SPEC 5) or best first (kFast), then -1 up to topk.

#include <cstdint>
#include <vector>

#include "kvo/gpu/read.hpp"

namespace kvo::gpu::testing {

/// Device pointers: scores [rows, n] floats (no NaN), n_valid [rows] int32 in [0, n], ids [rows,
/// topk]. Limits: n <= 16384, 1 <= topk <= 2048, rows <= 65535 (else spec::Unsupported). Launches
/// on `stream` (a cudaStream_t) without synchronising.
/// `fused_heads` 0: the two-launch path's selection kernel (a CUDA block a row); h > 0: the
/// one-launch indexer's selection (its last CUDA block of a query row, which selects the row's KV
/// heads), a CUDA block per h consecutive rows, which must share n_valid (rows a multiple of h; n
/// <= 4096, the one launch's limit).
void launch_block_topk(const float* scores, const std::int32_t* n_valid, std::int64_t rows,
                       std::int64_t n, std::int64_t topk, std::int32_t* ids, ReadKernel kernel,
                       void* stream, std::int64_t fused_heads = 0);

/// The same on host vectors (validated first: sizes, n_valid range, no NaN score, the fused heads'
/// rows sharing n_valid, spec::InvalidInput otherwise); synchronous. Returns ids [rows, topk].
std::vector<std::int32_t> block_topk_host(const std::vector<float>& scores, std::int64_t rows,
                                          std::int64_t n, const std::vector<std::int32_t>& n_valid,
                                          std::int64_t topk,
                                          ReadKernel kernel = ReadKernel::kCanonical,
                                          std::int64_t fused_heads = 0);

}  // namespace kvo::gpu::testing
