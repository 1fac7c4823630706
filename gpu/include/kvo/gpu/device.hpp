#pragma once
/// \file device.hpp
/// Whether CUDA subjects can run here: built with CUDA, and a device answers.

#include <cstdint>
#include <string>

namespace kvo::gpu {

/// True when this build contains the CUDA subjects.
bool built_with_cuda();

/// Number of CUDA devices that answer (0 without CUDA or without a GPU); `why` says why none.
int device_count(std::string* why = nullptr);

/// Name and compute capability of device 0, e.g. "NVIDIA H200 (sm_90)"; empty when none.
std::string device_description();

/// The memory of the calling thread's current device in bytes (cudaDeviceProp::totalGlobalMem);
/// 0 without CUDA or without a device. A campaign sizes its largest resident cases by it.
std::int64_t device_memory_bytes();

/// How host threads wait for the device (cudaSetDeviceFlags' scheduling policy). kAuto: CUDA's
/// choice (spin while the process has fewer contexts than cores); kSpin: spin on a core; kYield:
/// spin, yielding the core to any thread ready to run; kBlock: sleep until woken.
enum class HostWait { kAuto, kSpin, kYield, kBlock };
/// Sets it for the calling thread's current device, for every host thread of the process; false
/// where CUDA refused or there is no device. Several device lanes spinning in their waits leave
/// the CPU's other threads (the workers drawing cases and answering the sampled ones) fewer cores.
bool set_host_wait(HostWait wait);

}  // namespace kvo::gpu
