// The foreign dense insert (SPEC 4): judged by admissible sets around the float64 truth, a kernel
// in another arithmetic (vLLM's: fma squares per lane, xor butterfly, rsqrtf) passes, and so does
// the canonical one declared foreign; a wrong rope, a missing (1 + w), a wrong eps or an unscaled
// fp8 store fails, and the report names the element, both codes and the admitted range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "kvo/oracle/cpu_subjects.hpp"
#include "kvo/oracle/testing.hpp"
#include "kvo/reference/dense_insert.hpp"
#include "kvo/truth/dense_truth.hpp"

namespace {

namespace spec = kvo::spec;
using kvo::oracle::CheckOptions;
using kvo::oracle::make_cpu_dense_subject;
using kvo::oracle::make_function_subject;
using kvo::oracle::SubjectFunctions;
using kvo::oracle::testing::passes;
using kvo::subjects::DenseArithmetic;

CheckOptions dense_options(std::int64_t cases) {
  CheckOptions o;
  o.seed = 0xDE45E;
  o.cases = cases;
  o.ops = {spec::Op::kDense};
  return o;
}

std::unique_ptr<kvo::oracle::Subject> engine() {
  return make_cpu_dense_subject({}, "engine", DenseArithmetic::kEngine);
}

TEST(ForeignDense, EngineArithmeticPasses) { EXPECT_TRUE(passes(engine(), dense_options(150))); }

TEST(ForeignDense, CanonicalArithmeticDeclaredForeignPasses) {
  SubjectFunctions f;
  f.dense = [](const spec::ModelConfig& c, const spec::DenseInsert& in, spec::LayerCaches& out) {
    return kvo::reference::dense_insert(c, in, out);
  };
  f.ordering = spec::Ordering::kForeign;
  EXPECT_TRUE(passes(make_function_subject("canonical-as-foreign", f), dense_options(150)));
}

TEST(ForeignDense, EngineArithmeticIsNotBitExact) {
  // Declared canonical, the engine's arithmetic is caught: the foreign mode is what admits it.
  SubjectFunctions f;
  f.dense = [](const spec::ModelConfig& c, const spec::DenseInsert& in, spec::LayerCaches& out) {
    return kvo::subjects::dense_insert_fused(c, in, out, {}, DenseArithmetic::kEngine);
  };
  EXPECT_FALSE(passes(make_function_subject("engine-as-canonical", f), dense_options(50)));
}

// The planted bugs (GPT-J rope, x*r*w, eps 1e-5, fp8 stored unscaled) in this arithmetic are the
// mutants engine-dense-* of the catalogue: `kvoracle mutants` kills each on default cases
// (tests/cli mutants_all_killed).

TEST(ForeignDense, ReportNamesTheElementAndTheAdmittedRange) {
  // Every K inserted at twice its value (a scale halved, or without one (1 + w) = 2): far outside
  // the bound. The report gives the element, both codes and the admitted range.
  SubjectFunctions f;
  f.dense = [](const spec::ModelConfig& c, const spec::DenseInsert& in, spec::LayerCaches& out) {
    spec::DenseInsert doubled = in;
    if (c.kv.scale_mode == spec::ScaleMode::kNone) {
      doubled.k_norm_weight.assign(in.k_norm_weight.size(), 1.0f);
    } else {
      doubled.kv.k_scale.assign(in.kv.k_scale.size(), 0.5f);
      doubled.fp8_store = spec::DenseFp8Store::kScaled;
    }
    spec::LayerCaches wrong = out;
    kvo::subjects::dense_insert_fused(c, doubled, wrong, {}, DenseArithmetic::kEngine);
    const spec::HostTensor q =
        kvo::subjects::dense_insert_fused(c, in, out, {}, DenseArithmetic::kEngine);
    out = std::move(wrong);  // the right q_out, the wrong K
    return q;
  };
  f.ordering = spec::Ordering::kForeign;
  const ::testing::AssertionResult r = passes(make_function_subject("moved", f), dense_options(20));
  ASSERT_FALSE(r);
  const std::string text = r.message();
  EXPECT_NE(text.find("outside the admitted codes"), std::string::npos) << text;
  EXPECT_NE(text.find("kv=K"), std::string::npos) << text;
  EXPECT_NE(text.find("should have written"), std::string::npos) << text;
}

TEST(DenseTruth, HandChecked) {
  // One token, one head of eight dims: x = (3, 4, 0, ...), w = 0, eps = 0, rotary_dim 2 at
  // position 0 (cos 1, sin 0): ms = 25 / 8, y = x / sqrt(3.125) = (1.697056..., 2.262741..., 0...).
  spec::ModelConfig c;
  c.layers = {spec::LayerKind::kDense};
  c.act_dtype = spec::DType::kF32;
  c.geometry = {1, 1, 1, 8, 128};
  c.kv.cache_dtype = spec::DType::kF32;
  c.kv.scale_mode = spec::ScaleMode::kNone;
  spec::DenseInsert in;
  const auto f32 = [](std::vector<float> v, std::int64_t heads) {
    spec::HostTensor t;
    t.dtype = spec::DType::kF32;
    t.shape = {1, heads, static_cast<std::int64_t>(v.size()) / heads};
    t.bytes.resize(v.size() * 4);
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    return t;
  };
  const std::vector<float> x{3.0f, 4.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  in.q = f32(x, 1);
  in.kv.kind = spec::LayerKind::kDense;
  in.kv.k = f32(x, 1);
  in.kv.v = f32(std::vector<float>(8, 1.0f), 1);
  in.kv.slots.slots = {0};
  in.kv.k_scale = {1.0f};
  in.kv.v_scale = {1.0f};
  in.q_norm_weight.assign(8, 0.0f);
  in.k_norm_weight.assign(8, 0.0f);
  in.eps = 0.0f;
  in.rotary_dim = 2;
  in.cos_sin = {1.0f, 0.0f};
  in.positions = {0};
  const kvo::truth::DenseTruth t = kvo::truth::dense_truth(c, in);
  ASSERT_EQ(t.k.size(), 8u);
  EXPECT_NEAR(t.k[0], 3.0 / std::sqrt(3.125), 1e-15);
  EXPECT_NEAR(t.k[1], 4.0 / std::sqrt(3.125), 1e-15);
  EXPECT_EQ(t.k[2], 0.0);
  EXPECT_EQ(t.q, t.k);
  // The bound: e_y = (1 + gamma_9 / 2 + u / 2 + 4u)(1 + u)^3 - 1, about 12.5u relative, above the
  // canonical path's own error (a few u) and below 16u.
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_GT(t.k_bound[i], 8 * 0x1p-24 * std::fabs(t.k[i]));
    EXPECT_LT(t.k_bound[i], 16 * 0x1p-24 * std::fabs(t.k[i]));
  }
  EXPECT_EQ(t.k_bound[2], 0.0);
}

}  // namespace
