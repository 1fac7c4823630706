// Trace throughput: parsing (bytes/s of a simulated serving trace, container alone and whole trace)
// and write-path replay of a 60-layer (3D57S) batch-64 decode trace in steps/s, split into its
// parts (value generation, reference writes, subject writes, cache comparison) to explain where a
// step's time goes.
#include <benchmark/benchmark.h>

#include <cstring>

#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/subject.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/subjects/cpu_write.hpp"
#include "kvo/traces/replay.hpp"
#include "kvo/traces/safetensors.hpp"
#include "kvo/traces/simulator.hpp"
#include "kvo/traces/trace.hpp"

namespace {

using namespace kvo;

/// A serving trace of batch up to 64: ~4000 steps, a few MB.
const std::vector<std::uint8_t>& serving_file() {
  static const std::vector<std::uint8_t> bytes = [] {
    traces::SimOptions o;
    o.seed = 42;
    o.steps = 4000;
    o.max_batch = 64;
    o.token_budget = 512;
    o.prompt_max = 512;
    o.output_max = 512;
    o.config.geometry.num_blocks = 4096;
    return traces::serialize_trace(traces::simulate(o));
  }();
  return bytes;
}

void BM_ParseSafetensors(benchmark::State& state) {
  const auto& bytes = serving_file();
  for (auto _ : state) {
    benchmark::DoNotOptimize(traces::parse_safetensors(bytes));
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes.size()));
  state.SetLabel(std::to_string(bytes.size() >> 10) + " KiB");
}
BENCHMARK(BM_ParseSafetensors)->Unit(benchmark::kMillisecond);

void BM_ParseTrace(benchmark::State& state) {
  const auto& bytes = serving_file();
  for (auto _ : state) {
    benchmark::DoNotOptimize(traces::parse_trace(bytes));
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes.size()));
  state.SetLabel(std::to_string(bytes.size() >> 10) + " KiB");
}
BENCHMARK(BM_ParseTrace)->Unit(benchmark::kMillisecond);

/// 64 requests each decoding one token per step after a 128-token context, 60 layers: the shape
/// of a MiniMax-M3-like decode step (NKV 4, HD 128, index 128, bf16 in, fp8 e4m3 cache, page 16).
traces::Trace decode_trace(std::int64_t steps) {
  traces::Trace t;
  spec::ModelConfig& c = t.config;
  c.layers = spec::parse_layer_mix(spec::kDefaultLayerMix);
  c.geometry.block_size = 16;
  c.geometry.num_kv_heads = 4;
  c.geometry.head_dim = 128;
  c.geometry.index_dim = 128;
  c.kv.cache_dtype = spec::DType::kFp8E4M3;
  c.index.flat_dtype = spec::DType::kFp8E4M3;
  const std::int64_t batch = 64, context = 128;
  const std::int64_t per_request = (context + steps + 15) / 16;
  c.geometry.num_blocks = batch * per_request;
  for (std::int64_t s = 0; s < steps; ++s) {
    traces::TraceStep st;
    st.slot_mapping.type = spec::SlotType::kI64;
    st.slot_mapping.shape = {batch};
    st.block_table.shape = {batch, per_request};
    st.seq_lens.shape = {batch};
    traces::IntTensor qsl;
    qsl.shape = {batch + 1};
    qsl.values.push_back(0);
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t p = context + s;
      // Requests' blocks interleaved (block j of request b is j * batch + b): a scattered table.
      for (std::int64_t j = 0; j < per_request; ++j) st.block_table.values.push_back(j * batch + b);
      st.slot_mapping.values.push_back(((p / 16) * batch + b) * 16 + p % 16);
      st.seq_lens.values.push_back(p + 1);
      qsl.values.push_back(b + 1);
    }
    st.query_start_loc = qsl;
    t.steps.push_back(std::move(st));
  }
  return t;
}

/// Whole replays of `steps` decode steps; arg 1: subjects (0 reference only, 1 cpu-fused, 2 both
/// CPU forms). Cache allocation and poisoning (~0.9 GB per copy) is part of each iteration, so
/// the marginal per-step rate is the difference between the two step counts.
void BM_ReplayDecode(benchmark::State& state) {
  const std::int64_t steps = state.range(0);
  const traces::Trace trace = decode_trace(steps);
  oracle::SubjectList subjects;
  for (auto& s : oracle::make_subjects()) {
    if ((state.range(1) >= 1 && s->name() == "cpu-fused") ||
        (state.range(1) >= 2 && s->name() == "cpu-unfused")) {
      subjects.push_back(std::move(s));
    }
  }
  std::int64_t done = 0;
  for (auto _ : state) {
    const traces::ReplayReport r = traces::replay_trace(trace, traces::ReplayOptions{}, subjects);
    if (r.worst != spec::Outcome::kPass) state.SkipWithError("replay mismatch");
    done += r.steps_run;
  }
  state.counters["steps_per_s"] =
      benchmark::Counter(static_cast<double>(done), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ReplayDecode)
    ->ArgsProduct({{2, 10}, {0, 1, 2}})
    ->ArgNames({"steps", "subjects"})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

/// The parts of one decode step: generating the 60 layers' K, V, index-K (SPEC 8 hash per
/// element); the reference's 60 writes; one subject's 60 writes; comparing one cache copy.
void BM_DecodeStepParts(benchmark::State& state) {
  const traces::Trace trace = decode_trace(1);
  const auto gen = traces::replay_generator(trace, traces::ReplayOptions{});
  const reference::PagedCacheLayout layout(trace.config);
  const auto layers = static_cast<std::int64_t>(trace.config.layers.size());
  std::vector<spec::LayerWrite> writes;
  for (std::int64_t l = 0; l < layers; ++l)
    writes.push_back(traces::make_step_write(trace, 0, l, gen));
  std::vector<spec::LayerCaches> a = oracle::make_model_caches(layout);
  std::vector<spec::LayerCaches> b = a;
  for (auto _ : state) {
    std::size_t equal = 0;
    for (std::int64_t l = 0; l < layers; ++l) {
      const auto li = static_cast<std::size_t>(l);
      switch (state.range(0)) {
        case 0:
          benchmark::DoNotOptimize(traces::make_step_write(trace, 0, l, gen));
          break;
        case 1:
          reference::write_layer(trace.config, writes[li], a[li]);
          break;
        case 2:
          subjects::write_layer_fused(trace.config, writes[li], b[li]);
          break;
        default:
          for (std::size_t k = 0; k < a[li].buffers.size(); ++k) {
            equal += std::memcmp(a[li].buffers[k].storage.data(), b[li].buffers[k].storage.data(),
                                 static_cast<std::size_t>(a[li].buffers[k].storage.size())) == 0;
          }
      }
    }
    benchmark::DoNotOptimize(equal);
  }
  state.SetLabel(std::array{"generate values", "reference writes", "cpu-fused writes",
                            "compare caches"}[static_cast<std::size_t>(state.range(0))]);
  state.counters["steps_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecodeStepParts)->DenseRange(0, 3)->ArgName("part")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
