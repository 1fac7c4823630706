#include "kvo/oracle/read_judge.hpp"

#include "kvo/oracle/op_driver.hpp"
#include "kvo/oracle/read_diff.hpp"

namespace kvo::oracle {

ReadExpectation::ReadExpectation(const ReadCase& c, bool dense) : rc_(c), dense_(dense) {
  if (!dense_) {
    selection_ = reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches);
  }
}

const truth::ScoreTruth& ReadExpectation::score_truth(spec::Ordering o) {
  auto& t = scores_[static_cast<int>(o)];
  if (!t) t = truth::indexer_truth(rc_.config, rc_.indexer, rc_.batch, rc_.index_q, rc_.caches, o);
  return *t;
}

const truth::AttentionTruth& ReadExpectation::attention_truth(spec::Ordering o,
                                                              spec::AttentionProfile profile) {
  auto& t = truth_[o == spec::Ordering::kCanonical ? 0 : 1 + static_cast<std::size_t>(profile)];
  if (!t) {
    t = truth::attention_truth(rc_.config, rc_.attention, rc_.batch, rc_.q, rc_.caches, rc_.k_scale,
                               rc_.v_scale, attended(), o, profile);
  }
  return *t;
}

const spec::HostTensor& ReadExpectation::exact() {
  if (!exact_out_) {
    exact_out_ = reference::attention(rc_.config, rc_.attention, rc_.batch, rc_.q, rc_.caches,
                                      rc_.k_scale, rc_.v_scale, attended())
                     .out;
  }
  return *exact_out_;
}

std::string profile_override_problem(const Subject& s,
                                     std::optional<spec::AttentionProfile> profile) {
  if (!profile || s.ordering() != spec::Ordering::kCanonical) return {};
  return "subject " + s.name() +
         " is canonical (judged bit for bit); --profile applies to foreign subjects only";
}

AttentionDiff diff_attention_output(ReadExpectation& e, const spec::HostTensor& out,
                                    std::optional<spec::AttentionProfile> profile) {
  if (!profile) return diff_attention_exact(e.exact(), out);
  return diff_attention_bounded(e.attention_truth(spec::Ordering::kForeign, *profile), out);
}

ReadVerdict judge_read(Subject& s, spec::Op op, ReadExpectation& e,
                       std::optional<spec::AttentionProfile> profile) {
  const bool canonical = s.ordering() == spec::Ordering::kCanonical;
  ReadVerdict v;
  if (op == spec::Op::kAttention) {
    v.report = profile_override_problem(s, profile);
    if (!v.report.empty()) {
      v.outcome = spec::Outcome::kInvalidInput;
      return v;
    }
  }
  v.outcome = run_guarded(
      [&] {
        if (op == spec::Op::kIndexer) {
          const std::vector<std::int32_t> ids = s.indexer(e.read_case());
          const TopkDiff d =
              diff_topk_declared(e.selection(), canonical ? nullptr : &e.score_truth(s.ordering()),
                                 e.read_case().indexer, ids, s.ordering(), s.topk_form());
          v.report = d.report();
          if (d.equal()) return spec::Outcome::kPass;
          if (!d.samples.empty()) v.query = d.samples.front().query;
          return spec::Outcome::kMismatch;
        }
        const spec::HostTensor out = s.attention(e.read_case(), e.attended());
        const AttentionDiff d = diff_attention_output(
            e, out,
            canonical
                ? std::nullopt
                : std::optional<spec::AttentionProfile>(profile.value_or(s.attention_profile())));
        v.report = d.report();
        if (d.pass()) return spec::Outcome::kPass;
        if (d.first) v.query = d.first->query;
        return spec::Outcome::kMismatch;
      },
      v.report);
  return v;
}

}  // namespace kvo::oracle
