// The device API's host side (kvo/gpu/device_caches.hpp, device_calls.hpp, and
// kvo/oracle/device_subject.hpp), on any machine: element types follow the spec's dtypes, tensor
// views carry row-major strides, and a device subject where no CUDA device answers is unavailable
// (a test of it fails naming why: nothing judged is never a pass). Runs in CI without a GPU; the
// device calls themselves run on the H200 (tests/gpu/test_device_subject.cpp).
#include <gtest/gtest.h>

#include <string>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/device_caches.hpp"
#include "kvo/oracle/device_subject.hpp"
#include "kvo/oracle/testing.hpp"

namespace kvo {
namespace {

TEST(DeviceApi, ElementTypesFollowTheSpecDtypes) {
  for (const spec::DTypeFacts& f : spec::kDTypeFacts) {
    const gpu::ElementType t = gpu::element_type_of(f.dtype);
    EXPECT_EQ(gpu::element_bytes(t), f.bytes);
    EXPECT_EQ(gpu::name_of(t), spec::name_of(f.dtype));
  }
  EXPECT_EQ(gpu::element_bytes(gpu::ElementType::kI32), 4u);
  EXPECT_EQ(gpu::element_bytes(gpu::ElementType::kI64), 8u);
  EXPECT_EQ(gpu::element_bytes(gpu::ElementType::kU8), 1u);
}

TEST(DeviceApi, ContiguousTensorsHaveRowMajorStrides) {
  const gpu::DeviceTensor t = gpu::contiguous_tensor(nullptr, gpu::ElementType::kBF16, {2, 3, 4});
  EXPECT_EQ(t.strides, (std::vector<std::int64_t>{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_FALSE(t.present());
}

TEST(DeviceApi, DeviceSubjectWithoutADeviceIsUnavailableNeverAPass) {
  std::string why;
  if (gpu::device_count(&why) > 0) GTEST_SKIP() << "a CUDA device answers: tests/gpu covers it";
  oracle::DeviceSubjectFunctions f;
  f.write = [](const gpu::DeviceWriteCall&) {};
  std::unique_ptr<oracle::Subject> s = oracle::make_device_subject("device-here", f);
  EXPECT_TRUE(s->implements(spec::Op::kWrite));
  EXPECT_FALSE(s->implements(spec::Op::kAttention));
  EXPECT_NE(s->unavailable_reason().find("no CUDA device answers"), std::string::npos);
  oracle::CheckOptions o;
  o.ops = {spec::Op::kWrite};
  o.cases = 3;
  const ::testing::AssertionResult r = oracle::testing::passes(std::move(s), o);
  EXPECT_FALSE(r);
}

}  // namespace
}  // namespace kvo
