#pragma once
/// \file read_diff.hpp
/// Diffs of the read side (SPEC 7): top-k selections, exactly or tie-aware for foreign kernels
/// (SPEC 5 last bullets), and attention outputs, bit-exactly (first differing element, both bit
/// patterns, ulp distance) or against the float64 truth and its derived bound (max abs and rel
/// error, ulp histogram, the bound).

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvo/reference/read_path.hpp"
#include "kvo/truth/truth.hpp"

namespace kvo::oracle {

using spec::TopkForm;
using spec::TopkOrder;

struct TopkRowDiff {
  std::int64_t query = 0, kv_head = 0, n_valid = 0, k_eff = 0;
  std::vector<std::int32_t> expected, actual;
  std::vector<std::int32_t> missing, extra;  ///< ids, with their reference scores below
  std::vector<float> missing_scores, extra_scores;
  float kth_score = 0.0f;  ///< the k_eff-th largest reference score
  std::string problem;     ///< tie-aware mode: which rule the row breaks
};

struct TopkDiff {
  std::int64_t rows = 0, differing = 0;
  std::vector<TopkRowDiff> samples;  ///< the first few differing rows

  bool equal() const { return differing == 0; }
  std::string report() const;
};

/// A top-k output of the selection's shape laid out as `layout` says, as token-major rows
/// [Tq, nkv, width]; an output of another size is returned as it is (the diffs report its size).
std::vector<std::int32_t> token_major_ids(const reference::TopkSelection& shape,
                                          const std::vector<std::int32_t>& actual,
                                          spec::TopkLayout layout);

/// Exact comparison with the reference selection: same ids in the same slots (token-major).
TopkDiff diff_topk_exact(const reference::TopkSelection& expected,
                         const std::vector<std::int32_t>& actual);

/// A whole selection (a reference tier's answer, Subject::indexer_selection) against the CPU
/// reference's, bit for bit: its shape, each row's n_valid, the ids (diff_topk_exact), and every
/// valid block's score by its bits. Empty when equal; else the first difference with its
/// coordinates and both values.
std::string diff_selection_exact(const reference::TopkSelection& expected,
                                 const reference::TopkSelection& actual);

/// Tie-aware comparison for a foreign kernel (token-major rows), per (query row, KV head) and per
/// lane (score row: one under index_group max, each index head under union): ids below n_valid,
/// no duplicates, k_eff of them (under union between the largest lane's count and the lanes' sum;
/// drop_neg_inf removes -inf blocks), every chosen block's reference score at least some lane's
/// k_eff-th largest less the slack, every lane's forced blocks when there is room and its blocks
/// above the k_eff-th score by more than the slack, and the declared order (by score only with
/// one lane). The slack of two scores is both their bounds plus one key step of the form's key
/// precision (spec::topk_key_step) at the larger magnitude.
TopkDiff diff_topk_tie_aware(const reference::TopkSelection& expected,
                             const truth::ScoreTruth& truth, const spec::IndexerParams& params,
                             const std::vector<std::int32_t>& actual, const TopkForm& form);

/// A subject's top-k output judged as its form declares: laid out token-major, then exactly
/// (canonical: a row other than ascending ids is a mismatch) or tie-aware (foreign).
TopkDiff diff_topk_declared(const reference::TopkSelection& expected,
                            const truth::ScoreTruth* truth, const spec::IndexerParams& params,
                            const std::vector<std::int32_t>& actual, spec::Ordering ordering,
                            const TopkForm& form);

struct AttentionMismatch {
  std::int64_t query = 0, head = 0, dim = 0;
  std::uint32_t expected_bits = 0, actual_bits = 0;
  double expected = 0.0, actual = 0.0;
  std::uint64_t ulps = 0;
  double bound = 0.0;  ///< bounded mode: the allowed error there
};

/// A planted bug (spec::AttentionBug) that the bound of a bounded diff cannot see on its case:
/// the bug's float64 output lies within the allowed error everywhere, though it moves some element.
struct BlindSpot {
  spec::AttentionBug bug = spec::AttentionBug::kNone;
  double reach = 0.0;  ///< the bug's largest effect, as a fraction of the allowed error there
};

struct AttentionDiff {
  bool bounded = false;
  spec::AttentionProfile profile = spec::AttentionProfile::kFp32;  ///< bounded mode: the bound's
  std::int64_t elements = 0, differing = 0;  ///< bounded mode: elements past their bound
  std::optional<AttentionMismatch> first;
  double max_abs_error = 0.0, max_rel_error = 0.0;
  double max_error_ratio = 0.0;  ///< bounded mode: the largest error / allowed error
  /// ulp distances: 0, 1, 2, 3-4, 5-8, 9-16, 17-256, more.
  std::array<std::int64_t, 8> ulp_histogram{};
  /// Bounded mode: the planted bugs this case's bound cannot see (SPEC principle 4: a profile too
  /// loose to catch one is reported as such).
  std::vector<BlindSpot> blind;

  bool pass() const { return differing == 0; }
  std::string report() const;
};

/// Bit-exact comparison of two attention outputs [Tq, nq, hd] of the same dtype.
AttentionDiff diff_attention_exact(const spec::HostTensor& expected,
                                   const spec::HostTensor& actual);

/// A foreign output against the float64 truth: element i passes when |actual - truth| <= bound_i
/// plus one unit in the last place of the output dtype at |truth| + bound_i (the output rounding).
/// The truth's planted bugs that the same rule would let through are listed in `blind`.
AttentionDiff diff_attention_bounded(const truth::AttentionTruth& truth,
                                     const spec::HostTensor& actual);

/// Distance in units in the last place between two codes of a float dtype (f32, bf16, fp16).
std::uint64_t ulp_distance(std::uint32_t a, std::uint32_t b, spec::DType dtype);

}  // namespace kvo::oracle
