// Case files and result files (traces/case_file.hpp): every op's case round-trips and a CPU
// subject's result passes; a mutant's result gets the campaign's own first mismatch; a div_approx
// result that picks another admissible code passes; hand-broken case and result files are invalid
// input naming what is wrong; a producer's failure is failed-to-run.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../common/invalid_input.hpp"
#include "kvo/oracle/mutants.hpp"
#include "kvo/oracle/op_driver.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/traces/case_file.hpp"
#include "kvo/traces/safetensors.hpp"

namespace kvo::traces {
namespace {

using spec::Op;
using spec::Outcome;

/// The built-in subject that answers each op canonically or foreign.
const char* cpu_subject_of(Op op) {
  constexpr std::array<const char*, 4> kNames{"cpu-fused", "cpu-dense", "cpu-naive-f32",
                                              "cpu-naive-f32"};
  return kNames[static_cast<std::size_t>(op)];
}

struct Fixture {
  CaseFile c;
  std::vector<std::uint8_t> bytes;
};

Fixture emit(Op op, std::uint64_t seed, const oracle::Overrides& o = {}) {
  auto prepared = oracle::driver_of(op).prepare(seed, o);
  Fixture f;
  f.bytes = serialize_case(op, *prepared, oracle::driver_of(op).flags(o));
  f.c = parse_case(f.bytes);
  return f;
}

std::vector<std::uint8_t> run(CaseFile& c, const std::string& subject_name) {
  oracle::SubjectList subjects = oracle::make_subjects();
  oracle::add_named_mutants({subject_name}, subjects);
  return run_case(c, oracle::find_subject(subjects, subject_name));
}

/// A file with its metadata or tensors edited through `edit` (the container rebuilt).
template <class Edit>
std::vector<std::uint8_t> edited(const std::vector<std::uint8_t>& bytes, Edit edit) {
  const StFile file = parse_safetensors(bytes);
  std::map<std::string, std::string> metadata = file.metadata;
  std::vector<StTensorOut> tensors;
  for (const StTensor& t : file.tensors)
    tensors.push_back({t.name, t.dtype, t.shape, {t.bytes.begin(), t.bytes.end()}});
  edit(metadata, tensors);
  return build_safetensors(metadata, tensors);
}

/// The first tensor whose name starts with `prefix` (the whole name, or a layer's first buffer).
StTensorOut& tensor(std::vector<StTensorOut>& tensors, const std::string& prefix) {
  for (StTensorOut& t : tensors)
    if (t.name.rfind(prefix, 0) == 0) return t;
  throw std::logic_error("no tensor " + prefix);
}

using kvo::testing::invalid_input;

TEST(CaseFile, EveryOpRoundTripsAndItsCpuSubjectsResultPasses) {
  for (Op op : oracle::all_ops()) {
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      Fixture f = emit(op, seed);
      EXPECT_EQ(serialize_case(op, *f.c.prepared, f.c.flags), f.bytes) << spec::name_of(op);
      const std::vector<std::uint8_t> result = run(f.c, cpu_subject_of(op));
      const Judgement j = judge_result(f.c, result, {});
      EXPECT_EQ(j.outcome, Outcome::kPass) << spec::name_of(op) << " seed " << seed << "\n"
                                           << j.report;
    }
  }
}

TEST(CaseFile, MutantResultGetsTheCampaignsFirstMismatch) {
  const std::vector<std::pair<Op, const char*>> mutants{{Op::kWrite, "off-by-one-offset"},
                                                        {Op::kDense, "dense-gptj-rope"},
                                                        {Op::kIndexer, "local-block-ignored"},
                                                        {Op::kAttention, "missing-causal-mask"}};
  for (const auto& [op, name] : mutants) {
    // The campaign's verdict on its first case that kills the mutant, drawn from the seed.
    oracle::SubjectList subjects = oracle::make_subjects();
    oracle::add_named_mutants({name}, subjects);
    std::uint64_t seed = 0;
    oracle::Verdict v;
    while (v.outcome != Outcome::kMismatch && seed < 50) {
      auto drawn = oracle::driver_of(op).prepare(++seed, {});
      v = oracle::driver_of(op).judge(oracle::find_subject(subjects, name), *drawn);
    }
    ASSERT_EQ(v.outcome, Outcome::kMismatch) << name;
    Fixture f = emit(op, seed);
    const Judgement j = judge_result(f.c, run(f.c, name), {});
    EXPECT_EQ(j.outcome, Outcome::kMismatch) << name;
    EXPECT_NE(j.report.find(v.report), std::string::npos) << name << "\n" << j.report;
    EXPECT_NE(j.report.find("reproduce: kvoracle check --case-seed 0x"), std::string::npos);
    EXPECT_NE(j.report.find("--subject " + std::string(name)), std::string::npos);
  }
}

TEST(CaseFile, DivApproxResultPickingAnotherAdmissibleCodePasses) {
  oracle::Overrides o;
  o.write.scale_mode = spec::ScaleMode::kDivApprox;
  o.write.kv_dtype = spec::DType::kFp8E4M3;
  std::size_t differing = 0;
  for (std::uint64_t seed = 1; seed <= 40 && differing == 0; ++seed) {
    Fixture f = emit(Op::kWrite, seed, o);
    const std::vector<std::uint8_t> result = run(f.c, "approx-division-where-exact");
    EXPECT_EQ(judge_result(f.c, result, {}).outcome, Outcome::kPass) << seed;
    // Count the bytes where the subject picked a code other than the reference's.
    const StFile r = parse_safetensors(result), c = parse_safetensors(f.bytes);
    for (const StTensor& t : r.tensors) {
      for (const StTensor& e : c.tensors) {
        if (e.name != "expected." + t.name) continue;
        for (std::size_t i = 0; i < t.bytes.size(); ++i) differing += t.bytes[i] != e.bytes[i];
      }
    }
  }
  EXPECT_GT(differing, 0u) << "no case where the approximate division picked another code";
}

TEST(CaseFile, HandBrokenCaseFilesAreInvalidInputNamingWhat) {
  const Fixture f = emit(Op::kIndexer, 5);
  const std::vector<std::uint8_t> truncated(f.bytes.begin(), f.bytes.end() - 10);
  EXPECT_NE(invalid_input([&] { parse_case(truncated); }).find("past the end"), std::string::npos);
  const auto wrong_dtype = edited(f.bytes, [](auto&, auto& t) {
    StTensorOut& s = tensor(t, "input.seq_lens");
    s.dtype = StDType::kI32;
    s.shape = {2 * s.shape[0]};
  });
  EXPECT_NE(invalid_input([&] {
              parse_case(wrong_dtype);
            }).find("tensor 'input.seq_lens' dtype = I32: expected I64"),
            std::string::npos);
  const auto wrong_shape = edited(f.bytes, [](auto& m, auto&) {
    m["num_q_heads"] = std::to_string(2 * std::stoll(m["num_q_heads"]));
  });
  EXPECT_NE(invalid_input([&] { parse_case(wrong_shape); }).find("tensor 'input.q' shape"),
            std::string::npos);
  const auto unknown_key = edited(f.bytes, [](auto& m, auto&) { m["engine"] = "x"; });
  EXPECT_NE(invalid_input([&] {
              parse_case(unknown_key);
            }).find("__metadata__ 'engine' = \"x\": unknown key"),
            std::string::npos);
  const auto unknown_tensor = edited(f.bytes, [](auto&, auto& t) {
    t.push_back({"input.extra", StDType::kU8, {1}, {0}});
  });
  EXPECT_NE(invalid_input([&] { parse_case(unknown_tensor); }).find("tensor 'input.extra'"),
            std::string::npos);
  const auto bad_value = edited(f.bytes, [](auto& m, auto&) { m["topk"] = "07"; });
  EXPECT_NE(invalid_input([&] { parse_case(bad_value); }).find("__metadata__ 'topk' = \"07\""),
            std::string::npos);
  const auto tampered =
      edited(f.bytes, [](auto&, auto& t) { tensor(t, "expected.topk_ids").bytes[0] ^= 1; });
  EXPECT_NE(invalid_input([&] { parse_case(tampered); }).find("tensor 'expected.topk_ids'[0] = 0x"),
            std::string::npos);
  // A write whose stored caches were tampered with: named down to the buffer and byte.
  const Fixture w = emit(Op::kWrite, 5);
  const auto tampered_cache = edited(w.bytes, [](auto&, auto& t) {
    tensor(t, "expected.cache.layer.0.").bytes[spec::kGuardBytes] ^= 0x80;
  });
  EXPECT_NE(invalid_input([&] { parse_case(tampered_cache); }).find("[256] = 0x"),
            std::string::npos);
}

TEST(CaseFile, HandBrokenResultsAreInvalidInputNamingWhat) {
  Fixture f = emit(Op::kWrite, 9);
  const std::vector<std::uint8_t> result = run(f.c, "cpu-fused");
  const auto short_cache = edited(result, [](auto&, auto& t) {
    StTensorOut& k = tensor(t, "cache.layer.0.");
    k.bytes.pop_back();
    k.shape[0] -= 1;
  });
  EXPECT_NE(invalid_input([&] { judge_result(f.c, short_cache, {}); }).find("' shape = ["),
            std::string::npos);
  const auto missing = edited(result, [](auto&, auto& t) {
    t.erase(t.begin() + (&tensor(t, "cache.layer.0.") - t.data()));
  });
  EXPECT_NE(invalid_input([&] { judge_result(f.c, missing, {}); }).find("' = missing"),
            std::string::npos);
  Fixture other = emit(Op::kWrite, 10);
  EXPECT_NE(
      invalid_input([&] { judge_result(other.c, result, {}); }).find("the result of another case"),
      std::string::npos);
  const auto bad_ordering = edited(result, [](auto& m, auto&) { m["ordering"] = "sideways"; });
  EXPECT_NE(
      invalid_input([&] { judge_result(f.c, bad_ordering, {}); }).find("__metadata__ 'ordering'"),
      std::string::npos);
}

TEST(CaseFile, ProducerFailureIsFailedToRun) {
  Fixture f = emit(Op::kAttention, 19);
  oracle::SubjectFunctions fns;
  fns.attention = [](const oracle::ReadCase&, const reference::TopkSelection*) -> spec::HostTensor {
    throw spec::FailedToRun("out of device memory");
  };
  const auto subject = oracle::make_function_subject("oom", fns);
  const Judgement j = judge_result(f.c, run_case(f.c, *subject), {});
  EXPECT_EQ(j.outcome, Outcome::kFailedToRun);
  EXPECT_NE(j.report.find("out of device memory"), std::string::npos) << j.report;
}

TEST(CaseFile, JudgeFlagsOverrideTheDeclaredOrdering) {
  Fixture f = emit(Op::kAttention, 19);
  const std::vector<std::uint8_t> result = run(f.c, "cpu-naive-f32");
  EXPECT_EQ(judge_result(f.c, result, {}).outcome, Outcome::kPass);
  const Judgement exact = judge_result(f.c, result, {spec::Ordering::kCanonical, {}, {}});
  EXPECT_EQ(exact.outcome, Outcome::kMismatch) << exact.report;
  // A profile is a foreign attention's bound: given for a canonical answer, it is bad input.
  EXPECT_NE(
      invalid_input([&] {
        judge_result(f.c, result, {spec::Ordering::kCanonical, spec::AttentionProfile::kBf16P, {}});
      }).find("profile"),
      std::string::npos);
}

}  // namespace
}  // namespace kvo::traces
