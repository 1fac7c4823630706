#pragma once
/// \file gpu_bench.cuh
/// What the GPU benchmarks share: CUDA error checks, a streaming copy kernel and the copy bandwidth
/// measured in the same run (the baseline every achieved bandwidth is a share of), a bf16 fill,
/// and event-timed medians of CUDA graph replays.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvo::bench {

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}

/// A streaming copy, 4 x 16 bytes in flight per thread: src, dst [n] uint4.
__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                            std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a, dst[i + stride] = b, dst[i + 2 * stride] = c, dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

/// Fills n bf16 values (uniform in [-4, 4), from a hash of the index) at p: [n] bf16.
__global__ void fill_bf16(std::uint16_t* p, std::int64_t n, std::uint32_t seed) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  std::uint32_t h = static_cast<std::uint32_t>(i) * 0x9E3779B9u ^ seed;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  const float x = (static_cast<float>(h >> 8) * (1.0f / 16777216.0f) - 0.5f) * 8.0f;
  p[i] = static_cast<std::uint16_t>(__float_as_uint(x) >> 16);
}

/// Median of `reps` event-timed launches of `exec`, in seconds. Replays for at least 50 ms first:
/// an idle H200 sits at a few hundred MHz and takes that long to reach its boost clock, which
/// would otherwise inflate short graphs several-fold.
inline double median_replay_s(cudaGraphExec_t exec, cudaStream_t s, int reps) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  const auto warm_start = std::chrono::steady_clock::now();
  for (int i = 0; i < 100000; ++i) {
    for (int k = 0; k < 10; ++k) check(cudaGraphLaunch(exec, s), "graph warm-up");
    check(cudaStreamSynchronize(s), "warm-up sync");
    if (std::chrono::steady_clock::now() - warm_start > std::chrono::milliseconds(50)) break;
  }
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(a, s), "record");
    check(cudaGraphLaunch(exec, s), "graph launch");
    check(cudaEventRecord(b, s), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

__global__ void empty_kernel() {}

/// The empty kernel's PDL twin: waits for the previous kernel as a PDL consumer must, then lets the
/// next one launch.
__global__ void empty_pdl_kernel() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
}

/// Per-launch time of `launches` one-warp launches captured in one graph (a model's layers) and
/// replayed: launch(l, stream, config) launches layer l, plainly or, where `pdl`, through
/// `config` (programmatic stream serialization, one block of one warp).
template <typename Launch>
double one_warp_launches_s(bool pdl, int launches, Launch&& launch) {
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cudaLaunchAttribute pdl_attr{};
  pdl_attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl_attr.val.programmaticStreamSerializationAllowed = 1;
  const cudaLaunchConfig_t pdl_cfg{dim3(1), dim3(32), 0, s, &pdl_attr, 1};
  cudaGraph_t g;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  for (int l = 0; l < launches; ++l) launch(l, s, pdl ? &pdl_cfg : nullptr);
  check(cudaStreamEndCapture(s, &g), "end capture");
  cudaGraphExec_t exec;
  check(cudaGraphInstantiate(&exec, g, 0), "instantiate");
  const double t = median_replay_s(exec, s, 200) / launches;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return t;
}

/// Per-launch time of an empty kernel, `launches` launches in one graph (a model's layers); with
/// `pdl`, the PDL twin launched with programmatic stream serialization. Measured once per process.
inline double empty_launch_s(bool pdl, int launches = 60) {
  auto measure = [launches](bool with_pdl) {
    return one_warp_launches_s(
        with_pdl, launches, [](int, cudaStream_t s, const cudaLaunchConfig_t* pdl_cfg) {
          if (pdl_cfg != nullptr) {
            check(cudaLaunchKernelEx(pdl_cfg, empty_pdl_kernel), "empty pdl launch");
          } else {
            empty_kernel<<<1, 32, 0, s>>>();
          }
        });
  };
  static const double plain = measure(false);
  static const double with_pdl = measure(true);
  return pdl ? with_pdl : plain;
}

/// The floor of any slot-mapped write: one warp loads 32 slots (int64) and 32 bf16 values, then
/// stores each value at its slot of the layer's cache. slots: [32], values: [32], cache: [layers]
/// blocks of kSlotStoreSpan 16-bit words, one a launch. The PDL twin waits before its first read
/// and triggers its dependents at once, as the fused write does at small sizes.
constexpr std::int64_t kSlotStoreSpan = std::int64_t{1} << 22;
template <bool kPdl>
__global__ void slot_store_kernel(const std::int64_t* slots, const std::uint16_t* values,
                                  std::uint16_t* cache) {
  if constexpr (kPdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
  }
  cache[slots[threadIdx.x]] = values[threadIdx.x];
}

/// Per-launch time of slot_store_kernel, `launches` launches in one graph, each into a cache of
/// its own (as a model's layers), measured once per process: what a kernel that does nothing but
/// the slot mapping's dependent load and one store costs over an empty launch.
inline double slot_store_launch_s(bool pdl, int launches = 60) {
  auto measure = [launches](bool with_pdl) {
    std::int64_t* slots = nullptr;
    std::uint16_t* values = nullptr;
    std::uint16_t* cache = nullptr;
    check(cudaMalloc(&slots, 32 * sizeof(std::int64_t)), "cudaMalloc(slots)");
    check(cudaMalloc(&values, 32 * sizeof(std::uint16_t)), "cudaMalloc(values)");
    check(cudaMalloc(&cache, launches * kSlotStoreSpan * sizeof(std::uint16_t)),
          "cudaMalloc(cache)");
    std::vector<std::int64_t> host_slots(32);
    for (int i = 0; i < 32; ++i) host_slots[i] = (i * 2654435761LL) % kSlotStoreSpan;
    check(cudaMemcpy(slots, host_slots.data(), 32 * sizeof(std::int64_t), cudaMemcpyHostToDevice),
          "upload slots");
    check(cudaMemset(values, 0x3f, 32 * sizeof(std::uint16_t)), "values");
    const std::int64_t* slots_in = slots;
    const std::uint16_t* values_in = values;
    const double t = one_warp_launches_s(
        with_pdl, launches, [&](int l, cudaStream_t s, const cudaLaunchConfig_t* pdl_cfg) {
          std::uint16_t* layer = cache + l * kSlotStoreSpan;
          if (pdl_cfg != nullptr) {
            check(cudaLaunchKernelEx(pdl_cfg, slot_store_kernel<true>, slots_in, values_in, layer),
                  "slot store pdl launch");
          } else {
            slot_store_kernel<false><<<1, 32, 0, s>>>(slots_in, values_in, layer);
          }
        });
    cudaFree(slots);
    cudaFree(values);
    cudaFree(cache);
    return t;
  };
  static const double plain = measure(false);
  static const double with_pdl = measure(true);
  return pdl ? with_pdl : plain;
}

/// Device-to-device copy bandwidth (bytes read + written per second) over 2 GiB: the better of
/// cudaMemcpyAsync and a streaming copy kernel, each the median of 20 graph replays.
struct CopyBandwidth {
  double memcpy_bps = 0, kernel_bps = 0;
  double best() const { return std::max(memcpy_bps, kernel_bps); }
};
inline const CopyBandwidth& copy_bandwidth() {
  static const CopyBandwidth value = [] {
    const std::size_t n = std::size_t{2} << 30;
    void *src, *dst;
    check(cudaMalloc(&src, n), "cudaMalloc(copy src)");
    check(cudaMalloc(&dst, n), "cudaMalloc(copy dst)");
    check(cudaMemset(src, 0x5A, n), "memset");
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    CopyBandwidth bw;
    for (int kernel = 0; kernel < 2; ++kernel) {
      cudaGraph_t g;
      check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
      if (kernel) {
        copy_kernel<<<132 * 8, 256, 0, s>>>(static_cast<const uint4*>(src),
                                            static_cast<uint4*>(dst),
                                            static_cast<std::int64_t>(n / 16));
      } else {
        check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s), "copy");
      }
      check(cudaStreamEndCapture(s, &g), "end capture");
      cudaGraphExec_t exec;
      check(cudaGraphInstantiate(&exec, g, 0), "instantiate");
      const double t = median_replay_s(exec, s, 20);
      (kernel ? bw.kernel_bps : bw.memcpy_bps) = 2.0 * static_cast<double>(n) / t;
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(g);
    }
    cudaStreamDestroy(s);
    cudaFree(src);
    cudaFree(dst);
    return bw;
  }();
  return value;
}

/// Captures `body(stream)` into a graph once; run() replays it and median_s() times it.
class CapturedGraph {
 public:
  template <class Body>
  explicit CapturedGraph(Body body) {
    check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "stream");
    cudaGraph_t g;
    check(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal), "capture");
    body(s_);
    check(cudaStreamEndCapture(s_, &g), "end capture");
    check(cudaGraphInstantiate(&exec_, g, 0), "instantiate");
    cudaGraphDestroy(g);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    cudaGraphExecDestroy(exec_);
    cudaStreamDestroy(s_);
  }
  void run() {
    check(cudaGraphLaunch(exec_, s_), "graph launch");
    check(cudaStreamSynchronize(s_), "graph sync");
  }
  double median_s(int reps) { return median_replay_s(exec_, s_, reps); }

 private:
  cudaStream_t s_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace kvo::bench
