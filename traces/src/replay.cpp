#include "kvo/traces/replay.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <semaphore>
#include <sstream>

#include "kvo/oracle/cache_diff.hpp"
#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/dense_diff.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/one_thread.hpp"
#include "kvo/oracle/read_diff.hpp"
#include "kvo/oracle/read_judge.hpp"
#include "kvo/oracle/resident_writes.hpp"
#include "kvo/reference/dense_insert.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/cache_storage.hpp"
#include "kvo/traces/analysis.hpp"

namespace kvo::traces {
namespace {

using reference::GenTensor;

/// The generator key of every slot-mapping row of a step: (request id, position) for the real
/// tokens, in slot-mapping order, then (-1, row) for the padding tail.
struct RowKeys {
  std::vector<reference::RowKey> keys;
  std::size_t real = 0;  ///< rows before the padding
  /// The real tokens' keys.
  std::span<const reference::RowKey> real_keys() const { return {keys.data(), real}; }
};

RowKeys row_keys(const TraceStep& st) {
  const std::vector<std::int64_t> starts = st.starts();
  RowKeys k;
  k.keys.reserve(static_cast<std::size_t>(st.tokens()));
  for (std::int64_t b = 0; b < st.batch(); ++b) {
    const auto bi = static_cast<std::size_t>(b);
    const std::int64_t q = starts[bi + 1] - starts[bi];
    const std::int64_t first = st.seq_lens.values[bi] - q;
    for (std::int64_t j = 0; j < q; ++j) {
      k.keys.push_back({st.request_id(b), first + j});
    }
  }
  k.real = k.keys.size();
  for (std::int64_t i = starts.back(); i < st.tokens(); ++i) {
    k.keys.push_back({-1, i});  // padding rows: generated but never read
  }
  return k;
}

spec::SlotMapping slot_mapping(const IntTensor& t) {
  spec::SlotMapping m;
  m.type = t.type;
  m.slots = t.values;
  return m;
}

bool same_bytes(const spec::LayerCaches& a, const spec::LayerCaches& b) {
  if (a.buffers.size() != b.buffers.size()) return false;
  for (std::size_t i = 0; i < a.buffers.size(); ++i) {
    if (!a.buffers[i].storage.same_as(b.buffers[i].storage)) return false;
  }
  return true;
}

/// The cache blocks a step's writes may touch (oracle::touched_blocks over both mappings).
std::vector<std::int64_t> touched_blocks(const spec::ModelConfig& c, const TraceStep& st) {
  return oracle::touched_blocks(
      c.geometry,
      {st.slot_mapping.values, st.index_slot_mapping
                                   ? std::span<const std::int64_t>(st.index_slot_mapping->values)
                                   : std::span<const std::int64_t>()});
}

/// Compares the guard bands and the given blocks of every buffer (the bytes each block's elements
/// span, oracle::block_byte_ranges: any layout, dense or a strided view). Adds the bytes compared
/// to `compared`.
bool same_pages(const reference::PagedCacheLayout& layout, const spec::LayerCaches& a,
                const spec::LayerCaches& b, const std::vector<std::int64_t>& blocks,
                std::int64_t& compared) {
  if (a.buffers.size() != b.buffers.size()) return false;
  for (std::size_t i = 0; i < a.buffers.size(); ++i) {
    const spec::CacheBuffer& x = a.buffers[i];
    const spec::CacheBuffer& y = b.buffers[i];
    if (x.storage.size() != y.storage.size() || x.guard_bytes != y.guard_bytes) return false;
    const auto guard = static_cast<std::size_t>(x.guard_bytes);
    const std::size_t tail = x.storage.size() - guard;
    if (std::memcmp(x.storage.data(), y.storage.data(), guard) != 0 ||
        std::memcmp(x.storage.data() + tail, y.storage.data() + tail, guard) != 0) {
      return false;
    }
    compared += static_cast<std::int64_t>(2 * guard);
    for (std::int64_t blk : blocks) {
      for (const auto& [from, to] : oracle::block_byte_ranges(layout, x.kind, blk)) {
        const auto n = static_cast<std::size_t>(to - from);
        if (std::memcmp(x.body() + from, y.body() + from, n) != 0) return false;
        compared += to - from;
      }
    }
  }
  return true;
}

std::int64_t total_bytes(const spec::LayerCaches& c) {
  std::int64_t n = 0;
  for (const auto& b : c.buffers) n += b.storage.size();
  return n;
}

}  // namespace

reference::ValueGenerator replay_generator(const Trace& trace, const ReplayOptions& o) {
  reference::ValueGenerator gen;
  gen.seed = o.value_seed;
  gen.act = trace.config.act_dtype;
  gen.edge_values = o.edge_values;
  gen.allow_nonfinite = o.edge_values;
  return gen;
}

std::string resident_blocker(const Trace& trace, const ReplayOptions& o,
                             const std::vector<oracle::Subject*>& writers) {
  const spec::ModelConfig& c = trace.config;
  for (const spec::Op op : o.ops) {
    if (op != spec::Op::kWrite) {
      return "op " + std::string(spec::name_of(op)) + " reads the CPU reference's caches";
    }
  }
  if (trace.read.dense_rotary_dim > 0) {
    return "the trace's dense layers use the fused qknorm + rope + insert";
  }
  if (std::string why = oracle::ResidentWrites::config_blocker(c); !why.empty()) return why;
  if (writers.size() < 2) return "no write subject to judge";
  return oracle::ResidentWrites::unavailable(writers);
}

spec::LayerWrite make_step_write(const Trace& trace, std::int64_t step, std::int64_t layer,
                                 const reference::ValueGenerator& gen) {
  const spec::ModelConfig& c = trace.config;
  const TraceStep& st = trace.steps.at(static_cast<std::size_t>(step));
  const RowKeys k = row_keys(st);
  spec::LayerWrite w;
  w.kind = c.layers.at(static_cast<std::size_t>(layer));
  const spec::CacheGeometry& g = c.geometry;
  w.k = reference::generated_rows(gen, layer, GenTensor::kK, k.keys, g.num_kv_heads, g.head_dim);
  w.v = reference::generated_rows(gen, layer, GenTensor::kV, k.keys, g.num_kv_heads, g.head_dim);
  w.slots = slot_mapping(st.slot_mapping);
  if (w.kind == spec::LayerKind::kSparse) {
    w.index_k = reference::generated_rows(gen, layer, GenTensor::kIndexK, k.keys, 0, g.index_dim);
    if (st.index_slot_mapping) w.index_slots = slot_mapping(*st.index_slot_mapping);
  }
  w.k_scale = trace.k_scale;
  w.v_scale = trace.v_scale;
  return w;
}

std::vector<float> rope_table(const Trace& trace) {
  const std::int64_t rd = trace.read.dense_rotary_dim;
  if (rd <= 0) return {};
  std::int64_t max_pos = 0;
  for (const TraceStep& st : trace.steps) {
    for (std::int64_t len : st.seq_lens.values) max_pos = std::max(max_pos, len - 1);
  }
  return reference::rope_cos_sin(rd, max_pos + 1);
}

spec::DenseInsert make_step_dense(const Trace& trace, std::int64_t step, std::int64_t layer,
                                  const reference::ValueGenerator& gen,
                                  const std::vector<float>& cos_sin) {
  const TraceStep& st = trace.steps.at(static_cast<std::size_t>(step));
  const RowKeys k = row_keys(st);
  const std::int64_t hd = trace.config.geometry.head_dim;
  spec::DenseInsert d;
  d.kv = make_step_write(trace, step, layer, gen);
  d.q = reference::generated_rows(gen, layer, GenTensor::kQ, k.keys,
                                  attention_params(trace).num_q_heads, hd);
  // Weights near 0, so that (1 + w) stays near 1: generated values scaled by 1/8 (exact).
  for (auto [which, out] :
       {std::pair{GenTensor::kQ, &d.q_norm_weight}, std::pair{GenTensor::kK, &d.k_norm_weight}}) {
    out->resize(static_cast<std::size_t>(hd));
    gen.fill_row(gen.row_key(layer, which, -2, 0), 1, hd, out->data());
    for (float& w : *out) w *= 0.125f;
  }
  d.eps = 1e-6f;
  d.rotary_dim = trace.read.dense_rotary_dim;
  d.fp8_store = trace.read.dense_fp8_store;
  d.cos_sin = cos_sin;
  d.positions.assign(k.keys.size(), 0);  // padding rows: position 0 (q only, no insert)
  for (std::size_t r = 0; r < k.real; ++r) d.positions[r] = k.keys[r].position;
  return d;
}

oracle::ReadCase make_step_read(const Trace& trace, std::int64_t step, std::int64_t layer,
                                const reference::ValueGenerator& gen) {
  const TraceStep& st = trace.steps.at(static_cast<std::size_t>(step));
  const RowKeys k = row_keys(st);
  oracle::ReadCase rc;
  rc.seed = gen.seed;
  rc.config = trace.config;
  rc.indexer = indexer_params(trace);
  rc.attention = attention_params(trace);
  spec::ReadBatch& b = rc.batch;
  b.max_blocks = st.block_table.dim(1);
  b.block_table.reserve(st.block_table.values.size());
  for (std::int64_t v : st.block_table.values) {
    // Entries past a request's blocks are ignored by the format and may be anything.
    const bool fits = v >= std::numeric_limits<std::int32_t>::min() &&
                      v <= std::numeric_limits<std::int32_t>::max();
    b.block_table.push_back(fits ? static_cast<std::int32_t>(v) : -1);
  }
  b.seq_lens = st.seq_lens.values;
  b.query_start_loc = st.starts();
  const spec::CacheGeometry& g = trace.config.geometry;
  rc.index_q = reference::cast_tensor(
      reference::generated_rows(gen, layer, GenTensor::kIndexQ, k.real_keys(),
                                rc.indexer.num_index_heads, g.index_dim),
      spec::index_q_dtype(trace.config, rc.indexer));
  rc.q = reference::generated_rows(gen, layer, GenTensor::kQ, k.real_keys(),
                                   rc.attention.num_q_heads, g.head_dim);
  rc.k_scale = trace.k_scale;
  rc.v_scale = trace.v_scale;
  return rc;
}

std::string ReplayReport::summary() const {
  std::ostringstream s;
  for (const ReplaySubjectResult& r : subjects) {
    const bool write = r.op == spec::Op::kWrite || r.op == spec::Op::kDense;
    s << "  " << r.name << (r.op == spec::Op::kWrite ? "" : " " + std::string(spec::name_of(r.op)))
      << ": ";
    if (!r.note.empty() && r.layer_writes == 0 && r.outcome == spec::Outcome::kPass) {
      s << "skipped (" << r.note << ")\n";
      continue;
    }
    s << spec::name_of(r.outcome) << ", " << r.layer_writes
      << (write ? " layer writes" : " layer reads");
    if (r.mismatching_steps) s << ", " << r.mismatching_steps << " mismatching steps";
    if (!r.note.empty()) s << " (" << r.note << ")";
    s << "\n";
  }
  if (tier != oracle::ReferenceTier::kCpu) {
    s << "reference: the " << spec::name_of(tier) << " tier (" << tier_answerers << ") answered "
      << tier_layers << " layer writes, the CPU reference " << cpu_layers
      << "; the tier checked against the CPU reference on " << tier_checks << "\n";
    if (!residence.empty()) s << "caches: " << residence << "\n";
    if (!resident_times.empty()) s << "resident: " << resident_times << "\n";
  }
  if (!tier_disagreement.empty()) s << "tier disagreement: " << tier_disagreement << "\n";
  s << "result: " << spec::name_of(worst) << " (" << steps_run << " steps)";
  return s.str();
}

namespace {

/// One replay in progress: the validated options, the result rows and the caches.
class Replayer {
 public:
  Replayer(const Trace& trace, const ReplayOptions& o, ReplayReport& report)
      : trace_(trace),
        c_(trace.config),
        o_(o),
        report_(report),
        layout_(c_),
        gen_(replay_generator(trace, o)),
        cos_sin_(rope_table(trace)) {}

  void run(oracle::SubjectList& subjects, const ReplayProgress& progress);

 private:
  struct WriteRow {
    oracle::Subject* subject;
    spec::Op op;  ///< kWrite, or kDense on a trace whose dense layers use the fused insert
    std::size_t row;
    std::vector<spec::LayerCaches> caches;  ///< per selected layer
    bool running = true;
  };
  struct ReadRow {
    oracle::Subject* subject;
    spec::Op op;
    std::size_t row;
    bool running = true;
  };

  void check_arguments();
  /// Throws spec::FailedToRun, with the figures, when the caches the replay would hold do not fit
  /// in the host memory this process may take (issue 15: say so before starting, never be killed).
  void check_host_memory() const;
  std::size_t add_row(const std::string& name, spec::Op op, const std::string& note) {
    report_.subjects.push_back(ReplaySubjectResult{.name = name, .op = op, .note = note});
    return report_.subjects.size() - 1;
  }
  /// Records a mismatch of a row found at steps [first, s] of layer li (one step, or a sweep's
  /// range), with the replay flags that rerun it alone; true when the replay must stop.
  bool mismatch(std::size_t row, std::vector<bool>& mismatched, std::string text,
                std::int64_t first, std::int64_t s, std::size_t li) {
    ReplaySubjectResult& r = report_.subjects[row];
    r.outcome = spec::worst(r.outcome, spec::Outcome::kMismatch);
    if (!mismatched[row]) ++r.mismatching_steps;
    mismatched[row] = true;
    report_.mismatches.push_back(std::move(text));
    std::ostringstream flags;
    flags << "--steps " << first << ":" << s + 1 << " --layers " << layers_[li] << " --subject "
          << r.name << " --ops " << spec::name_of(r.op);
    if (o_.value_seed != ReplayOptions{}.value_seed) {
      char seed[24];
      std::snprintf(seed, sizeof seed, "0x%016llX", static_cast<unsigned long long>(o_.value_seed));
      flags << " --value-seed " << seed;
    }
    if (o_.edge_values) flags << " --edge-values";
    report_.reproduce.push_back(flags.str());
    return !o_.keep_going;
  }
  /// One layer's inputs at one step, and the reference's q_out of a fused dense insert.
  struct LayerInput {
    spec::LayerWrite write;
    std::optional<spec::DenseInsert> dense;
    spec::HostTensor q_expected;
  };
  /// Layer li's inputs at `step`, generated.
  LayerInput generate_layer(std::int64_t step, std::size_t li) const;
  /// The reference's answer to them, into expected_[li] (and in.q_expected).
  void reference_layer(std::size_t li, LayerInput& in);
  /// Whether layer li goes through the fused dense insert (a dense layer of such a trace).
  bool fused_dense(std::size_t li) const {
    return !cos_sin_.empty() &&
           c_.layers[static_cast<std::size_t>(layers_[li])] == spec::LayerKind::kDense;
  }
  /// Whether row `w` runs layer li: op dense the fused dense layers, op write every other layer.
  bool runs(const WriteRow& w, std::size_t li) const {
    return (w.op == spec::Op::kDense) == fused_dense(li);
  }
  /// A subject's write of one layer: its q_out (a fused dense insert) or what it threw. Run on a
  /// worker for a concurrent subject, else on the calling thread; judged by judge_write.
  struct SubjectWrite {
    spec::HostTensor q_got;
    std::exception_ptr error;
    /// same_pages of the step's pages, when the worker that wrote them compared them (a write
    /// row's write that did not throw), with the bytes it compared.
    std::optional<bool> pages_same;
    std::int64_t pages_compared = 0;
  };
  /// One layer of one step as the workers leave it: its inputs, the reference's write of them
  /// into expected_[li], and the concurrent rows' writes into their caches (per write row; empty
  /// for a row written on the calling thread).
  /// Who answered one layer write of a replayed step, and a disagreement of the tier with the CPU
  /// reference (or the tier's failure) found there.
  struct TierNote {
    enum class Answer { kCpu, kTier, kChecked } answer = Answer::kCpu;
    std::string problem;
  };
  struct LayerWork {
    LayerInput in;
    TierNote tier;
    std::vector<std::optional<SubjectWrite>> writes;
  };
  /// The answer to layer li's inputs at replayed step `step`, into expected_[li] (and
  /// in.q_expected): the CPU reference's, or the tier's; on a sampled step both, the tier's into a
  /// copy, compared whole. Runs on a worker.
  TierNote answer_layer(std::int64_t step, std::size_t li, LayerInput& in);
  /// The tier's answerer of layer li's op (null: the CPU reference answers it).
  oracle::Subject* tier_answerer(std::size_t li) const {
    return tier_.answering(fused_dense(li) ? spec::Op::kDense : spec::Op::kWrite);
  }
  /// After a tier-answered layer li at step s failed a subject: the CPU reference's own caches of
  /// the layer (shadow_[li], replayed from the poisoned caches through step s) compared whole
  /// with expected_[li], and q_out with `in`'s (a dense insert at s). Empty when they agree, else
  /// the disagreement. Runs on the calling thread.
  std::string tier_recheck(std::size_t li, std::int64_t s, const LayerInput* in);
  /// "the write answerer cuda-fused" of layer li.
  std::string tier_who(std::size_t li) const;
  /// Empty when the tier's answer to layer li equals the CPU reference's, else the SPEC 7 report
  /// (a dense insert's caches and q_out judged as a canonical subject's; a write's whole caches).
  std::string tier_diff(std::size_t li, const LayerInput& in, const spec::LayerCaches& cpu,
                        const spec::HostTensor& q_cpu, const spec::LayerCaches& tier,
                        const spec::HostTensor& q_tier);
  /// Records a tier disagreement at step s, layer li: the replay stops, failed to run.
  bool tier_failed(std::int64_t s, std::size_t li, const std::string& problem);
  SubjectWrite run_write(WriteRow& w, std::size_t li, const LayerInput& in);
  /// Judges row w's write of layer li (the pages the step names, or the dense judgement); true
  /// when the replay must stop.
  bool judge_write(WriteRow& w, std::size_t li, std::int64_t step, const LayerWork& work,
                   SubjectWrite run, const std::vector<std::int64_t>& blocks,
                   std::vector<bool>& mismatched);
  bool read_layer(std::size_t li, std::int64_t step, std::vector<bool>& mismatched);
  /// The CPU reference's own caches of layer li (shadow_), written through step s.
  spec::LayerCaches& advance_shadow(std::size_t li, std::int64_t s);
  /// Whether the replay runs with the GPU tier's caches resident on the device (options'
  /// Residence and resident_blocker); spec::InvalidInput when it must and cannot.
  bool resident_run();
  /// The replayed steps with the caches resident on the device (ReplayOptions::residence).
  void run_resident(const ReplayProgress& progress);
  /// The tier's copy of layer li against the CPU reference's own caches replayed through step s,
  /// over `bytes` (the pages a subject failed on); empty when they agree, else the disagreement.
  std::string resident_tier_recheck(oracle::ResidentWrites& rw, std::size_t li, std::int64_t s,
                                    std::span<const oracle::BufferBytes> bytes);
  /// A sampled step's check of layer li: the CPU reference's write of step s's CPU-generated values
  /// over the tier's pages from `before` the step, against its pages `after` it. Empty when they
  /// agree, else the SPEC 7 report. Runs on any thread.
  std::string check_sampled_layer(std::int64_t s, std::size_t li, const gpu::PagesInFlight& before,
                                  const gpu::PagesInFlight& after) const;
  /// The layer's host caches (every buffer lazy) holding `bytes` of writer `writer`'s copy.
  spec::LayerCaches resident_pages(oracle::ResidentWrites& rw, std::size_t li, std::size_t writer,
                                   std::span<const oracle::BufferBytes> bytes);
  bool sweep(std::int64_t first_step, std::int64_t step, std::vector<bool>& mismatched);
  /// Runs fn(li) for every selected layer, at most workers_ at once (layers share nothing).
  void each_layer(const std::function<void(std::size_t)>& fn) const;

  const Trace& trace_;
  const spec::ModelConfig& c_;
  const ReplayOptions& o_;
  ReplayReport& report_;
  const reference::PagedCacheLayout layout_;
  const reference::ValueGenerator gen_;
  const std::vector<float> cos_sin_;  ///< rope_table(trace): empty unless dense layers are fused
  std::vector<std::int64_t> layers_;
  std::int64_t end_ = 0;
  std::vector<spec::LayerCaches> expected_;  ///< per selected layer
  std::vector<WriteRow> write_rows_;
  std::vector<ReadRow> read_rows_;
  std::size_t workers_ = 1;  ///< --jobs: threads working on layers
  /// touched_blocks of each step up to end_: the pages each step is judged on, computed once.
  std::vector<std::vector<std::int64_t>> step_blocks_;
  oracle::TierAnswerers tier_;  ///< the GPU tier's answerers (none in the CPU tier)
  /// Per selected layer, the CPU reference's own caches (tier_recheck) and the next step they
  /// have not written.
  std::vector<std::optional<spec::LayerCaches>> shadow_;
  std::vector<std::int64_t> shadow_next_;
  spec::HostTensor shadow_q_;  ///< q_out of the last dense insert advance_shadow wrote
};

void Replayer::check_arguments() {
  const TraceValidation v = validate_trace(trace_, 1);
  if (!v.ok()) {
    const TraceProblem& p = v.problems.front();
    throw spec::InvalidInput(
        p.tensor, p.index, std::to_string(p.value),
        p.what + " (" + std::to_string(v.count) + " problems; kvoracle trace validate lists them)");
  }
  const auto steps = static_cast<std::int64_t>(trace_.steps.size());
  end_ = o_.step_end < 0 ? steps : o_.step_end;
  if (o_.step_begin < 0 || o_.step_begin > end_ || end_ > steps) {
    throw spec::InvalidInput("steps", -1,
                             std::to_string(o_.step_begin) + ":" + std::to_string(end_),
                             "expected a:b with 0 <= a <= b <= " + std::to_string(steps));
  }
  layers_ = o_.layers;
  if (layers_.empty()) {
    for (std::size_t l = 0; l < c_.layers.size(); ++l)
      layers_.push_back(static_cast<std::int64_t>(l));
  }
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i] < 0 || layers_[i] >= static_cast<std::int64_t>(c_.layers.size())) {
      throw spec::InvalidInput(
          "layers", static_cast<std::int64_t>(i), std::to_string(layers_[i]),
          "expected a layer index in [0, " + std::to_string(c_.layers.size()) + ")");
    }
  }
  std::sort(layers_.begin(), layers_.end());
  layers_.erase(std::unique(layers_.begin(), layers_.end()), layers_.end());
  const std::int64_t rotary = trace_.read.dense_rotary_dim;
  if (rotary > c_.geometry.head_dim) {
    throw spec::InvalidInput("__metadata__ 'dense_rotary_dim'", -1, std::to_string(rotary),
                             "must be at most head_dim = " + std::to_string(c_.geometry.head_dim));
  }
  for (std::size_t i = 0; i < o_.ops.size(); ++i) {
    const bool known =
        std::find(kReplayOps.begin(), kReplayOps.end(), o_.ops[i]) != kReplayOps.end();
    if (!known || (o_.ops[i] == spec::Op::kDense && rotary == 0)) {
      throw spec::InvalidInput("ops", static_cast<std::int64_t>(i),
                               std::string(spec::name_of(o_.ops[i])),
                               "this trace holds cases for write, indexer and attention" +
                                   std::string(rotary == 0 ? " (dense: no dense_rotary_dim in "
                                                             "its metadata)"
                                                           : " and dense"));
    }
  }
  if (o_.full_diff_every < 1) {
    throw spec::InvalidInput("full_diff_every", -1, std::to_string(o_.full_diff_every),
                             "must be >= 1");
  }
}

void Replayer::check_host_memory() const {
  const std::optional<spec::HostMemory> available = spec::host_memory_available();
  if (!available) return;
  // The blocks any step up to the range's end names: all a lazy (huge) buffer ever holds.
  const spec::CacheGeometry& g = c_.geometry;
  std::vector<bool> named(static_cast<std::size_t>(g.num_blocks), false);
  for (std::int64_t s = 0; s < end_; ++s) {
    for (const std::int64_t b : step_blocks_[static_cast<std::size_t>(s)])
      named[static_cast<std::size_t>(b)] = true;
  }
  const auto named_blocks = std::count(named.begin(), named.end(), true);
  std::int64_t per_copy = 0;
  for (const std::int64_t l : layers_) {
    for (const spec::BufferKind b : layout_.buffers(c_.layers[static_cast<std::size_t>(l)])) {
      const std::int64_t bytes = layout_.buffer_bytes(b) + 2 * spec::kGuardBytes;
      // A lazy buffer: each named block's bytes, and a page on either side where they straddle.
      const std::int64_t held = named_blocks * (layout_.buffer_bytes(b) / g.num_blocks +
                                                2 * spec::ByteStorage::kPageBytes);
      per_copy += bytes < spec::kLazyStorageBytes ? bytes : std::min(bytes, held);
    }
  }
  // The GPU tier's rechecks may hold the CPU reference's own copy of every layer (shadow_).
  const auto copies =
      static_cast<std::int64_t>(1 + write_rows_.size() + (tier_.by_op.empty() ? 0 : 1));
  const std::int64_t needed = per_copy * copies;
  if (needed <= available->bytes) return;
  const auto gib = [](std::int64_t v) {
    char text[32];
    if (v < (std::int64_t{1} << 30)) {
      std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(v) / (1 << 20));
    } else {
      std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(v) / (1ll << 30));
    }
    return std::string(text);
  };
  throw spec::FailedToRun(
      "the replay needs about " + gib(needed) + " of host memory (" +
      std::to_string(layers_.size()) + " layers' caches, " + gib(per_copy) + " a copy, x " +
      std::to_string(copies) + " copies: the reference's, " + std::to_string(write_rows_.size()) +
      " write subject(s)'" + (tier_.by_op.empty() ? "" : " and the tier's CPU check's") +
      "; a buffer of " + gib(spec::kLazyStorageBytes) + " or more counted by the " +
      std::to_string(named_blocks) + " blocks the steps name) and " + gib(available->bytes) +
      " are available (" + available->source +
      "): replay fewer layers (--layers), fewer subjects (--subject) or "
      "fewer steps (--steps)");
}

Replayer::LayerInput Replayer::generate_layer(std::int64_t step, std::size_t li) const {
  LayerInput in;
  if (fused_dense(li)) {
    in.dense = make_step_dense(trace_, step, layers_[li], gen_, cos_sin_);
    in.write = in.dense->kv;
  } else {
    in.write = make_step_write(trace_, step, layers_[li], gen_);
  }
  return in;
}

void Replayer::reference_layer(std::size_t li, LayerInput& in) {
  // A huge cache's pages this step touches (oracle/harness.hpp), before anyone writes them; the
  // subjects' copies get the same in write_layer.
  oracle::materialise_write(layout_, expected_[li], in.write);
  if (in.dense) {
    in.q_expected = reference::dense_insert(c_, *in.dense, expected_[li]);
  } else {
    reference::write_layer(c_, in.write, expected_[li]);
  }
}

Replayer::TierNote Replayer::answer_layer(std::int64_t step, std::size_t li, LayerInput& in) {
  oracle::Subject* answerer = tier_answerer(li);
  // Where the modes admit several codes (SPEC 7: div_approx, legacy-wrap races) the answer is not
  // one set of bytes, and the subjects are judged against the CPU reference's.
  if (answerer == nullptr || reference::admits_several(c_, in.write)) {
    reference_layer(li, in);
    return {};
  }
  oracle::materialise_write(layout_, expected_[li], in.write);
  const bool sampled =
      oracle::tier_sampled(step - o_.step_begin, o_.tier_sample_first, o_.tier_sample_every);
  TierNote note{sampled ? TierNote::Answer::kChecked : TierNote::Answer::kTier, {}};
  spec::LayerCaches copy;
  spec::LayerCaches& into = sampled ? (copy = expected_[li]) : expected_[li];
  spec::HostTensor q_tier;
  try {
    if (in.dense) {
      q_tier = answerer->dense_insert(c_, *in.dense, into);
    } else {
      answerer->write_layer(c_, in.write, into);
    }
  } catch (const spec::Unsupported& e) {
    // One configuration for the whole trace: a tier that cannot answer it cannot run this replay.
    note.problem = tier_who(li) + " does not implement this trace's configuration (" + e.what() +
                   "); --tier cpu replays it on the CPU reference";
    return note;
  } catch (const std::exception& e) {
    note.problem = tier_who(li) + " failed: " + e.what();
    return note;
  }
  if (!sampled) {
    in.q_expected = std::move(q_tier);
    return note;
  }
  reference_layer(li, in);
  if (const std::string diff = tier_diff(li, in, expected_[li], in.q_expected, copy, q_tier);
      !diff.empty())
    note.problem = tier_who(li) + " disagrees with the CPU reference on a sampled step\n" + diff;
  return note;
}

std::string Replayer::tier_who(std::size_t li) const {
  return "the " + std::string(fused_dense(li) ? "dense" : "write") + " answerer " +
         tier_answerer(li)->name();
}

std::string Replayer::tier_diff(std::size_t li, const LayerInput& in, const spec::LayerCaches& cpu,
                                const spec::HostTensor& q_cpu, const spec::LayerCaches& tier,
                                const spec::HostTensor& q_tier) {
  const std::int64_t l = layers_[li];
  if (in.dense) {
    const oracle::DenseJudgement j = oracle::judge_dense(c_, layout_, *in.dense, cpu, q_cpu, tier,
                                                         q_tier, spec::Ordering::kCanonical, l, 1);
    return j.pass ? std::string() : j.report;
  }
  if (same_bytes(cpu, tier)) return {};
  return oracle::diff_layer_caches(layout_, l, cpu, tier, nullptr).report();
}

spec::LayerCaches& Replayer::advance_shadow(std::size_t li, std::int64_t s) {
  std::optional<spec::LayerCaches>& shadow = shadow_[li];
  if (!shadow) {
    const std::int64_t l = layers_[li];
    shadow = oracle::make_layer_caches(layout_, l, c_.layers[static_cast<std::size_t>(l)]);
    shadow_next_[li] = 0;
  }
  for (std::int64_t t = shadow_next_[li]; t <= s; ++t) {
    LayerInput x = generate_layer(t, li);
    oracle::materialise_write(layout_, *shadow, x.write);
    if (x.dense) {
      shadow_q_ = reference::dense_insert(c_, *x.dense, *shadow);
    } else {
      reference::write_layer(c_, x.write, *shadow);
    }
  }
  shadow_next_[li] = std::max(shadow_next_[li], s + 1);
  return *shadow;
}

std::string Replayer::tier_recheck(std::size_t li, std::int64_t s, const LayerInput* in) {
  const bool fresh_step = shadow_next_[li] <= s || !shadow_[li];
  spec::HostTensor q;
  const spec::LayerCaches& shadow = advance_shadow(li, s);
  if (fresh_step) q = std::move(shadow_q_);
  ++report_.tier_checks;
  // The step's q_out is judged with the caches when this call wrote step s (a dense insert).
  const std::string diff = in != nullptr && in->dense && fresh_step
                               ? tier_diff(li, *in, shadow, q, expected_[li], in->q_expected)
                               : tier_diff(li, LayerInput{}, shadow, q, expected_[li], q);
  if (diff.empty()) return {};
  return tier_who(li) + " disagrees with the CPU reference (its caches replayed from step 0 " +
         "through " + std::to_string(s) + ")\n" + diff;
}

bool Replayer::tier_failed(std::int64_t s, std::size_t li, const std::string& problem) {
  report_.tier_disagreement =
      "step " + std::to_string(s) + ", layer " + std::to_string(layers_[li]) + ": " + problem;
  report_.worst = spec::worst(report_.worst, spec::Outcome::kFailedToRun);
  return true;
}

Replayer::SubjectWrite Replayer::run_write(WriteRow& w, std::size_t li, const LayerInput& in) {
  SubjectWrite out;
  spec::LayerCaches& got = w.caches[li];
  try {
    oracle::materialise_write(layout_, got, in.write);
    if (w.op == spec::Op::kDense) {
      out.q_got = w.subject->dense_insert(c_, *in.dense, got);
    } else {
      w.subject->write_layer(c_, in.write, got);
    }
  } catch (...) {
    out.error = std::current_exception();
  }
  return out;
}

bool Replayer::judge_write(WriteRow& w, std::size_t li, std::int64_t s, const LayerWork& work,
                           SubjectWrite run, const std::vector<std::int64_t>& blocks,
                           std::vector<bool>& mismatched) {
  const LayerInput& in = work.in;
  // A subject failing against the tier's answer is judged against an answer the CPU reference
  // agrees with: the tier's caches are checked first (a disagreement stops the replay).
  const auto tier_disagrees = [&] {
    if (work.tier.answer != TierNote::Answer::kTier) return false;
    const std::string problem = tier_recheck(li, s, &in);
    return !problem.empty() && tier_failed(s, li, problem);
  };
  ReplaySubjectResult& r = report_.subjects[w.row];
  const std::int64_t l = layers_[li];
  spec::LayerCaches& got = w.caches[li];
  const spec::LayerWrite& lw = in.write;
  std::string rejected;
  spec::HostTensor q_got = std::move(run.q_got);
  try {
    if (run.error) std::rethrow_exception(run.error);
    ++r.layer_writes;
  } catch (const spec::Unsupported& e) {
    r.outcome = spec::worst(r.outcome, spec::Outcome::kUnsupported);
    r.note = e.what();
    w.running = false;
    return false;
  } catch (const spec::InvalidInput& e) {
    rejected = e.what();  // the reference accepted this write: a wrong answer
  } catch (const std::exception& e) {
    r.outcome = spec::worst(r.outcome, spec::Outcome::kFailedToRun);
    r.note = "step " + std::to_string(s) + " layer " + std::to_string(l) + ": " + e.what();
    w.running = false;
    return false;
  }
  if (w.op == spec::Op::kDense && rejected.empty()) {
    // The dense insert's judgement (SPEC 4): exact, or a foreign subject's admissible ranges
    // around the float64 truth; the layer's caches whole.
    const oracle::DenseJudgement j =
        oracle::judge_dense(c_, layout_, *in.dense, expected_[li], in.q_expected, got, q_got,
                            w.subject->ordering(), l, 1);
    report_.compared_bytes += j.bytes_compared;
    if (j.pass) {
      got = expected_[li];  // resync: admitted codes
      return false;
    }
    if (tier_disagrees()) return true;
    got = expected_[li];  // resync: any difference reported once
    return mismatch(w.row, mismatched,
                    "mismatch: subject " + r.name + " (dense), step " + std::to_string(s) +
                        ", layer " + std::to_string(l) + "\n" + j.report,
                    s, s, li);
  }
  bool pages = false;
  if (rejected.empty() && run.pages_same.has_value()) {  // compared by the worker that wrote them
    pages = *run.pages_same;
    report_.compared_bytes += run.pages_compared;
  } else if (rejected.empty()) {
    pages = same_pages(layout_, expected_[li], got, blocks, report_.compared_bytes);
  }
  // SPEC 7: where the modes admit several codes (div_approx, legacy-wrap races), differing pages
  // are judged element by element against their admissible sets, then resynced.
  if (!pages && rejected.empty() && w.op == spec::Op::kWrite && reference::admits_several(c_, lw) &&
      oracle::diff_write_layer(c_, layout_, static_cast<std::size_t>(l), lw, expected_[li], got)
          .equal()) {
    pages = true;
    got = expected_[li];
  }
  if (pages) return false;
  if (tier_disagrees()) return true;
  std::string text = "mismatch: subject " + r.name + (w.op == spec::Op::kDense ? " (dense)" : "") +
                     ", step " + std::to_string(s) + ", layer " + std::to_string(l) + "\n";
  if (!rejected.empty()) {
    text += "rejected a write the reference accepts: " + rejected;
  } else {
    text +=
        oracle::diff_write_layer(c_, layout_, static_cast<std::size_t>(l), lw, expected_[li], got)
            .report();
  }
  got = expected_[li];  // resync, so a later report shows only new differences
  return mismatch(w.row, mismatched, std::move(text), s, s, li);
}

bool Replayer::read_layer(std::size_t li, std::int64_t s, std::vector<bool>& mismatched) {
  const std::int64_t l = layers_[li];
  const bool dense = c_.layers[static_cast<std::size_t>(l)] == spec::LayerKind::kDense;
  oracle::ReadCase rc = make_step_read(trace_, s, l, gen_);
  // The reference's caches are what the subjects' writes were checked against; moved in and back
  // out, so a read costs no copy of the layer.
  rc.caches = std::move(expected_[li]);
  bool stop = false;
  {
    oracle::ReadExpectation expected(rc, dense);
    const std::vector<reference::QueryRow> rows = reference::query_rows(rc.batch);
    for (ReadRow& rr : read_rows_) {
      if (!rr.running || stop || (dense && rr.op == spec::Op::kIndexer)) continue;
      ReplaySubjectResult& r = report_.subjects[rr.row];
      const oracle::ReadVerdict v = oracle::judge_read(*rr.subject, rr.op, expected);
      ++r.layer_writes;
      if (v.outcome == spec::Outcome::kPass) continue;
      if (v.outcome == spec::Outcome::kUnsupported || v.outcome == spec::Outcome::kFailedToRun) {
        r.outcome = spec::worst(r.outcome, v.outcome);
        r.note = "step " + std::to_string(s) + " layer " + std::to_string(l) + ": " + v.report;
        rr.running = false;
        continue;
      }
      std::string text = "mismatch: subject " + r.name + " (" + std::string(spec::name_of(r.op)) +
                         (dense ? ", dense" : "") + "), step " + std::to_string(s) + ", layer " +
                         std::to_string(l);
      if (v.query && *v.query >= 0 && *v.query < static_cast<std::int64_t>(rows.size())) {
        const reference::QueryRow& q = rows[static_cast<std::size_t>(*v.query)];
        const TraceStep& st = trace_.steps[static_cast<std::size_t>(s)];
        text += ", query row " + std::to_string(*v.query) + " (batch row " +
                std::to_string(q.request) + ", request id " +
                std::to_string(st.request_id(q.request)) + ", position " +
                std::to_string(q.position) + ")";
      }
      stop = mismatch(rr.row, mismatched, text + "\n" + v.report, s, s, li);
    }
  }
  expected_[li] = std::move(rc.caches);
  return stop;
}

void Replayer::each_layer(const std::function<void(std::size_t)>& fn) const {
  std::deque<std::future<void>> running;
  for (std::size_t li = 0; li < layers_.size(); ++li) {
    if (running.size() >= workers_) {
      running.front().get();
      running.pop_front();
    }
    running.push_back(std::async(std::launch::async, fn, li));
  }
  for (auto& f : running) f.get();
}

bool Replayer::sweep(std::int64_t first, std::int64_t s, std::vector<bool>& mismatched) {
  // Every (row, layer) pair compared on the workers first; then judged in order, as before.
  std::vector<std::vector<char>> same(write_rows_.size(), std::vector<char>(layers_.size(), 1));
  each_layer([&](std::size_t li) {
    for (std::size_t i = 0; i < write_rows_.size(); ++i) {
      if (runs(write_rows_[i], li))
        same[i][li] = same_bytes(expected_[li], write_rows_[i].caches[li]) ? 1 : 0;
    }
  });
  bool stop = false;
  for (std::size_t i = 0; i < write_rows_.size(); ++i) {
    WriteRow& w = write_rows_[i];
    for (std::size_t li = 0; li < layers_.size() && !stop; ++li) {
      if (!runs(w, li)) continue;  // that layer is another op's, and this row never wrote it
      report_.compared_bytes += total_bytes(expected_[li]);
      if (same[i][li] != 0) continue;
      if (tier_answerer(li) != nullptr) {
        if (const std::string problem = tier_recheck(li, s, nullptr); !problem.empty())
          return tier_failed(s, li, problem);
      }
      const std::int64_t l = layers_[li];
      std::string text =
          "mismatch: subject " + report_.subjects[w.row].name +
          ", whole-cache comparison after step " + std::to_string(s) + ", layer " +
          std::to_string(l) + ": a write outside the pages steps " + std::to_string(first) + ".." +
          std::to_string(s) + " named\n" +
          oracle::diff_layer_caches(layout_, l, expected_[li], w.caches[li], nullptr).report();
      w.caches[li] = expected_[li];
      stop = mismatch(w.row, mismatched, std::move(text), first, s, li);
    }
  }
  return stop;
}

bool Replayer::resident_run() {
  if (o_.tier != oracle::ReferenceTier::kGpu) {
    if (o_.residence == Residence::kResident) {
      throw spec::InvalidInput("resident", -1, "on",
                               "the caches resident on the device are the GPU tier's: add "
                               "--tier gpu");
    }
    return false;
  }
  std::string why = "--resident off";
  if (o_.residence != Residence::kStaged) {
    std::vector<oracle::Subject*> writers{tier_.answering(spec::Op::kWrite)};
    for (const WriteRow& w : write_rows_) writers.push_back(w.subject);
    why = writers.front() == nullptr
              ? "the tier's write answerer is itself judged, so the CPU reference answers"
              : resident_blocker(trace_, o_, writers);
  }
  if (why.empty()) return true;
  if (o_.residence == Residence::kResident) {
    throw spec::InvalidInput("resident", -1, "on", "the caches cannot stay on the device: " + why);
  }
  report_.residence = "staged through the host (" + why + ")";
  return false;
}

spec::LayerCaches Replayer::resident_pages(oracle::ResidentWrites& rw, std::size_t li,
                                           std::size_t writer,
                                           std::span<const oracle::BufferBytes> bytes) {
  const std::int64_t l = layers_[li];
  const spec::LayerKind kind = c_.layers[static_cast<std::size_t>(l)];
  spec::LayerCaches out = oracle::make_layer_caches(layout_, l, kind, true);
  // The lazy caches hold their guard bands' pages from the start, poisoned: those pages come from
  // the device too (a guard's page also holds the first and last blocks' bytes), so that every
  // page the caches hold is the copy's.
  std::vector<oracle::BufferBytes> wanted = oracle::step_bytes(layout_, kind, {});
  wanted.insert(wanted.end(), bytes.begin(), bytes.end());
  rw.download(li, writer, wanted, out);
  return out;
}

std::string Replayer::check_sampled_layer(std::int64_t s, std::size_t li,
                                          const gpu::PagesInFlight& before,
                                          const gpu::PagesInFlight& after) const {
  const std::int64_t l = layers_[li];
  const spec::LayerKind kind = c_.layers[static_cast<std::size_t>(l)];
  spec::LayerCaches cpu = oracle::make_layer_caches(layout_, l, kind, true);
  before.store(li, cpu);
  std::int64_t flagged = 0;
  for (const spec::CacheBuffer& b : cpu.buffers) flagged += b.storage.flagged_pages();
  const LayerInput in = generate_layer(s, li);
  oracle::materialise_write(layout_, cpu, in.write);
  reference::write_layer(c_, in.write, cpu);
  // Where the write materialised no page beyond those brought back (its slots land in the step's
  // blocks), both sides hold the same pages: compared in place.
  for (const spec::CacheBuffer& b : cpu.buffers) flagged -= b.storage.flagged_pages();
  if (flagged == 0 && after.same_as(li, cpu)) return {};
  spec::LayerCaches tier = oracle::make_layer_caches(layout_, l, kind, true);
  after.store(li, tier);
  if (same_bytes(cpu, tier)) return {};
  return oracle::diff_layer_caches(layout_, l, cpu, tier, nullptr).report();
}

std::string Replayer::resident_tier_recheck(oracle::ResidentWrites& rw, std::size_t li,
                                            std::int64_t s,
                                            std::span<const oracle::BufferBytes> bytes) {
  const spec::LayerCaches& shadow = advance_shadow(li, s);
  ++report_.tier_checks;
  const spec::LayerCaches tier = resident_pages(rw, li, 0, bytes);
  // The CPU reference's bytes of the same pages (what every other byte means: its poison).
  spec::LayerCaches cpu = oracle::make_layer_caches(
      layout_, layers_[li], c_.layers[static_cast<std::size_t>(layers_[li])], true);
  for (std::size_t b = 0; b < cpu.buffers.size(); ++b) {
    for (const spec::ByteRange& r : tier.buffers[b].storage.materialised()) {
      std::vector<std::uint8_t> page(static_cast<std::size_t>(r.second - r.first));
      for (std::int64_t i = r.first; i < r.second; ++i)
        page[static_cast<std::size_t>(i - r.first)] = shadow.buffers[b].storage.byte(i);
      cpu.buffers[b].storage.store(r.first, page);
    }
  }
  if (same_bytes(cpu, tier)) return {};
  return tier_who(li) + " disagrees with the CPU reference (its caches replayed from step 0 " +
         "through " + std::to_string(s) + ", the pages the subject failed on)\n" +
         oracle::diff_layer_caches(layout_, layers_[li], cpu, tier, nullptr).report();
}

void Replayer::run_resident(const ReplayProgress& progress) {
  // Wall time by phase (ReplayReport::resident_times).
  using Clock = std::chrono::steady_clock;
  enum Phase { kSetup, kStage, kWrites, kWait, kChecks, kCompare, kSweeps, kPhases };
  std::array<double, kPhases> seconds{};
  Clock::time_point mark = Clock::now();
  const auto lap = [&](Phase p) {
    const Clock::time_point now = Clock::now();
    seconds[p] += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };
  // Writer 0 is the tier's answerer, writer i + 1 write row i.
  std::vector<oracle::Subject*> writers{tier_.answering(spec::Op::kWrite)};
  for (const WriteRow& w : write_rows_) writers.push_back(w.subject);
  workers_ = static_cast<std::size_t>(oracle::campaign_jobs(o_.jobs));
  shadow_.assign(layers_.size(), std::nullopt);
  shadow_next_.assign(layers_.size(), 0);
  std::int64_t max_tokens = 1;
  bool any_sparse = false;
  for (std::int64_t s = 0; s < end_; ++s)
    max_tokens = std::max(max_tokens, trace_.steps[static_cast<std::size_t>(s)].tokens());
  std::vector<spec::LayerCaches> initial;
  for (const std::int64_t l : layers_) {
    const spec::LayerKind kind = c_.layers[static_cast<std::size_t>(l)];
    any_sparse = any_sparse || kind == spec::LayerKind::kSparse;
    initial.push_back(oracle::make_layer_caches(layout_, l, kind, true));
  }
  // A sparse layer's buffers (K, V or KV, then index-K) begin with a dense one's: one list of the
  // bytes a step compares serves both.
  const spec::LayerKind widest = any_sparse ? spec::LayerKind::kSparse : spec::LayerKind::kDense;
  oracle::ResidentWrites rw(c_, layers_, initial, writers, gen_, {trace_.k_scale}, {trace_.v_scale},
                            max_tokens);
  initial.clear();
  {
    char text[96];
    std::snprintf(text, sizeof text, "resident on the device (%.2f GiB, %zu copies)",
                  static_cast<double>(rw.device_bytes()) / (1ll << 30), writers.size());
    report_.residence = text;
  }
  // Bytes a comparison of one writer's copies reads: per kind of layer, for a step's list.
  const auto layer_bytes = [&](std::span<const oracle::BufferBytes> bytes) {
    std::int64_t n = 0;
    for (const std::int64_t l : layers_) {
      const auto buffers =
          static_cast<std::int32_t>(layout_.buffers(c_.layers[static_cast<std::size_t>(l)]).size());
      for (const oracle::BufferBytes& b : bytes)
        if (b.buffer < buffers) n += b.end - b.begin;
    }
    return n;
  };
  const auto stage = [&](std::int64_t s) {
    const TraceStep& st = trace_.steps[static_cast<std::size_t>(s)];
    const RowKeys keys = row_keys(st);
    const spec::SlotMapping slots = slot_mapping(st.slot_mapping);
    std::optional<spec::SlotMapping> index_slots;
    if (c_.separate_index_slots && st.index_slot_mapping)
      index_slots = slot_mapping(*st.index_slot_mapping);
    std::vector<oracle::BufferBytes> bytes =
        oracle::step_bytes(layout_, widest, step_blocks_[static_cast<std::size_t>(s)]);
    rw.stage_step(keys.keys, slots, index_slots ? &*index_slots : nullptr, bytes);
    return bytes;
  };
  const auto tier_write = [&](std::size_t li) -> std::string {
    try {
      rw.write(li, 0);
    } catch (const spec::Unsupported& e) {
      return tier_who(li) + " does not implement this trace's configuration (" + e.what() +
             "); --tier cpu replays it on the CPU reference";
    } catch (const std::exception& e) {
      return tier_who(li) + " failed: " + e.what();
    }
    return {};
  };
  // The steps before the range: the tier's alone, then every writer's copies from its.
  for (std::int64_t s = 0; s < o_.step_begin; ++s) {
    stage(s);
    for (std::size_t li = 0; li < layers_.size(); ++li) {
      if (const std::string problem = tier_write(li); !problem.empty()) {
        tier_failed(s, li, problem);
        return;
      }
    }
  }
  for (std::size_t w = 1; w < writers.size(); ++w)
    for (std::size_t li = 0; li < layers_.size(); ++li) rw.resync(li, w);
  rw.synchronize();
  lap(kSetup);
  const auto report_times = [&] {
    const std::int64_t steps = report_.steps_run;
    double replay = 0;
    for (int p = kStage; p < kPhases; ++p) replay += seconds[static_cast<std::size_t>(p)];
    char text[320];
    std::snprintf(text, sizeof text,
                  "%lld steps in %.3f s (%.1f steps/s) after %.3f s putting the caches on the "
                  "device: staging %.3f, writes issued %.3f, device wait %.3f, tier checks %.3f, "
                  "comparisons %.3f, sweeps %.3f",
                  static_cast<long long>(steps), replay, replay > 0 ? steps / replay : 0.0,
                  seconds[kSetup], seconds[kStage], seconds[kWrites], seconds[kWait],
                  seconds[kChecks], seconds[kCompare], seconds[kSweeps]);
    report_.resident_times = text;
  };
  struct ReportTimes {
    const std::function<void()> fn;
    ~ReportTimes() { fn(); }
  } const report_on_exit{report_times};

  // A sampled step's layers are checked on threads of their own (the workers' count), started at
  // the first sampled step.
  std::optional<oracle::TaskThreads> check_threads;
  const std::int64_t first = o_.step_begin;
  std::int64_t last_sweep = first - 1;
  bool stop = false;
  for (std::int64_t s = first; s < end_ && !stop; ++s) {
    std::vector<bool> mismatched(report_.subjects.size(), false);
    const std::vector<oracle::BufferBytes> bytes = stage(s);
    lap(kStage);
    const bool sampled =
        oracle::tier_sampled(s - first, o_.tier_sample_first, o_.tier_sample_every);
    // A sampled step: the tier's pages before the step, which the CPU reference writes next (with
    // the guard bands' pages: every page a check's caches hold is the copy's).
    std::vector<oracle::BufferBytes> check_bytes;
    std::shared_ptr<const gpu::PagesInFlight> before;
    if (sampled) {
      check_bytes = oracle::step_bytes(layout_, widest, {});
      check_bytes.insert(check_bytes.end(), bytes.begin(), bytes.end());
      before = rw.download_async(0, check_bytes);
      lap(kChecks);
    }
    // Layer by layer, the tier then each subject (the inputs generated once a layer); a subject
    // that rejects or cannot run a write is judged as on the host.
    std::vector<std::vector<bool>> rejected(write_rows_.size(),
                                            std::vector<bool>(layers_.size(), false));
    for (std::size_t li = 0; li < layers_.size() && !stop; ++li) {
      if (const std::string problem = tier_write(li); !problem.empty()) {
        stop = tier_failed(s, li, problem);
        break;
      }
      ++report_.tier_layers;
      for (std::size_t i = 0; i < write_rows_.size() && !stop; ++i) {
        WriteRow& w = write_rows_[i];
        if (!w.running) continue;
        ReplaySubjectResult& r = report_.subjects[w.row];
        try {
          rw.write(li, i + 1);
          ++r.layer_writes;
        } catch (const spec::Unsupported& e) {
          r.outcome = spec::worst(r.outcome, spec::Outcome::kUnsupported);
          r.note = e.what();
          w.running = false;
        } catch (const spec::InvalidInput& e) {
          rejected[i][li] = true;
          stop = mismatch(w.row, mismatched,
                          "mismatch: subject " + r.name + ", step " + std::to_string(s) +
                              ", layer " + std::to_string(layers_[li]) +
                              "\nrejected a write the reference accepts: " + e.what(),
                          s, s, li);
        } catch (const std::exception& e) {
          r.outcome = spec::worst(r.outcome, spec::Outcome::kFailedToRun);
          r.note = "step " + std::to_string(s) + " layer " + std::to_string(layers_[li]) + ": " +
                   e.what();
          w.running = false;
        }
      }
    }
    if (stop) break;
    lap(kWrites);
    try {
      rw.synchronize();
      lap(kWait);
    } catch (const spec::FailedToRun& e) {
      // A kernel faulted; the device is unusable from here on (CUDA's rule), and which writer's
      // kernel it was is not known: the step's writers are named.
      std::string names = writers.front()->name();
      for (const WriteRow& w : write_rows_) names += ", " + w.subject->name();
      for (WriteRow& w : write_rows_) {
        ReplaySubjectResult& r = report_.subjects[w.row];
        r.outcome = spec::worst(r.outcome, spec::Outcome::kFailedToRun);
        r.note = "step " + std::to_string(s) + ": a kernel of the step's writers (" + names +
                 ") failed: " + e.what() + "; --resident off runs each write alone";
      }
      break;
    }
    if (sampled) {
      // The CPU reference's write of the CPU-generated values over the tier's pages from before
      // the step, against the tier's pages after it: the device's values and the tier's write.
      // Each side's pages come back in one copy; the layers are checked on the check threads.
      const std::shared_ptr<const gpu::PagesInFlight> after =
          rw.download_async(0, check_bytes, before.get());
      if (!check_threads) check_threads.emplace(workers_);
      std::vector<std::future<std::string>> problems;
      for (std::size_t li = 0; li < layers_.size(); ++li) {
        problems.push_back(check_threads->post(
            [this, s, li, before, after] { return check_sampled_layer(s, li, *before, *after); }));
      }
      report_.tier_checks += static_cast<std::int64_t>(layers_.size());
      for (std::size_t li = 0; li < layers_.size(); ++li) {
        const std::string problem = problems[li].get();
        if (problem.empty() || stop) continue;
        stop = tier_failed(s, li,
                           tier_who(li) +
                               " disagrees with the CPU reference on a sampled step (the values "
                               "generated and the caches written on the device)\n" +
                               problem);
      }
      lap(kChecks);
    }
    // Each subject's copies against the tier's: the step's pages and guards; whole caches when a
    // sweep is due.
    const bool sweep_due = (s - first + 1) % o_.full_diff_every == 0 || s + 1 == end_;
    for (bool whole : {false, true}) {
      if (whole && !sweep_due) break;
      const std::vector<oracle::BufferBytes> compared =
          whole ? oracle::whole_bytes(layout_, widest) : bytes;
      for (std::size_t i = 0; i < write_rows_.size() && !stop; ++i) {
        WriteRow& w = write_rows_[i];
        if (!w.running) continue;
        const std::vector<oracle::LayerDifference> diffs = rw.compare(i + 1, whole);
        report_.compared_bytes += layer_bytes(compared);
        for (std::size_t li = 0; li < layers_.size() && !stop; ++li) {
          const oracle::LayerDifference& d = diffs[li];
          if (rejected[i][li] || d.count == 0) {
            if (rejected[i][li]) rw.resync(li, i + 1);
            continue;
          }
          const std::int64_t l = layers_[li];
          const std::string& name = report_.subjects[w.row].name;
          if (d.buffer < 0) {
            rw.resync(li, i + 1);
            stop = mismatch(w.row, mismatched,
                            "mismatch: subject " + name + ", step " + std::to_string(s) +
                                ", layer " + std::to_string(l) +
                                ": wrote outside every cache buffer and its guard bands (byte " +
                                std::to_string(d.byte) + " of the layer's device allocation; " +
                                std::to_string(d.count) + " bytes differ)",
                            whole ? last_sweep + 1 : s, s, li);
            continue;
          }
          // The pages to report: the step's, or (a sweep) the page of the first difference.
          const std::vector<oracle::BufferBytes> pages =
              whole ? std::vector<oracle::BufferBytes>{{d.buffer, d.byte, d.byte + 1}} : bytes;
          if (const std::string problem = resident_tier_recheck(rw, li, s, pages);
              !problem.empty()) {
            stop = tier_failed(s, li, problem);
            break;
          }
          const spec::LayerCaches expected = resident_pages(rw, li, 0, pages);
          const spec::LayerCaches got = resident_pages(rw, li, i + 1, pages);
          std::string text = "mismatch: subject " + name;
          if (whole) {
            text += ", whole-cache comparison after step " + std::to_string(s) + ", layer " +
                    std::to_string(l) + ": a write outside the pages steps " +
                    std::to_string(last_sweep + 1) + ".." + std::to_string(s) + " named (" +
                    std::to_string(d.count) + " bytes differ; the first one's page)\n" +
                    oracle::diff_layer_caches(layout_, l, expected, got, nullptr).report();
          } else {
            const LayerInput in = generate_layer(s, li);
            text += ", step " + std::to_string(s) + ", layer " + std::to_string(l) + "\n" +
                    oracle::diff_write_layer(c_, layout_, static_cast<std::size_t>(l), in.write,
                                             expected, got)
                        .report();
          }
          rw.resync(li, i + 1);  // so that a later report shows only new differences
          stop = mismatch(w.row, mismatched, std::move(text), whole ? last_sweep + 1 : s, s, li);
        }
      }
      if (whole) last_sweep = s;
      lap(whole ? kSweeps : kCompare);
    }
    ++report_.steps_run;
    if (progress) progress(s - first + 1, end_ - first);
  }
}

void Replayer::run(oracle::SubjectList& subjects, const ReplayProgress& progress) {
  check_arguments();
  for (const oracle::SubjectOp& so : oracle::select_subject_ops(subjects, o_.subjects, o_.ops)) {
    const std::size_t row = add_row(so.subject->name(), so.op, so.skipped);
    if (!so.skipped.empty()) continue;
    if (so.op == spec::Op::kWrite || so.op == spec::Op::kDense) {
      write_rows_.push_back({so.subject, so.op, row, {}, true});
    } else {
      read_rows_.push_back({so.subject, so.op, row, true});
    }
  }

  report_.tier = o_.tier;
  if (o_.tier == oracle::ReferenceTier::kGpu) {
    oracle::check_tier_sample(o_.tier_sample_first, o_.tier_sample_every);
    std::vector<spec::Op> ops;  // the ops whose layers the replay writes
    for (const spec::Op op : {spec::Op::kWrite, spec::Op::kDense}) {
      if (op == spec::Op::kWrite || !cos_sin_.empty()) ops.push_back(op);
    }
    std::vector<std::pair<const oracle::Subject*, spec::Op>> judged;
    for (const WriteRow& w : write_rows_) judged.emplace_back(w.subject, w.op);
    tier_ = oracle::gpu_tier_answerers(subjects, ops, o_.tier_answerers, judged);
    report_.tier_answerers = tier_.names;
  }

  step_blocks_.clear();
  for (std::int64_t s = 0; s < end_; ++s)
    step_blocks_.push_back(touched_blocks(c_, trace_.steps[static_cast<std::size_t>(s)]));
  if (resident_run()) {
    run_resident(progress);
    for (const auto& r : report_.subjects) report_.worst = spec::worst(report_.worst, r.outcome);
    return;
  }
  check_host_memory();
  workers_ = static_cast<std::size_t>(oracle::campaign_jobs(o_.jobs));
  const std::size_t workers = workers_;
  // The poisoned caches; the reference alone writes the steps before the range into them; then
  // each write row starts from a copy.
  expected_.resize(layers_.size());
  shadow_.assign(layers_.size(), std::nullopt);
  shadow_next_.assign(layers_.size(), 0);
  for (WriteRow& w : write_rows_) w.caches.resize(layers_.size());
  each_layer([&](std::size_t li) {
    const std::int64_t l = layers_[li];
    expected_[li] = oracle::make_layer_caches(layout_, l, c_.layers[static_cast<std::size_t>(l)]);
    for (std::int64_t s = 0; s < o_.step_begin; ++s) {
      LayerInput in = generate_layer(s, li);
      reference_layer(li, in);
    }
    for (WriteRow& w : write_rows_) w.caches[li] = expected_[li];
  });

  // Work on one layer of one step (generating its K/V/index-K, the reference's write of them, the
  // concurrent subjects' writes) depends on nothing but that layer's caches: workers do it for
  // the layers ahead while this thread, in (step, layer) order, runs the other subjects (never
  // two calls at once, so they need not be thread-safe), the reads and every comparison. A
  // layer's work for step s + 1 starts only once this thread has judged the layer at step s (and
  // made the whole-cache comparison when one is due after step s), so no worker writes a cache
  // being compared; the report is the same for any number of workers.
  // At most `workers` layers are worked on at once; twice as many may be started, so that a layer
  // finished ahead of the one this thread waits for never leaves a worker idle.
  std::counting_semaphore<> running(static_cast<std::ptrdiff_t>(workers));
  const auto make = [&](std::int64_t step, std::size_t li) {
    std::vector<bool> ahead(write_rows_.size());
    for (std::size_t i = 0; i < write_rows_.size(); ++i) {
      const WriteRow& w = write_rows_[i];
      ahead[i] = w.running && runs(w, li) && w.subject->concurrent();
    }
    return std::async(std::launch::async, [this, step, li, ahead = std::move(ahead), &running] {
      running.acquire();
      struct Release {
        std::counting_semaphore<>& s;
        ~Release() { s.release(); }
      } const release{running};
      LayerWork work;
      work.in = generate_layer(step, li);
      work.tier = answer_layer(step, li, work.in);
      work.writes.resize(write_rows_.size());
      for (std::size_t i = 0; i < write_rows_.size(); ++i) {
        if (!ahead[i] || !work.tier.problem.empty()) continue;
        WriteRow& w = write_rows_[i];
        SubjectWrite run = run_write(w, li, work.in);
        // The step's pages compared here too, so that the calling thread only reads the verdict.
        if (!run.error && w.op == spec::Op::kWrite) {
          run.pages_same =
              same_pages(layout_, expected_[li], w.caches[li],
                         step_blocks_[static_cast<std::size_t>(step)], run.pages_compared);
        }
        work.writes[i] = std::move(run);
      }
      return work;
    });
  };
  const std::int64_t first = o_.step_begin;
  const auto sweep_due = [&](std::int64_t s) {
    return (s - first + 1) % o_.full_diff_every == 0 || s + 1 == end_;
  };
  std::deque<std::future<LayerWork>> pending;  // in (step, layer) order
  std::int64_t next_step = first;              // the next layer work to start
  std::size_t next_li = 0;
  // Starts layer work while fewer than 2 * workers are started and not yet judged: of step `s`, or
  // of step s + 1 for a layer this thread has judged at step s (`judged` layers of it) when no
  // whole-cache comparison is due after s.
  const auto start_ready = [&](std::int64_t s, std::size_t judged) {
    while (pending.size() < 2 * workers && next_step < end_ && !layers_.empty()) {
      if (next_step > s && (next_step > s + 1 || sweep_due(s) || next_li >= judged)) break;
      pending.push_back(make(next_step, next_li));
      if (++next_li == layers_.size()) {
        next_li = 0;
        ++next_step;
      }
    }
  };
  std::int64_t last_sweep = first - 1;
  bool stop = false;
  for (std::int64_t s = first; s < end_ && !stop; ++s) {
    std::vector<bool> mismatched(report_.subjects.size(), false);
    const std::vector<std::int64_t>& blocks = step_blocks_[static_cast<std::size_t>(s)];
    start_ready(s, 0);
    for (std::size_t li = 0; li < layers_.size() && !stop; ++li) {
      LayerWork work = pending.front().get();
      pending.pop_front();
      switch (work.tier.answer) {
        case TierNote::Answer::kCpu:
          ++report_.cpu_layers;
          break;
        case TierNote::Answer::kTier:
          ++report_.tier_layers;
          break;
        case TierNote::Answer::kChecked:
          ++report_.cpu_layers;
          ++report_.tier_checks;
          break;
      }
      if (!work.tier.problem.empty()) {
        stop = tier_failed(s, li, work.tier.problem);
        break;
      }
      for (std::size_t i = 0; i < write_rows_.size() && !stop; ++i) {
        WriteRow& wr = write_rows_[i];
        if (!wr.running || !runs(wr, li)) continue;
        SubjectWrite run = work.writes[i] ? std::move(*work.writes[i]) : run_write(wr, li, work.in);
        stop = judge_write(wr, li, s, work, std::move(run), blocks, mismatched);
      }
      if (!stop && !read_rows_.empty()) stop = read_layer(li, s, mismatched);
      if (!stop) start_ready(s, li + 1);
    }
    if (sweep_due(s) && !stop) {
      stop = sweep(last_sweep + 1, s, mismatched);
      last_sweep = s;
    }
    ++report_.steps_run;
    if (progress) progress(s - first + 1, end_ - first);
  }
  for (auto& f : pending) f.wait();  // the workers hold references into this frame
  for (const auto& r : report_.subjects) report_.worst = spec::worst(report_.worst, r.outcome);
}

}  // namespace

ReplayReport replay_trace(const Trace& trace, const ReplayOptions& o, oracle::SubjectList& subjects,
                          const ReplayProgress& progress) {
  ReplayReport report;
  Replayer(trace, o, report).run(subjects, progress);
  return report;
}

}  // namespace kvo::traces
