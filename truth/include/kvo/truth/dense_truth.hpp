#pragma once
/// \file dense_truth.hpp
/// The float64 truth of the dense-layer fused insert (SPEC 4: Gemma RMSNorm, then partial NeoX
/// RoPE) and the bound a foreign kernel's float32 result must meet (SPEC 4 last sentences): any
/// summation order of the squares, the reciprocal square root within 2 ulp (CUDA's rsqrtf), the
/// products and the rope with or without fma. The derivation is at the top of src/dense_truth.cpp.

#include <cstdint>
#include <vector>

#include "kvo/spec/dense_insert.hpp"

namespace kvo::truth {

/// q after the norm and rope, [T, nq, hd], and k after them, [T, nkv, hd] (T = the slot mapping's
/// length, padding rows included for q), each value with the largest |float32 result - value| a
/// foreign kernel may have before the final rounding or quantization.
struct DenseTruth {
  std::vector<double> q, q_bound;  ///< [T, nq, hd]
  std::vector<double> k, k_bound;  ///< [T, nkv, hd]
};

/// The same inputs as reference::dense_insert (widened exactly), in float64.
DenseTruth dense_truth(const spec::ModelConfig& config, const spec::DenseInsert& in);

}  // namespace kvo::truth
