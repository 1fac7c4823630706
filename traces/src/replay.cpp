#include "kvo/traces/replay.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <sstream>

#include "kvo/oracle/cache_diff.hpp"
#include "kvo/oracle/check.hpp"
#include "kvo/oracle/read_judge.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/traces/analysis.hpp"

namespace kvo::traces {
namespace {

static_assert(std::endian::native == std::endian::little, "codes are stored with memcpy");

using reference::GenTensor;

/// [rows, heads, dim] (heads > 0) or [rows, dim] of generated values keyed per row.
spec::HostTensor make_tensor(const reference::ValueGenerator& gen, std::int64_t layer,
                             GenTensor which, const std::vector<std::int64_t>& requests,
                             const std::vector<std::int64_t>& positions, std::size_t rows,
                             std::int64_t heads, std::int64_t dim) {
  spec::HostTensor t;
  t.dtype = gen.act;
  const auto n = static_cast<std::int64_t>(rows);
  t.shape =
      heads > 0 ? std::vector<std::int64_t>{n, heads, dim} : std::vector<std::int64_t>{n, dim};
  const std::int64_t nh = std::max<std::int64_t>(heads, 1);
  const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(gen.act));
  t.bytes.resize(static_cast<std::size_t>(n * nh * dim * eb));
  std::uint8_t* out = t.bytes.data();
  std::vector<float> row(static_cast<std::size_t>(nh * dim));
  for (std::size_t r = 0; r < rows; ++r) {
    gen.fill_row(gen.row_key(layer, which, requests[r], positions[r]), nh, dim, row.data());
    for (const float x : row) {
      // A generated value is already rounded to the activation dtype: a finite bf16 or f32 one is
      // its float32 bits (bf16: the top half), without the general encoder.
      std::uint32_t code = 0;
      if (gen.act == spec::DType::kF32) {
        code = std::bit_cast<std::uint32_t>(x);
      } else if (gen.act == spec::DType::kBF16 && std::isfinite(x)) {
        code = std::bit_cast<std::uint32_t>(x) >> 16;
      } else {
        code = reference::encode(x, gen.act, spec::Saturation::kSatFinite);
      }
      std::memcpy(out, &code, static_cast<std::size_t>(eb));  // little-endian, as store_code
      out += eb;
    }
  }
  return t;
}

/// The generator key of every slot-mapping row of a step: (request id, position) for the real
/// tokens, in slot-mapping order, then (-1, row) for the padding tail.
struct RowKeys {
  std::vector<std::int64_t> requests, positions;
  std::size_t real = 0;  ///< rows before the padding
};

RowKeys row_keys(const TraceStep& st) {
  const std::vector<std::int64_t> starts = st.starts();
  RowKeys k;
  k.requests.reserve(static_cast<std::size_t>(st.tokens()));
  k.positions.reserve(static_cast<std::size_t>(st.tokens()));
  for (std::int64_t b = 0; b < st.batch(); ++b) {
    const auto bi = static_cast<std::size_t>(b);
    const std::int64_t q = starts[bi + 1] - starts[bi];
    const std::int64_t first = st.seq_lens.values[bi] - q;
    for (std::int64_t j = 0; j < q; ++j) {
      k.requests.push_back(st.request_id(b));
      k.positions.push_back(first + j);
    }
  }
  k.real = k.requests.size();
  for (std::int64_t i = starts.back(); i < st.tokens(); ++i) {
    k.requests.push_back(-1);  // padding rows: generated but never read
    k.positions.push_back(i);
  }
  return k;
}

spec::SlotMapping slot_mapping(const IntTensor& t) {
  spec::SlotMapping m;
  m.type = t.type == IntType::kI32 ? spec::SlotType::kI32 : spec::SlotType::kI64;
  m.slots = t.values;
  return m;
}

bool same_bytes(const spec::LayerCaches& a, const spec::LayerCaches& b) {
  if (a.buffers.size() != b.buffers.size()) return false;
  for (std::size_t i = 0; i < a.buffers.size(); ++i) {
    const auto& x = a.buffers[i].storage;
    const auto& y = b.buffers[i].storage;
    if (x.size() != y.size() || std::memcmp(x.data(), y.data(), x.size()) != 0) return false;
  }
  return true;
}

/// The cache blocks a step's writes may touch, ascending: every block a slot of either mapping
/// lands in, negative slots wrapped as legacy_wrap does (in strict mode they write nothing, and
/// comparing a block too many is harmless).
std::vector<std::int64_t> touched_blocks(const spec::ModelConfig& c, const TraceStep& st) {
  const std::int64_t cap = c.geometry.capacity(), bs = c.geometry.block_size;
  std::vector<std::int64_t> blocks;
  const auto add = [&](const IntTensor& slots) {
    for (std::int64_t s : slots.values) {
      if (s < 0) s += cap;
      if (s >= 0 && s < cap) blocks.push_back(s / bs);
    }
  };
  add(st.slot_mapping);
  if (st.index_slot_mapping) add(*st.index_slot_mapping);
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  return blocks;
}

/// Compares the guard bands and the given blocks of every buffer (every layout is block-major: a
/// body is num_blocks equal blocks). Adds the bytes compared to `compared`.
bool same_pages(const spec::ModelConfig& c, const spec::LayerCaches& a, const spec::LayerCaches& b,
                const std::vector<std::int64_t>& blocks, std::int64_t& compared) {
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
    const auto block_bytes = static_cast<std::size_t>(x.body_bytes() / c.geometry.num_blocks);
    for (std::int64_t blk : blocks) {
      const std::size_t at = static_cast<std::size_t>(blk) * block_bytes;
      if (std::memcmp(x.body() + at, y.body() + at, block_bytes) != 0) return false;
    }
    compared += static_cast<std::int64_t>(2 * guard + blocks.size() * block_bytes);
  }
  return true;
}

std::int64_t total_bytes(const spec::LayerCaches& c) {
  std::int64_t n = 0;
  for (const auto& b : c.buffers) n += static_cast<std::int64_t>(b.storage.size());
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

spec::LayerWrite make_step_write(const Trace& trace, std::int64_t step, std::int64_t layer,
                                 const reference::ValueGenerator& gen) {
  const spec::ModelConfig& c = trace.config;
  const TraceStep& st = trace.steps.at(static_cast<std::size_t>(step));
  const RowKeys k = row_keys(st);
  const std::size_t rows = k.requests.size();
  spec::LayerWrite w;
  w.kind = c.layers.at(static_cast<std::size_t>(layer));
  const spec::CacheGeometry& g = c.geometry;
  w.k = make_tensor(gen, layer, GenTensor::kK, k.requests, k.positions, rows, g.num_kv_heads,
                    g.head_dim);
  w.v = make_tensor(gen, layer, GenTensor::kV, k.requests, k.positions, rows, g.num_kv_heads,
                    g.head_dim);
  w.slots = slot_mapping(st.slot_mapping);
  if (w.kind == spec::LayerKind::kSparse) {
    w.index_k =
        make_tensor(gen, layer, GenTensor::kIndexK, k.requests, k.positions, rows, 0, g.index_dim);
    if (st.index_slot_mapping) w.index_slots = slot_mapping(*st.index_slot_mapping);
  }
  w.k_scale = trace.k_scale;
  w.v_scale = trace.v_scale;
  return w;
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
  rc.index_q = make_tensor(gen, layer, GenTensor::kIndexQ, k.requests, k.positions, k.real,
                           rc.indexer.num_index_heads, g.index_dim);
  rc.q = make_tensor(gen, layer, GenTensor::kQ, k.requests, k.positions, k.real,
                     rc.attention.num_q_heads, g.head_dim);
  rc.k_scale = trace.k_scale;
  rc.v_scale = trace.v_scale;
  return rc;
}

std::string ReplayReport::summary() const {
  std::ostringstream s;
  for (const ReplaySubjectResult& r : subjects) {
    s << "  " << r.name << (r.op == "write" ? "" : " " + r.op) << ": ";
    if (!r.note.empty() && r.layer_writes == 0 && r.outcome == spec::Outcome::kPass) {
      s << "skipped (" << r.note << ")\n";
      continue;
    }
    s << spec::name_of(r.outcome) << ", " << r.layer_writes
      << (r.op == "write" ? " layer writes" : " layer reads");
    if (r.mismatching_steps) s << ", " << r.mismatching_steps << " mismatching steps";
    if (!r.note.empty()) s << " (" << r.note << ")";
    s << "\n";
  }
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
        gen_(replay_generator(trace, o)) {}

  void run(std::vector<std::unique_ptr<oracle::WriteSubject>>& writes,
           std::vector<std::unique_ptr<oracle::ReadSubject>>& reads,
           const ReplayProgress& progress);

 private:
  struct WriteRow {
    oracle::WriteSubject* subject;
    std::size_t row;
    std::vector<spec::LayerCaches> caches;  ///< per selected layer
    bool running = true;
  };
  struct ReadRow {
    oracle::ReadSubject* subject;
    oracle::ReadOp op;
    std::size_t row;
    bool running = true;
  };

  void check_arguments(const std::vector<std::unique_ptr<oracle::WriteSubject>>& writes,
                       const std::vector<std::unique_ptr<oracle::ReadSubject>>& reads);
  bool selected(const std::string& name) const {
    return o_.subjects.empty() ||
           std::find(o_.subjects.begin(), o_.subjects.end(), name) != o_.subjects.end();
  }
  bool op_on(const std::string& op) const {
    return std::find(o_.ops.begin(), o_.ops.end(), op) != o_.ops.end();
  }
  std::size_t add_row(const std::string& name, const std::string& op, const std::string& note) {
    report_.subjects.push_back(ReplaySubjectResult{.name = name, .op = op, .note = note});
    return report_.subjects.size() - 1;
  }
  /// Records a mismatch of a row in this step; true when the replay must stop.
  bool mismatch(std::size_t row, std::vector<bool>& mismatched, std::string text) {
    ReplaySubjectResult& r = report_.subjects[row];
    r.outcome = spec::worst(r.outcome, spec::Outcome::kMismatch);
    if (!mismatched[row]) ++r.mismatching_steps;
    mismatched[row] = true;
    report_.mismatches.push_back(std::move(text));
    return !o_.keep_going;
  }
  bool write_layer(WriteRow& w, std::size_t li, std::int64_t step, const spec::LayerWrite& lw,
                   const std::vector<std::int64_t>& blocks, std::vector<bool>& mismatched);
  bool read_layer(std::size_t li, std::int64_t step, std::vector<bool>& mismatched);
  bool sweep(std::int64_t first_step, std::int64_t step, std::vector<bool>& mismatched);

  const Trace& trace_;
  const spec::ModelConfig& c_;
  const ReplayOptions& o_;
  ReplayReport& report_;
  const reference::PagedCacheLayout layout_;
  const reference::ValueGenerator gen_;
  std::vector<std::int64_t> layers_;
  std::int64_t end_ = 0;
  std::vector<spec::LayerCaches> expected_;  ///< per selected layer
  std::vector<WriteRow> write_rows_;
  std::vector<ReadRow> read_rows_;
};

void Replayer::check_arguments(const std::vector<std::unique_ptr<oracle::WriteSubject>>& writes,
                               const std::vector<std::unique_ptr<oracle::ReadSubject>>& reads) {
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
  std::vector<std::string> names;
  for (const auto& s : writes) names.push_back(s->name());
  for (const auto& s : reads) names.push_back(s->name());
  oracle::require_known("subject", "subject", o_.subjects, names);
  oracle::require_known("ops", "op", o_.ops, kReplayOps);
  if (o_.full_diff_every < 1) {
    throw spec::InvalidInput("full_diff_every", -1, std::to_string(o_.full_diff_every),
                             "must be >= 1");
  }
}

bool Replayer::write_layer(WriteRow& w, std::size_t li, std::int64_t s, const spec::LayerWrite& lw,
                           const std::vector<std::int64_t>& blocks, std::vector<bool>& mismatched) {
  ReplaySubjectResult& r = report_.subjects[w.row];
  const std::int64_t l = layers_[li];
  spec::LayerCaches& got = w.caches[li];
  std::string rejected;
  try {
    w.subject->write_layer(c_, lw, got);
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
  if (rejected.empty() && same_pages(c_, expected_[li], got, blocks, report_.compared_bytes)) {
    return false;
  }
  std::string text = "mismatch: subject " + r.name + ", step " + std::to_string(s) + ", layer " +
                     std::to_string(l) + "\n";
  text += rejected.empty() ? oracle::diff_layer_caches(layout_, l, expected_[li], got, &lw).report()
                           : "rejected a write the reference accepts: " + rejected;
  got = expected_[li];  // resync, so a later report shows only new differences
  return mismatch(w.row, mismatched, std::move(text));
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
      if (!rr.running || stop || (dense && rr.op == oracle::ReadOp::kIndexer)) continue;
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
      std::string text = "mismatch: subject " + r.name + " (" + r.op + (dense ? ", dense" : "") +
                         "), step " + std::to_string(s) + ", layer " + std::to_string(l);
      if (v.query && *v.query >= 0 && *v.query < static_cast<std::int64_t>(rows.size())) {
        const reference::QueryRow& q = rows[static_cast<std::size_t>(*v.query)];
        const TraceStep& st = trace_.steps[static_cast<std::size_t>(s)];
        text += ", query row " + std::to_string(*v.query) + " (batch row " +
                std::to_string(q.request) + ", request id " +
                std::to_string(st.request_id(q.request)) + ", position " +
                std::to_string(q.position) + ")";
      }
      stop = mismatch(rr.row, mismatched, text + "\n" + v.report);
    }
  }
  expected_[li] = std::move(rc.caches);
  return stop;
}

bool Replayer::sweep(std::int64_t first, std::int64_t s, std::vector<bool>& mismatched) {
  bool stop = false;
  for (WriteRow& w : write_rows_) {
    for (std::size_t li = 0; li < layers_.size() && !stop; ++li) {
      report_.compared_bytes += total_bytes(expected_[li]);
      if (same_bytes(expected_[li], w.caches[li])) continue;
      const std::int64_t l = layers_[li];
      std::string text =
          "mismatch: subject " + report_.subjects[w.row].name +
          ", whole-cache comparison after step " + std::to_string(s) + ", layer " +
          std::to_string(l) + ": a write outside the pages steps " + std::to_string(first) + ".." +
          std::to_string(s) + " named\n" +
          oracle::diff_layer_caches(layout_, l, expected_[li], w.caches[li], nullptr).report();
      w.caches[li] = expected_[li];
      stop = mismatch(w.row, mismatched, std::move(text));
    }
  }
  return stop;
}

void Replayer::run(std::vector<std::unique_ptr<oracle::WriteSubject>>& writes,
                   std::vector<std::unique_ptr<oracle::ReadSubject>>& reads,
                   const ReplayProgress& progress) {
  check_arguments(writes, reads);
  if (op_on("write")) {
    for (const auto& s : writes) {
      if (!selected(s->name())) continue;
      const std::size_t row = add_row(s->name(), "write", s->unavailable_reason());
      if (report_.subjects[row].note.empty()) write_rows_.push_back({s.get(), row, {}, true});
    }
  }
  const std::pair<const char*, oracle::ReadOp> read_ops[] = {
      {"indexer", oracle::ReadOp::kIndexer}, {"attention", oracle::ReadOp::kAttention}};
  for (const auto& [op, kind] : read_ops) {
    if (!op_on(op)) continue;
    for (const auto& s : reads) {
      if (!selected(s->name())) continue;
      const std::size_t row = add_row(s->name(), op, s->unavailable_reason());
      if (report_.subjects[row].note.empty()) read_rows_.push_back({s.get(), kind, row, true});
    }
  }

  for (std::int64_t l : layers_) {
    expected_.push_back(
        reference::make_layer_caches(layout_, l, c_.layers[static_cast<std::size_t>(l)]));
  }
  // Steps before the range: the reference alone builds the caches the range starts from.
  for (std::int64_t s = 0; s < o_.step_begin; ++s) {
    for (std::size_t li = 0; li < layers_.size(); ++li) {
      reference::write_layer(c_, make_step_write(trace_, s, layers_[li], gen_), expected_[li]);
    }
  }
  for (WriteRow& w : write_rows_) w.caches = expected_;

  // Generating a layer's K/V/index-K and the reference's write of it depend on nothing a subject
  // does: the next layer's are done on a second thread while the subjects (all on this thread, in
  // call order, so a subject need not be thread-safe) write and are compared. The reference
  // writes ahead only into another layer's caches than the one this thread is comparing.
  const bool ahead = layers_.size() > 1;
  const auto make = [&](std::int64_t step, std::size_t li) {
    return std::async(std::launch::async, [this, step, li, ahead] {
      spec::LayerWrite w = make_step_write(trace_, step, layers_[li], gen_);
      if (ahead) reference::write_layer(c_, w, expected_[li]);
      return w;
    });
  };
  const std::int64_t first = o_.step_begin;
  std::int64_t last_sweep = first - 1;
  std::future<spec::LayerWrite> next;
  if (first < end_ && !layers_.empty()) next = make(first, 0);
  bool stop = false;
  for (std::int64_t s = first; s < end_ && !stop; ++s) {
    std::vector<bool> mismatched(report_.subjects.size(), false);
    const std::vector<std::int64_t> blocks =
        touched_blocks(c_, trace_.steps[static_cast<std::size_t>(s)]);
    const bool sweep_due = (s - first + 1) % o_.full_diff_every == 0 || s + 1 == end_;
    for (std::size_t li = 0; li < layers_.size() && !stop; ++li) {
      const spec::LayerWrite w = next.get();
      // The next step's reference writes wait for this step's whole-cache comparison.
      if (li + 1 < layers_.size()) {
        next = make(s, li + 1);
      } else if (s + 1 < end_ && !sweep_due) {
        next = make(s + 1, 0);
      }
      if (!ahead) reference::write_layer(c_, w, expected_[li]);
      for (WriteRow& wr : write_rows_) {
        if (!stop && wr.running) stop = write_layer(wr, li, s, w, blocks, mismatched);
      }
      if (!stop && !read_rows_.empty()) stop = read_layer(li, s, mismatched);
    }
    if (next.valid() && stop) next.wait();  // the worker holds references into this frame
    if (sweep_due && !stop) {
      stop = sweep(last_sweep + 1, s, mismatched);
      last_sweep = s;
      if (s + 1 < end_ && !layers_.empty()) next = make(s + 1, 0);
    }
    ++report_.steps_run;
    if (progress) progress(s - first + 1, end_ - first);
  }
  if (next.valid()) next.wait();
  for (const auto& r : report_.subjects) report_.worst = spec::worst(report_.worst, r.outcome);
}

}  // namespace

ReplayReport replay_trace(const Trace& trace, const ReplayOptions& o,
                          std::vector<std::unique_ptr<oracle::WriteSubject>>& writes,
                          const ReplayProgress& progress) {
  std::vector<std::unique_ptr<oracle::ReadSubject>> none;
  return replay_trace(trace, o, writes, none, progress);
}

ReplayReport replay_trace(const Trace& trace, const ReplayOptions& o,
                          std::vector<std::unique_ptr<oracle::WriteSubject>>& writes,
                          std::vector<std::unique_ptr<oracle::ReadSubject>>& reads,
                          const ReplayProgress& progress) {
  ReplayReport report;
  Replayer(trace, o, report).run(writes, reads, progress);
  return report;
}

}  // namespace kvo::traces
