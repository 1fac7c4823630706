// The dense op (SPEC 4): the dense-layer fused qknorm + rope + insert. The caches are diffed byte
// for byte, guards included, and q_out element for element, against the reference; a foreign
// subject's (another reduction order, rsqrtf) by admissible sets around the float64 truth.
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>

#include "kv_modes.hpp"
#include "kvo/oracle/cache_diff.hpp"
#include "kvo/oracle/dense_diff.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/reference/dense_insert.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "op_drivers.hpp"
#include "page_picture.hpp"

namespace kvo::oracle {
namespace {

/// `caches` with the pages `write` touches materialised (a huge cache, harness.hpp).
spec::LayerCaches materialised(const reference::PagedCacheLayout& layout, spec::LayerCaches caches,
                               const spec::LayerWrite& write) {
  materialise_write(layout, caches, write);
  return caches;
}

struct DensePrepared final : PreparedCase {
  /// `answerer`: who inserts the expected caches and q_out (null: the reference).
  DensePrepared(DenseCase c, Subject* answerer)
      : dc(std::move(c)),
        layout(dc.config),
        poisoned(materialised(layout, oracle::make_layer_caches(layout, 0, spec::LayerKind::kDense),
                              dc.in.kv)),
        expected(poisoned),
        q_expected(answerer != nullptr ? answerer->dense_insert(dc.config, dc.in, expected)
                                       : reference::dense_insert(dc.config, dc.in, expected)) {}
  /// A case with the given initial caches (a case file's).
  DensePrepared(DenseCase c, spec::LayerCaches initial)
      : dc(std::move(c)),
        layout(dc.config),
        poisoned(materialised(layout, std::move(initial), dc.in.kv)),
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
  DenseAnswer(const DensePrepared& c, spec::Ordering ordering)
      : c_(c), ordering_(ordering), negative_slots_(has_negative_slots({&c.dc.in.kv.slots})) {}

  /// `choice`: the write modes (kv_mode_axes), then dense_fp8_store (the last axis).
  Verdict judge_under(const ModeChoice& choice) override {
    const ModeChoice kv_choice(choice.begin(), choice.end() - 1);
    const std::size_t store = choice.back();
    ModeChoice key = relevant_kv_modes(spec::Op::kDense, KvPart::kKvBuffers, c_.dc.config,
                                       kv_choice, negative_slots_);
    key.push_back(store);
    if (const auto it = memo_.find(key); it != memo_.end()) return it->second;
    Verdict v;
    const spec::ModelConfig config =
        with_kv_modes(spec::Op::kDense, c_.dc.config, ModeChoice(key.begin(), key.end() - 1));
    if (!inputs_[store]) {
      inputs_[store] = c_.dc.in;
      inputs_[store]->fp8_store = spec::EnumInfo<spec::DenseFp8Store>::kNames.at(store).value;
    }
    const spec::DenseInsert& in = *inputs_[store];
    spec::LayerCaches expected = c_.poisoned;
    v.outcome = run_guarded(
        [&] {
          const spec::HostTensor q = reference::dense_insert(config, in, expected);
          const DenseJudgement j =
              judge_dense(config, c_.layout, in, expected, q, actual, q_out, ordering_, 0, 1);
          v.report = j.report;
          v.failure_class = j.failure_class;
          v.mismatch_size = j.mismatch_size;
          v.bytes_compared = j.bytes_compared;
          return j.pass ? spec::Outcome::kPass : spec::Outcome::kMismatch;
        },
        v.report);
    return memo_.emplace(key, std::move(v)).first->second;
  }

  spec::LayerCaches actual;
  spec::HostTensor q_out;

 private:
  const DensePrepared& c_;
  spec::Ordering ordering_;
  bool negative_slots_;
  std::map<ModeChoice, Verdict> memo_;
  /// The inputs under each dense_fp8_store value, made when first judged.
  std::array<std::optional<spec::DenseInsert>, spec::EnumInfo<spec::DenseFp8Store>::kNames.size()>
      inputs_;
};

/// The dense insert's rare conditions (issue 14): the one table conditions() and reached() read.
struct DenseCondition {
  CaseCondition info;
  bool (*reached)(const DenseCase&);
};

const std::array<DenseCondition, 6> kDenseConditions{{
    {{"strided_cache", "K/V caches as strided views: padding between blocks, tokens or heads"},
     [](const DenseCase& c) { return !c.config.kv_strides.dense(); }},
    {{"partial_rotary", "a rope over fewer dims than the head (rotary_dim < head_dim)"},
     [](const DenseCase& c) { return c.in.rotary_dim < c.config.geometry.head_dim; }},
    {{"fp8_scaled_store", "an fp8 cache with scales other than 1, stored scaled"},
     [](const DenseCase& c) {
       const auto not_one = [](float s) { return s != 1.0f; };
       return spec::is_fp8(c.config.kv.cache_dtype) &&
              c.in.fp8_store == spec::DenseFp8Store::kScaled &&
              (std::any_of(c.in.kv.k_scale.begin(), c.in.kv.k_scale.end(), not_one) ||
               std::any_of(c.in.kv.v_scale.begin(), c.in.kv.v_scale.end(), not_one));
     }},
    {{"fp8_identity_store", "an fp8 cache under dense_fp8_store identity (scale 1)"},
     [](const DenseCase& c) {
       return spec::is_fp8(c.config.kv.cache_dtype) &&
              c.in.fp8_store == spec::DenseFp8Store::kIdentity;
     }},
    {{"padding_slots", "-1 slots: q rows with no insert"},
     [](const DenseCase& c) {
       return std::any_of(c.in.kv.slots.slots.begin(), c.in.kv.slots.slots.end(),
                          [](std::int64_t s) { return s < 0; });
     }},
    {{"gqa", "more query heads than KV heads"},
     [](const DenseCase& c) { return c.in.q.shape.at(1) > c.config.geometry.num_kv_heads; }},
}};

class DenseDriver final : public OpDriver {
 public:
  spec::Op op() const override { return spec::Op::kDense; }
  std::string_view case_kind() const override { return "dense"; }

  std::unique_ptr<PreparedCase> prepare(std::uint64_t seed, const Overrides& o,
                                        Subject* answerer) const override {
    return std::make_unique<DensePrepared>(make_dense_case(seed, o.write, dense_overrides(o)),
                                           answerer);
  }
  bool answers_through_tier() const override { return true; }

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

  std::vector<CaseCondition> conditions() const override {
    return table_conditions(kDenseConditions);
  }
  std::vector<bool> reached(const PreparedCase& pc) const override {
    return table_reached(kDenseConditions, static_cast<const DensePrepared&>(pc).dc);
  }

  std::string flags(const Overrides& o) const override {
    return o.write.to_flags() + dense_overrides(o).to_flags();
  }

  // Mode detection: the write modes that can change a dense insert's bytes (kv_modes.hpp), then
  // SPEC 4's dense_fp8_store.
  std::vector<ModeAxis> mode_axes() const override {
    std::vector<ModeAxis> axes = kv_mode_axes(op());
    axes.push_back(names_axis<spec::DenseFp8Store>("dense_fp8_store"));
    return axes;
  }
  bool possible(const ModeChoice& choice) const override {
    return kv_mode_possible(op(), ModeChoice(choice.begin(), choice.end() - 1));
  }
  Overrides pin_modes(const Overrides& o, ModeChoice& pinned) const override {
    Overrides p = pin_kv_modes(op(), o, pinned);
    p.dense.fp8_store = o.dense.fp8_store.value_or(spec::DenseFp8Store::kScaled);
    pinned.push_back(static_cast<std::size_t>(*p.dense.fp8_store));
    return p;
  }

  std::unique_ptr<CapturedAnswer> capture(Subject& subject, PreparedCase& pc) const override {
    auto& c = static_cast<DensePrepared&>(pc);
    auto answer = std::make_unique<DenseAnswer>(c, subject.ordering());
    const Verdict ran =
        run_on_copy(c.poisoned, &answer->actual, [&](spec::LayerCaches& actual, Verdict&) {
          answer->q_out = subject.dense_insert(c.dc.config, c.dc.in, actual);
          return spec::Outcome::kPass;
        });
    answer->run_outcome = ran.outcome;
    answer->run_error = ran.report;
    return answer;
  }

  // Case file: metadata the configuration, tokens (T), source_rows (rows), num_q_heads (nq),
  // rotary_dim, max_pos and eps; tensors input.q [rows, nq, hd] (act dtype), the write call
  // input.* (put_layer_write), input.q_norm_weight, input.k_norm_weight [hd] F32, input.cos_sin
  // [max_pos, rotary_dim] F32, input.positions [T] I64, cache.<buffer> (poisoned, guards
  // included), expected.cache.<buffer> and expected.q_out [T, nq, hd]. The result: cache.<buffer>
  // after the insert and q_out.

  void encode_case(PreparedCase& pc, TensorWriter& out) const override {
    const auto& c = static_cast<const DensePrepared&>(pc);
    const spec::DenseInsert& in = c.dc.in;
    spec::Metadata& m = out.metadata();
    spec::write_config(c.dc.config, m);
    m["tokens"] = std::to_string(in.kv.slots.slots.size());
    m["source_rows"] = std::to_string(in.q.shape.at(0));
    m["num_q_heads"] = std::to_string(in.q.shape.at(1));
    m["rotary_dim"] = std::to_string(in.rotary_dim);
    m["max_pos"] = std::to_string(in.cos_sin.size() / static_cast<std::size_t>(in.rotary_dim));
    m["eps"] = spec::floats_text(std::vector<float>{in.eps});
    m["dense_fp8_store"] = spec::name_of(in.fp8_store);
    out.put_host("input.q", in.q);
    put_layer_write(out, "input.", c.dc.config, in.kv);
    out.put_f32("input.q_norm_weight", in.q_norm_weight);
    out.put_f32("input.k_norm_weight", in.k_norm_weight);
    out.put_f32("input.cos_sin",
                {static_cast<std::int64_t>(in.cos_sin.size()) / in.rotary_dim, in.rotary_dim},
                in.cos_sin);
    out.put_i64("input.positions", {static_cast<std::int64_t>(in.positions.size())}, in.positions);
    out.put_caches("cache.", c.poisoned);
    out.put_caches("expected.cache.", c.expected);
    out.put_host("expected.q_out", c.q_expected);
  }

  std::unique_ptr<PreparedCase> decode_case(TensorReader& in, std::uint64_t seed) const override {
    spec::MetadataReader& m = in.metadata();
    DenseCase dc;
    dc.seed = seed;
    dc.config = spec::read_config(m);
    const spec::CacheGeometry& g = dc.config.geometry;
    const std::int64_t tokens = case_count(m, "tokens");
    const std::int64_t rows = case_count(m, "source_rows");
    const std::int64_t nq = case_count(m, "num_q_heads");
    const std::int64_t max_pos = case_count(m, "max_pos");
    spec::DenseInsert& d = dc.in;
    d.rotary_dim = case_count(m, "rotary_dim");
    const std::vector<float> eps = m.floats("eps");
    if (eps.size() != 1) {
      throw spec::InvalidInput("__metadata__ 'eps'", -1, m.text("eps"), "expected one float32");
    }
    d.eps = eps.front();
    d.fp8_store = m.optional_choice("dense_fp8_store", spec::DenseFp8Store::kScaled);
    d.q = in.take_host("input.q", dc.config.act_dtype, {rows, nq, g.head_dim});
    d.kv = take_layer_write(in, "input.", dc.config, spec::LayerKind::kDense, rows, tokens);
    d.q_norm_weight = in.take_f32("input.q_norm_weight", g.head_dim);
    d.k_norm_weight = in.take_f32("input.k_norm_weight", g.head_dim);
    d.cos_sin = in.take_f32("input.cos_sin", {max_pos, d.rotary_dim});
    d.positions = in.take_i64("input.positions", {tokens});
    validate_as("input.", [&] { spec::validate_dense_insert(dc.config, d); });
    if (!std::isfinite(d.eps) || d.eps < 0.0f) {
      throw spec::InvalidInput("__metadata__ 'eps'", -1, m.text("eps"),
                               "expected a finite, non-negative float32");
    }
    spec::LayerCaches initial = in.take_caches("cache.", dc.config, spec::LayerKind::kDense);
    auto c = std::make_unique<DensePrepared>(std::move(dc), std::move(initial));
    check_expected_caches(in, "cache.", c->expected);
    check_expected(in, "q_out", tensor_dtype(c->q_expected.dtype), c->q_expected.shape,
                   c->q_expected.bytes);
    return c;
  }

  void encode_answer(Subject& subject, PreparedCase& pc, TensorWriter& out) const override {
    auto& c = static_cast<DensePrepared&>(pc);
    spec::LayerCaches actual = c.poisoned;
    const spec::HostTensor q_out = subject.dense_insert(c.dc.config, c.dc.in, actual);
    out.put_caches("cache.", actual);
    out.put_host("q_out", q_out);
  }

  void answer_from(const TensorSet& result, PreparedCase& pc,
                   SubjectFunctions& into) const override {
    const auto& c = static_cast<DensePrepared&>(pc);
    into.dense = [&c, tensors = tensors_by_name(result)](const spec::ModelConfig&,
                                                         const spec::DenseInsert&,
                                                         spec::LayerCaches& caches) {
      fill_caches(tensors, "cache.", caches);
      return spec::HostTensor{c.q_expected.dtype, c.q_expected.shape, tensors.at("q_out")};
    };
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
      const DenseJudgement j = judge_dense(c.dc.config, c.layout, c.dc.in, c.expected, c.q_expected,
                                           actual, q, subject.ordering(), 0, samples);
      v.bytes_compared = j.bytes_compared;
      v.failure_class = j.failure_class;
      if (!j.pass) v.report = j.report;
      return j.pass ? spec::Outcome::kPass : spec::Outcome::kMismatch;
    });
  }
};

}  // namespace

const OpDriver& dense_driver() {
  static const DenseDriver driver;
  return driver;
}

}  // namespace kvo::oracle
