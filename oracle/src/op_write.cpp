// The write op (SPEC 4): one random step's writes over every layer of a layer mix, diffed byte for
// byte over whole buffers, guards included, against the reference.
#include <sstream>

#include "kvo/oracle/cache_diff.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "op_drivers.hpp"
#include "page_picture.hpp"

namespace kvo::oracle {
namespace {

struct WritePrepared final : PreparedCase {
  explicit WritePrepared(WriteCase c)
      : wc(std::move(c)), layout(wc.config), poisoned(oracle::make_model_caches(layout)) {
    expected = poisoned;
    for (std::size_t l = 0; l < wc.writes.size(); ++l)
      reference::write_layer(wc.config, wc.writes[l], expected[l]);
  }
  std::uint64_t seed() const override { return wc.seed; }
  std::string describe() const override { return wc.describe(); }

  WriteCase wc;
  reference::PagedCacheLayout layout;
  std::vector<spec::LayerCaches> poisoned;  ///< poisoned once per case, copied per subject
  std::vector<spec::LayerCaches> expected;
};

class WriteDriver final : public OpDriver {
 public:
  spec::Op op() const override { return spec::Op::kWrite; }
  std::string_view case_kind() const override { return "write"; }

  std::unique_ptr<PreparedCase> prepare(std::uint64_t seed, const Overrides& o) const override {
    return std::make_unique<WritePrepared>(make_write_case(seed, o.write));
  }

  Verdict judge(Subject& subject, PreparedCase& pc) const override {
    return run(subject, static_cast<WritePrepared&>(pc), 1, nullptr);
  }

  Verdict explain(Subject& subject, PreparedCase& pc) const override {
    auto& c = static_cast<WritePrepared&>(pc);
    std::ostringstream s;
    explain_header(s, c, subject, op());
    for (std::size_t r = 0; r < c.wc.requests.size(); ++r) {
      s << "  request " << r << ": context " << c.wc.requests[r].context << ", "
        << c.wc.requests[r].q_len << " new tokens, blocks";
      for (std::int64_t b : c.wc.requests[r].block_table) s << " " << b;
      s << "\n";
    }
    s << "  slot_mapping:";
    for (std::int64_t slot : c.wc.writes.front().slots.slots) s << " " << slot;
    s << "\n";
    std::vector<spec::LayerCaches> actual;
    Verdict v = run(subject, c, kExplainSamples, &actual);
    if (!explain_verdict(s, v)) {
      v.report = s.str();
      return v;
    }
    CacheDiff all;
    for (std::size_t l = 0; l < c.wc.writes.size(); ++l) {
      all.merge(explain_layer(s, c.layout, static_cast<std::int64_t>(l), c.wc.config,
                              c.wc.writes[l], c.expected[l], actual[l]));
    }
    list_samples(s, all);
    v.report = s.str();
    return v;
  }

  std::vector<Reduction> reductions() const override {
    using W = CaseOverrides;
    std::vector<Reduction> r;
    for (const char* mix : {"S", "D"})
      r.push_back(set_override("one layer", &Overrides::write, &W::layers, std::string(mix)));
    for (std::int64_t t : {1, 2, 4, 8})
      r.push_back(set_override("fewer tokens", &Overrides::write, &W::tokens, t));
    r.push_back(set_override("one request", &Overrides::write, &W::requests, std::int64_t{1}));
    r.push_back(set_override("one KV head", &Overrides::write, &W::num_kv_heads, std::int64_t{1}));
    r.push_back(set_override("head_dim 8", &Overrides::write, &W::head_dim, std::int64_t{8}));
    for (std::int64_t b : {1, 2, 4, 8, 16})
      r.push_back(set_override("smaller pages", &Overrides::write, &W::block_size, b));
    r.push_back(set_override("no edge values", &Overrides::write, &W::edge_values, false));
    r.push_back(set_override("one scale", &Overrides::write, &W::per_head_scale, false));
    r.push_back(
        set_override("one slot mapping", &Overrides::write, &W::separate_index_slots, false));
    r.push_back(
        set_override("no scale", &Overrides::write, &W::scale_mode, spec::ScaleMode::kNone));
    r.push_back(set_override("one rounding", &Overrides::write, &W::via_model_dtype, false));
    r.push_back(set_override("flat index-K", &Overrides::write, &W::index_layout,
                             spec::IndexLayout::kFlat));
    r.push_back(set_override("index_dim 8", &Overrides::write, &W::index_dim, std::int64_t{8}));
    return r;
  }

  std::string flags(const Overrides& o) const override { return o.write.to_flags(); }

 private:
  /// Runs the subject over every layer into a copy of the poisoned caches (kept in `keep` when
  /// given) and diffs them, describing up to `samples` elements.
  static Verdict run(Subject& subject, const WritePrepared& c, std::size_t samples,
                     std::vector<spec::LayerCaches>* keep) {
    return run_on_copy(c.poisoned, keep, [&](std::vector<spec::LayerCaches>& actual, Verdict& v) {
      for (std::size_t l = 0; l < c.wc.writes.size(); ++l)
        subject.write_layer(c.wc.config, c.wc.writes[l], actual[l]);
      CacheDiff diff;
      for (std::size_t l = 0; l < c.wc.writes.size(); ++l) {
        diff.merge(diff_layer_caches(c.layout, static_cast<std::int64_t>(l), c.expected[l],
                                     actual[l], &c.wc.writes[l], samples));
      }
      v.bytes_compared = diff.compared_bytes;
      v.report = diff.report();
      return diff.equal() ? spec::Outcome::kPass : spec::Outcome::kMismatch;
    });
  }
};

}  // namespace

const OpDriver& write_driver() {
  static const WriteDriver driver;
  return driver;
}

}  // namespace kvo::oracle
