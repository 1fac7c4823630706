// CPU cost of a read case's reference: what a GPU campaign's worker spends on each sampled read
// case (issue 15 item 4), and every read case of a CPU campaign. The case built (its sparse
// layer's caches written by the reference write from SPEC 8's values), the indexer's top-k, and
// the attention over its selection, at 1k- and 16k-token contexts; a memcpy of the bytes the
// case's write stores, measured in the same run, as the bandwidth baseline.
#include <benchmark/benchmark.h>

#include <array>
#include <cstring>
#include <vector>

#include "kvo/oracle/read_case.hpp"
#include "kvo/reference/read_path.hpp"

namespace {

using namespace kvo;

/// Two requests of exactly `seq_len` tokens each (their query rows drawn), case seed 1.
oracle::ReadCase read_case(std::int64_t seq_len) {
  oracle::ReadOverrides o;
  o.seq_len = seq_len;
  o.requests = 2;
  return oracle::make_read_case(1, o);
}

/// Bytes the case's write stores: every token's K and V rows and its index-K row (codes only).
std::int64_t written_bytes(const oracle::ReadCase& c) {
  const spec::CacheGeometry& g = c.config.geometry;
  const auto tokens = static_cast<std::int64_t>(c.values.keys.size());
  const std::int64_t index_bytes =
      c.config.index.layout == spec::IndexLayout::kFlat
          ? g.index_dim * static_cast<std::int64_t>(spec::dtype_bytes(c.config.index.flat_dtype))
          : g.index_dim;
  return tokens * (2 * g.num_kv_heads * g.head_dim *
                       static_cast<std::int64_t>(spec::dtype_bytes(c.config.kv.cache_dtype)) +
                   index_bytes);
}

/// arg 0: every request's tokens; arg 1: part (0 the case built and written, 1 the indexer's
/// top-k, 2 the attention over it, 3 memcpy of the bytes the write stores).
void BM_ReadCaseReference(benchmark::State& state) {
  const std::int64_t seq_len = state.range(0);
  const oracle::ReadCase c = read_case(seq_len);
  const reference::TopkSelection selection =
      reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches);
  const std::int64_t bytes = written_bytes(c);
  std::vector<std::uint8_t> src(static_cast<std::size_t>(bytes)), dst(src.size());
  for (auto _ : state) {
    switch (state.range(1)) {
      case 0:
        benchmark::DoNotOptimize(read_case(seq_len));
        break;
      case 1:
        benchmark::DoNotOptimize(
            reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches));
        break;
      case 2:
        benchmark::DoNotOptimize(reference::attention(c.config, c.attention, c.batch, c.q, c.caches,
                                                      c.k_scale, c.v_scale, &selection));
        break;
      default:
        std::memcpy(dst.data(), src.data(), src.size());
        benchmark::DoNotOptimize(dst.data());
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["queries"] = static_cast<double>(c.batch.num_queries());
  state.SetLabel(std::array{"case", "indexer", "attention",
                            "memcpy"}[static_cast<std::size_t>(state.range(1))]);
}
BENCHMARK(BM_ReadCaseReference)
    ->ArgsProduct({{1024, 16384}, {0, 1, 2, 3}})
    ->ArgNames({"seq_len", "part"})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
