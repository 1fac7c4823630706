#pragma once
/// \file read_judge.hpp
/// How a read subject's answer is judged (SPEC principle 4, section 7): a canonical subject bit for
/// bit against the reference, a foreign one against the float64 truth (tie-aware top-k, attention
/// within the derived bound). One place for `kvoracle check` (random read cases) and `kvoracle
/// replay` (the read side of trace steps), so both apply the same rules.

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>

#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/subject.hpp"
#include "kvo/reference/read_path.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/truth/truth.hpp"

namespace kvo::oracle {

/// The expected results of one read case, computed once per case and only as far as the subjects
/// judged against it need (the float64 truth only for foreign subjects).
class ReadExpectation {
 public:
  /// `dense`: attention over every token t <= p and no indexer (a dense layer); otherwise the
  /// reference's top-k selection, which attention is judged over (so an indexer bug does not mask
  /// an attention one). `answerer` (sparse only): a reference tier's answerer (reference_tier.hpp)
  /// gives the selection (Subject::indexer_selection) and the exact attention output over the
  /// selection handed to attention, both asked here (what it throws propagates); null: the CPU
  /// reference, the exact output computed when first asked.
  explicit ReadExpectation(const ReadCase& c, bool dense = false, Subject* answerer = nullptr);
  /// A sparse case's expectation from a tier's answer given in two steps: its `selection` (with
  /// the scores), then `exact_over` the selection handed to attention (attended(), derived from
  /// it here) gives the exact output (what it throws propagates). The resident read path
  /// computes the subjects' answers inside it, while the tier's reads run on another thread.
  ReadExpectation(
      const ReadCase& c, reference::TopkSelection selection,
      const std::function<spec::HostTensor(const reference::TopkSelection& attended)>& exact_over);

  const ReadCase& read_case() const { return rc_; }
  bool dense() const { return dense_; }
  /// The reference selection (sparse cases only).
  const reference::TopkSelection& selection() const { return selection_; }
  /// What attention reads: null (dense), or the selection handed to it (SPEC 6): the case file's,
  /// else the reference selection's ids arranged by the case's AttendedForm.
  const reference::TopkSelection* attended() const { return dense_ ? nullptr : &attended_; }
  const truth::ScoreTruth& score_truth(spec::Ordering o);
  /// The truth with the bound of ordering `o` (foreign: of `profile`), computed once each.
  const truth::AttentionTruth& attention_truth(
      spec::Ordering o, spec::AttentionProfile profile = spec::AttentionProfile::kFp32);
  const spec::HostTensor& exact();

 private:
  /// attended_ from selection_ (SPEC 6): the case file's ids, else arranged by its AttendedForm.
  void attend();

  const ReadCase& rc_;
  bool dense_ = false;
  reference::TopkSelection selection_;
  reference::TopkSelection attended_;           ///< selection_'s rows as attention is handed them
  std::optional<truth::ScoreTruth> scores_[2];  // per Ordering
  // Canonical, then foreign per spec::AttentionProfile.
  std::optional<truth::AttentionTruth>
      truth_[1 + spec::EnumInfo<spec::AttentionProfile>::kNames.size()];
  std::optional<spec::HostTensor> exact_out_;
};

/// The ids [Tq, nkv, width + form.extra] handed to attention (SPEC 6), drawn from the reference's
/// `selection` (ids ascending, then -1) by `form` with the case's `seed`: per row the chosen ids,
/// then the rest (past_n_valid: n_valid + r, 1024 + n_valid + r and INT32_MAX - r for a drawn r,
/// as far as the rest reaches, then -1), in the form's order (descending score: by the best of the
/// row's lanes, ties by the lower id).
std::vector<std::int32_t> arrange_selection(const reference::TopkSelection& selection,
                                            const AttendedForm& form, std::uint64_t seed);

/// `inner` with its reads answered ahead: indexer_ahead and attention_ahead call inner now and keep
/// its answer, or what it threw; the next indexer (attention) call on the same case (over a
/// selection of the same ids and width) returns (throws) it, once. Every other call goes to inner.
/// The resident read path asks a subject's reads of one copy ahead, while the tier's answerer
/// reads the other copy on a thread of its own, then judges it with judge_read as ever.
class ReadsAhead final : public Subject {
 public:
  explicit ReadsAhead(Subject& inner) : inner_(inner) {}
  void indexer_ahead(const ReadCase& c);
  void attention_ahead(const ReadCase& c, const reference::TopkSelection* selection);

  std::string name() const override { return inner_.name(); }
  std::string unavailable_reason() const override { return inner_.unavailable_reason(); }
  bool implements(spec::Op op) const override { return inner_.implements(op); }
  spec::Ordering ordering() const override { return inner_.ordering(); }
  TopkForm topk_form() const override { return inner_.topk_form(); }
  spec::AttentionProfile attention_profile() const override { return inner_.attention_profile(); }
  std::vector<std::int32_t> indexer(const ReadCase& c) override;
  spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* selection) override;
  reference::TopkSelection indexer_selection(const ReadCase& c) override {
    return inner_.indexer_selection(c);
  }

 private:
  /// One answer asked ahead: the case it answers, its value or what the call threw.
  template <class Value>
  struct Ahead {
    const ReadCase* of = nullptr;
    std::optional<Value> value;
    std::exception_ptr thrown;
  };
  Subject& inner_;
  Ahead<std::vector<std::int32_t>> ids_;
  Ahead<spec::HostTensor> out_;
  bool out_dense_ = false;             ///< out_ was asked with no selection
  std::vector<std::int32_t> out_ids_;  ///< the selection out_ was asked over
  std::int64_t out_topk_ = 0;
};

/// One subject's answer to one op, judged.
struct ReadVerdict {
  spec::Outcome outcome = spec::Outcome::kPass;
  std::string report;                    ///< the diff (SPEC 7, a pass's too) or the error
  std::optional<std::int64_t> query;     ///< the first differing query row, when a diff found one
  std::string failure_class;             ///< Verdict::failure_class of a mismatch
  std::vector<std::string> blind_spots;  ///< Verdict::blind_spots
};

/// Empty, or why a --profile override cannot apply to `subject`: a canonical subject is judged bit
/// for bit and has no arithmetic profile (bad input, exit 2).
std::string profile_override_problem(const Subject& subject,
                                     std::optional<spec::AttentionProfile> profile);

/// The attention output `out` of a subject judged against the expectation: bit for bit when
/// `profile` is empty, else within the float64 truth's bound of that profile.
AttentionDiff diff_attention_output(ReadExpectation& expected, const spec::HostTensor& out,
                                    std::optional<spec::AttentionProfile> profile);

/// Runs `op` (kIndexer or kAttention) of `subject` on the expectation's case and judges it by the
/// subject's ordering: canonical exactly (diff_topk_exact, diff_attention_exact), foreign
/// tie-aware and bounded, attention under `profile` when given (--profile) and otherwise under the
/// subject's declared profile. A profile given for a canonical subject is kInvalidInput.
ReadVerdict judge_read(Subject& subject, spec::Op op, ReadExpectation& expected,
                       std::optional<spec::AttentionProfile> profile = std::nullopt);

}  // namespace kvo::oracle
