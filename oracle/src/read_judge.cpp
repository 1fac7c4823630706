#include "kvo/oracle/read_judge.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "kvo/reference/generator.hpp"

#include "kvo/oracle/op_driver.hpp"
#include "kvo/oracle/read_diff.hpp"

namespace kvo::oracle {

std::vector<std::int32_t> arrange_selection(const reference::TopkSelection& s,
                                            const AttendedForm& form, std::uint64_t seed) {
  reference::SplitMix64 rng(reference::mix64(seed ^ 0x5E1EC7AB1Eull));
  const std::int64_t width = s.topk + form.extra;
  std::vector<std::int32_t> out;
  out.reserve(static_cast<std::size_t>(s.num_queries * s.num_kv_heads * width));
  for (std::int64_t q = 0; q < s.num_queries; ++q) {
    const auto n_valid = static_cast<std::int32_t>(s.n_valid[static_cast<std::size_t>(q)]);
    for (std::int64_t g = 0; g < s.num_kv_heads; ++g) {
      std::vector<std::int32_t> chosen;  // ascending, as the reference gives them
      for (std::int64_t k = 0; k < s.topk; ++k)
        if (s.id(q, g, k) >= 0) chosen.push_back(s.id(q, g, k));
      if (form.order == spec::SelectionOrder::kDescendingScore) {
        const auto best = [&](std::int32_t j) {
          float b = -INFINITY;
          for (std::int64_t l = 0; l < s.lanes; ++l) b = std::max(b, s.score(q, g, j, l));
          return b;
        };
        std::stable_sort(chosen.begin(), chosen.end(),
                         [&](std::int32_t a, std::int32_t b) { return best(a) > best(b); });
      }
      std::vector<std::int32_t> rest(static_cast<std::size_t>(width) - chosen.size(), -1);
      if (form.past_n_valid) {
        const auto r = static_cast<std::int32_t>(rng.uniform(0, 2));
        const std::array<std::int32_t, 3> past{n_valid + r, 1024 + n_valid + r,
                                               std::numeric_limits<std::int32_t>::max() - r};
        for (std::size_t i = 0; i < rest.size() && i < past.size(); ++i) rest[i] = past[i];
      }
      std::vector<std::int32_t> row;
      if (form.order == spec::SelectionOrder::kMinusOneFirst) {
        row.assign(rest.rbegin(), rest.rend());
        row.insert(row.end(), chosen.begin(), chosen.end());
      } else {
        row = chosen;
        row.insert(row.end(), rest.begin(), rest.end());
        if (form.order == spec::SelectionOrder::kShuffled) rng.shuffle(row);
      }
      out.insert(out.end(), row.begin(), row.end());
    }
  }
  return out;
}

ReadExpectation::ReadExpectation(const ReadCase& c, bool dense, Subject* answerer)
    : rc_(c), dense_(dense) {
  if (dense_) return;
  selection_ = answerer != nullptr
                   ? answerer->indexer_selection(c)
                   : reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches);
  attend();
  if (answerer != nullptr) exact_out_ = answerer->attention(c, &attended_);
}

ReadExpectation::ReadExpectation(
    const ReadCase& c, reference::TopkSelection selection,
    const std::function<spec::HostTensor(const reference::TopkSelection&)>& exact_over)
    : rc_(c), selection_(std::move(selection)) {
  attend();
  exact_out_ = exact_over(attended_);
}

void ReadExpectation::attend() {
  attended_ = selection_;
  if (rc_.attention_ids.empty()) {
    attended_.ids = arrange_selection(selection_, rc_.attended, rc_.seed);
    attended_.topk = selection_.topk + rc_.attended.extra;
  } else {
    attended_.ids = rc_.attention_ids;
    attended_.topk = rc_.attention_width;
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

void ReadsAhead::indexer_ahead(const ReadCase& c) {
  ids_ = {&c, std::nullopt, nullptr};
  try {
    ids_.value = inner_.indexer(c);
  } catch (...) {
    ids_.thrown = std::current_exception();
  }
}

void ReadsAhead::attention_ahead(const ReadCase& c, const reference::TopkSelection* selection) {
  out_ = {&c, std::nullopt, nullptr};
  out_dense_ = selection == nullptr;
  out_ids_ = selection != nullptr ? selection->ids : std::vector<std::int32_t>{};
  out_topk_ = selection != nullptr ? selection->topk : 0;
  try {
    out_.value = inner_.attention(c, selection);
  } catch (...) {
    out_.thrown = std::current_exception();
  }
}

namespace {

/// The answer kept ahead for case `c` (its value, or rethrown), cleared; null where none is kept.
template <class Value, class Ahead>
std::optional<Value> take_ahead(Ahead& ahead, const ReadCase& c, bool same_inputs) {
  if (ahead.of != &c || !same_inputs) return std::nullopt;
  Ahead taken = std::exchange(ahead, Ahead{});
  if (taken.thrown) std::rethrow_exception(taken.thrown);
  return std::move(taken.value);
}

}  // namespace

std::vector<std::int32_t> ReadsAhead::indexer(const ReadCase& c) {
  if (auto ids = take_ahead<std::vector<std::int32_t>>(ids_, c, true)) return std::move(*ids);
  return inner_.indexer(c);
}

spec::HostTensor ReadsAhead::attention(const ReadCase& c,
                                       const reference::TopkSelection* selection) {
  const bool same = selection == nullptr
                        ? out_dense_
                        : !out_dense_ && selection->topk == out_topk_ && selection->ids == out_ids_;
  if (auto out = take_ahead<spec::HostTensor>(out_, c, same)) return std::move(*out);
  return inner_.attention(c, selection);
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
          v.failure_class = "top-k ids differ";
          return spec::Outcome::kMismatch;
        }
        const spec::HostTensor out = s.attention(e.read_case(), e.attended());
        const AttentionDiff d = diff_attention_output(
            e, out,
            canonical
                ? std::nullopt
                : std::optional<spec::AttentionProfile>(profile.value_or(s.attention_profile())));
        v.report = d.report();
        for (const BlindSpot& b : d.blind) v.blind_spots.emplace_back(spec::name_of(b.bug));
        if (d.pass()) return spec::Outcome::kPass;
        if (d.first) v.query = d.first->query;
        v.failure_class =
            canonical ? "attention output differs" : "attention output outside its bound";
        return spec::Outcome::kMismatch;
      },
      v.report);
  return v;
}

}  // namespace kvo::oracle
