#pragma once
/// \file device_subject.hpp
/// A user's CUDA kernels as a subject: one function per op that receives the case in device memory
/// (kvo/gpu/device_calls.hpp: every tensor a DeviceTensor with shape and strides, the caches with
/// their guard bands, a stream) and launches the kernel. The oracle stages each case on the device,
/// calls the function, waits, brings the caches and outputs back and judges them as it judges every
/// other subject (campaign, shrinking, explain, mode detection, testing::passes).
///
///     kvo::oracle::DeviceSubjectFunctions f;
///     f.write = [](const kvo::gpu::DeviceWriteCall& call) {
///       my_launch(call.k.as<const __nv_bfloat16>(), ..., static_cast<cudaStream_t>(call.stream));
///     };
///     EXPECT_TRUE(kvo::oracle::testing::passes(
///         kvo::oracle::make_device_subject("my-cuda-write", f), options));
///
/// The subject is unavailable (skipped, never a pass) where no CUDA device answers; its functions
/// throw spec::Unsupported for a configuration the kernel does not implement.

#include <memory>
#include <string>

#include "kvo/gpu/device_calls.hpp"
#include "kvo/oracle/subject.hpp"

namespace kvo::oracle {

struct DeviceSubjectFunctions {
  gpu::DeviceWriteFunction write;
  gpu::DeviceDenseFunction dense;
  gpu::DeviceIndexerFunction indexer;
  gpu::DeviceAttentionFunction attention;
  spec::Ordering ordering = spec::Ordering::kCanonical;
  TopkForm topk_form;
  spec::AttentionProfile attention_profile = spec::AttentionProfile::kFp32;
  /// The functions keep no state between calls and launch only on the call's stream: a resident
  /// campaign may then call them from several host threads at once (Subject::device_concurrent,
  /// CheckOptions::device_lanes). Off unless the kernel's author says so.
  bool device_concurrent = false;
};

/// The ops it implements are the functions given.
std::unique_ptr<Subject> make_device_subject(std::string name, DeviceSubjectFunctions functions);

/// The same functions called in host memory (kvo/gpu/device_calls.hpp's run_host_*): the calls have
/// the same tensors, shapes and strides, each a host pointer, and no stream. For implementations on
/// the CPU, and for the Python package's NumPy functions. Always available.
std::unique_ptr<Subject> make_host_call_subject(std::string name, DeviceSubjectFunctions functions);

/// Empty when a CUDA device answers here, else why not ("no CUDA device answers (...)").
std::string device_unavailable_reason();

}  // namespace kvo::oracle
