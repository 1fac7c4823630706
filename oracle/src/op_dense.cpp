// The dense op (SPEC 4): the dense-layer fused qknorm + rope + insert. The caches are diffed byte
// for byte, guards included, and q_out element for element, against the reference.
#include <map>
#include <sstream>

#include "kv_modes.hpp"
#include "kvo/oracle/cache_diff.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/reference/dense_insert.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "op_drivers.hpp"
#include "page_picture.hpp"

namespace kvo::oracle {
namespace {

/// The dense insert's caches against the reference's: byte-exact, except where the modes admit
/// several codes (div_approx, legacy-wrap races), judged element by element (SPEC 7).
CacheDiff diff_dense(const spec::ModelConfig& config, const reference::PagedCacheLayout& layout,
                     const spec::DenseInsert& in, const spec::LayerCaches& expected,
                     const spec::LayerCaches& actual, std::size_t samples) {
  if (!reference::admits_several(config, in.kv))
    return diff_layer_caches(layout, 0, expected, actual, &in.kv, samples);
  const AdmissibleCodes admissible = [&](const ElementCoord& at) {
    return reference::admissible_dense_codes(config, in, element_of(at));
  };
  return diff_layer_caches(layout, 0, expected, actual, &in.kv, samples, &admissible);
}

struct DensePrepared final : PreparedCase {
  explicit DensePrepared(DenseCase c)
      : dc(std::move(c)),
        layout(dc.config),
        poisoned(oracle::make_layer_caches(layout, 0, spec::LayerKind::kDense)),
        expected(poisoned),
        q_expected(reference::dense_insert(dc.config, dc.in, expected)) {}
  std::uint64_t seed() const override { return dc.seed; }
  std::string describe() const override { return dc.describe(); }

  DenseCase dc;
  reference::PagedCacheLayout layout;
  spec::LayerCaches poisoned;
  spec::LayerCaches expected;
  spec::HostTensor q_expected;  ///< [T, nq, hd]
};

/// A subject's dense insert for one case, judged under any of the dense insert's write modes.
class DenseAnswer final : public CapturedAnswer {
 public:
  explicit DenseAnswer(const DensePrepared& c)
      : c_(c), negative_slots_(has_negative_slots({&c.dc.in.kv.slots})) {}

  Verdict judge_under(const ModeChoice& choice) override {
    const ModeChoice key = relevant_kv_modes(spec::Op::kDense, KvPart::kKvBuffers, c_.dc.config,
                                             choice, negative_slots_);
    if (const auto it = memo_.find(key); it != memo_.end()) return it->second;
    Verdict v;
    const spec::ModelConfig config = with_kv_modes(spec::Op::kDense, c_.dc.config, key);
    spec::LayerCaches expected = c_.poisoned;
    CacheDiff cd;
    v.outcome = run_guarded(
        [&] {
          const spec::HostTensor q = reference::dense_insert(config, c_.dc.in, expected);
          cd = diff_dense(config, c_.layout, c_.dc.in, expected, actual, 1);
          const AttentionDiff qd = diff_attention_exact(q, q_out);
          if (!cd.equal()) v.report += cd.report() + "\n";
          if (!qd.pass()) v.report += "q_out: " + qd.report();
          v.mismatch_size = cd.differing_bytes + (qd.pass() ? 0 : 1);
          return cd.equal() && qd.pass() ? spec::Outcome::kPass : spec::Outcome::kMismatch;
        },
        v.report);
    if (v.report.empty()) v.report = cd.report();
    v.bytes_compared = cd.compared_bytes;
    return memo_.emplace(key, std::move(v)).first->second;
  }

  spec::LayerCaches actual;
  spec::HostTensor q_out;

 private:
  const DensePrepared& c_;
  bool negative_slots_;
  std::map<ModeChoice, Verdict> memo_;
};

class DenseDriver final : public OpDriver {
 public:
  spec::Op op() const override { return spec::Op::kDense; }
  std::string_view case_kind() const override { return "dense"; }

  std::unique_ptr<PreparedCase> prepare(std::uint64_t seed, const Overrides& o) const override {
    return std::make_unique<DensePrepared>(make_dense_case(seed, o.write, dense_overrides(o)));
  }

  Verdict judge(Subject& subject, PreparedCase& pc) const override {
    return run(subject, static_cast<DensePrepared&>(pc), 1, nullptr);
  }

  Verdict explain(Subject& subject, PreparedCase& pc) const override {
    auto& c = static_cast<DensePrepared&>(pc);
    std::ostringstream s;
    explain_header(s, c, subject, op());
    s << "  slot_mapping:";
    for (std::int64_t slot : c.dc.in.kv.slots.slots) s << " " << slot;
    s << "\n  positions:";
    for (std::int64_t p : c.dc.in.positions) s << " " << p;
    s << "\n";
    spec::LayerCaches actual;
    Verdict v = run(subject, c, kExplainSamples, &actual);
    if (!explain_verdict(s, v)) {
      v.report = s.str();
      return v;
    }
    const CacheDiff d = explain_layer(s, c.layout, 0, c.dc.config, c.dc.in.kv, c.expected, actual);
    if (!d.equal()) list_samples(s, d);
    v.report = s.str();
    return v;
  }

  std::vector<Reduction> reductions() const override {
    using W = CaseOverrides;
    using D = DenseOverrides;
    std::vector<Reduction> r;
    for (std::int64_t t : {1, 2, 4, 8})
      r.push_back(set_override("fewer tokens", &Overrides::write, &W::tokens, t));
    r.push_back(set_override("one KV head", &Overrides::write, &W::num_kv_heads, std::int64_t{1}));
    r.push_back(set_override("one query head per KV head", &Overrides::dense, &D::group_size,
                             std::int64_t{1}));
    r.push_back(set_override("head_dim 32", &Overrides::write, &W::head_dim, std::int64_t{32}));
    for (std::int64_t b : {1, 2, 4, 8, 16})
      r.push_back(set_override("smaller pages", &Overrides::write, &W::block_size, b));
    r.push_back(set_override("one scale", &Overrides::write, &W::per_head_scale, false));
    r.push_back(
        set_override("no scale", &Overrides::write, &W::scale_mode, spec::ScaleMode::kNone));
    r.push_back(set_override("one rounding", &Overrides::write, &W::via_model_dtype, false));
    r.push_back(set_override("rotary_dim 2", &Overrides::dense, &D::rotary_dim, std::int64_t{2}));
    return r;
  }

  std::string flags(const Overrides& o) const override {
    return o.write.to_flags() + dense_overrides(o).to_flags();
  }

  std::vector<ModeAxis> mode_axes() const override { return kv_mode_axes(op()); }
  bool possible(const ModeChoice& choice) const override { return kv_mode_possible(op(), choice); }
  Overrides pin_modes(const Overrides& o, ModeChoice& pinned) const override {
    return pin_kv_modes(op(), o, pinned);
  }

  std::unique_ptr<CapturedAnswer> capture(Subject& subject, PreparedCase& pc) const override {
    auto& c = static_cast<DensePrepared&>(pc);
    auto answer = std::make_unique<DenseAnswer>(c);
    const Verdict ran =
        run_on_copy(c.poisoned, &answer->actual, [&](spec::LayerCaches& actual, Verdict&) {
          answer->q_out = subject.dense_insert(c.dc.config, c.dc.in, actual);
          return spec::Outcome::kPass;
        });
    answer->run_outcome = ran.outcome;
    answer->run_error = ran.report;
    return answer;
  }

 private:
  /// The dense overrides with the query group taken from --group-size when the dense ones leave it.
  static DenseOverrides dense_overrides(const Overrides& o) {
    DenseOverrides d = o.dense;
    if (!d.group_size) d.group_size = o.read.group_size;
    return d;
  }

  static Verdict run(Subject& subject, const DensePrepared& c, std::size_t samples,
                     spec::LayerCaches* keep) {
    return run_on_copy(c.poisoned, keep, [&](spec::LayerCaches& actual, Verdict& v) {
      const spec::HostTensor q = subject.dense_insert(c.dc.config, c.dc.in, actual);
      const CacheDiff cd = diff_dense(c.dc.config, c.layout, c.dc.in, c.expected, actual, samples);
      const AttentionDiff qd = diff_attention_exact(c.q_expected, q);
      v.bytes_compared = cd.compared_bytes;
      if (!cd.equal()) v.report += cd.report() + "\n";
      if (!qd.pass()) v.report += "q_out: " + qd.report();
      return cd.equal() && qd.pass() ? spec::Outcome::kPass : spec::Outcome::kMismatch;
    });
  }
};

}  // namespace

const OpDriver& dense_driver() {
  static const DenseDriver driver;
  return driver;
}

}  // namespace kvo::oracle
