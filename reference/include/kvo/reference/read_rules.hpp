#pragma once
/// \file read_rules.hpp
/// The rules of SPEC 5 that the bit-exact reference (read_path.hpp) and the float64 truth
/// (kvo/truth/truth.hpp) both follow, written once so that the two cannot drift apart: which
/// logical blocks a query sees (n_valid), the forced init and local block scores, the NaN block
/// rule (per index head), the group reduce over a KV head's index heads, and the addressing of
/// query rows and of the [Tq, nkv, max_blocks] score table. Templates on the score type: float in
/// the reference, double in the truth.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "kvo/spec/read.hpp"

namespace kvo::reference {

/// Forced block scores (SPEC 5): init blocks outrank local blocks, which outrank every real score.
inline constexpr float kInitBlockScore = 1e30f;
inline constexpr float kLocalBlockScore = 1e29f;
/// The block score of one index head under index_nan lowest when one of its token scores is NaN,
/// and under skip when all of them are.
inline constexpr float kNanBlockScore = -1e30f;
/// The block score of one index head under index_nan first when one of its token scores is NaN:
/// above every score, the forced ones included (torch's topk ranks NaN above +inf).
inline constexpr float kNanFirstBlockScore = INFINITY;

/// Position of every query row: request and position p (SPEC 5: p = seq_len - q_len + j).
struct QueryRow {
  std::int64_t request = 0;
  std::int64_t position = 0;
};
/// The query rows of a batch in order, request by request.
std::vector<QueryRow> query_rows(const spec::ReadBatch& batch);

/// SPEC 5: the logical blocks a query at position p sees, n_valid = floor(p / sparse_block) + 1.
constexpr std::int64_t n_valid_blocks(std::int64_t position, std::int64_t sparse_block) {
  return position / sparse_block + 1;
}

/// Logical blocks per row of a score table: the largest n_valid over the rows (0 without rows).
std::int64_t max_valid_blocks(const std::vector<QueryRow>& rows, std::int64_t sparse_block);

/// Row of (query row q, head h) in a [Tq, heads, dim] input tensor (index_q, q).
constexpr std::int64_t head_row(std::int64_t q, std::int64_t h, std::int64_t num_heads) {
  return q * num_heads + h;
}

/// Index of the score of (query row q, score row r, logical block j) in a
/// [Tq, rows, max_blocks] table (TopkSelection::scores, the truth's scores). A query row has
/// nkv * lanes score rows (spec::selection_lanes): under index_group max r is the KV head g,
/// under union r is the index head h = g * lanes + lane.
constexpr std::size_t score_index(std::int64_t q, std::int64_t r, std::int64_t j, std::int64_t rows,
                                  std::int64_t max_blocks) {
  return static_cast<std::size_t>((q * rows + r) * max_blocks + j);
}

/// The forced score of logical block j of a row with n_valid blocks, or nothing: j < init_blocks
/// gets kInitBlockScore, j >= n_valid - local_blocks gets kLocalBlockScore (local overrides init).
constexpr std::optional<float> forced_block_score(std::int64_t j, std::int64_t n_valid,
                                                  const spec::IndexerParams& params) {
  if (j >= n_valid - params.local_blocks) return kLocalBlockScore;
  if (j < params.init_blocks) return kInitBlockScore;
  return std::nullopt;
}

/// The blocks of one row that top-k must respect beyond the scores' order: the forced blocks, and
/// the blocks that outrank even them (index_nan first's NaN blocks, +inf). When both fit in k_eff
/// (`room`), every forced block is chosen; otherwise every chosen block is one of them.
struct ForcedBlocks {
  std::set<std::int32_t> forced, outranking;
  bool room = true;
};
template <class ScoreOf>
ForcedBlocks forced_blocks(std::int64_t n_valid, std::int64_t k_eff,
                           const spec::IndexerParams& params, ScoreOf score_of) {
  ForcedBlocks f;
  for (std::int64_t j = 0; j < n_valid; ++j) {
    const auto id = static_cast<std::int32_t>(j);
    if (forced_block_score(j, n_valid, params)) {
      f.forced.insert(id);
    } else if (static_cast<double>(score_of(j)) == static_cast<double>(kNanFirstBlockScore)) {
      f.outranking.insert(id);
    }
  }
  f.room = static_cast<std::int64_t>(f.forced.size() + f.outranking.size()) <= k_eff;
  return f;
}

/// The running maximum of SPEC 5: comparison `>` in the order values are added, so the first
/// maximum wins (and a NaN added first stays until a larger value comes).
template <class T>
class FirstMax {
 public:
  void add(T x) {
    if (!any_ || x > best_) best_ = x;
    any_ = true;
  }
  bool empty() const { return !any_; }
  T value() const { return best_; }

 private:
  T best_{};
  bool any_ = false;
};

/// SPEC 5 block score S(h, q, j) of ONE index head: the max of its token scores over the block's
/// valid tokens (add them in ascending t), NaN token scores following `index_nan`: skip ignores
/// them (a block of only NaN scores kNanBlockScore), first gives kNanFirstBlockScore and lowest
/// kNanBlockScore when one of them is NaN. The NaN rule belongs to the head, never to its KV
/// group: the group's score is the max over its heads' block scores (GroupScore).
template <class T>
class HeadBlockScore {
 public:
  explicit HeadBlockScore(spec::IndexNan rule) : rule_(rule) {}
  void add(T token_score) {
    if (std::isnan(token_score)) {
      nan_ = true;
    } else {
      max_.add(token_score);
    }
  }
  /// True when the value is one of the NaN rule's constants, not a token score.
  bool ruled_by_nan() const { return rule_ == spec::IndexNan::kSkip ? nan_ && max_.empty() : nan_; }
  T value() const {
    if (ruled_by_nan()) {
      return static_cast<T>(rule_ == spec::IndexNan::kFirst ? kNanFirstBlockScore : kNanBlockScore);
    }
    return max_.value();
  }

 private:
  spec::IndexNan rule_;
  FirstMax<T> max_;
  bool nan_ = false;
};

/// SPEC 5 group reduce (`max`): score(q, g, j) = the max over the index heads h of KV head g of
/// their block scores, ascending h, first maximum wins.
template <class T>
using GroupScore = FirstMax<T>;

}  // namespace kvo::reference
