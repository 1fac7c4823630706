#pragma once
/// \file dense_insert.hpp
/// The reference of the dense-layer fused insert (SPEC 4): Gemma RMSNorm + partial NeoX RoPE of q
/// and k per token and head, then the SPEC 4 insert of k and v.

#include <cstdint>
#include <vector>

#include "kvo/reference/layer_write.hpp"
#include "kvo/spec/dense_insert.hpp"

namespace kvo::reference {

/// Per token t (all T of the slot mapping, padding included for q) and head, on x widened to fp32:
///   ms = fl(tree_sum(fl(x_i * x_i)) / hd); r = fl(1 / fl(sqrt(fl(ms + eps))));
///   y_i = fl(fl(x_i * r) * fl(1 + w_i));
///   for i < rotary_dim / 2 (c, s from row positions[t]): y_i' = fma(y_i, c, -fl(y_j * s)),
///   y_j' = fma(y_j, c, fl(y_i * s)) with j = i + rotary_dim / 2.
/// q: the result rounded to the activation dtype, returned as [T, nq, hd]. k: the result, v: the
/// input, inserted per slot as write_layer does (scale, via_model_dtype, cast; padding skipped).
spec::HostTensor dense_insert(const spec::ModelConfig& config, const spec::DenseInsert& in,
                              spec::LayerCaches& caches);

/// The codes SPEC 7 admits at one K or V element after dense_insert (as admissible_codes does for
/// write_layer): over every token that lands on its slot, the admissible codes of that token's
/// value there (k after the norm and rope, v as given). Empty when no token writes it.
std::vector<std::uint32_t> admissible_dense_codes(const spec::ModelConfig& config,
                                                  const spec::DenseInsert& in,
                                                  const CacheElement& element);

}  // namespace kvo::reference
