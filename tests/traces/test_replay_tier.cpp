// Replay's reference tiers (issue 15): the GPU tier's answerers write the reference caches of the
// replayed steps, checked bit for bit against the CPU reference on every layer of the sampled
// steps and wherever a write subject fails; any disagreement stops the replay, failed to run. CPU
// subjects stand in for the CUDA answerers here (the tier's logic is the same; the GPU tests run
// the CUDA ones), planted with divergences at sampled and unsampled steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/mutants.hpp"
#include "kvo/reference/dense_insert.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/traces/replay.hpp"
#include "trace_fixture.hpp"

namespace kvo::traces {
namespace {

using testing::small_trace;

/// The subject of `name` from a fresh list (a different instance from any a replay judges).
std::unique_ptr<oracle::Subject> fresh(const std::string& name) {
  for (auto& s : oracle::make_subjects()) {
    if (s->name() == name) return std::move(s);
  }
  ADD_FAILURE() << "no subject " << name;
  return nullptr;
}

oracle::SubjectList subjects_named(std::initializer_list<const char*> names) {
  oracle::SubjectList out;
  for (const char* n : names) out.push_back(fresh(n));
  return out;
}

/// The GPU tier with `write` answering the write layers: checked on steps 0, 1, then 2, 6, 10.
ReplayOptions tier_options(oracle::Subject* write, oracle::Subject* dense = nullptr) {
  ReplayOptions o;
  o.tier = oracle::ReferenceTier::kGpu;
  o.tier_sample_first = 2;
  o.tier_sample_every = 4;
  o.tier_answerers[spec::Op::kWrite] = write;
  if (dense != nullptr) o.tier_answerers[spec::Op::kDense] = dense;
  return o;
}

std::unique_ptr<oracle::Subject> diverging_at(const Trace& t, std::size_t step,
                                              std::int64_t stray_block = -1) {
  return testing::planted_at("diverging-tier", t, step, stray_block);
}

TEST(TraceReplayTier, AnAgreeingTierAnswersAndIsCheckedOnItsSample) {
  const Trace t = small_trace();
  const auto steps = static_cast<std::int64_t>(t.steps.size());
  const auto layers = static_cast<std::int64_t>(t.config.layers.size());
  ASSERT_EQ(steps, 12);
  auto answerer = fresh("cpu-fused");
  for (const std::int64_t jobs : {1, 3}) {
    SCOPED_TRACE("jobs " + std::to_string(jobs));
    oracle::SubjectList subjects = subjects_named({"cpu-fused", "cpu-unfused"});
    ReplayOptions o = tier_options(answerer.get());
    o.jobs = jobs;
    o.full_diff_every = 5;
    const ReplayReport r = replay_trace(t, o, subjects);
    EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
    EXPECT_TRUE(r.tier_disagreement.empty());
    EXPECT_EQ(r.tier, oracle::ReferenceTier::kGpu);
    EXPECT_EQ(r.tier_answerers, "write: cpu-fused");
    // Sampled steps 0, 1, 2, 6, 10: the CPU reference answers them and checks the tier.
    EXPECT_EQ(r.tier_checks, 5 * layers);
    EXPECT_EQ(r.cpu_layers, 5 * layers);
    EXPECT_EQ(r.tier_layers, (steps - 5) * layers);
    EXPECT_NE(r.summary().find("reference: the gpu tier (write: cpu-fused) answered 14 layer "
                               "writes, the CPU reference 10; the tier checked against the CPU "
                               "reference on 10"),
              std::string::npos)
        << r.summary();
    // The subjects' verdicts are the CPU tier's.
    oracle::SubjectList again = subjects_named({"cpu-fused", "cpu-unfused"});
    ReplayOptions cpu;
    cpu.full_diff_every = 5;
    const ReplayReport c = replay_trace(t, cpu, again);
    EXPECT_EQ(c.tier_layers, 0);
    EXPECT_EQ(c.cpu_layers, steps * layers);
    EXPECT_EQ(c.summary().find("reference:"), std::string::npos) << c.summary();
    EXPECT_EQ(r.compared_bytes, c.compared_bytes);
    ASSERT_EQ(r.subjects.size(), c.subjects.size());
    for (std::size_t i = 0; i < r.subjects.size(); ++i) {
      EXPECT_EQ(r.subjects[i].outcome, c.subjects[i].outcome);
      EXPECT_EQ(r.subjects[i].layer_writes, c.subjects[i].layer_writes);
    }
  }
}

TEST(TraceReplayTier, ADivergentTierIsCaughtOnASampledStep) {
  const Trace t = small_trace();
  auto answerer = diverging_at(t, 6);
  oracle::SubjectList subjects = subjects_named({"cpu-fused"});
  const ReplayReport r = replay_trace(t, tier_options(answerer.get()), subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kFailedToRun) << r.summary();
  EXPECT_TRUE(r.mismatches.empty()) << "no subject is blamed for the tier's fault";
  EXPECT_EQ(r.subjects[0].outcome, spec::Outcome::kPass);
  EXPECT_NE(r.tier_disagreement.find("step 6, layer 0: the write answerer diverging-tier "
                                     "disagrees with the CPU reference on a sampled step"),
            std::string::npos)
      << r.tier_disagreement;
  // SPEC 7: the first differing byte with its coordinates and both values.
  EXPECT_NE(r.tier_disagreement.find("first: layer 0, buffer=k"), std::string::npos)
      << r.tier_disagreement;
  EXPECT_NE(r.tier_disagreement.find("expected byte"), std::string::npos) << r.tier_disagreement;
  EXPECT_NE(r.summary().find("tier disagreement: step 6"), std::string::npos);
  EXPECT_EQ(r.steps_run, 7);
}

/// Step 4 is not sampled: the tier's fault shows only as a subject that disagrees with it, and
/// the CPU reference's own caches of the layer (replayed from step 0) decide who is wrong.
TEST(TraceReplayTier, ADivergenceOnAnUnsampledStepIsCaughtWhereASubjectFails) {
  const Trace t = small_trace();
  auto answerer = diverging_at(t, 4);
  for (const bool keep_going : {false, true}) {
    SCOPED_TRACE("keep_going " + std::to_string(keep_going));
    oracle::SubjectList subjects = subjects_named({"cpu-fused"});
    ReplayOptions o = tier_options(answerer.get());
    o.keep_going = keep_going;
    const ReplayReport r = replay_trace(t, o, subjects);
    EXPECT_EQ(r.worst, spec::Outcome::kFailedToRun) << r.summary();
    EXPECT_TRUE(r.mismatches.empty());
    EXPECT_NE(r.tier_disagreement.find("step 4, layer 0: the write answerer diverging-tier "
                                       "disagrees with the CPU reference (its caches replayed "
                                       "from step 0 through 4)"),
              std::string::npos)
        << r.tier_disagreement;
    EXPECT_EQ(r.steps_run, 5);
  }
}

TEST(TraceReplayTier, AStrayWriteOfTheTierIsCaughtByTheWholeCacheComparison) {
  const Trace t = small_trace();
  std::vector<bool> named(static_cast<std::size_t>(t.config.geometry.num_blocks), false);
  for (std::size_t s = 4; s < t.steps.size(); ++s) {  // a block no step from 4 on names
    for (std::int64_t slot : t.steps[s].slot_mapping.values) {
      if (slot >= 0) named[static_cast<std::size_t>(slot / t.config.geometry.block_size)] = true;
    }
  }
  const std::int64_t block = std::find(named.begin(), named.end(), false) - named.begin();
  ASSERT_LT(block, t.config.geometry.num_blocks) << "the fixture should leave a block unnamed";
  auto answerer = diverging_at(t, 4, block);
  oracle::SubjectList subjects = subjects_named({"cpu-fused"});
  ReplayOptions o = tier_options(answerer.get());
  o.full_diff_every = 4;  // whole caches after steps 3, 7, 11
  const ReplayReport r = replay_trace(t, o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kFailedToRun) << r.summary();
  EXPECT_TRUE(r.mismatches.empty());
  EXPECT_NE(r.tier_disagreement.find("step 7, layer 0: the write answerer diverging-tier "
                                     "disagrees with the CPU reference"),
            std::string::npos)
      << r.tier_disagreement;
}

/// A subject's own bug stays the subject's: the tier agrees with the CPU reference on the layer
/// where the subject fails (checked once more there).
TEST(TraceReplayTier, ASubjectFailingAgainstAnAgreeingTierIsStillAMismatch) {
  const Trace t = small_trace();
  auto answerer = fresh("cpu-fused");
  oracle::SubjectList subjects;
  subjects.push_back(diverging_at(t, 4));
  const ReplayReport r = replay_trace(t, tier_options(answerer.get()), subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kMismatch) << r.summary();
  EXPECT_TRUE(r.tier_disagreement.empty()) << r.tier_disagreement;
  ASSERT_EQ(r.mismatches.size(), 1u);
  EXPECT_NE(r.mismatches[0].find("subject diverging-tier, step 4, layer 0"), std::string::npos)
      << r.mismatches[0];
  const auto layers = static_cast<std::int64_t>(t.config.layers.size());
  EXPECT_EQ(r.tier_checks, 3 * layers + 1) << "steps 0-2 sampled, and the failing layer";
}

TEST(TraceReplayTier, TheDenseTierAnswersFusedDenseLayersAndItsQIsChecked) {
  Trace t = small_trace();  // layers DS
  t.read.dense_rotary_dim = 8;
  auto write = fresh("cpu-fused");
  auto dense = fresh("cpu-dense");
  oracle::SubjectList subjects = subjects_named({"cpu-fused", "cpu-dense"});
  ReplayOptions o = tier_options(write.get(), dense.get());
  o.ops = {spec::Op::kWrite, spec::Op::kDense};
  const ReplayReport r = replay_trace(t, o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  EXPECT_EQ(r.tier_answerers, "write: cpu-fused, dense: cpu-dense");
  EXPECT_EQ(r.tier_layers, 2 * 7);
  EXPECT_EQ(r.tier_checks, 2 * 5);

  // q_out one ulp off on every call: caught on the first sampled step, the caches being right.
  oracle::SubjectFunctions f;
  f.dense = [](const spec::ModelConfig& c, const spec::DenseInsert& in, spec::LayerCaches& caches) {
    spec::HostTensor q = reference::dense_insert(c, in, caches);
    q.bytes[0] ^= 0x01;
    return q;
  };
  auto off_q = oracle::make_function_subject("off-q", std::move(f));
  oracle::SubjectList again = subjects_named({"cpu-fused", "cpu-dense"});
  const ReplayReport bad = replay_trace(t, tier_options(write.get(), off_q.get()), again);
  EXPECT_EQ(bad.worst, spec::Outcome::kFailedToRun) << bad.summary();
  EXPECT_NE(bad.tier_disagreement.find("step 0, layer 0: the dense answerer off-q disagrees with "
                                       "the CPU reference on a sampled step\n"),
            std::string::npos)
      << bad.tier_disagreement;
  EXPECT_NE(bad.tier_disagreement.find("q_out: 1 of"), std::string::npos);
  EXPECT_NE(bad.tier_disagreement.find("first: query 0 head 0 dim 0: expected"), std::string::npos)
      << bad.tier_disagreement;
}

/// A passing replay whose every layer write the CPU reference answered, the tier never asked.
void expect_answered_by_the_cpu(const Trace& t, const ReplayReport& r) {
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  EXPECT_EQ(r.tier_layers, 0);
  EXPECT_EQ(r.tier_checks, 0);
  EXPECT_EQ(r.cpu_layers, static_cast<std::int64_t>(t.steps.size() * t.config.layers.size()));
}

/// div_approx admits several codes per element: the answer is not one set of bytes, so the CPU
/// reference answers every layer (the tier, planted here, is never asked).
TEST(TraceReplayTier, WhereTheModesAdmitSeveralCodesTheCpuAnswers) {
  Trace t = small_trace();
  t.config.kv.cache_dtype = spec::DType::kFp8E4M3;
  t.config.kv.scale_mode = spec::ScaleMode::kDivApprox;
  auto answerer = diverging_at(t, 0);
  oracle::SubjectList subjects = subjects_named({"cpu-fused"});
  const ReplayReport r = replay_trace(t, tier_options(answerer.get()), subjects);
  expect_answered_by_the_cpu(t, r);
}

/// The answerer judged as a subject is never judged against itself: the CPU reference answers its
/// op.
TEST(TraceReplayTier, AnAnswererThatIsAlsoJudgedLeavesItsOpToTheCpu) {
  const Trace t = small_trace();
  oracle::SubjectList subjects = subjects_named({"cpu-fused"});
  const ReplayReport r = replay_trace(t, tier_options(subjects.front().get()), subjects);
  expect_answered_by_the_cpu(t, r);
}

TEST(TraceReplayTier, ATierThatCannotRunIsRefusedBeforeAnyStep) {
  const Trace t = small_trace();
  oracle::SubjectList subjects = subjects_named({"cpu-fused"});
  oracle::SubjectFunctions gone;
  gone.write = [](const spec::ModelConfig&, const spec::LayerWrite&, spec::LayerCaches&) {};
  gone.unavailable_reason = [] { return std::string("no CUDA device"); };
  auto nowhere = oracle::make_function_subject("cuda-nowhere", std::move(gone));
  try {
    replay_trace(t, tier_options(nowhere.get()), subjects);
    ADD_FAILURE() << "an unavailable answerer ran";
  } catch (const spec::FailedToRun& e) {
    EXPECT_NE(std::string(e.what()).find("the gpu tier cannot run here: its write answerer "
                                         "cuda-nowhere is unavailable (no CUDA device)"),
              std::string::npos)
        << e.what();
  }
  auto reader = fresh("cpu-naive-f32");  // reads only
  EXPECT_THROW(replay_trace(t, tier_options(reader.get()), subjects), spec::InvalidInput);
  ReplayOptions bad = tier_options(fresh("cpu-fused").release());
  std::unique_ptr<oracle::Subject> owned(bad.tier_answerers[spec::Op::kWrite]);
  bad.tier_sample_every = 0;
  EXPECT_THROW(replay_trace(t, bad, subjects), spec::InvalidInput);
  // A configuration the answerer does not implement: failed to run at the first layer.
  oracle::SubjectFunctions f;
  f.write = [](const spec::ModelConfig&, const spec::LayerWrite&, spec::LayerCaches&) {
    throw spec::Unsupported("this layout");
  };
  auto unsupported = oracle::make_function_subject("picky", std::move(f));
  const ReplayReport r = replay_trace(t, tier_options(unsupported.get()), subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kFailedToRun);
  EXPECT_NE(r.tier_disagreement.find("step 0, layer 0: the write answerer picky does not "
                                     "implement this trace's configuration (this layout)"),
            std::string::npos)
      << r.tier_disagreement;
}

/// On a GPU: the CUDA tier (cuda-fused) replays a committed trace with the CPU subjects passing,
/// and a planted CUDA fault as the answerer is caught on the first sampled step.
TEST(TraceReplayTier, TheCudaTierReplaysACommittedTraceAndAPlantedFaultIsCaught) {
  oracle::SubjectList subjects = oracle::make_subjects();
  const oracle::Subject* fused = nullptr;
  for (const auto& s : subjects) {
    if (s->name() == "cuda-fused") fused = s.get();
  }
  if (fused == nullptr) GTEST_SKIP() << "built without CUDA";
  if (!fused->unavailable_reason().empty()) GTEST_SKIP() << fused->unavailable_reason();
  const Trace t = load_trace(testing::trace_data_dir() / "serving_bf16_nhd.st");
  ReplayOptions o;
  o.tier = oracle::ReferenceTier::kGpu;
  o.tier_sample_first = 2;
  o.tier_sample_every = 8;
  o.step_end = 40;
  o.subjects = {"cpu-fused", "cpu-unfused"};
  const ReplayReport r = replay_trace(t, o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  EXPECT_EQ(r.tier_answerers, "write: cuda-fused");
  const auto layers = static_cast<std::int64_t>(t.config.layers.size());
  EXPECT_EQ(r.tier_checks, 7 * layers) << "steps 0, 1, 2, 10, 18, 26, 34";
  EXPECT_EQ(r.tier_layers, 33 * layers);
  oracle::add_named_mutants({"cuda-off-by-one-offset"}, subjects);
  o.tier_answerers[spec::Op::kWrite] = &oracle::find_subject(subjects, "cuda-off-by-one-offset");
  const ReplayReport bad = replay_trace(t, o, subjects);
  EXPECT_EQ(bad.worst, spec::Outcome::kFailedToRun) << bad.summary();
  EXPECT_NE(bad.tier_disagreement.find("step 0, layer 0: the write answerer "
                                       "cuda-off-by-one-offset disagrees with the CPU reference"),
            std::string::npos)
      << bad.tier_disagreement;
}

}  // namespace
}  // namespace kvo::traces
