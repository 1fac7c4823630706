#pragma once
/// \file cuda_subjects.hpp
/// The CUDA subjects (built with CUDA only: cuda_subjects.cpp), and the same kernels with a planted
/// bug (kvo_gpu_testing, kvo/gpu/testing/faults.hpp) for the mutation catalogue. The fault enums
/// are declared opaquely here, so that this header compiles without CUDA too.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "kvo/oracle/subject.hpp"

namespace kvo::gpu::testing {
enum class WriteFault : std::uint8_t;  // defined in kvo/gpu/testing/faults.hpp
enum class ReadFault : std::uint8_t;   // defined in kvo/gpu/testing/faults.hpp
enum class DenseFault : std::uint8_t;  // defined in kvo/gpu/testing/faults.hpp
}  // namespace kvo::gpu::testing

namespace kvo::oracle {

/// The fast indexer in the engines' declared forms (SPEC 5), indexer only: cuda-fast-head-major
/// (vLLM's Triton M3 indexer: descending score, head-major [H, T, K]) and cuda-fast-keys16 (ranked
/// by 16-bit score keys, as MSA's msa_v1 top-k).
inline const std::array<std::pair<const char*, TopkForm>, 2> kCudaFastIndexerForms{{
    {"cuda-fast-head-major", {spec::TopkOrder::kDescendingScore, spec::TopkLayout::kHeadMajor}},
    {"cuda-fast-keys16", {spec::TopkOrder::kDescendingScore, spec::TopkLayout::kTokenMajor, 16}},
}};

/// cuda-fused, cuda-unfused, cuda-fused-generic, cuda-dense-qknorm-rope, cuda-dense-engine,
/// cuda-canonical, cuda-canonical-generic, cuda-fast, cuda-fast-head-major, cuda-fast-keys16,
/// cuda-flash-bf16: every one skipped with its reason where no CUDA device answers.
SubjectList make_cuda_subjects();

/// cuda-fast-head-major's kernel declaring token-major rows (vllm#48604's class): the mutant.
std::unique_ptr<Subject> make_cuda_head_major_as_token_major_subject(const std::string& name);

/// cuda-fused with `fault` planted in its kernel.
std::unique_ptr<Subject> make_cuda_fault_subject(const std::string& name,
                                                 gpu::testing::WriteFault fault);

/// cuda-fused in div_approx mode with every K/V code moved one code beyond its admissible set
/// (WriteFault::kDivApproxOneCodeBeyond): the admissible sets must be exactly as wide as SPEC 2.
std::unique_ptr<Subject> make_cuda_div_approx_beyond_subject(const std::string& name);

/// cuda-fused writing e4m3 codes into an fp8_e5m2 cache (WriteFault::kE4m3IntoE5m2, vLLM's
/// Triton wrapper bug); needs cases with an e5m2 cache.
std::unique_ptr<Subject> make_cuda_e4m3_into_e5m2_subject(const std::string& name);

/// cuda-fused decoding padding slot -1 as page 0, offset -1 (WriteFault::kTruncDivNegativeSlot,
/// Triton's truncating // and %): one token row lands before page 0; needs padding in the case.
std::unique_ptr<Subject> make_cuda_trunc_div_negative_slot_subject(const std::string& name);

/// cuda-dense-engine (`engine`, foreign) or cuda-dense-qknorm-rope with `fault` planted.
std::unique_ptr<Subject> make_cuda_dense_fault_subject(const std::string& name,
                                                       gpu::testing::DenseFault fault, bool engine);

/// cuda-fast (indexer and attention) with `fault` planted in the fast family, or cuda-canonical
/// (judged bit for bit) with `canonical` and a selection fault (ReadFault::kTiesToHigherId).
std::unique_ptr<Subject> make_cuda_read_fault_subject(const std::string& name,
                                                      gpu::testing::ReadFault fault,
                                                      bool canonical = false);

/// cuda-flash-bf16 (attention, foreign, profile bf16_p) with a kFlash `fault` planted.
std::unique_ptr<Subject> make_cuda_flash_fault_subject(const std::string& name,
                                                       gpu::testing::ReadFault fault);

}  // namespace kvo::oracle
