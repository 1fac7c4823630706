#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace kvo::gpu {

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why != nullptr) *why = cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && why != nullptr) *why = "no CUDA device";
  return n;
}

std::string cuda_device_description() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return {};
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major * 10 + prop.minor) + ")";
}

std::int64_t cuda_device_memory_bytes() {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess)
    return 0;
  return static_cast<std::int64_t>(prop.totalGlobalMem);
}

bool cuda_set_host_wait(int policy) {
  // Indexed by HostWait (device.hpp).
  static constexpr unsigned kFlags[] = {cudaDeviceScheduleAuto, cudaDeviceScheduleSpin,
                                        cudaDeviceScheduleYield, cudaDeviceScheduleBlockingSync};
  if (cudaSetDeviceFlags(kFlags[policy]) == cudaSuccess) return true;
  (void)cudaGetLastError();
  return false;
}

}  // namespace kvo::gpu
