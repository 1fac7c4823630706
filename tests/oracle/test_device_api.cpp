// The device API's host side (kvo/gpu/device_caches.hpp, device_calls.hpp, and
// kvo/oracle/device_subject.hpp), on any machine: element types follow the spec's dtypes, tensor
// views carry row-major strides, and a device subject where no CUDA device answers is unavailable
// (a test of it fails naming why: nothing judged is never a pass); the same calls in host memory
// (make_host_call_subject). Runs in CI without a GPU; the device calls themselves run on the H200
// (tests/gpu/test_device_subject.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "kvo/gpu/device.hpp"
#include "kvo/gpu/device_caches.hpp"
#include "kvo/gpu/device_calls.hpp"
#include "kvo/oracle/device_subject.hpp"
#include "kvo/oracle/testing.hpp"

namespace kvo {
namespace {

TEST(DeviceApi, ElementTypesFollowTheSpecDtypes) {
  for (const spec::NumberFormat& f : spec::kNumberFormats) {
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

// Host-call subjects (make_host_call_subject): the same calls in host memory. A write that copies
// each token's rows through the logical [nb, bs, nkv, hd] views is correct on every layout; the
// runner's rules (a read may not change its caches, an unwritten output is a mismatch) hold.

/// Copies K and V of every token through the views; `wrap` lets slot -1 index from the end (the
/// vllm#43810 class) instead of skipping it.
void copy_through_views(const gpu::DeviceWriteCall& c, bool wrap) {
  if (c.kind != spec::LayerKind::kDense) throw spec::Unsupported("dense layers only");
  const auto eb = static_cast<std::int64_t>(gpu::element_bytes(c.k.type));
  const std::int64_t bs = c.caches.k.shape[1], nkv = c.caches.k.shape[2], hd = c.caches.k.shape[3];
  const std::int64_t capacity = c.caches.k.shape[0] * bs;
  const std::vector<std::int64_t>& st = c.caches.k.strides;
  for (std::int64_t t = 0; t < c.slot_mapping.shape[0]; ++t) {
    std::int64_t slot = c.slot_mapping.as<const std::int64_t>()[t];
    if (slot < 0 && !wrap) continue;
    if (slot < 0) slot += capacity;
    for (std::int64_t h = 0; h < nkv; ++h) {
      const std::int64_t dst = ((slot / bs) * st[0] + (slot % bs) * st[1] + h * st[2]) * eb;
      const std::int64_t src = (t * nkv + h) * hd * eb;
      std::memcpy(c.caches.k.as<std::uint8_t>() + dst, c.k.as<const std::uint8_t>() + src,
                  static_cast<std::size_t>(hd * eb));
      std::memcpy(c.caches.v.as<std::uint8_t>() + dst, c.v.as<const std::uint8_t>() + src,
                  static_cast<std::size_t>(hd * eb));
    }
  }
}

oracle::CheckOptions copy_write_options() {
  oracle::CheckOptions o;
  o.ops = {spec::Op::kWrite};
  o.cases = 120;
  o.overrides.write.layers = "2D";
  o.overrides.write.act_dtype = spec::DType::kBF16;
  o.overrides.write.kv_dtype = spec::DType::kBF16;
  o.overrides.write.scale_mode = spec::ScaleMode::kNone;
  o.overrides.write.slot_mode = spec::SlotMode::kStrict;
  o.overrides.write.slot_type = spec::SlotType::kI64;
  return o;
}

TEST(HostCallSubject, WriteThroughTheLayoutViewsPassesEveryLayout) {
  oracle::DeviceSubjectFunctions f;
  f.write = [](const gpu::DeviceWriteCall& c) { copy_through_views(c, false); };
  std::unique_ptr<oracle::Subject> s = oracle::make_host_call_subject("host-views", f);
  EXPECT_TRUE(s->unavailable_reason().empty());
  EXPECT_TRUE(oracle::testing::passes(std::move(s), copy_write_options()));
}

TEST(HostCallSubject, WrappingPaddingSlotFails) {
  oracle::DeviceSubjectFunctions f;
  f.write = [](const gpu::DeviceWriteCall& c) { copy_through_views(c, true); };
  const ::testing::AssertionResult r =
      oracle::testing::passes(oracle::make_host_call_subject("host-wrap", f), copy_write_options());
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("KVO_CASE_SEED=0x"), std::string::npos);
}

TEST(HostCallSubject, ReadThatWritesItsCachesIsFailedToRun) {
  oracle::DeviceSubjectFunctions f;
  f.indexer = [](const gpu::DeviceIndexerCall& c) {
    c.caches.index_cache.as<std::uint8_t>()[3] ^= 1;  // a read op may not touch its caches
  };
  oracle::CheckOptions o;
  o.ops = {spec::Op::kIndexer};
  o.cases = 3;
  const ::testing::AssertionResult r =
      oracle::testing::passes(oracle::make_host_call_subject("host-scribble", f), o);
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("a read changed its caches"), std::string::npos);
}

TEST(HostCallSubject, UnwrittenOutputIsAMismatch) {
  oracle::DeviceSubjectFunctions f;
  f.attention = [](const gpu::DeviceAttentionCall&) {};
  f.ordering = spec::Ordering::kForeign;
  oracle::CheckOptions o;
  o.ops = {spec::Op::kAttention};
  o.cases = 3;
  const ::testing::AssertionResult r =
      oracle::testing::passes(oracle::make_host_call_subject("host-idle", f), o);
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("mismatch"), std::string::npos);
}

}  // namespace
}  // namespace kvo
