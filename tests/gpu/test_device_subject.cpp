// Device subjects (kvo/oracle/device_subject.hpp, kvo/gpu/device_calls.hpp): kvoracle's own CUDA
// kernels, called through their device-pointer launchers exactly as a user's kernel would be (from
// the DeviceTensors of each call), pass the default campaign of every op; and what a user's kernel
// can get wrong is reported, never passed: a changed cache byte (mismatch with its coordinates), a
// write outside every guard band (a mismatch, naming the offset), an output never written
// (poisoned: mismatch), a read that changes its caches, a function that throws (failed to run) or
// does not implement the configuration (unsupported). Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/device_calls.hpp"
#include "kvo/gpu/read.hpp"
#include "kvo/gpu/write.hpp"
#include "kvo/oracle/device_subject.hpp"
#include "kvo/oracle/testing.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo {
namespace {

using oracle::testing::passes;

#define SKIP_WITHOUT_GPU()                                                       \
  do {                                                                           \
    std::string why;                                                             \
    if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (0)

void cuda(cudaError_t e) {
  if (e != cudaSuccess) throw std::runtime_error(cudaGetErrorString(e));
}

/// The fused write kernel, fed from the call's tensors (the production adapter).
const gpu::DeviceWriteFunction builtin_write = gpu::device_write_function(gpu::WritePath::kFused);

/// kvoracle's canonical read kernels as device functions (kvo/gpu/read.hpp), fed from the call's
/// tensors as a user's kernel is.
const gpu::DeviceIndexerFunction builtin_indexer =
    gpu::device_indexer_function(gpu::ReadKernel::kCanonical);
const gpu::DeviceAttentionFunction builtin_attention =
    gpu::device_attention_function(gpu::ReadKernel::kCanonical);

oracle::CheckOptions options(std::vector<spec::Op> ops, std::int64_t cases) {
  oracle::CheckOptions o;
  o.seed = 0xDE71CE;
  o.cases = cases;
  o.ops = std::move(ops);
  return o;
}

TEST(DeviceSubject, BuiltinKernelsPassThroughTheDeviceApi) {
  SKIP_WITHOUT_GPU();
  oracle::DeviceSubjectFunctions f;
  f.write = builtin_write;
  f.dense = gpu::launch_dense_insert;
  f.indexer = builtin_indexer;
  f.attention = builtin_attention;
  const ::testing::AssertionResult r =
      passes(oracle::make_device_subject("device-builtin", f), options(oracle::all_ops(), 300));
  EXPECT_TRUE(r);
  // The summary's rows, for gpu/run_on_device.sh's table.
  std::istringstream lines(r.message());
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("device-builtin", 0) == 0)
      std::printf("[gpu-device-subject] %s\n", line.c_str());
  }
}

TEST(DeviceSubject, ChangedCacheByteIsAMismatchWithCoordinates) {
  SKIP_WITHOUT_GPU();
  oracle::DeviceSubjectFunctions f;
  f.write = [](const gpu::DeviceWriteCall& call) {
    builtin_write(call);
    // The planted bug: the last byte of the K (or KV) body changes.
    const std::int64_t bytes =
        call.caches.k_cache.numel() *
        static_cast<std::int64_t>(gpu::element_bytes(call.caches.k_cache.type));
    cuda(cudaMemsetAsync(call.caches.k_cache.as<std::uint8_t>() + bytes - 1, 0x42, 1,
                         static_cast<cudaStream_t>(call.stream)));
  };
  const ::testing::AssertionResult r =
      passes(oracle::make_device_subject("device-stray-byte", f), options({spec::Op::kWrite}, 50));
  ASSERT_FALSE(r);
  const std::string m = r.message();
  EXPECT_NE(m.find("result: mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find("first: layer "), std::string::npos) << m;
}

TEST(DeviceSubject, WriteOutsideEveryGuardBandIsAMismatchWithItsLocation) {
  SKIP_WITHOUT_GPU();
  oracle::DeviceSubjectFunctions f;
  f.write = [](const gpu::DeviceWriteCall& call) {
    // One byte before the first buffer's guard band: in the mirror's margin.
    cuda(cudaMemsetAsync(call.caches.k_cache.as<std::uint8_t>() - spec::kGuardBytes - 1, 0x42, 1,
                         static_cast<cudaStream_t>(call.stream)));
  };
  const ::testing::AssertionResult r =
      passes(oracle::make_device_subject("device-margin", f), options({spec::Op::kWrite}, 5));
  ASSERT_FALSE(r);
  const std::string m = r.message();
  EXPECT_NE(m.find("wrote outside every cache buffer and its guard bands: "), std::string::npos)
      << m;
  EXPECT_NE(m.find(" body byte -"), std::string::npos) << m;  // before the first buffer's body
  // A wrong answer, not the subject's failure to run: counted and classed as a mismatch.
  EXPECT_NE(m.find("result: mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find("  mismatch: wrote outside every cache buffer and its guard bands (first: "),
            std::string::npos)
      << m;
}

TEST(DeviceSubject, UnwrittenOutputsAreMismatches) {
  SKIP_WITHOUT_GPU();
  oracle::DeviceSubjectFunctions f;
  f.indexer = [](const gpu::DeviceIndexerCall&) {};
  f.attention = [](const gpu::DeviceAttentionCall&) {};
  for (const spec::Op op : {spec::Op::kIndexer, spec::Op::kAttention}) {
    const ::testing::AssertionResult r =
        passes(oracle::make_device_subject("device-lazy", f), options({op}, 20));
    ASSERT_FALSE(r);
    EXPECT_NE(std::string(r.message()).find("result: mismatch"), std::string::npos) << r.message();
  }
}

TEST(DeviceSubject, ReadThatChangesItsCachesFailsToRun) {
  SKIP_WITHOUT_GPU();
  oracle::DeviceSubjectFunctions f;
  f.attention = [](const gpu::DeviceAttentionCall& call) {
    builtin_attention(call);
    cuda(
        cudaMemsetAsync(call.caches.k_cache.data, 0x42, 1, static_cast<cudaStream_t>(call.stream)));
  };
  const ::testing::AssertionResult r = passes(oracle::make_device_subject("device-read-writes", f),
                                              options({spec::Op::kAttention}, 5));
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("a read changed its caches"), std::string::npos)
      << r.message();
}

TEST(DeviceSubject, ThrowingAndUnsupportedFunctionsAreNeverPasses) {
  SKIP_WITHOUT_GPU();
  oracle::DeviceSubjectFunctions throws;
  throws.write = [](const gpu::DeviceWriteCall&) { throw std::runtime_error("launcher exploded"); };
  const ::testing::AssertionResult r =
      passes(oracle::make_device_subject("device-throws", throws), options({spec::Op::kWrite}, 5));
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("launcher exploded"), std::string::npos) << r.message();

  oracle::DeviceSubjectFunctions unsupported;
  unsupported.write = [](const gpu::DeviceWriteCall&) {
    throw spec::Unsupported("only the dense layout of my dreams");
  };
  const ::testing::AssertionResult u =
      passes(oracle::make_device_subject("device-unsupported", unsupported),
             options({spec::Op::kWrite}, 5));
  ASSERT_FALSE(u);  // nothing judged is not a pass
}

}  // namespace
}  // namespace kvo
