// The op registry and the one subject model: every op has one driver, in spec::Op order; a subject
// runs only the ops it declares; the campaign serves every op, the dense insert included (CPU
// subject, overrides, shrinking, explain); a named subject that implements none of the ops asked
// is bad input, not a silent pass.
#include <gtest/gtest.h>

#include <set>

#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/cpu_subjects.hpp"
#include "kvo/oracle/explain.hpp"
#include "kvo/oracle/mutants.hpp"
#include "kvo/oracle/op_driver.hpp"
#include "kvo/oracle/shrink.hpp"
#include "kvo/reference/layer_write.hpp"

namespace kvo::oracle {
namespace {

TEST(OpRegistry, OneDriverPerOpInEnumOrder) {
  const auto& registry = op_registry();
  ASSERT_EQ(registry.size(), spec::EnumInfo<spec::Op>::kNames.size());
  for (std::size_t i = 0; i < registry.size(); ++i) {
    EXPECT_EQ(static_cast<std::size_t>(registry[i]->op()), i);
    EXPECT_EQ(&driver_of(registry[i]->op()), registry[i]);
    EXPECT_FALSE(registry[i]->reductions().empty()) << spec::name_of(registry[i]->op());
  }
  // The read ops share one case; the others have their own.
  EXPECT_EQ(driver_of(spec::Op::kIndexer).case_kind(), driver_of(spec::Op::kAttention).case_kind());
  EXPECT_NE(driver_of(spec::Op::kWrite).case_kind(), driver_of(spec::Op::kDense).case_kind());
}

TEST(OpRegistry, OpNamesParseAndUnknownOnesAreNamed) {
  EXPECT_EQ(parse_ops({"attention", "write", "write"}),
            (std::vector<spec::Op>{spec::Op::kAttention, spec::Op::kWrite}));
  try {
    parse_ops({"write", "softmax"});
    FAIL();
  } catch (const spec::InvalidInput& e) {
    EXPECT_EQ(e.field(), "ops");
    EXPECT_EQ(e.index(), 1);
    EXPECT_NE(std::string(e.what()).find("write|dense|indexer|attention"), std::string::npos);
  }
}

TEST(OpRegistry, ReadFlagsCarryTheSharedDimensionsFixedOnTheReadSide) {
  // A C++ caller may fix a shared dimension in ReadOverrides: the reproduce line must carry it.
  Overrides o;
  o.read.block_size = 16;
  o.read.kv_dtype = spec::DType::kBF16;
  o.write.head_dim = 32;
  for (spec::Op op : {spec::Op::kIndexer, spec::Op::kAttention}) {
    const std::string flags = driver_of(op).flags(o);
    EXPECT_NE(flags.find("--block-size 16"), std::string::npos) << flags;
    EXPECT_NE(flags.find("--kv-dtype bf16"), std::string::npos) << flags;
    EXPECT_NE(flags.find("--head-dim 32"), std::string::npos) << flags;
  }
}

TEST(Subjects, EveryOpHasACpuSubjectAndEveryNameIsUnique) {
  const SubjectList subjects = make_subjects();
  std::set<std::string> names;
  for (const auto& s : subjects) EXPECT_TRUE(names.insert(s->name()).second) << s->name();
  for (spec::Op op : all_ops()) {
    bool cpu = false;
    for (const auto& s : subjects) cpu |= s->implements(op) && s->unavailable_reason().empty();
    EXPECT_TRUE(cpu) << "no CPU subject for " << spec::name_of(op);
  }
}

TEST(Subjects, AFunctionSubjectImplementsTheOpsItIsGiven) {
  auto s = make_function_subject("writes-only", reference::write_layer);
  EXPECT_TRUE(s->implements(spec::Op::kWrite));
  EXPECT_FALSE(s->implements(spec::Op::kDense));
  EXPECT_EQ(implemented_ops(*s), "write");
  const ReadCase rc = make_read_case(1, {});
  EXPECT_THROW(s->indexer(rc), spec::Unsupported);
}

TEST(Campaign, ANamedSubjectThatImplementsNoneOfTheOpsIsInvalidInput) {
  CheckOptions o;
  o.cases = 1;
  o.subjects = {"cpu-naive-f32", "cpu-fused"};
  o.ops = {spec::Op::kIndexer};
  auto subjects = make_subjects();
  try {
    run_check(o, subjects);
    FAIL();
  } catch (const spec::InvalidInput& e) {
    EXPECT_EQ(e.field(), "subject");
    EXPECT_EQ(e.index(), 1);
    EXPECT_NE(std::string(e.what()).find("implements write"), std::string::npos) << e.what();
  }
}

TEST(Campaign, RowsFollowTheRegistryThenTheSubjectList) {
  CheckOptions o;
  o.cases = 2;
  o.subjects = {"cpu-naive-f32", "cpu-dense", "cpu-fused"};
  auto subjects = make_subjects();
  const CheckReport r = run_check(o, subjects);
  ASSERT_EQ(r.subjects.size(), 4u) << r.summary();
  EXPECT_EQ(r.subjects[0].op, spec::Op::kWrite);
  EXPECT_EQ(r.subjects[1].op, spec::Op::kDense);
  EXPECT_EQ(r.subjects[2].op, spec::Op::kIndexer);
  EXPECT_EQ(r.subjects[3].op, spec::Op::kAttention);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
}

TEST(Dense, CpuSubjectMatchesTheReferenceByteForByte) {
  CheckOptions o;
  o.seed = 0xDE45E;
  o.cases = 120;
  o.ops = {spec::Op::kDense};
  o.subjects = {"cpu-dense"};
  auto subjects = make_subjects();
  const CheckReport r = run_check(o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  EXPECT_EQ(r.subjects.at(0).count(spec::Outcome::kPass), 120);
  EXPECT_GT(r.bytes_compared, 0);
}

TEST(Dense, OverridesFixTheirDimensionAndBadOnesAreNamed) {
  CaseOverrides w;
  w.head_dim = 64;
  w.block_size = 5;
  w.tokens = 7;
  w.kv_dtype = spec::DType::kFp8E5M2;
  DenseOverrides d;
  d.rotary_dim = 10;
  d.group_size = 3;
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    const DenseCase c = make_dense_case(seed, w, d);
    EXPECT_EQ(c.config.geometry.head_dim, 64);
    EXPECT_EQ(c.config.geometry.block_size, 5);
    EXPECT_EQ(c.config.kv.cache_dtype, spec::DType::kFp8E5M2);
    EXPECT_EQ(c.in.rotary_dim, 10);
    EXPECT_EQ(c.in.q.shape[1], 3 * c.config.geometry.num_kv_heads);
    std::int64_t real = 0;
    for (std::int64_t s : c.in.kv.slots.slots) real += s >= 0;
    EXPECT_EQ(real, 7);
  }
  // Without overrides, fixing nothing draws the same case as before.
  EXPECT_EQ(make_dense_case(42).describe(), make_dense_case(42, {}, {}).describe());
  d.rotary_dim = 100;  // > head_dim
  try {
    make_dense_case(1, w, d);
    FAIL();
  } catch (const spec::InvalidInput& e) {
    EXPECT_EQ(e.field(), "rotary-dim");
  }
}

TEST(Dense, ExplainShowsThePagesAndTheFirstDifferingElements) {
  auto subjects = make_subjects();
  add_named_mutants({"dense-fp8-store-unscaled"}, subjects);
  CheckOptions o;
  o.overrides.write.kv_dtype = spec::DType::kFp8E4M3;
  o.overrides.write.scale_mode = spec::ScaleMode::kDivide;
  const Explanation ok = explain_case(o, 7, "cpu-dense", spec::Op::kDense, subjects);
  EXPECT_EQ(ok.outcome, spec::Outcome::kPass) << ok.text;
  const Explanation bad =
      explain_case(o, 7, "dense-fp8-store-unscaled", spec::Op::kDense, subjects);
  EXPECT_EQ(bad.outcome, spec::Outcome::kMismatch) << bad.text;
  EXPECT_NE(bad.text.find("op dense"), std::string::npos) << bad.text;
  EXPECT_NE(bad.text.find("first differing elements:"), std::string::npos) << bad.text;
  EXPECT_NE(bad.text.find("targeted but wrong"), std::string::npos) << bad.text;
  EXPECT_THROW(explain_case(o, 7, "cpu-dense", spec::Op::kWrite, subjects), spec::InvalidInput);
}

}  // namespace
}  // namespace kvo::oracle
