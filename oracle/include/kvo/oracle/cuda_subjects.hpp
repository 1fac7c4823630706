#pragma once
/// \file cuda_subjects.hpp
/// The CUDA subjects (built with CUDA only: cuda_subjects.cpp), and the same kernels with a planted
/// bug (kvo_gpu_testing, kvo/gpu/testing/faults.hpp) for the mutation catalogue. The fault enums
/// are declared opaquely here, so that this header compiles without CUDA too.

#include <cstdint>
#include <memory>
#include <string>

#include "kvo/oracle/subject.hpp"

namespace kvo::gpu::testing {
enum class WriteFault : std::uint8_t;  // defined in kvo/gpu/testing/faults.hpp
enum class ReadFault : std::uint8_t;   // defined in kvo/gpu/testing/faults.hpp
}  // namespace kvo::gpu::testing

namespace kvo::oracle {

/// cuda-fused, cuda-unfused, cuda-dense-qknorm-rope, cuda-canonical, cuda-fast: every one skipped
/// with its reason where no CUDA device answers.
SubjectList make_cuda_subjects();

/// cuda-fused with `fault` planted in its kernel.
std::unique_ptr<Subject> make_cuda_fault_subject(const std::string& name,
                                                 gpu::testing::WriteFault fault);

/// cuda-fast (indexer and attention) with `fault` planted in the fast family.
std::unique_ptr<Subject> make_cuda_read_fault_subject(const std::string& name,
                                                      gpu::testing::ReadFault fault);

}  // namespace kvo::oracle
