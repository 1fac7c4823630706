// The user's CUDA kernels (my_cuda_kernels.hpp) judged by kvoracle in device memory: each call
// arrives as device tensors with shapes and strides and a stream (kvo/gpu/device_calls.hpp); the
// adapters below map them onto the kernels' arguments. Each kernel passes as written, and its
// planted bug fails with the case seed, the first mismatch and the reproduce line. Skips where no
// CUDA device answers (CI builds it; the H200 runs it: gpu/run_on_device.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>

#include "kvo/gpu/device.hpp"
#include "kvo/oracle/device_subject.hpp"
#include "kvo/oracle/testing.hpp"
#include "my_cuda_kernels.hpp"

namespace {

namespace gpu = kvo::gpu;
namespace spec = kvo::spec;
namespace oracle = kvo::oracle;
using kvo::oracle::testing::passes;

#define SKIP_WITHOUT_GPU()                                                               \
  do {                                                                                   \
    std::string why;                                                                     \
    if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device answers: " << why; \
  } while (0)

// ---- the write kernel ----

/// What write_kv_cache_cuda implements: any layout (it addresses the caches through the logical
/// views' strides), bf16 or fp8 e4m3 satfinite caches, divide by the scale, strict slots.
void check_write_supported(const spec::ModelConfig& c, spec::LayerKind kind) {
  const bool ok = kind == spec::LayerKind::kDense && c.act_dtype == spec::DType::kBF16 &&
                  (c.kv.cache_dtype == spec::DType::kBF16 ||
                   (c.kv.cache_dtype == spec::DType::kFp8E4M3 &&
                    c.kv.saturation == spec::Saturation::kSatFinite)) &&
                  c.kv.scale_mode == spec::ScaleMode::kDivide && !c.kv.via_model_dtype &&
                  !c.kv.scale_in_model_dtype && c.slot_mode == spec::SlotMode::kStrict;
  if (!ok) throw spec::Unsupported("my CUDA write kernel: " + spec::describe(c));
}

gpu::DeviceWriteFunction adapt_write(void (*kernel)(const my::KvWriteCuda&)) {
  return [kernel](const gpu::DeviceWriteCall& call) {
    const spec::ModelConfig& c = *call.config;
    check_write_supported(c, call.kind);
    const gpu::DeviceTensor& k = call.caches.k;  // [nb, bs, nkv, hd] with the layout's strides
    kernel({call.k.as<const std::uint16_t>(), call.v.as<const std::uint16_t>(),
            call.slot_mapping.data, call.slot_mapping.type == gpu::ElementType::kI64,
            call.slot_mapping.shape[0], c.geometry.num_kv_heads, c.geometry.head_dim,
            c.geometry.block_size, c.geometry.num_blocks, call.k_scale.as<const float>(),
            call.v_scale.as<const float>(), c.kv.per_head_scale,
            c.kv.cache_dtype == spec::DType::kFp8E4M3, k.data, call.caches.v.data, k.strides[0],
            k.strides[1], k.strides[2], call.stream});
  };
}

oracle::CheckOptions write_options() {
  oracle::CheckOptions o;
  o.ops = {spec::Op::kWrite};
  o.cases = 300;
  auto& w = o.overrides.write;
  w.layers = "2D";
  w.act_dtype = spec::DType::kBF16;
  w.saturation = spec::Saturation::kSatFinite;
  w.scale_mode = spec::ScaleMode::kDivide;
  w.via_model_dtype = false;
  w.scale_in_model_dtype = false;
  w.slot_mode = spec::SlotMode::kStrict;
  return o;
}

oracle::DeviceSubjectFunctions write_subject(void (*kernel)(const my::KvWriteCuda&)) {
  oracle::DeviceSubjectFunctions f;
  f.write = adapt_write(kernel);
  return f;
}

TEST(MyCudaWrite, PassesOnEveryLayout) {
  SKIP_WITHOUT_GPU();
  for (const spec::DType cache : {spec::DType::kBF16, spec::DType::kFp8E4M3}) {
    oracle::CheckOptions o = write_options();
    o.overrides.write.kv_dtype = cache;
    EXPECT_TRUE(passes(
        oracle::make_device_subject("my-cuda-write", write_subject(my::write_kv_cache_cuda)), o));
  }
}

TEST(MyCudaWrite, PlantedBugFails) {
  SKIP_WITHOUT_GPU();
  oracle::CheckOptions o = write_options();
  o.overrides.write.kv_dtype = spec::DType::kBF16;
  const ::testing::AssertionResult r =
      passes(oracle::make_device_subject("my-cuda-write-bug",
                                         write_subject(my::write_kv_cache_cuda_planted_bug)),
             o);
  ASSERT_FALSE(r);
  const std::string m = r.message();
  EXPECT_NE(m.find("result: mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find(" seed 0x"), std::string::npos) << m;
  EXPECT_NE(m.find("first: layer "), std::string::npos) << m;
  EXPECT_NE(m.find("reproduce in this test (my-cuda-write-bug, write): KVO_CASE_SEED=0x"),
            std::string::npos)
      << m;
}

// ---- the attention kernel ----

gpu::DeviceAttentionFunction adapt_attention(void (*kernel)(const my::SparseAttentionCuda&)) {
  return [kernel](const gpu::DeviceAttentionCall& call) {
    const spec::ModelConfig& c = *call.config;
    const spec::DType out = call.params.out_dtype;
    if (c.kv.cache_dtype != spec::DType::kBF16 || c.act_dtype != spec::DType::kBF16 ||
        (out != spec::DType::kF32 && out != spec::DType::kBF16) || c.geometry.head_dim > 256) {
      throw spec::Unsupported("my CUDA attention: " + spec::describe(c));
    }
    const gpu::DeviceTensor& k = call.caches.k;  // [nb, bs, nkv, hd] with the layout's strides
    const bool sparse = call.selection.present();
    kernel({call.q.as<const std::uint16_t>(),
            k.as<const std::uint16_t>(),
            call.caches.v.as<const std::uint16_t>(),
            k.strides[0],
            k.strides[1],
            k.strides[2],
            call.batch.block_table.as<const std::int32_t>(),
            call.batch.block_table.shape[1],
            call.batch.seq_lens.as<const std::int64_t>(),
            call.batch.row_request.as<const std::int64_t>(),
            call.batch.row_position.as<const std::int64_t>(),
            call.q.shape[0],
            sparse ? call.selection.as<const std::int32_t>() : nullptr,
            sparse ? call.selection.shape[2] : 0,
            call.params.sparse_block,
            call.params.num_q_heads,
            c.geometry.num_kv_heads,
            c.geometry.head_dim,
            c.geometry.block_size,
            call.params.sm_scale > 0.0f ? call.params.sm_scale
                                        : 1.0f / std::sqrt(static_cast<float>(c.geometry.head_dim)),
            call.out.data,
            out == spec::DType::kBF16,
            call.stream});
  };
}

/// A float32 kernel in its own order: judged against the float64 truth within the fp32 bound.
std::unique_ptr<oracle::Subject> attention_subject(std::string name,
                                                   void (*kernel)(const my::SparseAttentionCuda&)) {
  oracle::DeviceSubjectFunctions f;
  f.attention = adapt_attention(kernel);
  f.ordering = spec::Ordering::kForeign;
  f.attention_profile = spec::AttentionProfile::kFp32;
  return oracle::make_device_subject(std::move(name), std::move(f));
}

oracle::CheckOptions attention_options() {
  oracle::CheckOptions o;
  o.ops = {spec::Op::kAttention};
  o.cases = 200;
  o.overrides.write.kv_dtype = spec::DType::kBF16;
  return o;
}

TEST(MyCudaAttention, Passes) {
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(passes(attention_subject("my-cuda-attention", my::sparse_attention_cuda),
                     attention_options()));
}

TEST(MyCudaAttention, PlantedBugFails) {
  SKIP_WITHOUT_GPU();
  const ::testing::AssertionResult r =
      passes(attention_subject("my-cuda-attention-bug", my::sparse_attention_cuda_planted_bug),
             attention_options());
  ASSERT_FALSE(r);
  const std::string m = r.message();
  EXPECT_NE(m.find("result: mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find("first: query "), std::string::npos) << m;
  EXPECT_NE(m.find("reproduce in this test (my-cuda-attention-bug, attention): KVO_CASE_SEED=0x"),
            std::string::npos)
      << m;
}

}  // namespace
