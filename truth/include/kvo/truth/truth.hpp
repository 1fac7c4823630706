#pragma once
/// \file truth.hpp
/// The float64 truth of the read side (Eigen, used nowhere else), and the error bounds derived for
/// float32 results: for the canonical order of SPEC 6 (what the bit-exact path may be off from the
/// truth), and for a foreign kernel of a declared arithmetic profile (fp32 in any order with a
/// hardware exp2, or flash-style with P and the operands in bf16/fp16: spec::profile_facts), which
/// is what the oracle's foreign mode accepts. Inputs are the same dequantized float32 values,
/// widened exactly, so the only difference is arithmetic. The rules that decide which tokens and
/// blocks count (n_valid, forced blocks, the per-head NaN rule, the group reduce) are the
/// reference's own (read_rules.hpp).

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

/// One planted bug's float64 output (spec::AttentionBug), [Tq, nq, hd] like AttentionTruth::out.
struct PlantedOutput {
  spec::AttentionBug bug = spec::AttentionBug::kNone;
  std::vector<double> out;
};

/// Float64 attention with its per-element bound.
struct AttentionTruth {
  spec::Ordering ordering = spec::Ordering::kCanonical;
  spec::AttentionProfile profile = spec::AttentionProfile::kFp32;  ///< foreign: the bound's
  std::vector<double> out;                                         ///< [Tq, nq, hd]
  std::vector<double> bound;  ///< [Tq, nq, hd]: allowed |float32 result - out| before rounding
  /// Foreign only: every numeric bug of spec::AttentionBug (spec::bug_is_numeric) in the same
  /// float64 arithmetic, so that the oracle can say when this case's bound cannot see one (SPEC
  /// principle 4).
  std::vector<PlantedOutput> planted;
};

/// The same tokens, chunks and scales as reference::attention, in float64 with std::exp. The bound
/// is the canonical order's, or (foreign) that of a kernel with the arithmetic profile `profile`
/// (spec::profile_facts); a canonical ordering takes the fp32 profile only (else
/// std::invalid_argument).
AttentionTruth attention_truth(const spec::ModelConfig& config, const spec::AttentionParams& params,
                               const spec::ReadBatch& batch, const spec::HostTensor& q,
                               const spec::LayerCaches& caches, const std::vector<float>& k_scale,
                               const std::vector<float>& v_scale,
                               const reference::TopkSelection* selection, spec::Ordering ordering,
                               spec::AttentionProfile profile = spec::AttentionProfile::kFp32);

/// Float64 block scores of the indexer (after forcing), [Tq, nkv * lanes, max_blocks] as in
/// reference::TopkSelection::scores (one row per KV head under index_group max, one per index head
/// under union), and the bound on each float32 score. Each index head's block score follows the
/// NaN rule on its own; a KV head's under max is the max over its heads (SPEC 5).
struct ScoreTruth {
  std::vector<double> scores;
  std::vector<double> bound;
};
ScoreTruth indexer_truth(const spec::ModelConfig& config, const spec::IndexerParams& params,
                         const spec::ReadBatch& batch, const spec::HostTensor& index_q,
                         const spec::LayerCaches& caches, spec::Ordering ordering);

}  // namespace kvo::truth
