// The dense-layer fused insert (qknorm + rope + insert, SPEC 4) on the GPU against its CPU
// reference: q_out and the whole K/V buffers (guards included) byte for byte, over the random cases
// of oracle::make_dense_case.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/write.hpp"
#include "kvo/oracle/cache_diff.hpp"
#include "kvo/oracle/dense_case.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/reference/dense_insert.hpp"
#include "kvo/reference/generator.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"

namespace kvo {
namespace {

using spec::DType;

TEST(DenseInsert, GpuMatchesReference) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const char* env = std::getenv("KVO_DENSE_CASES");
  const std::int64_t n = env != nullptr ? std::strtoll(env, nullptr, 0) : 400;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t seed = 0xD15E0000ull + static_cast<std::uint64_t>(i);
    const oracle::DenseCase ic = oracle::make_dense_case(seed);
    const reference::PagedCacheLayout layout(ic.config);
    spec::LayerCaches expected = oracle::make_layer_caches(layout, 0, spec::LayerKind::kDense);
    spec::LayerCaches actual = oracle::make_layer_caches(layout, 0, spec::LayerKind::kDense);
    const spec::HostTensor q_ref = reference::dense_insert(ic.config, ic.in, expected);
    const spec::HostTensor q_gpu = gpu::dense_insert_host(ic.config, ic.in, actual);
    char tag[64];
    std::snprintf(tag, sizeof tag, "seed 0x%016llX", static_cast<unsigned long long>(seed));
    ASSERT_EQ(q_ref.bytes.size(), q_gpu.bytes.size()) << tag;
    const auto mismatch =
        std::mismatch(q_ref.bytes.begin(), q_ref.bytes.end(), q_gpu.bytes.begin());
    ASSERT_TRUE(mismatch.first == q_ref.bytes.end())
        << tag << " " << spec::describe(ic.config) << ": q_out differs first at byte "
        << (mismatch.first - q_ref.bytes.begin());
    const oracle::CacheDiff d = oracle::diff_layer_caches(layout, 0, expected, actual, &ic.in.kv);
    ASSERT_TRUE(d.equal()) << tag << " " << spec::describe(ic.config) << "\n" << d.report();
  }
  std::printf("[gpu-cases] dense insert cases diffed: %lld\n", static_cast<long long>(n));
}

}  // namespace
}  // namespace kvo
