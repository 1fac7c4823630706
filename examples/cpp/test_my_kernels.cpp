// The user's tests: each kernel of my_kernels.hpp judged by kvoracle in one assertion, once as
// written (it must pass) and once with its planted bug (it must fail, with the case seed, the
// first mismatch and the reproduce line in the message). The adapters below are the only code
// that knows both sides: they map a kvoracle case onto the kernel's arguments and its answer back.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvo/oracle/testing.hpp"
#include "my_kernels.hpp"

namespace {

namespace spec = kvo::spec;
namespace oracle = kvo::oracle;
using kvo::oracle::testing::passes;

// ---- the write kernel ----

/// What write_kv_cache implements; kvoracle counts anything else as unsupported (and a test in
/// which every case is unsupported fails: it judged nothing).
void check_write_supported(const spec::ModelConfig& c, const spec::LayerWrite& w) {
  const bool ok = w.kind == spec::LayerKind::kDense && c.layout == spec::KvLayout::kNhd &&
                  c.act_dtype == spec::DType::kBF16 &&
                  (c.kv.cache_dtype == spec::DType::kBF16 ||
                   (c.kv.cache_dtype == spec::DType::kFp8E4M3 &&
                    c.kv.saturation == spec::Saturation::kSatFinite)) &&
                  c.kv.scale_mode == spec::ScaleMode::kDivide && !c.kv.via_model_dtype &&
                  !c.kv.scale_in_model_dtype && c.slot_mode == spec::SlotMode::kStrict &&
                  c.kv_strides.dense();  // contiguous [nb, bs, nkv, hd] caches only
  if (!ok) throw spec::Unsupported("my write kernel: " + spec::describe(c));
}

oracle::WriteFunction adapt_write(void (*kernel)(const my::KvWrite&)) {
  return [kernel](const spec::ModelConfig& c, const spec::LayerWrite& w, spec::LayerCaches& out) {
    check_write_supported(c, w);
    kernel({reinterpret_cast<const std::uint16_t*>(w.k.bytes.data()),
            reinterpret_cast<const std::uint16_t*>(w.v.bytes.data()), w.slots.slots.data(),
            static_cast<std::int64_t>(w.slots.slots.size()), c.geometry.num_kv_heads,
            c.geometry.head_dim, w.k_scale.data(), w.v_scale.data(), c.kv.per_head_scale,
            c.kv.cache_dtype == spec::DType::kFp8E4M3, out.find(spec::BufferKind::kK)->body(),
            out.find(spec::BufferKind::kV)->body()});
  };
}

/// The cases: the dimensions the kernel fixes are fixed; everything else (geometry, tokens, slot
/// mappings, scales, per-head scales, edge values) is drawn.
oracle::CheckOptions write_options(spec::DType cache) {
  oracle::CheckOptions o;
  o.ops = {spec::Op::kWrite};
  o.cases = 200;
  auto& w = o.overrides.write;
  w.layers = "2D";
  w.layout = spec::KvLayout::kNhd;
  w.act_dtype = spec::DType::kBF16;
  w.kv_dtype = cache;
  w.saturation = spec::Saturation::kSatFinite;
  w.scale_mode = spec::ScaleMode::kDivide;
  w.via_model_dtype = false;
  w.scale_in_model_dtype = false;
  w.slot_mode = spec::SlotMode::kStrict;
  return o;
}

TEST(MyWrite, PassesOnBf16AndFp8Caches) {
  for (const spec::DType cache : {spec::DType::kBF16, spec::DType::kFp8E4M3}) {
    EXPECT_TRUE(passes(oracle::make_function_subject("my-write", adapt_write(my::write_kv_cache)),
                       write_options(cache)));
  }
}

TEST(MyWrite, PlantedBugFails) {
  const ::testing::AssertionResult r = passes(
      oracle::make_function_subject("my-write-bug", adapt_write(my::write_kv_cache_planted_bug)),
      write_options(spec::DType::kBF16));
  ASSERT_FALSE(r);
  const std::string m = r.message();
  EXPECT_NE(m.find("result: mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find(" seed 0x"), std::string::npos) << m;
  EXPECT_NE(m.find("first: layer "), std::string::npos) << m;  // the first differing byte
  EXPECT_NE(m.find("reproduce in this test (my-write-bug, write): KVO_CASE_SEED=0x"),
            std::string::npos)
      << m;
}

// ---- the attention kernel ----

/// Runs a kernel of my_kernels.hpp on a read case's caches, batch and selection.
oracle::AttentionFunction adapt_attention(void (*kernel)(const my::SparseAttention&)) {
  return [kernel](const oracle::ReadCase& c, const kvo::reference::TopkSelection* selection) {
    const spec::ModelConfig& m = c.config;
    const spec::DType out_dtype = c.attention.out_dtype;
    if (m.layout != spec::KvLayout::kNhd || m.kv.cache_dtype != spec::DType::kBF16 ||
        !m.kv_strides.dense() || c.q.dtype != spec::DType::kBF16 ||
        (out_dtype != spec::DType::kF32 && out_dtype != spec::DType::kBF16)) {
      throw spec::Unsupported("my attention: " + spec::describe(m));
    }
    const std::int64_t rows = c.batch.num_queries(), nq = c.attention.num_q_heads;
    const std::int64_t hd = m.geometry.head_dim;
    std::vector<float> out(static_cast<std::size_t>(rows * nq * hd));
    const auto cache = [&](spec::BufferKind b) {
      return reinterpret_cast<const std::uint16_t*>(c.caches.find(b)->body());
    };
    kernel({reinterpret_cast<const std::uint16_t*>(c.q.bytes.data()), cache(spec::BufferKind::kK),
            cache(spec::BufferKind::kV), c.batch.block_table.data(), c.batch.max_blocks,
            c.batch.seq_lens.data(), c.batch.query_start_loc.data(), c.batch.num_requests(),
            selection ? selection->ids.data() : nullptr, selection ? selection->topk : 0,
            c.attention.sparse_block, nq, m.geometry.num_kv_heads, hd, m.geometry.block_size,
            c.attention.sm_scale > 0.0f ? c.attention.sm_scale
                                        : 1.0f / std::sqrt(static_cast<float>(hd)),
            out.data()});
    spec::HostTensor t{out_dtype, {rows, nq, hd}, {}};
    t.bytes.resize(out.size() * spec::dtype_bytes(out_dtype));
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (out_dtype == spec::DType::kF32) {
        std::memcpy(&t.bytes[i * 4], &out[i], 4);
      } else {
        const std::uint16_t b = my::float_to_bf16(out[i]);
        std::memcpy(&t.bytes[i * 2], &b, 2);
      }
    }
    return t;
  };
}

/// A float32 kernel in its own order: judged against the float64 truth within the fp32 bound.
std::unique_ptr<oracle::Subject> attention_subject(std::string name,
                                                   void (*kernel)(const my::SparseAttention&)) {
  oracle::SubjectFunctions f;
  f.attention = adapt_attention(kernel);
  f.ordering = spec::Ordering::kForeign;
  f.attention_profile = spec::AttentionProfile::kFp32;
  return oracle::make_function_subject(std::move(name), std::move(f));
}

oracle::CheckOptions attention_options() {
  oracle::CheckOptions o;
  o.ops = {spec::Op::kAttention};
  o.cases = 100;
  // The dimensions read and write cases share (layout, cache dtype, block size, heads) are set
  // where the command line sets them.
  o.overrides.write.layout = spec::KvLayout::kNhd;
  o.overrides.write.kv_dtype = spec::DType::kBF16;
  return o;
}

TEST(MyAttention, Passes) {
  EXPECT_TRUE(passes(attention_subject("my-attention", my::sparse_attention), attention_options()));
}

TEST(MyAttention, PlantedBugFails) {
  const ::testing::AssertionResult r = passes(
      attention_subject("my-attention-bug", my::sparse_attention_planted_bug), attention_options());
  ASSERT_FALSE(r);
  const std::string m = r.message();
  EXPECT_NE(m.find("result: mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find(" seed 0x"), std::string::npos) << m;
  EXPECT_NE(m.find("first: query "), std::string::npos) << m;  // the first element past its bound
  EXPECT_NE(m.find("reproduce in this test (my-attention-bug, attention): KVO_CASE_SEED=0x"),
            std::string::npos)
      << m;
  // The shrunk case replays in this test too: its seed and the shrinking steps it took.
  EXPECT_NE(m.find("KVO_CASE_REDUCTIONS=attention:"), std::string::npos) << m;
}

}  // namespace
