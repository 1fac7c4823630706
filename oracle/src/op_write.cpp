// The write op (SPEC 4): one random step's writes over every layer of a layer mix, diffed byte for
// byte over whole buffers, guards included, against the reference.
#include <algorithm>
#include <array>
#include <map>
#include <numeric>
#include <sstream>

#include "kv_modes.hpp"
#include "kvo/oracle/cache_diff.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/resident_writes.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "op_drivers.hpp"
#include "page_picture.hpp"

namespace kvo::oracle {

namespace {

struct WritePrepared final : PreparedCase {
  /// `answerer`: who writes the expected caches (null: the reference).
  WritePrepared(WriteCase c, Subject* answerer)
      : wc(std::move(c)), layout(wc.config), poisoned(oracle::make_model_caches(layout)) {
    answer(answerer);
  }
  /// A case with the given initial caches (a case file's).
  WritePrepared(WriteCase c, std::vector<spec::LayerCaches> initial)
      : wc(std::move(c)), layout(wc.config), poisoned(std::move(initial)) {
    answer();
  }
  /// A case for the device (its values deferred, WriteCase::values): lazy poisoned caches with
  /// nothing held (the device poisons every byte itself). A case with several admissible answers
  /// (ResidentWrites::config_blocker) also gets its values and the CPU reference's answer here (on
  /// the campaign's worker), so that a subject differing from the answerer on the device is
  /// judged from its device bytes by the sets, without running again.
  explicit WritePrepared(WriteCase c) : wc(std::move(c)), layout(wc.config) {
    for (std::size_t l = 0; l < wc.config.layers.size(); ++l) {
      device_initial.push_back(make_layer_caches(layout, static_cast<std::int64_t>(l),
                                                 wc.config.layers[l], /*lazy=*/true,
                                                 /*hold_guards=*/false));
    }
    if (ResidentWrites::config_blocker(wc.config).empty()) return;
    fill_write_values(wc);
    poisoned = make_model_caches(layout);
    answer();
  }
  /// The reference's answer, or the answerer's.
  void answer(Subject* answerer = nullptr) {
    for (std::size_t l = 0; l < wc.writes.size(); ++l) {
      materialise_write(layout, poisoned[l], wc.writes[l]);  // a huge cache's touched pages
    }
    expected = poisoned;
    for (std::size_t l = 0; l < wc.writes.size(); ++l) {
      if (answerer != nullptr) {
        answerer->write_layer(wc.config, wc.writes[l], expected[l]);
      } else {
        reference::write_layer(wc.config, wc.writes[l], expected[l]);
      }
    }
  }
  std::uint64_t seed() const override { return wc.seed; }
  std::string describe() const override { return wc.describe(); }

  WriteCase wc;
  reference::PagedCacheLayout layout;
  std::vector<spec::LayerCaches> poisoned;  ///< poisoned once per case, copied per subject
  std::vector<spec::LayerCaches> expected;
  /// A case for the device: its caches as the device starts them (nothing held on the host).
  std::vector<spec::LayerCaches> device_initial;

  /// The caches every device copy starts from: a device case's, else (a sampled case the CPU
  /// reference answered) the poisoned host caches.
  const std::vector<spec::LayerCaches>& device_start() const {
    return device_initial.empty() ? poisoned : device_initial;
  }
};

/// A subject's caches for one case, judged under any write modes: the reference is run once per
/// distinct setting of the modes that can change a byte of this case.
class WriteAnswer final : public CapturedAnswer {
 public:
  explicit WriteAnswer(const WritePrepared& c) : c_(c) {
    std::vector<const spec::SlotMapping*> maps;
    for (const auto& w : c.wc.writes) maps.insert(maps.end(), {&w.slots, &w.index_slots});
    negative_slots_ = has_negative_slots(maps);
  }

  Verdict judge_under(const ModeChoice& choice) override {
    const Verdict& kv = judge_part(KvPart::kKvBuffers, choice);
    const Verdict& index = judge_part(KvPart::kIndexBuffer, choice);
    Verdict v;
    v.outcome = spec::worst(kv.outcome, index.outcome);
    v.bytes_compared = kv.bytes_compared + index.bytes_compared;
    v.mismatch_size = kv.mismatch_size + index.mismatch_size;
    for (const Verdict* part : {&kv, &index}) {
      if (part->outcome != spec::Outcome::kPass)
        v.report += (v.report.empty() ? "" : "\n") + part->report;
    }
    if (v.report.empty()) v.report = kv.report;
    return v;
  }

  std::vector<spec::LayerCaches> actual;

 private:
  /// One part's buffers under the modes that can change them: the reference is run once per
  /// distinct setting of those modes.
  const Verdict& judge_part(KvPart part, const ModeChoice& choice) {
    ModeChoice key =
        relevant_kv_modes(spec::Op::kWrite, part, c_.wc.config, choice, negative_slots_);
    const auto memo_key = std::make_pair(part, key);
    if (const auto it = memo_.find(memo_key); it != memo_.end()) return it->second;
    Verdict v;
    const spec::ModelConfig config = with_kv_modes(spec::Op::kWrite, c_.wc.config, key);
    std::vector<spec::LayerCaches> expected = c_.poisoned;
    CacheDiff diff;
    v.outcome = run_guarded(
        [&] {
          for (std::size_t l = 0; l < c_.wc.writes.size(); ++l) {
            reference::write_layer(config, c_.wc.writes[l], expected[l]);
            diff.merge(diff_write_layer(config, c_.layout, l, c_.wc.writes[l],
                                        only(part, expected[l]), only(part, actual[l])));
          }
          return diff.equal() ? spec::Outcome::kPass : spec::Outcome::kMismatch;
        },
        v.report);
    if (v.report.empty()) v.report = diff.report();
    v.failure_class = diff.failure_class();
    v.bytes_compared = diff.compared_bytes;
    v.mismatch_size = v.outcome == spec::Outcome::kMismatch ? diff.differing_bytes : 0;
    return memo_.emplace(memo_key, std::move(v)).first->second;
  }

  /// The buffers of `caches` in `part`.
  static spec::LayerCaches only(KvPart part, const spec::LayerCaches& caches) {
    spec::LayerCaches out;
    out.kind = caches.kind;
    for (const spec::CacheBuffer& b : caches.buffers) {
      if (in_part(part, b.kind)) out.buffers.push_back(b);
    }
    return out;
  }

  const WritePrepared& c_;
  bool negative_slots_ = false;
  std::map<std::pair<KvPart, ModeChoice>, Verdict> memo_;
};

/// The write's rare conditions (issue 14): the one table conditions() and reached() read.
struct WriteCondition {
  CaseCondition info;
  bool (*reached)(const WriteCase&);
};

/// One past the last K/V element (in elements, and in bytes) that a write of the case stores to.
std::pair<std::int64_t, std::int64_t> kv_write_end(const WriteCase& c) {
  const spec::CacheGeometry& g = c.config.geometry;
  const auto e = static_cast<std::int64_t>(spec::dtype_bytes(c.config.kv.cache_dtype));
  std::int64_t end = 0;
  for (const spec::LayerWrite& w : c.writes) {
    for (const std::int64_t slot : w.slots.slots) {
      if (slot < 0) continue;
      for (int kv = 0; kv < 2; ++kv) {
        end = std::max(end,
                       reference::kv_element(c.config, kv, slot / g.block_size, slot % g.block_size,
                                             g.num_kv_heads - 1, g.head_dim - 1) +
                           1);
      }
    }
  }
  return {end, end * e};
}

bool has_sparse(const WriteCase& c) {
  return std::find(c.config.layers.begin(), c.config.layers.end(), spec::LayerKind::kSparse) !=
         c.config.layers.end();
}

const std::array<WriteCondition, 16> kWriteConditions{{
    {{"bytes_past_2_31", "a K/V store past byte 2^31 of its buffer (int32 byte offsets wrap)"},
     [](const WriteCase& c) { return kv_write_end(c).second > (std::int64_t{1} << 31); }},
    {{"bytes_past_2_32", "a K/V store past byte 2^32 of its buffer (uint32 byte offsets wrap)"},
     [](const WriteCase& c) { return kv_write_end(c).second > (std::int64_t{1} << 32); }},
    {{"elements_past_2_31", "a K/V store past element 2^31 (int32 element offsets wrap)"},
     [](const WriteCase& c) { return kv_write_end(c).first > (std::int64_t{1} << 31); }},
    {{"strided_cache", "K/V caches as strided views: padding between blocks, tokens or heads"},
     [](const WriteCase& c) { return !c.config.kv_strides.dense(); }},
    {{"strided_index_cache", "the index-K cache as a strided view: padded rows or blocks, offset"},
     [](const WriteCase& c) { return has_sparse(c) && !c.config.index_strides.dense(); }},
    {{"minus_one_before_real", "a -1 slot before a real token's (not only a tail)"},
     [](const WriteCase& c) { return c.padding_interleaved; }},
    {{"legacy_wrap_padding", "legacy_wrap with -1 slots: they wrap onto the last slot"},
     [](const WriteCase& c) {
       return c.config.slot_mode == spec::SlotMode::kLegacyWrap && c.padding > 0;
     }},
    {{"zero_rows", "source rows all zero: zero amax, all-zero blockscale groups"},
     [](const WriteCase& c) { return c.zero_rows > 0; }},
    {{"per_head_scales", "per-head K/V scales over several heads, applied"},
     [](const WriteCase& c) {
       return c.config.kv.per_head_scale && c.config.geometry.num_kv_heads > 1 &&
              c.config.kv.scale_mode != spec::ScaleMode::kNone;
     }},
    {{"fp8_cache", "an fp8 K/V cache (e4m3 or e5m2)"},
     [](const WriteCase& c) { return spec::is_fp8(c.config.kv.cache_dtype); }},
    {{"page_size_1", "one token per page"},
     [](const WriteCase& c) { return c.config.geometry.block_size == 1; }},
    {{"page_edge_straddle", "a request's new tokens cross a page edge"},
     [](const WriteCase& c) {
       const std::int64_t bs = c.config.geometry.block_size;
       return std::any_of(c.requests.begin(), c.requests.end(), [&](const StepRequest& r) {
         return r.q_len > 0 && r.context / bs != (r.context + r.q_len - 1) / bs;
       });
     }},
    {{"vector_tail", "a head row whose bytes are not a multiple of 16 (a vector store's tail)"},
     [](const WriteCase& c) {
       return c.config.geometry.head_dim *
                  static_cast<std::int64_t>(spec::dtype_bytes(c.config.kv.cache_dtype)) % 16 !=
              0;
     }},
    {{"blockscale_index_k", "a block-scaled (fp8 + fp32 group scales) index-K cache"},
     [](const WriteCase& c) {
       return has_sparse(c) && c.config.index.layout == spec::IndexLayout::kBlockScale;
     }},
    {{"separate_index_slots", "index-K written through its own slot mapping"},
     [](const WriteCase& c) { return has_sparse(c) && c.config.separate_index_slots; }},
    {{"mixed_layers", "dense and sparse layers in one model"},
     [](const WriteCase& c) {
       return has_sparse(c) && std::find(c.config.layers.begin(), c.config.layers.end(),
                                         spec::LayerKind::kDense) != c.config.layers.end();
     }},
}};

class WriteDriver final : public OpDriver {
 public:
  spec::Op op() const override { return spec::Op::kWrite; }
  std::string_view case_kind() const override { return "write"; }

  std::unique_ptr<PreparedCase> prepare(std::uint64_t seed, const Overrides& o,
                                        Subject* answerer) const override {
    return std::make_unique<WritePrepared>(make_write_case(seed, o.write), answerer);
  }
  bool answers_through_tier() const override { return true; }

  std::unique_ptr<PreparedCase> prepare_for_device(std::uint64_t seed,
                                                   const Overrides& o) const override {
    return std::make_unique<WritePrepared>(make_write_case(seed, o.write, CaseValues::kDeferred));
  }

  bool device_answer_exact(const PreparedCase& pc) const override {
    return ResidentWrites::config_blocker(static_cast<const WritePrepared&>(pc).wc.config).empty();
  }

  bool runs_on_device(const Subject& subject) const override {
    return static_cast<bool>(subject.device_write());
  }

  bool device_heavy(const PreparedCase& pc) const override {
    return huge_copies(static_cast<const WritePrepared&>(pc));
  }
  std::int64_t device_bytes(const PreparedCase& pc, std::size_t copies) const override {
    const auto& c = static_cast<const WritePrepared&>(pc);
    return ResidentWrites::device_bytes_needed(c.wc.config, c.device_start(), copies);
  }

  std::vector<Verdict> judge_on_device(PreparedCase& pc, Subject& answerer,
                                       const std::vector<DeviceRow>& rows) const override {
    auto& c = static_cast<WritePrepared&>(pc);
    std::vector<Subject*> writers{&answerer};
    for (const DeviceRow& r : rows) writers.push_back(r.subject);
    // A huge case's tier copy holds only the pages its writes touch (ResidentReplay's
    // DefinedCopies::kFirst): every other byte of a subject's copy is compared with the poison
    // pattern, so that a huge copy is poisoned once and read once a case, not twice each.
    const std::vector<BufferBytes> written =
        huge_copies(c) ? written_pages(c) : std::vector<BufferBytes>{};
    const std::vector<BufferBytes> judged = judged_ranges(c, written);
    const std::unique_ptr<ResidentWrites> device = write_resident(c, writers, written, judged);
    const std::vector<spec::LayerCaches>& initial = c.device_start();
    // Every byte of every allocation: the buffers, their guard bands and the margins around them.
    std::int64_t compared = 0;
    for (const spec::LayerCaches& caches : initial) {
      for (const spec::CacheBuffer& b : caches.buffers) compared += b.storage.size();
    }
    std::vector<Verdict> out;
    for (std::size_t w = 1; w < writers.size(); ++w) {
      Verdict v;
      v.bytes_compared = compared;
      const std::vector<LayerDifference> diffs = device->compare(w, /*whole=*/true);
      // A case with several admissible answers and the CPU reference's answer at hand: a copy
      // that differs from the answerer's only inside the ranges staged for it (every buffer; a
      // huge one's written pages: the same count there as over the whole allocations) is judged
      // from its bytes there, by the sets.
      if (!judged.empty() && total(diffs) > 0 &&
          total(device->compare(w, /*whole=*/false)) == total(diffs)) {
        out.push_back(judge_device_bytes(c, *device, w, judged, compared));
        continue;
      }
      for (std::size_t l = 0; l < diffs.size(); ++l) {
        if (diffs[l].count == 0) continue;
        v.outcome = spec::Outcome::kMismatch;
        v.mismatch_size += diffs[l].count;
        if (!v.report.empty()) continue;
        v.failure_class = diffs[l].buffer < 0 ? "a write outside every buffer and its guard bands"
                                              : "bytes differ from the answerer's on the device";
        const std::string buffer =
            diffs[l].buffer < 0
                ? std::string("a margin outside every buffer")
                : std::string(spec::name_of(
                      initial[l].buffers[static_cast<std::size_t>(diffs[l].buffer)].kind));
        v.report = "on the device: layer " + std::to_string(l) + ", " + buffer + " byte " +
                   std::to_string(diffs[l].byte) + " differs from " + answerer.name() + "'s (" +
                   std::to_string(diffs[l].count) + " bytes differ in the layer)";
      }
      if (v.outcome == spec::Outcome::kPass)
        v.report = "equal on the device to " + answerer.name() + "'s caches";
      out.push_back(std::move(v));
    }
    return out;
  }

  std::string check_on_device(PreparedCase& pc, Subject& answerer) const override {
    auto& c = static_cast<WritePrepared&>(pc);
    const std::unique_ptr<ResidentWrites> device = write_resident(c, {&answerer}, {}, {});
    CacheDiff diff;
    for (std::size_t l = 0; l < c.wc.writes.size(); ++l) {
      // Every byte of a dense buffer; of a lazy (huge) one, the pages the reference's answer holds
      // (the touched blocks and the guard bands).
      std::vector<BufferBytes> ranges;
      for (std::size_t b = 0; b < c.poisoned[l].buffers.size(); ++b) {
        const spec::ByteStorage& s = c.poisoned[l].buffers[b].storage;
        const auto index = static_cast<std::int32_t>(b);
        if (!s.is_lazy()) {
          ranges.push_back({index, 0, s.size()});
          continue;
        }
        for (const spec::ByteRange& r : c.expected[l].buffers[b].storage.materialised())
          ranges.push_back({index, r.first, r.second});
      }
      spec::LayerCaches got = c.poisoned[l];
      device->download(l, 0, ranges, got);
      diff.merge(diff_write_layer(c.wc.config, c.layout, l, c.wc.writes[l], c.expected[l], got));
    }
    if (diff.equal()) return {};
    return "the write answerer " + answerer.name() +
           " writing on the device (inputs generated there) disagrees with the CPU reference on " +
           c.describe() + "\n" + diff.report();
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
    r.push_back(set_override("dense caches", &Overrides::write, &W::kv_strides, spec::KvStrides{}));
    r.push_back(
        set_override("dense index-K", &Overrides::write, &W::index_strides, spec::IndexStrides{}));
    return r;
  }

  std::string flags(const Overrides& o) const override { return o.write.to_flags(); }

  std::vector<CaseCondition> conditions() const override {
    return table_conditions(kWriteConditions);
  }
  std::vector<bool> reached(const PreparedCase& pc) const override {
    return table_reached(kWriteConditions, static_cast<const WritePrepared&>(pc).wc);
  }

  std::vector<ModeAxis> mode_axes() const override { return kv_mode_axes(op()); }
  bool possible(const ModeChoice& choice) const override { return kv_mode_possible(op(), choice); }
  Overrides pin_modes(const Overrides& o, ModeChoice& pinned) const override {
    return pin_kv_modes(op(), o, pinned);
  }

  std::unique_ptr<CapturedAnswer> capture(Subject& subject, PreparedCase& pc) const override {
    auto& c = static_cast<WritePrepared&>(pc);
    auto answer = std::make_unique<WriteAnswer>(c);
    const Verdict ran = run_on_copy(c.poisoned, &answer->actual,
                                    [&](std::vector<spec::LayerCaches>& actual, Verdict&) {
                                      for (std::size_t l = 0; l < c.wc.writes.size(); ++l)
                                        subject.write_layer(c.wc.config, c.wc.writes[l], actual[l]);
                                      return spec::Outcome::kPass;
                                    });
    answer->run_outcome = ran.outcome;
    answer->run_error = ran.report;
    return answer;
  }

  // Case file: metadata the configuration, allocator, padding, tokens (T), source_rows (rows),
  // requests (R) and request_blocks (M); tensors input.request.context, .q_len [R] and
  // .block_table [R, M] (I64, -1 past a request's blocks); per layer l, input.layer.l.* (a write
  // call, put_layer_write), cache.layer.l.<buffer> (the poisoned caches, guards included) and
  // expected.cache.layer.l.<buffer>. The result: cache.layer.l.<buffer> after the writes.

  void encode_case(PreparedCase& pc, TensorWriter& out) const override {
    const auto& c = static_cast<const WritePrepared&>(pc);
    const WriteCase& wc = c.wc;
    spec::Metadata& m = out.metadata();
    spec::write_config(wc.config, m);
    m["allocator"] = spec::name_of(wc.allocator);
    m["padding"] = std::to_string(wc.padding);
    m["tokens"] = std::to_string(wc.writes.front().slots.slots.size());
    m["source_rows"] = std::to_string(wc.writes.front().k.shape.at(0));
    std::size_t blocks = 0;
    for (const StepRequest& r : wc.requests) blocks = std::max(blocks, r.block_table.size());
    const auto nreq = static_cast<std::int64_t>(wc.requests.size());
    m["requests"] = std::to_string(nreq);
    m["request_blocks"] = std::to_string(blocks);
    std::vector<std::int64_t> context, q_len, table;
    for (const StepRequest& r : wc.requests) {
      context.push_back(r.context);
      q_len.push_back(r.q_len);
      table.insert(table.end(), r.block_table.begin(), r.block_table.end());
      table.resize(table.size() + blocks - r.block_table.size(), -1);
    }
    out.put_i64("input.request.context", {nreq}, context);
    out.put_i64("input.request.q_len", {nreq}, q_len);
    out.put_i64("input.request.block_table", {nreq, static_cast<std::int64_t>(blocks)}, table);
    for (std::size_t l = 0; l < wc.writes.size(); ++l) {
      put_layer_write(out, layer_prefix("input", l), wc.config, wc.writes[l]);
      out.put_caches(layer_prefix("cache", l), c.poisoned[l]);
      out.put_caches(layer_prefix("expected.cache", l), c.expected[l]);
    }
  }

  std::unique_ptr<PreparedCase> decode_case(TensorReader& in, std::uint64_t seed) const override {
    spec::MetadataReader& m = in.metadata();
    WriteCase wc;
    wc.seed = seed;
    wc.config = spec::read_config(m);
    wc.allocator = m.choice<AllocatorShape>("allocator");
    wc.padding = case_count(m, "padding");
    const std::int64_t tokens = case_count(m, "tokens");
    const std::int64_t rows = case_count(m, "source_rows");
    const std::int64_t nreq = case_count(m, "requests");
    const std::int64_t blocks = case_count(m, "request_blocks");
    const std::vector<std::int64_t> context = in.take_i64("input.request.context", {nreq});
    const std::vector<std::int64_t> q_len = in.take_i64("input.request.q_len", {nreq});
    const std::vector<std::int64_t> table =
        in.take_i64("input.request.block_table", {nreq, blocks});
    std::int64_t written = wc.padding;
    for (std::int64_t r = 0; r < nreq; ++r) {
      const auto i = static_cast<std::size_t>(r);
      for (const auto& [part, counts] : {std::pair{"context", &context}, {"q_len", &q_len}}) {
        const std::int64_t v = (*counts)[i];
        if (v < 0 || v > kMaxCaseCount) {
          throw spec::InvalidInput("tensor 'input.request." + std::string(part) + "'", r,
                                   std::to_string(v), "expected a token count in [0, 2^30]");
        }
      }
      written += q_len[i];
      // The row's blocks, up to its first -1.
      const auto row = table.begin() + static_cast<std::ptrdiff_t>(i) * blocks;
      wc.requests.push_back({context[i], q_len[i], {row, std::find(row, row + blocks, -1)}});
    }
    if (written != tokens) {
      throw spec::InvalidInput(
          "tensor 'input.request.q_len'", -1, std::to_string(written - wc.padding),
          "the requests' tokens plus __metadata__ 'padding' must be __metadata__ 'tokens' = " +
              std::to_string(tokens));
    }
    std::vector<spec::LayerCaches> initial;
    for (std::size_t l = 0; l < wc.config.layers.size(); ++l) {
      const spec::LayerKind kind = wc.config.layers[l];
      wc.writes.push_back(
          take_layer_write(in, layer_prefix("input", l), wc.config, kind, rows, tokens));
      initial.push_back(in.take_caches(layer_prefix("cache", l), wc.config, kind));
    }
    auto c = std::make_unique<WritePrepared>(std::move(wc), std::move(initial));
    for (std::size_t l = 0; l < c->expected.size(); ++l)
      check_expected_caches(in, layer_prefix("cache", l), c->expected[l]);
    return c;
  }

  void encode_answer(Subject& subject, PreparedCase& pc, TensorWriter& out) const override {
    auto& c = static_cast<WritePrepared&>(pc);
    std::vector<spec::LayerCaches> actual = c.poisoned;
    for (std::size_t l = 0; l < c.wc.writes.size(); ++l)
      subject.write_layer(c.wc.config, c.wc.writes[l], actual[l]);
    for (std::size_t l = 0; l < actual.size(); ++l)
      out.put_caches(layer_prefix("cache", l), actual[l]);
  }

  void answer_from(const TensorSet& result, PreparedCase& pc,
                   SubjectFunctions& into) const override {
    const auto& c = static_cast<WritePrepared&>(pc);
    into.write = [&c, tensors = tensors_by_name(result)](const spec::ModelConfig&,
                                                         const spec::LayerWrite& write,
                                                         spec::LayerCaches& caches) {
      // The layer is the one whose write call the campaign passes (the case's own).
      for (std::size_t l = 0; l < c.wc.writes.size(); ++l) {
        if (&c.wc.writes[l] == &write)
          return fill_caches(tensors, layer_prefix("cache", l), caches);
      }
      throw spec::FailedToRun("a result file answers only its own case's write calls");
    };
  }

 private:
  /// Whether a case's copies are huge (a buffer of spec::kLazyStorageBytes or more: gigabytes,
  /// the huge-cache theme).
  static bool huge_copies(const WritePrepared& c) {
    for (const spec::LayerCaches& caches : c.device_start()) {
      for (const spec::CacheBuffer& b : caches.buffers) {
        if (b.storage.size() >= spec::kLazyStorageBytes) return true;
      }
    }
    return false;
  }

  /// Every layer of case `c` written on the device by each of `writers` (writer 0 the tier's
  /// answerer) into a copy of its own: the inputs generated there from the case's WriteValues, the
  /// case's scales and slot mappings; the tier's copy defined only over `tier_defined` when given
  /// (DefinedCopies::kFirst), the staged comparison over `staged`.
  static std::unique_ptr<ResidentWrites> write_resident(const WritePrepared& c,
                                                        const std::vector<Subject*>& writers,
                                                        std::span<const BufferBytes> tier_defined,
                                                        std::span<const BufferBytes> staged) {
    if (!c.wc.values) throw spec::Unsupported("a write case without generated values");
    const WriteValues& plan = *c.wc.values;
    std::vector<std::int64_t> layers(c.wc.writes.size());
    std::iota(layers.begin(), layers.end(), 0);
    std::vector<std::vector<float>> k_scale, v_scale;
    const spec::SlotMapping* index_slots = nullptr;
    for (const spec::LayerWrite& w : c.wc.writes) {
      k_scale.push_back(w.k_scale);
      v_scale.push_back(w.v_scale);
      if (c.wc.config.separate_index_slots && w.kind == spec::LayerKind::kSparse)
        index_slots = &w.index_slots;
    }
    const auto rows = static_cast<std::int64_t>(plan.row_keys.size());
    std::unique_ptr<ResidentWrites> device;
    if (!tier_defined.empty()) {
      device = std::make_unique<ResidentWrites>(c.wc.config, layers, c.device_start(), writers,
                                                plan.gen, k_scale, v_scale, rows, tier_defined);
    } else {
      device = std::make_unique<ResidentWrites>(c.wc.config, layers, c.device_start(), writers,
                                                plan.gen, k_scale, v_scale, rows);
    }
    device->stage_step(plan.row_keys, c.wc.writes.front().slots, index_slots, staged,
                       plan.zero_rows);
    for (std::size_t l = 0; l < layers.size(); ++l) {
      for (std::size_t w = 0; w < writers.size(); ++w) device->write(l, w);
    }
    return device;
  }

  /// The buffer lists of the case's widest layer (a dense layer's buffers are a sparse one's
  /// first: a list of a sparse layer's serves both, a range of a buffer a layer lacks is skipped).
  static spec::LayerKind widest_kind(const WritePrepared& c) {
    const std::vector<spec::LayerKind>& kinds = c.wc.config.layers;
    return std::find(kinds.begin(), kinds.end(), spec::LayerKind::kSparse) != kinds.end()
               ? spec::LayerKind::kSparse
               : spec::LayerKind::kDense;
  }
  /// The bytes the case's writes may touch: every buffer's guard bands and the blocks its slots
  /// name (a negative one's legacy wrap included).
  static std::vector<BufferBytes> written_pages(const WritePrepared& c) {
    // Every layer writes through the same mappings (stage_step stages one of each).
    std::span<const std::int64_t> index_slots;
    for (const spec::LayerWrite& w : c.wc.writes) {
      if (c.wc.config.separate_index_slots && w.kind == spec::LayerKind::kSparse)
        index_slots = w.index_slots.slots;
    }
    return step_bytes(
        c.layout, widest_kind(c),
        touched_blocks(c.wc.config.geometry, {c.wc.writes.front().slots.slots, index_slots}));
  }
  /// Where a device case is judged from its device bytes when a copy differs from the answerer's
  /// (empty: it is not): a case that carries the CPU reference's answer (several admissible
  /// answers), over every buffer, or a huge one's `written` pages (written_pages: the rest of a
  /// huge copy is compared with the poison on the device, and its pages would not fit on the host).
  static std::vector<BufferBytes> judged_ranges(const WritePrepared& c,
                                                const std::vector<BufferBytes>& written) {
    if (c.expected.empty() || c.device_initial.empty()) return {};
    return huge_copies(c) ? written : whole_bytes(c.layout, widest_kind(c));
  }
  static std::int64_t total(const std::vector<LayerDifference>& diffs) {
    std::int64_t n = 0;
    for (const LayerDifference& d : diffs) n += d.count;
    return n;
  }

  /// Writer `writer`'s device copy of a case that carries the CPU reference's answer, judged as
  /// `run` judges a host run (by the sets where the contract admits several codes): the bytes of
  /// `ranges` (judged_ranges) downloaded here, the diff left to Verdict::finish (no device).
  /// `compared`: the bytes the device compared first (every byte of the allocations, equal
  /// outside `ranges`), what the verdict counts whichever way the copy is judged: a racing
  /// subject's copy may equal the answerer's in one run and differ in the next.
  static Verdict judge_device_bytes(const WritePrepared& c, ResidentWrites& device,
                                    std::size_t writer, const std::vector<BufferBytes>& ranges,
                                    std::int64_t compared) {
    auto actual = std::make_shared<std::vector<spec::LayerCaches>>(c.poisoned);
    Verdict v;
    v.bytes_compared = compared;
    v.outcome = run_guarded(
        [&] {
          device.download(writer, ranges, *actual);
          return spec::Outcome::kPass;
        },
        v.report);
    if (v.outcome != spec::Outcome::kPass) return v;
    v.finish = [&c, actual, compared] {
      Verdict f;
      f.outcome = run_guarded([&] { return diff_against_expected(c, *actual, 1, f); }, f.report);
      f.bytes_compared = compared;
      return f;
    };
    return v;
  }

  /// `actual` (every layer of case `c` after a writer's run) diffed against the expected caches
  /// into `v`: bytes compared, the SPEC 7 report, the differing bytes; the outcome.
  static spec::Outcome diff_against_expected(const WritePrepared& c,
                                             const std::vector<spec::LayerCaches>& actual,
                                             std::size_t samples, Verdict& v) {
    CacheDiff diff;
    for (std::size_t l = 0; l < c.wc.writes.size(); ++l)
      diff.merge(diff_write_layer(c.wc.config, c.layout, l, c.wc.writes[l], c.expected[l],
                                  actual[l], samples));
    v.bytes_compared = diff.compared_bytes;
    v.report = diff.report();
    v.failure_class = diff.failure_class();
    v.mismatch_size = diff.equal() ? 0 : diff.differing_bytes;
    return diff.equal() ? spec::Outcome::kPass : spec::Outcome::kMismatch;
  }

  /// Runs the subject over every layer into a copy of the poisoned caches (kept in `keep` when
  /// given) and diffs them, describing up to `samples` elements.
  static Verdict run(Subject& subject, const WritePrepared& c, std::size_t samples,
                     std::vector<spec::LayerCaches>* keep) {
    return run_on_copy(c.poisoned, keep, [&](std::vector<spec::LayerCaches>& actual, Verdict& v) {
      for (std::size_t l = 0; l < c.wc.writes.size(); ++l)
        subject.write_layer(c.wc.config, c.wc.writes[l], actual[l]);
      return diff_against_expected(c, actual, samples, v);
    });
  }
};

}  // namespace

const OpDriver& write_driver() {
  static const WriteDriver driver;
  return driver;
}

}  // namespace kvo::oracle
