#pragma once
/// \file cpu_dense.hpp
/// cpu-dense: the dense-layer fused insert (SPEC 4: Gemma RMSNorm + partial NeoX RoPE of q and k,
/// then the insert of k and v) in the structure of a fused kernel (32 lanes per head vector, a
/// shuffle-down tree, one stride descriptor), written apart from the reference and bit-identical
/// to it. Bugs can be planted (DenseMutation), each one a real engine's confusion.

#include "kvo/spec/config.hpp"
#include "kvo/spec/dense_insert.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::subjects {

/// Bugs that can be planted in the CPU dense insert.
struct DenseMutation {
  bool gptj_rope = false;           ///< interleaved pairs (2i, 2i+1) where NeoX is declared
  bool norm_without_one = false;    ///< y = x * r * w (Llama) where Gemma's (1 + w) is declared
  bool eps_outside_sqrt = false;    ///< r = 1 / (sqrt(ms) + eps)
  bool fp8_store_unscaled = false;  ///< K/V stored with scale 1 whatever the scales say
  float eps_factor = 1.0f;          ///< eps times this (1e-5 where 1e-6 is declared: 10)
  /// RoPE over the last rotary_dim dims (a rope-last layout, as DeepSeek MLA's k_pe) where SPEC 4
  /// rotates dims [0, rotary_dim)
  bool rope_over_tail_dims = false;
};

/// How the norm and rope are computed. kCanonical: SPEC 4 bit for bit. kEngine: the arithmetic of
/// vLLM's fused qknorm + rope + insert kernel, the same meaning in another order: each of 32 lanes
/// squares its contiguous elements with fma, an xor butterfly sums the lanes, the reciprocal square
/// root is approximate (rsqrtf, emulated: the correctly rounded one moved up one ulp when the
/// argument's last bit is odd, within its 2 ulp), and the rope is x1 * c - x2 * s without fma.
/// Judged against the float64 truth by admissible sets (SPEC 4, foreign).
enum class DenseArithmetic : std::uint8_t { kCanonical, kEngine };

/// Inserts k and v into `caches` (guards included) and returns q_out [T, nq, hd]. Validates the
/// whole call first and writes nothing on bad input.
spec::HostTensor dense_insert_fused(const spec::ModelConfig& config, const spec::DenseInsert& in,
                                    spec::LayerCaches& caches, const DenseMutation& mutation = {},
                                    DenseArithmetic arithmetic = DenseArithmetic::kCanonical);

}  // namespace kvo::subjects
