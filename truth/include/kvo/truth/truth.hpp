#pragma once
/// \file truth.hpp
/// The float64 truth of the read side (Eigen, used nowhere else), and the error bounds derived for
/// float32 results: for the canonical order of SPEC 6 (what the bit-exact path may be off from the
/// truth), and for a foreign kernel that sums in any order and uses a hardware exp2 (what the
/// oracle's foreign mode accepts). Inputs are the same dequantized float32 values, widened exactly,
/// so the only difference is arithmetic. The rules that decide which tokens and blocks count
/// (n_valid, forced blocks, the per-head NaN rule, the group reduce) are the reference's own
/// (read_rules.hpp).

#include <cstdint>
#include <vector>

#include "kvo/reference/read_path.hpp"
#include "kvo/spec/read.hpp"

namespace kvo::truth {

/// Unit roundoff of float32 and gamma_n = n u / (1 - n u).
inline constexpr double kUnitRoundoff = 0x1p-24;
double gamma_n(double n);

/// Bound on |fl(dot(a, b)) - dot(a, b)| for n-element float32 vectors with sum_abs = sum |a_i b_i|.
double dot_error_bound(std::int64_t n, double sum_abs, spec::Ordering ordering);

/// Float64 attention with its per-element bound.
struct AttentionTruth {
  std::vector<double> out;    ///< [Tq, nq, hd]
  std::vector<double> bound;  ///< [Tq, nq, hd]: allowed |float32 result - out| before rounding
};

/// The same tokens, chunks and scales as reference::attention, in float64 with std::exp.
AttentionTruth attention_truth(const spec::ModelConfig& config, const spec::AttentionParams& params,
                               const spec::ReadBatch& batch, const spec::HostTensor& q,
                               const spec::LayerCaches& caches, const std::vector<float>& k_scale,
                               const std::vector<float>& v_scale,
                               const reference::TopkSelection* selection, spec::Ordering ordering);

/// Float64 group block scores of the indexer (after forcing), [Tq, nkv, max_blocks] as in
/// reference::TopkSelection::scores, and the bound on each float32 score. Each index head's block
/// score follows the NaN rule on its own; the group's is the max over its heads (SPEC 5).
struct ScoreTruth {
  std::vector<double> scores;
  std::vector<double> bound;
};
ScoreTruth indexer_truth(const spec::ModelConfig& config, const spec::IndexerParams& params,
                         const spec::ReadBatch& batch, const spec::HostTensor& index_q,
                         const spec::LayerCaches& caches, spec::Ordering ordering);

}  // namespace kvo::truth
