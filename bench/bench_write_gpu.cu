// Per-layer cache-write time on the GPU, fused (1 launch per layer) against unfused (12 launches on
// a sparse layer, 8 on a dense one), with a model's 60 layers (3D57S) captured in ONE CUDA graph,
// as a serving engine's decode step runs them. The same run measures an empty kernel (60 launches
// in a graph), the floor of a slot-mapped write (slot_store_kernel: a warp's slot loads and one
// store each, 60 launches in a graph) and a device-to-device copy, so the figures read as ratios:
//   x_empty = fused per-layer time / empty-kernel per-launch time (target <= 2 at <= 256 tokens)
//   speedup = unfused per-layer time / fused per-layer time (target >= 15 at <= 256)
//   bw_frac = fused bytes (read + written) / time / copy bandwidth (target >= 0.9 at 65536)
// Shapes and flavours (bf16; fp8 under divide, divide by 1.0, mul_recip, none):
// write_bench_setup.hpp, which bench_write_peer.py shares through libkvo_bench_write to time the
// Triton peer next to it. Times are medians of individually event-timed graph replays (manual
// time).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_bench.cuh"
#include "kvo/gpu/write.hpp"
#include "kvo/spec/config.hpp"
#include "write_bench_setup.hpp"

namespace {

using kvo::spec::DType;
using kvo::spec::LayerKind;
using namespace kvo::bench;  // NOLINT: the shared benchmark helpers

constexpr int kLayers = 60;

/// The model and the device buffers of one benchmark point: 60 layers' caches, one set of
/// inputs shared by all layers (an engine's per-layer inputs are as cold: at 65536 tokens they are
/// far larger than the L2), and the slot mapping.
struct Setup {
  kvo::spec::ModelConfig config;
  std::int64_t tokens = 0;
  std::vector<void*> allocations;
  kvo::gpu::DeviceWriteInputs in;
  std::vector<kvo::gpu::DeviceLayerCaches> caches;
  double bytes_per_step = 0;  ///< read + written by the fused path over the 60 layers

  void* alloc(std::size_t n) {
    void* p = nullptr;
    check(cudaMalloc(&p, std::max<std::size_t>(n, 256)), "cudaMalloc(bench)");
    allocations.push_back(p);
    return p;
  }
  ~Setup() {
    for (void* p : allocations) cudaFree(p);
  }
};

/// hot: a 16-block cache per layer (4.5 MB bf16) instead of >= 512 blocks, a diagnostic of how
/// much of the small-token time is the caches' cold pages rather than the kernel.
void make_setup(Setup& st, const WriteFlavour& flavour, std::int64_t tokens, bool hot = false) {
  const std::int64_t nb = bench_num_blocks(tokens, hot);
  st.config = write_bench_config(flavour, nb);
  const kvo::spec::ModelConfig& c = st.config;
  st.tokens = tokens;
  const std::int64_t row = 4 * 128;
  auto fill = [&](std::size_t elems, std::uint32_t seed) {
    auto* p = static_cast<std::uint16_t*>(st.alloc(elems * 2));
    fill_bf16<<<static_cast<unsigned>((elems + 255) / 256), 256>>>(
        p, static_cast<std::int64_t>(elems), seed);
    return p;
  };
  st.in.k = fill(static_cast<std::size_t>(tokens * row), 1);
  st.in.v = fill(static_cast<std::size_t>(tokens * row), 2);
  st.in.index_k = fill(static_cast<std::size_t>(tokens * 128), 3);
  const std::vector<std::int64_t> slots = bench_slots(tokens, nb, hot);
  void* d_slots = st.alloc(slots.size() * 8);
  check(cudaMemcpy(d_slots, slots.data(), slots.size() * 8, cudaMemcpyHostToDevice), "slots");
  st.in.slots = d_slots;
  auto* d_scale = static_cast<float*>(st.alloc(4));
  check(cudaMemcpy(d_scale, &flavour.scale, 4, cudaMemcpyHostToDevice), "scale");
  st.in.k_scale = d_scale;
  st.in.v_scale = d_scale;
  st.in.num_tokens = tokens;

  const std::int64_t kv_bytes = kvo::gpu::kv_buffer_bytes(c);
  const std::int64_t ix_bytes = kvo::gpu::index_buffer_bytes(c);
  for (LayerKind kind : c.layers) {
    kvo::gpu::DeviceLayerCaches lc;
    lc.k = st.alloc(static_cast<std::size_t>(kv_bytes));  // the one packed K/V tensor
    if (kind == LayerKind::kSparse) lc.index_k = st.alloc(static_cast<std::size_t>(ix_bytes));
    st.caches.push_back(lc);
    st.bytes_per_step += bench_layer_bytes(flavour, kind, tokens);
  }
  check(cudaDeviceSynchronize(), "setup");
}

/// The write timed: the fused write as shipped (its specialised kernel where it applies), the
/// fused write's generic kernel, or the unfused launches.
enum class Path { kFused, kFusedGeneric, kUnfused };

/// Captures the 60 layer writes of `path` into one graph; returns the median time of one replay
/// and the launches it holds.
double time_path(Setup& st, Path path, int reps, int* launches, bool pdl = false) {
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  kvo::gpu::UnfusedWorkspace ws(st.tokens);
  cudaGraph_t g;
  *launches = 0;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  for (std::size_t l = 0; l < st.caches.size(); ++l) {
    const LayerKind kind = st.config.layers[l];
    switch (path) {
      case Path::kFused:
        *launches += kvo::gpu::launch_fused_write(st.config, kind, st.in, st.caches[l], s, pdl);
        break;
      case Path::kFusedGeneric:
        *launches +=
            kvo::gpu::launch_fused_write_generic(st.config, kind, st.in, st.caches[l], s, pdl);
        break;
      case Path::kUnfused:
        *launches += kvo::gpu::launch_unfused_write(st.config, kind, st.in, st.caches[l], ws, s);
        break;
    }
  }
  check(cudaStreamEndCapture(s, &g), "end capture");
  cudaGraphExec_t exec;
  check(cudaGraphInstantiate(&exec, g, 0), "instantiate");
  const double t = median_replay_s(exec, s, reps);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return t;
}

void BM_LayerWrite(benchmark::State& state) {
  // range(0): the flavour (kWriteFlavours: bf16, fp8 divide by 0.37, by 1.0, mul_recip, none).
  const WriteFlavour& flavour = kWriteFlavours[state.range(0)];
  const std::int64_t tokens = state.range(1);
  try {
    const double empty = empty_launch_s(false);
    const double empty_pdl = empty_launch_s(true);
    const double copy_bw = copy_bandwidth().best();
    Setup st;
    make_setup(st, flavour, tokens);
    const int reps = tokens >= 65536 ? 10 : (tokens >= 4096 ? 30 : 100);
    int fused_launches = 0, unfused_launches = 0, pdl_launches = 0;
    const double fused = time_path(st, Path::kFused, reps, &fused_launches) / kLayers;
    const double fused_pdl = time_path(st, Path::kFused, reps, &pdl_launches, true) / kLayers;
    int generic_launches = 0;
    const double generic = time_path(st, Path::kFusedGeneric, reps, &generic_launches) / kLayers;
    const double unfused =
        time_path(st, Path::kUnfused, std::max(reps / 3, 5), &unfused_launches) / kLayers;
    for (auto _ : state) state.SetIterationTime(fused);
    const double bw = st.bytes_per_step / (fused * kLayers);
    const double bw_pdl = st.bytes_per_step / (fused_pdl * kLayers);
    state.counters["fused_us"] = fused * 1e6;
    state.counters["fused_pdl_us"] = fused_pdl * 1e6;
    state.counters["unfused_us"] = unfused * 1e6;
    state.counters["generic_us"] = generic * 1e6;
    state.counters["x_generic"] = fused / generic;
    state.counters["specialised"] =
        kvo::gpu::fused_write_is_specialised(st.config, LayerKind::kSparse) ? 1 : 0;
    state.counters["empty_us"] = empty * 1e6;
    state.counters["empty_pdl_us"] = empty_pdl * 1e6;
    state.counters["slot_store_us"] = slot_store_launch_s(false) * 1e6;
    state.counters["slot_store_pdl_us"] = slot_store_launch_s(true) * 1e6;
    state.counters["x_empty"] = fused / empty;
    state.counters["x_empty_pdl"] = fused_pdl / empty;
    state.counters["speedup"] = unfused / fused;
    state.counters["speedup_pdl"] = unfused / fused_pdl;
    state.counters["GBps"] = bw * 1e-9;
    state.counters["copy_GBps"] = copy_bw * 1e-9;
    state.counters["bw_frac"] = bw / copy_bw;
    state.counters["bw_frac_pdl"] = bw_pdl / copy_bw;
    state.counters["launches_fused"] = fused_launches;
    state.counters["launches_unfused"] = unfused_launches;
    if (tokens <= 256) {
      Setup hot;
      make_setup(hot, flavour, tokens, true);
      int n = 0;
      state.counters["fused_hot_us"] = time_path(hot, Path::kFused, reps, &n) / kLayers * 1e6;
      state.counters["fused_hot_pdl_us"] =
          time_path(hot, Path::kFused, reps, &n, true) / kLayers * 1e6;
    }
    state.SetLabel(std::string(flavour.name) + " tokens=" + std::to_string(tokens));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}
BENCHMARK(BM_LayerWrite)
    ->ArgNames({"flavour", "tokens"})
    ->ArgsProduct({{0, 1, 2, 3, 4}, {1, 8, 64, 256, 4096, 65536}})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMicrosecond);

void BM_EmptyLaunch(benchmark::State& state) {
  try {
    const double t = empty_launch_s(false);
    for (auto _ : state) state.SetIterationTime(t);
    state.counters["empty_us"] = t * 1e6;
    state.counters["empty_pdl_us"] = empty_launch_s(true) * 1e6;
    state.counters["slot_store_us"] = slot_store_launch_s(false) * 1e6;
    state.counters["slot_store_pdl_us"] = slot_store_launch_s(true) * 1e6;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}
BENCHMARK(BM_EmptyLaunch)->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);

void BM_CopyD2D(benchmark::State& state) {
  try {
    const CopyBandwidth& bw = copy_bandwidth();
    for (auto _ : state) state.SetIterationTime((std::size_t{4} << 30) / bw.best());
    state.counters["copy_GBps"] = bw.best() * 1e-9;
    state.counters["memcpy_GBps"] = bw.memcpy_bps * 1e-9;
    state.counters["copy_kernel_GBps"] = bw.kernel_bps * 1e-9;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}
BENCHMARK(BM_CopyD2D)->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
