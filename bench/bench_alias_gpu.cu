// What judging every byte of a huge subject allocation costs, in two layouts (issue 15, the write
// campaign's bound). A huge-cache write case must catch a stray write anywhere in the subject's
// allocation (an offset past 2^31 that wraps lands anywhere), so today each case poisons the whole
// allocation and reads it all back (plain: cudaMalloc, memset, count). The aliased layout is one
// reserved address range (cuMemAddressReserve) whose every granule maps ONE shared poisoned
// granule, except the granules a case touches, which map granules of their own for the case
// (cuMemUnmap, cuMemMap, cuMemSetAccess, and back after it). Poisoning and reading the touched
// granules and the shared one then judge every byte: a stray write anywhere lands in one of them.
// Only whole handles are mapped (a granule each, at offset 0); whether the driver maps part of a
// larger handle, or from an offset into it, is probed and reported. Each case also plants a
// stray byte far from its touched granules and requires the shared granule to show it (the
// aliasing is real, not assumed). Times are per case, medians of kCases cases of random touched
// granules, against the plain layout measured in the same run.
#include <benchmark/benchmark.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_bench.cuh"

namespace {

using namespace kvo::bench;  // NOLINT: the shared benchmark helpers

constexpr int kPoisonByte = 0xA5;
constexpr std::uint32_t kPoisonWord = 0xA5A5A5A5u;
constexpr int kCases = 9;

void drv(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  cuGetErrorString(r, &s);
  throw std::runtime_error(std::string(what) + ": " + (s ? s : "unknown driver error"));
}

/// The 32-bit words of p[i] (16-byte words) that are not the poison pattern.
__device__ unsigned long long unpoisoned_words(const uint4* p, std::size_t i) {
  const uint4 v = __ldcs(p + i);
  return (v.x != kPoisonWord) + (v.y != kPoisonWord) + (v.z != kPoisonWord) + (v.w != kPoisonWord);
}

/// Adds to *bad the 32-bit words of p[0, n16) (16-byte words) that are not the poison pattern.
__global__ void count_unpoisoned_kernel(const uint4* p, std::size_t n16, unsigned long long* bad) {
  unsigned long long local = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n16;
       i += stride) {
    local += unpoisoned_words(p, i);
  }
  if (local != 0) atomicAdd(bad, local);
}

/// Poisons (kPoison) or counts into *bad the words that are not poison of each granule listed:
/// granules: [gridDim.y] addresses of `granule_bytes` each; one launch for a case's granules.
template <bool kPoison>
__global__ void granules_kernel(const unsigned long long* granules, std::size_t granule_bytes,
                                unsigned long long* bad) {
  uint4* p = reinterpret_cast<uint4*>(granules[blockIdx.y]);
  const std::size_t n16 = granule_bytes / 16;
  unsigned long long local = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n16;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    if constexpr (kPoison) {
      p[i] = make_uint4(kPoisonWord, kPoisonWord, kPoisonWord, kPoisonWord);
    } else {
      local += unpoisoned_words(p, i);
    }
  }
  if (local != 0) atomicAdd(bad, local);
}

/// One judging pass over the byte ranges given: poison them, then count what is not poison.
struct Judge {
  cudaStream_t stream = nullptr;
  unsigned long long* bad = nullptr;
  Judge() {
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    check(cudaMalloc(&bad, sizeof(*bad)), "cudaMalloc(bad)");
  }
  ~Judge() {
    cudaFree(bad);
    cudaStreamDestroy(stream);
  }
  void poison(CUdeviceptr p, std::size_t n) {
    check(cudaMemsetAsync(reinterpret_cast<void*>(p), kPoisonByte, n, stream), "poison");
  }
  void count(CUdeviceptr p, std::size_t n) {
    count_unpoisoned_kernel<<<132 * 8, 512, 0, stream>>>(reinterpret_cast<const uint4*>(p), n / 16,
                                                         bad);
    check(cudaGetLastError(), "count launch");
  }
  unsigned long long finish() {
    unsigned long long h = 0;
    check(cudaMemcpyAsync(&h, bad, sizeof(h), cudaMemcpyDeviceToHost, stream), "fetch");
    check(cudaStreamSynchronize(stream), "sync");
    check(cudaMemsetAsync(bad, 0, sizeof(*bad), stream), "reset");
    return h;
  }
};

struct Granules {
  std::size_t size = 0;
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  Granules() {
    check(cudaFree(nullptr), "context");
    CUdevice dev;
    drv(cuCtxGetDevice(&dev), "cuCtxGetDevice");
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = static_cast<int>(dev);
    drv(cuMemGetAllocationGranularity(&size, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "granularity");
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  CUmemGenericAllocationHandle create(std::size_t bytes) const {
    CUmemGenericAllocationHandle h;
    drv(cuMemCreate(&h, bytes, &prop, 0), "cuMemCreate");
    return h;
  }
  /// Whether a handle of `handle_bytes` maps `bytes` of it from `offset` (then unmapped): the
  /// driver may refuse a mapping of part of a handle.
  bool probe(CUdeviceptr at, std::size_t handle_bytes, std::size_t bytes,
             std::size_t offset) const {
    const CUmemGenericAllocationHandle h = create(handle_bytes);
    const bool ok = cuMemMap(at, bytes, offset, h, 0) == CUDA_SUCCESS;
    if (ok) drv(cuMemUnmap(at, bytes), "cuMemUnmap(probe)");
    drv(cuMemRelease(h), "cuMemRelease(probe)");
    return ok;
  }
  /// Handle h mapped whole at `at` (bytes: its size), readable and writable.
  void map(CUdeviceptr at, std::size_t bytes, CUmemGenericAllocationHandle h) const {
    drv(cuMemMap(at, bytes, 0, h, 0), "cuMemMap");
    drv(cuMemSetAccess(at, bytes, &access, 1), "cuMemSetAccess");
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// range(0): the allocation in GiB; range(1): touched granules a case (drawn at random).
void BM_HugeCaseJudging(benchmark::State& state) {
  try {
    const std::size_t gib = static_cast<std::size_t>(state.range(0));
    const std::size_t touched_count = static_cast<std::size_t>(state.range(1));
    const Granules gran;
    const std::size_t bytes = (gib << 30) / gran.size * gran.size;
    const std::size_t granules = bytes / gran.size;
    Judge judge;
    std::mt19937_64 rng(20261204);
    std::vector<std::vector<bool>> cases(kCases, std::vector<bool>(granules, false));
    for (auto& t : cases) {
      for (std::size_t k = 0; k < touched_count; ++k) t[rng() % granules] = true;
    }

    // The plain layout: the whole allocation poisoned and read back each case.
    std::vector<double> plain;
    {
      void* p = nullptr;
      check(cudaMalloc(&p, bytes), "cudaMalloc(plain)");
      for (int c = 0; c < kCases; ++c) {
        const auto t0 = std::chrono::steady_clock::now();
        judge.poison(reinterpret_cast<CUdeviceptr>(p), bytes);
        judge.count(reinterpret_cast<CUdeviceptr>(p), bytes);
        if (judge.finish() != 0) throw std::runtime_error("plain: poison not read back");
        plain.push_back(seconds_since(t0));
      }
      cudaFree(p);
    }

    // Whole-handle mappings only (a handle of one granule each, mapped at offset 0): the shared
    // poisoned granule at every untouched granule of the range, a granule of its own at each
    // touched one. Partial and offset mappings of a larger handle are probed, not used.
    CUdeviceptr base = 0, chunk_view = 0;
    drv(cuMemAddressReserve(&base, bytes, 0, 0, 0), "cuMemAddressReserve");
    drv(cuMemAddressReserve(&chunk_view, gran.size, 0, 0, 0), "cuMemAddressReserve(view)");
    const CUmemGenericAllocationHandle shared = gran.create(gran.size);
    gran.map(chunk_view, gran.size, shared);
    std::vector<CUmemGenericAllocationHandle> own(touched_count);
    for (auto& h : own) h = gran.create(gran.size);
    const bool partial_ok = gran.probe(base, 2 * gran.size, gran.size, 0);
    const bool offset_ok = gran.probe(base, 2 * gran.size, gran.size, gran.size);

    const auto setup0 = std::chrono::steady_clock::now();
    for (std::size_t g = 0; g < granules; ++g) {
      drv(cuMemMap(base + g * gran.size, gran.size, 0, shared, 0), "cuMemMap(shared)");
    }
    drv(cuMemSetAccess(base, bytes, &gran.access, 1), "cuMemSetAccess(range)");
    const double setup_s = seconds_since(setup0);

    unsigned long long* addrs = nullptr;  // [touched + 1] granule addresses a case
    check(cudaMalloc(&addrs, (touched_count + 1) * sizeof(*addrs)), "cudaMalloc(addrs)");
    std::vector<double> remap_s, judge_s;
    std::size_t remaps = 0;
    int strays_seen = 0;
    auto remap = [&](std::size_t g, CUmemGenericAllocationHandle h) {
      drv(cuMemUnmap(base + g * gran.size, gran.size), "cuMemUnmap(granule)");
      gran.map(base + g * gran.size, gran.size, h);
    };
    for (const auto& t : cases) {
      std::vector<std::size_t> touched;
      for (std::size_t g = 0; g < granules; ++g) {
        if (t[g]) touched.push_back(g);
      }
      auto t0 = std::chrono::steady_clock::now();
      for (std::size_t k = 0; k < touched.size(); ++k) remap(touched[k], own[k]);
      remaps += touched.size();
      double in_s = seconds_since(t0);
      // The case's judging: the touched granules and the shared one, poisoned and read back.
      t0 = std::chrono::steady_clock::now();
      std::vector<unsigned long long> list;
      for (const std::size_t g : touched) list.push_back(base + g * gran.size);
      list.push_back(chunk_view);
      check(cudaMemcpyAsync(addrs, list.data(), list.size() * sizeof(list[0]),
                            cudaMemcpyHostToDevice, judge.stream),
            "upload granules");
      const dim3 grid(16, static_cast<unsigned>(list.size()));
      granules_kernel<true><<<grid, 512, 0, judge.stream>>>(addrs, gran.size, judge.bad);
      granules_kernel<false><<<grid, 512, 0, judge.stream>>>(addrs, gran.size, judge.bad);
      check(cudaGetLastError(), "granules launch");
      if (judge.finish() != 0) throw std::runtime_error("aliased: poison not read back");
      judge_s.push_back(seconds_since(t0));
      // A stray byte in an untouched granule, far from the touched ones, must show in the view.
      std::size_t far = granules - 1;
      while (t[far]) --far;
      check(cudaMemsetAsync(reinterpret_cast<void*>(base + far * gran.size + 12345), 0, 1,
                            judge.stream),
            "stray");
      judge.count(chunk_view, gran.size);
      if (judge.finish() != 1) {
        throw std::runtime_error("aliased: a stray byte in granule " + std::to_string(far) +
                                 " did not show in the shared granule");
      }
      ++strays_seen;
      t0 = std::chrono::steady_clock::now();
      for (const std::size_t g : touched) remap(g, shared);
      remap_s.push_back(in_s + seconds_since(t0));
    }
    cudaFree(addrs);
    for (std::size_t g = 0; g < granules; ++g) {
      drv(cuMemUnmap(base + g * gran.size, gran.size), "cuMemUnmap(granule)");
    }
    drv(cuMemUnmap(chunk_view, gran.size), "cuMemUnmap(view)");
    drv(cuMemAddressFree(base, bytes), "cuMemAddressFree");
    drv(cuMemAddressFree(chunk_view, gran.size), "cuMemAddressFree(view)");
    for (auto h : own) drv(cuMemRelease(h), "cuMemRelease(own)");
    drv(cuMemRelease(shared), "cuMemRelease(shared)");

    const double plain_s = median(plain);
    const double aliased_s = median(remap_s) + median(judge_s);
    for (auto _ : state) state.SetIterationTime(aliased_s);
    state.counters["granule_MiB"] = static_cast<double>(gran.size) / (1 << 20);
    state.counters["plain_ms"] = plain_s * 1e3;
    state.counters["plain_TBps"] = 2.0 * bytes / plain_s * 1e-12;
    state.counters["aliased_ms"] = aliased_s * 1e3;
    state.counters["remap_ms"] = median(remap_s) * 1e3;
    state.counters["judge_ms"] = median(judge_s) * 1e3;
    state.counters["remaps_per_case"] = static_cast<double>(remaps) / kCases;
    state.counters["setup_ms"] = setup_s * 1e3;
    state.counters["x_plain"] = aliased_s / plain_s;
    state.counters["strays_seen"] = strays_seen;
    state.counters["strays_planted"] = kCases;
    state.counters["partial_map_ok"] = partial_ok ? 1 : 0;
    state.counters["offset_map_ok"] = offset_ok ? 1 : 0;
    state.SetLabel(std::to_string(gib) + " GiB, " + std::to_string(touched_count) +
                   " touched granules");
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}
BENCHMARK(BM_HugeCaseJudging)
    ->ArgNames({"GiB", "touched"})
    ->ArgsProduct({{6, 12}, {64, 512}})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
