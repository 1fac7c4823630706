#include "kvo/traces/replay.hpp"

#include <algorithm>
#include <cstring>
#include <future>
#include <sstream>

#include "kvo/oracle/cache_diff.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/traces/analysis.hpp"

namespace kvo::traces {
namespace {

using reference::GenTensor;

/// [rows, heads, dim] (heads > 0) or [rows, dim] of generated values keyed per row.
spec::HostTensor make_tensor(const reference::ValueGenerator& gen, std::int64_t layer,
                             GenTensor which, const std::vector<std::int64_t>& requests,
                             const std::vector<std::int64_t>& positions, std::int64_t heads,
                             std::int64_t dim) {
  spec::HostTensor t;
  t.dtype = gen.act;
  const auto rows = static_cast<std::int64_t>(requests.size());
  t.shape = heads > 0 ? std::vector<std::int64_t>{rows, heads, dim}
                      : std::vector<std::int64_t>{rows, dim};
  const std::int64_t nh = std::max<std::int64_t>(heads, 1);
  const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(gen.act));
  t.bytes.resize(static_cast<std::size_t>(rows * nh * dim * eb));
  std::uint8_t* out = t.bytes.data();
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t request = requests[static_cast<std::size_t>(r)];
    const std::int64_t position = positions[static_cast<std::size_t>(r)];
    for (std::int64_t h = 0; h < nh; ++h) {
      for (std::int64_t d = 0; d < dim; ++d) {
        const float x = gen.value(layer, which, request, position, h, d);
        reference::store_code(reference::encode(x, gen.act, spec::Saturation::kSatFinite), gen.act,
                              out);
        out += eb;
      }
    }
  }
  return t;
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
  const std::vector<std::int64_t> starts = st.starts();
  std::vector<std::int64_t> requests, positions;
  requests.reserve(static_cast<std::size_t>(st.tokens()));
  positions.reserve(static_cast<std::size_t>(st.tokens()));
  for (std::int64_t b = 0; b < st.batch(); ++b) {
    const auto bi = static_cast<std::size_t>(b);
    const std::int64_t q = starts[bi + 1] - starts[bi];
    const std::int64_t first = st.seq_lens.values[bi] - q;
    for (std::int64_t j = 0; j < q; ++j) {
      requests.push_back(st.request_id(b));
      positions.push_back(first + j);
    }
  }
  for (std::int64_t i = starts.back(); i < st.tokens(); ++i) {
    requests.push_back(-1);  // padding rows: generated but never read
    positions.push_back(i);
  }
  spec::LayerWrite w;
  w.kind = c.layers.at(static_cast<std::size_t>(layer));
  const spec::CacheGeometry& g = c.geometry;
  w.k = make_tensor(gen, layer, GenTensor::kK, requests, positions, g.num_kv_heads, g.head_dim);
  w.v = make_tensor(gen, layer, GenTensor::kV, requests, positions, g.num_kv_heads, g.head_dim);
  w.slots = slot_mapping(st.slot_mapping);
  if (w.kind == spec::LayerKind::kSparse) {
    w.index_k = make_tensor(gen, layer, GenTensor::kIndexK, requests, positions, 0, g.index_dim);
    if (st.index_slot_mapping) w.index_slots = slot_mapping(*st.index_slot_mapping);
  }
  w.k_scale = trace.k_scale;
  w.v_scale = trace.v_scale;
  return w;
}

std::string ReplayReport::summary() const {
  std::ostringstream s;
  for (const ReplaySubjectResult& r : subjects) {
    s << "  " << r.name << ": ";
    if (!r.note.empty() && r.layer_writes == 0 && r.outcome == spec::Outcome::kPass) {
      s << "skipped (" << r.note << ")\n";
      continue;
    }
    s << spec::name_of(r.outcome) << ", " << r.layer_writes << " layer writes";
    if (r.mismatching_steps) s << ", " << r.mismatching_steps << " mismatching steps";
    if (!r.note.empty()) s << " (" << r.note << ")";
    s << "\n";
  }
  s << "result: " << spec::name_of(worst) << " (" << steps_run << " steps)";
  return s.str();
}

ReplayReport replay_trace(const Trace& trace, const ReplayOptions& o,
                          std::vector<std::unique_ptr<oracle::WriteSubject>>& all,
                          const ReplayProgress& progress) {
  const spec::ModelConfig& c = trace.config;
  const TraceValidation v = validate_trace(trace, 1);
  if (!v.ok()) {
    const TraceProblem& p = v.problems.front();
    throw spec::InvalidInput(
        p.tensor, p.index, std::to_string(p.value),
        p.what + " (" + std::to_string(v.count) + " problems; kvoracle trace validate lists them)");
  }
  const auto steps = static_cast<std::int64_t>(trace.steps.size());
  const std::int64_t end = o.step_end < 0 ? steps : o.step_end;
  if (o.step_begin < 0 || o.step_begin > end || end > steps) {
    throw spec::InvalidInput("steps", -1, std::to_string(o.step_begin) + ":" + std::to_string(end),
                             "expected a:b with 0 <= a <= b <= " + std::to_string(steps));
  }
  std::vector<std::int64_t> layers = o.layers;
  if (layers.empty()) {
    for (std::size_t l = 0; l < c.layers.size(); ++l)
      layers.push_back(static_cast<std::int64_t>(l));
  }
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] < 0 || layers[i] >= static_cast<std::int64_t>(c.layers.size())) {
      throw spec::InvalidInput(
          "layers", static_cast<std::int64_t>(i), std::to_string(layers[i]),
          "expected a layer index in [0, " + std::to_string(c.layers.size()) + ")");
    }
  }
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());

  ReplayReport report;
  std::vector<oracle::WriteSubject*> active;
  for (std::size_t i = 0; i < o.subjects.size(); ++i) {
    const bool known = std::any_of(all.begin(), all.end(),
                                   [&](const auto& s) { return s->name() == o.subjects[i]; });
    if (!known) {
      std::string names;
      for (const auto& s : all) names += (names.empty() ? "" : ", ") + s->name();
      throw spec::InvalidInput("subject", static_cast<std::int64_t>(i), o.subjects[i],
                               "unknown subject; expected one of " + names);
    }
  }
  for (const auto& s : all) {
    if (!o.subjects.empty() &&
        std::find(o.subjects.begin(), o.subjects.end(), s->name()) == o.subjects.end()) {
      continue;
    }
    ReplaySubjectResult r;
    r.name = s->name();
    r.note = s->unavailable_reason();
    if (r.note.empty()) active.push_back(s.get());
    report.subjects.push_back(r);
  }
  const auto result_of = [&](const oracle::WriteSubject* s) -> ReplaySubjectResult& {
    return *std::find_if(report.subjects.begin(), report.subjects.end(),
                         [&](const ReplaySubjectResult& r) { return r.name == s->name(); });
  };

  const reference::PagedCacheLayout layout(c);
  const reference::ValueGenerator gen = replay_generator(trace, o);
  std::vector<spec::LayerCaches> expected;
  for (std::int64_t l : layers) {
    expected.push_back(
        reference::make_layer_caches(layout, l, c.layers[static_cast<std::size_t>(l)]));
  }
  // Steps before the range: the reference alone builds the caches the range starts from.
  for (std::int64_t s = 0; s < o.step_begin; ++s) {
    for (std::size_t li = 0; li < layers.size(); ++li) {
      reference::write_layer(c, make_step_write(trace, s, layers[li], gen), expected[li]);
    }
  }
  std::vector<std::vector<spec::LayerCaches>> actual(active.size(), expected);
  std::vector<bool> running(active.size(), true);
  bool stop = false;
  // Generating a layer's K/V/index-K (SPEC 8 hashes) is a third of a step's time and depends on
  // nothing a subject does: the next layer's inputs are built on a second thread while the
  // reference and the subjects (all on this thread, so a subject need not be thread-safe) write.
  const auto make = [&](std::int64_t step, std::size_t li) {
    return std::async(std::launch::async, [&trace, &gen, step, l = layers[li]] {
      return make_step_write(trace, step, l, gen);
    });
  };
  std::future<spec::LayerWrite> next;
  if (o.step_begin < end && !layers.empty()) next = make(o.step_begin, 0);
  for (std::int64_t s = o.step_begin; s < end && !stop; ++s) {
    std::vector<bool> mismatched(active.size(), false);
    for (std::size_t li = 0; li < layers.size() && !stop; ++li) {
      const std::int64_t l = layers[li];
      const spec::LayerWrite w = next.get();
      if (li + 1 < layers.size()) {
        next = make(s, li + 1);
      } else if (s + 1 < end) {
        next = make(s + 1, 0);
      }
      reference::write_layer(c, w, expected[li]);
      for (std::size_t si = 0; si < active.size() && !stop; ++si) {
        if (!running[si]) continue;
        ReplaySubjectResult& r = result_of(active[si]);
        spec::LayerCaches& got = actual[si][li];
        std::string rejected;
        try {
          active[si]->write_layer(c, w, got);
          ++r.layer_writes;
        } catch (const spec::Unsupported& e) {
          r.outcome = spec::worst(r.outcome, spec::Outcome::kUnsupported);
          r.note = e.what();
          running[si] = false;
          continue;
        } catch (const spec::InvalidInput& e) {
          rejected = e.what();  // the reference accepted this write: a wrong answer
        } catch (const std::exception& e) {
          r.outcome = spec::worst(r.outcome, spec::Outcome::kFailedToRun);
          r.note = "step " + std::to_string(s) + " layer " + std::to_string(l) + ": " + e.what();
          running[si] = false;
          continue;
        }
        if (rejected.empty() && same_bytes(expected[li], got)) continue;
        r.outcome = spec::worst(r.outcome, spec::Outcome::kMismatch);
        if (!mismatched[si]) ++r.mismatching_steps;
        mismatched[si] = true;
        std::string text = "mismatch: subject " + r.name + ", step " + std::to_string(s) +
                           ", layer " + std::to_string(l) + "\n";
        text += rejected.empty()
                    ? oracle::diff_layer_caches(layout, l, expected[li], got, &w).report()
                    : "rejected a write the reference accepts: " + rejected;
        report.mismatches.push_back(std::move(text));
        if (o.keep_going) {
          got = expected[li];  // resync, so the next report shows only new differences
        } else {
          stop = true;
        }
      }
    }
    ++report.steps_run;
    if (progress) progress(s - o.step_begin + 1, end - o.step_begin);
  }
  for (const auto& r : report.subjects) report.worst = spec::worst(report.worst, r.outcome);
  return report;
}

}  // namespace kvo::traces
