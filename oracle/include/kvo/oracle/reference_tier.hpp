#pragma once
/// \file reference_tier.hpp
/// The reference tiers (issue 15): who answers the cases of a campaign (`kvoracle check --tier`) or
/// the layer writes of a trace replay (`kvoracle replay --tier`). The CPU reference is the root of
/// truth; the GPU tier's canonical CUDA subjects answer at GPU speed the ops whose answer is caches
/// (write, dense) and the read ops (the selection with its block scores, and the exact attention
/// output over the selection handed to attention), checked bit for bit against the CPU reference
/// on a sample (the first units, then one in N) and wherever a judged subject fails; a
/// disagreement is failed to run. Both runs resolve the tier's answerers, wrap them and pick their
/// sample here, once.

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/subject.hpp"
#include "kvo/reference/read_path.hpp"
#include "kvo/spec/op.hpp"

namespace kvo::oracle {

/// Who answers: the CPU reference (the root of truth), or the GPU tier.
enum class ReferenceTier { kCpu, kGpu };
}  // namespace kvo::oracle

namespace kvo::spec {
/// The tiers' names (spec::name_of, spec::parse_enum): the one table the CLI, the summaries and
/// the JSON report read.
template <>
struct EnumInfo<oracle::ReferenceTier> {
  static constexpr std::string_view kNoun = "reference tier";
  static constexpr std::array<EnumName<oracle::ReferenceTier>, 2> kNames{
      {{oracle::ReferenceTier::kCpu, "cpu"}, {oracle::ReferenceTier::kGpu, "gpu"}}};
};
}  // namespace kvo::spec

namespace kvo::oracle {

/// The GPU tier's answer to each op it answers: the canonical CUDA subject of that name. The ops
/// of one case kind (indexer and attention: one read case) share one answerer, which answers the
/// whole case: its selection through Subject::indexer_selection (the scores order the selection
/// handed to attention and mark the case's rare conditions), its exact attention output through
/// Subject::attention.
inline constexpr std::array<std::pair<spec::Op, std::string_view>, 4> kGpuTierAnswerers{{
    {spec::Op::kWrite, "cuda-fused"},
    {spec::Op::kDense, "cuda-dense-qknorm-rope"},
    {spec::Op::kIndexer, "cuda-canonical-generic"},
    {spec::Op::kAttention, "cuda-canonical-generic"},
}};

/// The tier a run asked for by name: a tier's, or "auto" (gpu when `gpu_answers`, else cpu).
/// Anything else is InvalidInput naming "tier".
ReferenceTier parse_tier(const std::string& name, bool gpu_answers);

/// Whether unit `index` (a campaign's case, a replay's step counted from the first replayed) is
/// one the tier is checked on: the first `first`, then one in `every`.
bool tier_sampled(std::int64_t index, std::int64_t first, std::int64_t every);

/// InvalidInput naming the flag unless first >= 0 and every >= 1.
void check_tier_sample(std::int64_t first, std::int64_t every);

/// The GPU tier's answerers of one run.
struct TierAnswerers {
  /// Each answerer called on a thread of its own (workers prepare side by side; a GPU subject is
  /// called one call at a time, always from the same host thread: one device memory pool): one
  /// wrapper per answering subject, however many ops it answers.
  /// Nanoseconds the wrappers' threads spent answering (busy_seconds); declared before them, so
  /// that it outlives their threads.
  std::unique_ptr<std::atomic<std::int64_t>> busy_ns =
      std::make_unique<std::atomic<std::int64_t>>(0);
  std::vector<std::unique_ptr<Subject>> wrappers;
  std::map<spec::Op, Subject*> by_op;  ///< into `wrappers`
  /// The ops whose answerer is also judged by the run on an op of the same case kind: the CPU
  /// reference answers them (an answerer is never judged against itself).
  std::set<spec::Op> self_judged;
  std::string names;  ///< "write: cuda-fused, dense: cuda-dense-qknorm-rope"

  /// The answerer of `op` (null: the tier has none for it).
  Subject* of(spec::Op op) const;
  /// The answerer of `op` when the tier answers it: null for an op it has no answerer for and for
  /// a self-judged op (the CPU reference answers those).
  Subject* answering(spec::Op op) const { return self_judged.contains(op) ? nullptr : of(op); }
  /// The seconds the answerers have spent answering so far.
  double busy_seconds() const { return 1e-9 * static_cast<double>(busy_ns->load()); }
  /// Runs `fn` on each answerer's thread in turn, waiting for it (a campaign gives back the
  /// device memory their pools hold idle before a case that needs most of the device).
  void on_each_thread(const std::function<void()>& fn) const;
};

/// The answerers of the GPU tier for the ops of `ops` that it answers: `given`'s subject for an op
/// (a test plants a divergent one), else kGpuTierAnswerers' by name from `subjects`. `judged`: the
/// (subject, op) pairs the run judges. An answerer that does not implement its op, or ops of one
/// case kind given different answerers, is InvalidInput naming "tier"; an answerer that is
/// unavailable is FailedToRun saying why (never a fall back to the CPU).
TierAnswerers gpu_tier_answerers(SubjectList& subjects, const std::vector<spec::Op>& ops,
                                 const std::map<spec::Op, Subject*>& given,
                                 const std::vector<std::pair<const Subject*, spec::Op>>& judged);

/// A kernel's top-k answer in the CPU reference's form (reference::indexer_topk): `ids` [Tq, nkv,
/// width] as the kernel gave them, `scores` its block score table [Tq, nkv * lanes, max_n_valid]
/// (gpu::BlockScores), copied for each row's valid blocks (the rest -inf, as the reference leaves
/// them), n_valid from the case's batch. InvalidInput naming "scores" when the table is narrower
/// than a row's n_valid or its size is not its shape's.
reference::TopkSelection selection_from_scores(const ReadCase& c, std::vector<std::int32_t> ids,
                                               const std::vector<float>& scores,
                                               std::int64_t max_n_valid);

}  // namespace kvo::oracle
