#pragma once
/// \file device.hpp
/// Whether CUDA subjects can run here: built with CUDA, and a device answers.

#include <string>

namespace kvo::gpu {

/// True when this build contains the CUDA subjects.
bool built_with_cuda();

/// Number of CUDA devices that answer (0 without CUDA or without a GPU); `why` says why none.
int device_count(std::string* why = nullptr);

/// Name and compute capability of device 0, e.g. "NVIDIA H200 (sm_90)"; empty when none.
std::string device_description();

}  // namespace kvo::gpu
