// Mode detection (SPEC 7) and admissible-set judging of writes: the built-in subjects told each
// mode are named in it; subjects that are not told their modes (a kernel with its own fixed
// arithmetic) are named by what they do; a subject that matches nothing gets the closest
// combination with its first mismatch; pruning keeps the cost near a campaign's.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/cpu_subjects.hpp"
#include "kvo/oracle/detect.hpp"
#include "kvo/oracle/mutants.hpp"
#include "kvo/subjects/cpu_write.hpp"

namespace kvo::oracle {
namespace {

CheckOptions options(spec::Op op, std::int64_t cases) {
  CheckOptions o;
  o.seed = 0xDE7EC7;
  o.cases = cases;
  o.ops = {op};
  std::printf("mode detection: seed 0x%llX, %lld cases\n", static_cast<unsigned long long>(o.seed),
              static_cast<long long>(cases));
  return o;
}

/// The one result of detecting `name` on `op`.
DetectResult detect(const CheckOptions& o, SubjectList& subjects, const std::string& name) {
  const auto results = detect_modes(o, subjects, name);
  EXPECT_EQ(results.size(), 1u);
  return results.front();
}

/// The values of axis `axis` among the matched combinations.
std::vector<std::string> matched_values(const DetectResult& r, const std::string& axis) {
  std::vector<std::string> out;
  for (std::size_t a = 0; a < r.axes.size(); ++a) {
    if (r.axes[a].name != axis) continue;
    for (const ModeCombination& m : r.matched) {
      const std::string& v = r.axes[a].values[m.choice[a]];
      if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

using Values = std::vector<std::string>;

TEST(DetectModes, BuiltInSubjectToldEachScaleModeIsNamedInIt) {
  // Told mode m, cpu-fused follows it; detection names m, and div_approx beside the two
  // divisions: x * fl(1/s) is within 2 ulp of x / s, so div_approx admits it too.
  const std::vector<std::pair<spec::ScaleMode, Values>> expected{
      {spec::ScaleMode::kDivide, {"div_approx", "divide"}},
      {spec::ScaleMode::kMulRecip, {"div_approx", "mul_recip"}},
      {spec::ScaleMode::kNone, {"none"}},
      {spec::ScaleMode::kDivApprox, {"div_approx", "divide"}}};
  for (const auto& [mode, want] : expected) {
    SCOPED_TRACE(std::string(spec::name_of(mode)));
    // bf16 caches: divide and mul_recip differ only where a scale is not a power of two and the
    // rounding differs, in a few percent of the cases.
    CheckOptions o = options(spec::Op::kWrite, 120);
    o.overrides.write.scale_mode = mode;
    o.overrides.write.kv_dtype = spec::DType::kBF16;
    SubjectList subjects = make_cpu_subjects();
    const DetectResult r = detect(o, subjects, "cpu-fused");
    std::cout << r.report();
    EXPECT_EQ(r.outcome(), spec::Outcome::kPass);
    EXPECT_EQ(matched_values(r, "scale_mode"), want);
  }
}

TEST(DetectModes, EveryWriteModeToldIsFoundByTheBuiltInSubject) {
  // One override per axis, on cases where the axis can change a byte.
  struct Told {
    const char* axis;
    const char* value;
    std::function<void(CaseOverrides&)> set;
  };
  const std::vector<Told> told{
      {"saturation", "nosat",
       [](CaseOverrides& w) {
         w.saturation = spec::Saturation::kNoSat;
         w.kv_dtype = spec::DType::kFp8E4M3;
         w.edge_values = true;
       }},
      {"via_model_dtype", "true",
       [](CaseOverrides& w) {
         w.via_model_dtype = true;
         w.act_dtype = spec::DType::kBF16;  // rounding to f32 would change nothing
         w.kv_dtype = spec::DType::kFp8E4M3;
       }},
      {"scale_in_model_dtype", "true",
       [](CaseOverrides& w) {
         w.scale_in_model_dtype = true;
         w.act_dtype = spec::DType::kBF16;
       }},
      {"blockscale_scale", "mul_recip",
       [](CaseOverrides& w) {
         w.blockscale_scale = spec::BlockScaleFormula::kMulRecip;
         w.layers = "S";
       }},
      {"ue8m0", "true",
       [](CaseOverrides& w) {
         w.ue8m0 = true;
         w.index_layout = spec::IndexLayout::kBlockScale;
         w.layers = "S";
       }},
      {"slot_mode", "legacy_wrap",
       [](CaseOverrides& w) { w.slot_mode = spec::SlotMode::kLegacyWrap; }}};
  for (const Told& t : told) {
    SCOPED_TRACE(t.axis);
    CheckOptions o = options(spec::Op::kWrite, 80);
    t.set(o.overrides.write);
    SubjectList subjects = make_cpu_subjects();
    const DetectResult r = detect(o, subjects, "cpu-unfused");
    std::cout << r.report();
    EXPECT_EQ(matched_values(r, t.axis), Values{t.value});
  }
}

TEST(DetectModes, SubjectNotToldItsModesIsNamedByWhatItDoes) {
  // A kernel with its own fixed arithmetic, whatever the configuration says: x * fl(1/s), and the
  // scaled value rounded to the model dtype first (SGLang's Triton write behind a torch cast).
  SubjectList subjects;
  subjects.push_back(
      make_function_subject("fixed-mul-recip-via", [](const auto& cfg, const auto& w, auto& out) {
        spec::ModelConfig own = cfg;
        own.kv.scale_mode = spec::ScaleMode::kMulRecip;
        own.kv.via_model_dtype = true;
        subjects::write_layer_fused(own, w, out);
      }));
  // bf16 caches: one fp32 ulp between x / s and x * fl(1/s) crosses a bf16 rounding boundary often
  // enough to tell them apart (an fp8 cache would need far more cases).
  // Activations drawn: fp16 ones make the rounding to the model dtype a double rounding.
  CheckOptions o = options(spec::Op::kWrite, 200);
  o.overrides.write.kv_dtype = spec::DType::kBF16;
  const DetectResult r = detect(o, subjects, "fixed-mul-recip-via");
  std::cout << r.report();
  ASSERT_EQ(r.outcome(), spec::Outcome::kPass);
  EXPECT_EQ(matched_values(r, "scale_mode"), (Values{"div_approx", "mul_recip"}));
  EXPECT_EQ(matched_values(r, "via_model_dtype"), Values{"true"});
  EXPECT_NE(r.report().find("told:    saturation=satfinite scale_mode=divide"), std::string::npos);
}

TEST(DetectModes, ApproximateDivisionIsNamedDivApprox) {
  SubjectList subjects;
  subjects.push_back(
      make_function_subject("approx-division", [](const auto& cfg, const auto& w, auto& out) {
        subjects::write_layer_fused_mutated(cfg, w, out, subjects::WriteMutation::kApproxDivision);
      }));
  CheckOptions o = options(spec::Op::kWrite, 150);
  const DetectResult r = detect(o, subjects, "approx-division");
  std::cout << r.report();
  ASSERT_EQ(r.outcome(), spec::Outcome::kPass);
  EXPECT_EQ(matched_values(r, "scale_mode"), Values{"div_approx"});
}

TEST(DetectModes, NoMatchReportsTheClosestCombinationAndItsMismatch) {
  SubjectList subjects;
  subjects.push_back(make_function_subject("truncating", [](const auto& cfg, const auto& w,
                                                            auto& out) {
    subjects::write_layer_fused_mutated(cfg, w, out, subjects::WriteMutation::kTruncatingMinusOne);
  }));
  CheckOptions o = options(spec::Op::kWrite, 100);
  const DetectResult r = detect(o, subjects, "truncating");
  std::cout << r.report();
  EXPECT_EQ(r.outcome(), spec::Outcome::kMismatch);
  ASSERT_TRUE(r.closest.has_value());
  ASSERT_TRUE(r.closest->failed_seed.has_value());
  EXPECT_NE(r.report().find("no combination matched every case"), std::string::npos);
  EXPECT_NE(r.report().find("guard band"), std::string::npos) << r.report();
  EXPECT_NE(r.reproduce.find("--detect-modes"), std::string::npos);
  EXPECT_NE(r.reproduce.find("--case-seed"), std::string::npos);
}

TEST(DetectModes, PruningKeepsTheCostNearOneCampaign) {
  CheckOptions o = options(spec::Op::kWrite, 200);
  SubjectList subjects = make_cpu_subjects();
  const DetectResult r = detect(o, subjects, "cpu-fused");
  std::cout << r.report();
  // The first case judges every combination; after it only the survivors are judged.
  EXPECT_LT(r.judgements, r.combinations + 10 * r.cases_run) << r.report();
  EXPECT_LT(r.judgements * 20, r.combinations * r.cases_run);
}

TEST(DetectModes, DenseInsertModesAreDetected) {
  CheckOptions o = options(spec::Op::kDense, 40);
  o.overrides.write.scale_mode = spec::ScaleMode::kMulRecip;
  o.overrides.write.kv_dtype = spec::DType::kBF16;
  SubjectList subjects = make_cpu_subjects();
  const DetectResult r = detect(o, subjects, "cpu-dense");
  std::cout << r.report();
  ASSERT_EQ(r.outcome(), spec::Outcome::kPass);
  EXPECT_EQ(matched_values(r, "scale_mode"), (Values{"div_approx", "mul_recip"}));
  // The dense insert has no index-K: its axes leave the block-scale modes out.
  for (const ModeAxis& a : r.axes) EXPECT_NE(a.name, "ue8m0");
}

TEST(DetectModes, DenseFp8StoreIsDetected) {
  // Told scaled, a kernel that stores fp8 with scale 1 (vLLM's fused insert) is named identity (or
  // scaled with scale mode none, the same bytes), and cpu-dense, which follows what it is told,
  // scaled (SPEC 4 dense_fp8_store).
  CheckOptions o = options(spec::Op::kDense, 40);
  o.overrides.write.scale_mode = spec::ScaleMode::kDivide;
  o.overrides.write.kv_dtype = spec::DType::kFp8E4M3;
  SubjectList subjects = make_cpu_subjects();
  subjects.push_back(make_cpu_dense_subject({.fp8_store_unscaled = true}, "fused-unscaled"));
  const DetectResult unscaled = detect(o, subjects, "fused-unscaled");
  std::cout << unscaled.report();
  ASSERT_EQ(unscaled.outcome(), spec::Outcome::kPass);
  const auto axis = [&](const std::string& name) {
    return static_cast<std::size_t>(
        std::find_if(unscaled.axes.begin(), unscaled.axes.end(),
                     [&](const ModeAxis& a) { return a.name == name; }) -
        unscaled.axes.begin());
  };
  const std::size_t store = axis("dense_fp8_store"), scale = axis("scale_mode");
  for (const ModeCombination& m : unscaled.matched) {
    const std::string& s = unscaled.axes[store].values[m.choice[store]];
    EXPECT_TRUE(s == "identity" || unscaled.axes[scale].values[m.choice[scale]] == "none");
  }
  EXPECT_EQ(unscaled.axes[store].values[unscaled.matched.front().choice[store]], "identity");
  const DetectResult told = detect(o, subjects, "cpu-dense");
  ASSERT_EQ(told.outcome(), spec::Outcome::kPass);
  EXPECT_EQ(matched_values(told, "dense_fp8_store"), (Values{"scaled"}));
}

TEST(DetectModes, IndexerToldItsModesIsNamedInThem) {
  // cpu-naive-f32 follows the params' index_nan and index_score_scale; cases with NaN index-K
  // tokens and scaled scores tell the modes apart.
  SubjectList subjects;
  subjects.push_back(make_cpu_naive_subject());
  CheckOptions o = options(spec::Op::kIndexer, 120);
  o.overrides.read.nan_index_k = true;
  o.overrides.read.index_nan = spec::IndexNan::kLowest;
  o.overrides.read.index_score_scale = spec::IndexScoreScale::kRsqrtDim;
  const DetectResult r = detect(o, subjects, "cpu-naive-f32");
  std::cout << r.report();
  ASSERT_EQ(r.outcome(), spec::Outcome::kPass);
  EXPECT_EQ(matched_values(r, "index_nan"), Values{"lowest"});
  // A positive factor keeps the blocks' order: a foreign indexer's ids cannot tell the score
  // scales apart (only ties through rounding could), so both stay, the told one among them.
  const Values scales = matched_values(r, "index_score_scale");
  EXPECT_NE(std::find(scales.begin(), scales.end(), "rsqrt_dim"), scales.end());
}

TEST(DetectModes, IndexerThatRanksNanBlocksFirstIsNamedIndexNanFirst) {
  // torch's amax + topk (TensorRT-LLM's torch selector), whatever it is told.
  ReadMutation nan_first;
  nan_first.nan_first = true;
  SubjectList subjects;
  subjects.push_back(make_cpu_naive_subject(nan_first, "amax-topk"));
  CheckOptions o = options(spec::Op::kIndexer, 120);
  o.overrides.read.nan_index_k = true;
  const DetectResult r = detect(o, subjects, "amax-topk");
  std::cout << r.report();
  ASSERT_EQ(r.outcome(), spec::Outcome::kPass);
  EXPECT_EQ(matched_values(r, "index_nan"), Values{"first"});
  EXPECT_NE(r.report().find("told:    index_nan=skip index_score_scale=one"), std::string::npos);
}

TEST(DetectModes, ASubjectWithoutModedOpsIsBadInput) {
  SubjectList subjects = make_cpu_subjects();
  CheckOptions o = options(spec::Op::kIndexer, 5);
  EXPECT_THROW(detect_modes(o, subjects, "cpu-fused"), spec::InvalidInput);
}

// Admissible sets in the campaign: the approximate division passes where div_approx is declared,
// every element outside its set still fails, and the report lists the set.
TEST(AdmissibleWrites, ApproximateDivisionPassesUnderDivApproxAndFailsUnderDivide) {
  SubjectList subjects;
  subjects.push_back(
      make_function_subject("approx-division", [](const auto& cfg, const auto& w, auto& out) {
        subjects::write_layer_fused_mutated(cfg, w, out, subjects::WriteMutation::kApproxDivision);
      }));
  CheckOptions o;
  o.seed = 0xA551;
  o.cases = 150;
  o.ops = {spec::Op::kWrite};
  o.overrides.write.scale_mode = spec::ScaleMode::kDivApprox;
  std::printf("seed 0x%llX\n", static_cast<unsigned long long>(o.seed));
  const CheckReport pass = run_check(o, subjects);
  EXPECT_EQ(pass.worst, spec::Outcome::kPass) << pass.summary();
  o.overrides.write.scale_mode = spec::ScaleMode::kDivide;
  const CheckReport fail = run_check(o, subjects);
  EXPECT_EQ(fail.worst, spec::Outcome::kMismatch) << fail.summary();
}

TEST(AdmissibleWrites, LegacyWrapRacesAdmitAnyWriterElementByElement) {
  // Three padding rows wrap onto the last slot: a kernel may keep any one of them per element.
  // The first writer everywhere passes; a value none of them wrote fails, with the set shown.
  SubjectList subjects;
  subjects.push_back(
      make_function_subject("first-writer", [](const auto& cfg, const auto& w, auto& out) {
        spec::LayerWrite reversed = w;  // the reference keeps the last writer: reverse the -1 rows
        std::vector<std::int64_t> rows;
        for (std::size_t t = 0; t < w.slots.slots.size(); ++t)
          if (w.slots.slots[t] < 0) rows.push_back(static_cast<std::int64_t>(t));
        const auto row_bytes = [&](const spec::HostTensor& x) {
          return static_cast<std::size_t>(x.numel() / x.shape[0]) * spec::dtype_bytes(x.dtype);
        };
        for (spec::HostTensor* x : {&reversed.k, &reversed.v, &reversed.index_k}) {
          if (x->shape.empty()) continue;
          const std::size_t n = row_bytes(*x);
          for (std::size_t i = 0; i < rows.size() / 2; ++i) {
            std::swap_ranges(
                x->bytes.begin() + static_cast<std::ptrdiff_t>(rows[i] * n),
                x->bytes.begin() + static_cast<std::ptrdiff_t>((rows[i] + 1) * n),
                x->bytes.begin() + static_cast<std::ptrdiff_t>(rows[rows.size() - 1 - i] * n));
          }
        }
        subjects::write_layer_fused(cfg, reversed, out);
      }));
  subjects.push_back(
      make_function_subject("padding-zeroed", [](const auto& cfg, const auto& w, auto& out) {
        spec::LayerWrite zeroed = w;
        for (std::size_t t = 0; t < w.slots.slots.size(); ++t) {
          if (w.slots.slots[t] >= 0) continue;
          for (spec::HostTensor* x : {&zeroed.k, &zeroed.v}) {
            const std::size_t n =
                static_cast<std::size_t>(x->numel() / x->shape[0]) * spec::dtype_bytes(x->dtype);
            std::fill_n(x->bytes.begin() + static_cast<std::ptrdiff_t>(t * n), n, 0x11);
          }
        }
        subjects::write_layer_fused(cfg, zeroed, out);
      }));
  CheckOptions o;
  o.seed = 0x4ACE;
  o.cases = 40;
  o.ops = {spec::Op::kWrite};
  o.overrides.write.slot_mode = spec::SlotMode::kLegacyWrap;
  o.overrides.write.layers = "DS";
  std::printf("seed 0x%llX\n", static_cast<unsigned long long>(o.seed));
  o.subjects = {"first-writer"};
  const CheckReport pass = run_check(o, subjects);
  EXPECT_EQ(pass.worst, spec::Outcome::kPass) << pass.summary();
  o.subjects = {"padding-zeroed"};
  const CheckReport fail = run_check(o, subjects);
  ASSERT_EQ(fail.worst, spec::Outcome::kMismatch) << fail.summary();
  EXPECT_NE(fail.subjects.front().first_failure.find("admissible codes {"), std::string::npos)
      << fail.subjects.front().first_failure;
}

}  // namespace
}  // namespace kvo::oracle
