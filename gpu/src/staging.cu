// Pooled device memory and the call stream every host path shares (staging.cuh).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "kvo/gpu/memory_pool.hpp"
#include "kvo/spec/outcome.hpp"
#include "launch.cuh"
#include "staging.cuh"

namespace kvo::gpu::detail {
namespace {

/// Blocks up to 1 GiB are pooled in power-of-two sizes (at least 256 bytes); larger ones are
/// allocated to the next 2 MiB and given back when freed, except under KeepLargeBlocks (a
/// resident campaign's huge caches come one case at a time, each a few GiB: cudaMalloc and
/// cudaFree of that size cost more than the case), where the last `large_kept` are kept and the
/// smallest that holds a request serves it. A large request none can hold frees them first. None
/// outside that scope: the test shards share the device, and a large block kept idle by one ran
/// another out of memory (sessions 22 and 40). The pool keeps at most kMaxCached bytes of small
/// blocks. An allocation that does not fit waits for other processes (device_memory_wait_s), then
/// is spec::DeviceMemoryShort: the case is skipped, not failed.
constexpr std::size_t kPooledMax = std::size_t{1} << 30;
constexpr std::size_t kMaxCached = std::size_t{4} << 30;

double gib(std::size_t bytes) { return static_cast<double>(bytes) / static_cast<double>(1u << 30); }

/// How long an allocation that does not fit waits for other processes to free device memory
/// (KVO_DEVICE_MEMORY_WAIT_S, seconds; default 120): test shards and users' parallel runs share
/// one device, and a case of gigabytes fits once another process's case ends.
double device_memory_wait_s() {
  static const double seconds = [] {
    const char* v = std::getenv("KVO_DEVICE_MEMORY_WAIT_S");
    if (v == nullptr || *v == '\0') return 120.0;
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(s >= 0.0)) {
      throw spec::InvalidInput("KVO_DEVICE_MEMORY_WAIT_S", -1, v, "expected seconds >= 0");
    }
    return s;
  }();
  return seconds;
}

std::size_t block_size_for(std::size_t bytes) {
  if (bytes <= kPooledMax) return std::max<std::size_t>(256, std::bit_ceil(bytes));
  constexpr std::size_t kGranule = std::size_t{2} << 20;
  return (bytes + kGranule - 1) / kGranule * kGranule;
}

}  // namespace

std::size_t pool_block_bytes(std::size_t bytes) { return block_size_for(bytes); }

namespace {

class Pool {
 public:
  ~Pool() {
    for (const auto& [size, p] : free_) cudaFree(p);
    trim_large(0);
  }
  /// A block of at least `block` bytes; `block` becomes the size handed out.
  void* acquire(std::size_t& block) {
    if (block > kPooledMax) {
      ++use_.requests;
      auto best = large_.end();
      for (auto it = large_.begin(); it != large_.end(); ++it) {
        const bool fits = it->first >= block && (scoped_ || it->first - block <= block / 4);
        if (fits && (best == large_.end() || it->first < best->first)) best = it;
      }
      if (best != large_.end()) {
        void* p = best->second;
        block = best->first;
        large_.erase(best);
        ++use_.reused;
        return held(p, block);
      }
      trim_large(0);
    }
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->first == block) {
        void* p = it->second;
        cached_ -= block;
        free_.erase(it);
        return p;
      }
    }
    void* p = nullptr;
    if (cudaMalloc(&p, block) == cudaSuccess) return held(p, block);
    // Give the cached blocks back and try again; then, while other processes (test shards, users'
    // parallel runs) hold the memory, wait for them to free it; then report the case skipped, not
    // failed (spec::DeviceMemoryShort).
    (void)cudaGetLastError();
    release_idle();
    const auto start = std::chrono::steady_clock::now();
    for (int attempt = 0;; ++attempt) {
      const cudaError_t err = cudaMalloc(&p, block);
      if (err == cudaSuccess) return held(p, block);
      if (err != cudaErrorMemoryAllocation) check_cuda(err, "cudaMalloc");
      (void)cudaGetLastError();
      std::size_t free_bytes = 0, total_bytes = 0;
      (void)cudaMemGetInfo(&free_bytes, &total_bytes);
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      // A thread that holds a large block does not wait: two processes each holding gigabytes
      // and waiting for the other's would wait out the limit together (hold and wait). It gives
      // up at once, its case skipped and its blocks freed as the case unwinds.
      if (block > total_bytes || live_large_ > 0 || waited >= device_memory_wait_s()) {
        char text[200];
        std::snprintf(text, sizeof text,
                      "needs %.2f GiB of device memory, %.2f GiB free of %.2f GiB (waited %.0f s "
                      "for other processes to free it)",
                      gib(block), gib(free_bytes), gib(total_bytes), waited);
        throw spec::DeviceMemoryShort(text);
      }
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::min(200, 10 << std::min(attempt, 4))));
    }
  }
  void release(void* p, std::size_t block) {
    if (block > kPooledMax) {
      live_large_ -= block;
      large_.insert(large_.begin(), {block, p});  // newest first
      trim_large(large_kept_);
      return;
    }
    if (cached_ + block > kMaxCached) {
      cudaFree(p);
      return;
    }
    free_.emplace_back(block, p);
    cached_ += block;
  }
  /// Frees every idle block.
  void release_idle() {
    for (const auto& [size, p] : free_) cudaFree(p);
    free_.clear();
    cached_ = 0;
    trim_large(0);
  }
  std::size_t large_kept() const { return large_kept_; }
  std::size_t idle_bytes() const {
    std::size_t n = cached_;
    for (const auto& [size, p] : large_) n += size;
    return n;
  }
  bool scoped() const { return scoped_; }
  const LargeBlockUse& use() const { return use_; }
  /// Keeps at most `n` freed large blocks from now on (the oldest freed first); `scoped`: any kept
  /// block that holds a request serves it (KeepLargeBlocks).
  void keep_large(std::size_t n, bool scoped) {
    large_kept_ = n;
    scoped_ = scoped;
    trim_large(n);
  }

 private:
  /// `p` handed out: a large block counted as held until it is released.
  void* held(void* p, std::size_t block) {
    if (block > kPooledMax) live_large_ += block;
    return p;
  }
  /// Frees the kept large blocks past the newest `n`.
  void trim_large(std::size_t n) {
    while (large_.size() > n) {
      cudaFree(large_.back().second);
      large_.pop_back();
    }
  }

  std::vector<std::pair<std::size_t, void*>> free_;
  std::size_t cached_ = 0;
  std::size_t live_large_ = 0;  ///< bytes of large blocks handed out and not yet released
  std::vector<std::pair<std::size_t, void*>> large_;  ///< freed large blocks, newest first
  // Outside KeepLargeBlocks no large block is kept: a process idle between huge cases must not
  // hold gigabytes another process's case needs (eight test shards on an 80 GB card).
  std::size_t large_kept_ = 0;
  bool scoped_ = false;
  LargeBlockUse use_;
};

Pool& pool() {
  thread_local Pool p;
  return p;
}

}  // namespace

std::size_t pool_idle_bytes() { return pool().idle_bytes(); }

}  // namespace kvo::gpu::detail

namespace kvo::gpu {

void release_idle_blocks() { detail::pool().release_idle(); }

// Nested scopes: the outer one's count and rule come back when the inner one ends.
KeepLargeBlocks::KeepLargeBlocks(std::size_t blocks)
    : before_(detail::pool().large_kept()),
      before_scoped_(detail::pool().scoped()),
      at_start_(detail::pool().use()) {
  detail::pool().keep_large(std::max(before_, blocks), true);
}
KeepLargeBlocks::~KeepLargeBlocks() { detail::pool().keep_large(before_, before_scoped_); }
LargeBlockUse KeepLargeBlocks::use() const {
  const LargeBlockUse now = detail::pool().use();
  return {now.requests - at_start_.requests, now.reused - at_start_.reused};
}

}  // namespace kvo::gpu

namespace kvo::gpu::detail {

DeviceBuffer::DeviceBuffer(std::size_t bytes) : size_(bytes) {
  // Even an empty buffer gets a block: a present pointer that is never dereferenced.
  capacity_ = block_size_for(bytes);
  data_ = static_cast<std::uint8_t*>(pool().acquire(capacity_));
}

DeviceBuffer::DeviceBuffer(const void* src, std::size_t bytes) : DeviceBuffer(bytes) {
  if (src != nullptr && bytes > 0) {
    check_cuda(cudaMemcpy(data_, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy(to device)");
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) pool().release(data_, capacity_);
}

void DeviceBuffer::fill(std::uint8_t byte) const {
  if (size_ > 0) check_cuda(cudaMemset(data_, byte, size_), "cudaMemset");
}

void DeviceBuffer::download(void* dst, std::size_t bytes) const {
  if (bytes > 0) {
    check_cuda(cudaMemcpy(dst, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(to host)");
  }
}

DeviceTensor upload_values(std::vector<DeviceBuffer>& keep, const void* values, ElementType type,
                           std::vector<std::int64_t> shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  keep.emplace_back(values, static_cast<std::size_t>(n) * element_bytes(type));
  return contiguous_tensor(keep.back().data(), type, std::move(shape));
}

DeviceTensor upload_tensor(std::vector<DeviceBuffer>& keep, const spec::HostTensor& t) {
  return upload_values(keep, t.bytes.data(), element_type_of(t.dtype), t.shape);
}

DeviceTensor poisoned_tensor(std::vector<DeviceBuffer>& keep, ElementType type,
                             std::vector<std::int64_t> shape, std::uint8_t poison) {
  DeviceTensor t = upload_values(keep, nullptr, type, std::move(shape));
  keep.back().fill(poison);
  return t;
}

cudaStream_t call_stream() {
  struct Stream {
    cudaStream_t s = nullptr;
    Stream() { check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream"); }
    ~Stream() { cudaStreamDestroy(s); }
  };
  thread_local Stream stream;
  return stream.s;
}

}  // namespace kvo::gpu::detail
