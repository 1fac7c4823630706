#pragma once
/// \file staging.cuh
/// What every host path of kvo_gpu shares to move a case to the device and back: pooled device
/// memory and the per-thread stream of a call (the host checks and query rows they share with
/// host-memory calls: call_inputs.hpp).
/// The built-in kernels' host paths (write_host.cu, dense_insert.cu, read_host.cu) and users'
/// device calls (device_calls.cu) use these; the guarded caches travel in a DeviceCacheMirror
/// (kvo/gpu/device_caches.hpp, device_caches.cu).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "call_inputs.hpp"
#include "kvo/gpu/device_caches.hpp"
#include "kvo/spec/read.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::gpu::detail {

/// Device memory from a per-thread pool of power-of-two blocks (the oracle runs thousands of small
/// cases; a cudaMalloc/cudaFree pair per buffer would dominate them). Move-only; the block returns
/// to the pool on destruction. Every constructed buffer has device memory, an empty one too (a
/// present pointer, never dereferenced). Allocation failure is spec::FailedToRun.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;  ///< no memory (a moved-from or not yet assigned buffer)
  explicit DeviceBuffer(std::size_t bytes);
  /// `bytes` bytes uploaded from host `src` (nothing copied when src is null).
  DeviceBuffer(const void* src, std::size_t bytes);
  template <class T>
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.data(), v.size() * sizeof(T)) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    swap(o);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }
  /// Sets every byte to `byte` (cudaMemset: ordered on the legacy default stream, asynchronous to
  /// the host and to non-blocking streams).
  void fill(std::uint8_t byte) const;
  /// Copies the first `bytes` bytes to host `dst`.
  void download(void* dst, std::size_t bytes) const;

 private:
  void swap(DeviceBuffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(capacity_, o.capacity_);
  }
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;  ///< the pool block's size
};

/// The bytes the pool hands out for a request of `bytes` (its block).
std::size_t pool_block_bytes(std::size_t bytes);
/// The device bytes this host thread's pool holds idle (small blocks cached, large ones kept by
/// KeepLargeBlocks): to the driver they are in use, to this thread free, since a request the pool
/// cannot serve from them gives them back before it allocates.
std::size_t pool_idle_bytes();

/// A contiguous device tensor uploaded from a host one, kept alive by `keep`.
DeviceTensor upload_tensor(std::vector<DeviceBuffer>& keep, const spec::HostTensor& t);
/// A contiguous device tensor of `type` and `shape` uploaded from `values` (numel elements).
DeviceTensor upload_values(std::vector<DeviceBuffer>& keep, const void* values, ElementType type,
                           std::vector<std::int64_t> shape);
/// A contiguous device tensor of `type` and `shape`, every byte `poison`.
DeviceTensor poisoned_tensor(std::vector<DeviceBuffer>& keep, ElementType type,
                             std::vector<std::int64_t> shape, std::uint8_t poison);

/// The stream a call runs on: one non-blocking stream per host thread.
cudaStream_t call_stream();

}  // namespace kvo::gpu::detail
