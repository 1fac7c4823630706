// CPU throughput of the write path: campaign cases per second (what `kvoracle check` sustains), and
// one layer's write per CPU form at the reference shape (NKV 4, HD 128, index 1x128, block 128),
// with a memcpy of the same bytes measured in the same run as the bandwidth baseline.
#include <benchmark/benchmark.h>

#include <cstring>

#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/subjects/cpu_write.hpp"

namespace {

using namespace kvo;

/// Whole campaign cases (reference + cpu-fused + cpu-unfused + diff), default random sizes;
/// arg 0: 1 = a full 60-layer MiniMax-M3-like mix (3D57S), 0 = drawn mixes of 1-4 layers.
void BM_CheckCases(benchmark::State& state) {
  oracle::CheckOptions o;
  o.cases = 16;
  o.ops = {spec::Op::kWrite};
  if (state.range(0) == 1) o.overrides.write.layers = std::string(spec::kDefaultLayerMix);
  auto subjects = oracle::make_subjects();
  oracle::SubjectList cpu;
  for (auto& s : subjects) {
    if (s->name().rfind("cpu-", 0) == 0 && s->implements(spec::Op::kWrite))
      cpu.push_back(std::move(s));
  }
  std::int64_t cases = 0;
  for (auto _ : state) {
    o.seed += 1;
    const oracle::CheckReport r = oracle::run_check(o, cpu);
    if (r.worst != spec::Outcome::kPass) state.SkipWithError("campaign failed");
    cases += r.cases_run;
  }
  state.counters["cases_per_s"] =
      benchmark::Counter(static_cast<double>(cases), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CheckCases)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("m3_mix")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();  // the campaign prepares the next case on a second thread

/// One sparse layer's write at the reference shape; arg 0: tokens; arg 1: form (0 reference,
/// 1 fused, 2 unfused, 3 memcpy of the bytes the write moves).
void BM_WriteLayer(benchmark::State& state) {
  oracle::CaseOverrides o;
  o.layers = "S";
  o.num_kv_heads = 4;
  o.head_dim = 128;
  o.index_dim = 128;
  o.block_size = 128;
  o.tokens = state.range(0);
  o.requests = 1;
  o.num_blocks = state.range(0) / 128 + 8;
  o.kv_dtype = spec::DType::kFp8E4M3;
  o.act_dtype = spec::DType::kBF16;
  o.layout = spec::KvLayout::kNhd;
  o.index_layout = spec::IndexLayout::kFlat;
  o.index_dtype = spec::DType::kFp8E4M3;
  o.edge_values = false;
  o.slot_mode = spec::SlotMode::kStrict;
  o.separate_index_slots = false;
  const oracle::WriteCase wc = oracle::make_write_case(1, o);
  const reference::PagedCacheLayout layout(wc.config);
  spec::LayerCaches caches = oracle::make_layer_caches(layout, 0, spec::LayerKind::kSparse);
  const spec::LayerWrite& w = wc.writes.front();
  // Bytes a write must move: sources read (K, V, index-K rows) plus cache elements written.
  const auto tokens = static_cast<std::int64_t>(w.slots.slots.size());
  const std::int64_t bytes = tokens * (2 * 4 * 128 * 2 + 128 * 2) + tokens * (2 * 4 * 128 + 128);
  std::vector<std::uint8_t> src(static_cast<std::size_t>(bytes)), dst(src.size());
  for (auto _ : state) {
    switch (state.range(1)) {
      case 0:
        reference::write_layer(wc.config, w, caches);
        break;
      case 1:
        subjects::write_layer_fused(wc.config, w, caches);
        break;
      case 2:
        subjects::write_layer_unfused(wc.config, w, caches);
        break;
      default:
        std::memcpy(dst.data(), src.data(), src.size() / 2);
        benchmark::DoNotOptimize(dst.data());
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetLabel(std::array{"reference", "fused", "unfused",
                            "memcpy"}[static_cast<std::size_t>(state.range(1))]);
}
BENCHMARK(BM_WriteLayer)
    ->ArgsProduct({{64, 4096}, {0, 1, 2, 3}})
    ->ArgNames({"tokens", "form"})
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
