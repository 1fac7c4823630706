#pragma once
/// \file memory_pool.hpp
/// How long the device memory pool of kvoracle's host paths (each host thread's: pooled blocks up
/// to 1 GiB; larger ones given back when freed, unless a KeepLargeBlocks lives) keeps what it was
/// given back. An allocation that does not fit waits for other processes to free device memory
/// (KVO_DEVICE_MEMORY_WAIT_S, default 120 s; at once, without waiting, where the thread holds a
/// block past 1 GiB itself), then throws spec::DeviceMemoryShort: the case is
/// reported skipped ("needs N GiB, M GiB free"), never as the subject's failure. No CUDA types.

#include <cstddef>
#include <cstdint>

namespace kvo::gpu {

/// Large requests (past 1 GiB) of a thread's pool while a KeepLargeBlocks lived on it: how many,
/// and how many a kept block served (no cudaMalloc, no cudaFree).
struct LargeBlockUse {
  std::int64_t requests = 0;
  std::int64_t reused = 0;
};

/// Frees every block the calling thread's pool holds idle (cached small blocks, kept large ones):
/// before a host path that needs the device's memory answers a case the resident path could not
/// fit (another thread's pool would otherwise find it held). Built without CUDA: does nothing.
void release_idle_blocks();

/// While one lives on a host thread, that thread's device memory pool keeps up to `blocks` freed
/// allocations past 1 GiB and serves a large request from the smallest kept block that holds it,
/// however much larger, instead of keeping the last one for requests within a quarter of it: a
/// resident campaign's huge-cache case allocates a copy of its caches per writer or reader,
/// 4-12 GB each and different case to case, and cudaMalloc and cudaFree of that size cost more
/// than the case. A large request none of them can hold frees them all first, so that the thread
/// never holds more than the largest case it ran; when the last one ends, the pool keeps one again.
/// Built without CUDA: does nothing.
class KeepLargeBlocks {
 public:
  explicit KeepLargeBlocks(std::size_t blocks);
  ~KeepLargeBlocks();
  KeepLargeBlocks(const KeepLargeBlocks&) = delete;
  KeepLargeBlocks& operator=(const KeepLargeBlocks&) = delete;

  /// The large requests since this one began (on its thread).
  LargeBlockUse use() const;

 private:
  std::size_t before_;          ///< the blocks kept before this scope
  bool before_scoped_ = false;  ///< the rule before it (a nested scope)
  LargeBlockUse at_start_;
};

}  // namespace kvo::gpu
