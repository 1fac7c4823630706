#pragma once
/// \file memory_pool.hpp
/// How long the device memory pool of kvoracle's host paths (each host thread's: pooled blocks up
/// to 1 GiB, the last larger block freed) keeps what it was given back. No CUDA types.

#include <cstddef>

namespace kvo::gpu {

/// While one lives on a host thread, that thread's device memory pool keeps up to `blocks` freed
/// allocations past 1 GiB for the next requests they can hold (at most a quarter to spare) instead
/// of the last one: a resident campaign's huge-cache case allocates a copy of its caches per writer
/// or reader, several GB each, and cudaMalloc and cudaFree of that size cost more than the case. A
/// large request none of them can hold frees them all first, so that the thread never holds more
/// than the largest case it ran; when the last one ends, the pool keeps one again. Built without
/// CUDA: does nothing.
class KeepLargeBlocks {
 public:
  explicit KeepLargeBlocks(std::size_t blocks);
  ~KeepLargeBlocks();
  KeepLargeBlocks(const KeepLargeBlocks&) = delete;
  KeepLargeBlocks& operator=(const KeepLargeBlocks&) = delete;

 private:
  std::size_t before_;
};

}  // namespace kvo::gpu
