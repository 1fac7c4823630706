// The reference tier's trust chain (issue 15): a tier answers the write and dense cases in place
// of the CPU reference and is judged against it, bit for bit, on the first cases, one in N and
// every case where a subject fails; a disagreement stops the campaign, failed to run. The same
// tests run with CPU answerers standing in for the GPU tier (everywhere) and with the CUDA
// answerers themselves (where a GPU answers).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvo/gpu/device_calls.hpp"
#ifdef KVO_HAVE_CUDA
#include <cuda_runtime.h>
#endif
#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/device_subject.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/mutants.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "tier_test_options.hpp"

namespace kvo::oracle {
namespace {

/// A write answerer that is the reference on its first `good_calls` layer writes and afterwards
/// turns the first byte of K (guard band excluded) into its complement: a tier gone wrong.
std::unique_ptr<Subject> diverging_answerer(std::int64_t good_calls) {
  auto calls = std::make_shared<std::int64_t>(0);
  return make_function_subject(
      "diverging-tier", [calls, good_calls](const spec::ModelConfig& c, const spec::LayerWrite& w,
                                            spec::LayerCaches& caches) {
        reference::write_layer(c, w, caches);
        if ((*calls)++ < good_calls) return;
        const reference::PagedCacheLayout layout(c);
        spec::CacheBuffer* k = caches.find(layout.kv_buffer(0));
        k->body()[0] = static_cast<std::uint8_t>(~k->body()[0]);
      });
}

CheckOptions tier_options(std::int64_t cases, std::int64_t first, std::int64_t every) {
  CheckOptions o;
  o.seed = 0x7135;
  o.cases = cases;
  o.ops = {spec::Op::kWrite};
  o.subjects = {"cpu-fused"};
  o.jobs = 1;
  o.tier = ReferenceTier::kGpu;
  o.tier_sample_first = first;
  o.tier_sample_every = every;
  o.device_lanes = kTestDeviceLanes;
  return o;
}

/// A write campaign of cpu-fused whose tier answerer goes wrong after `good_calls` layer writes.
CheckReport run_with_diverging_tier(std::int64_t good_calls, std::int64_t cases, std::int64_t first,
                                    std::int64_t every) {
  SubjectList subjects = make_subjects();
  const std::unique_ptr<Subject> wrong = diverging_answerer(good_calls);
  CheckOptions o = tier_options(cases, first, every);
  o.tier_answerers[spec::Op::kWrite] = wrong.get();
  return run_check(o, subjects);
}

TEST(ReferenceTier, ACorrectTierAnswersAndIsCheckedOnTheSample) {
  SubjectList subjects = make_subjects();
  CheckOptions o = tier_options(40, 4, 8);
  o.tier_answerers[spec::Op::kWrite] = &find_subject(subjects, "cpu-unfused");
  const CheckReport r = run_check(o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  // Cases 0-3, then 4, 12, 20, 28, 36 are answered by the CPU reference and check the tier.
  EXPECT_EQ(r.cpu_cases, 9);
  EXPECT_EQ(r.tier_cases, 31);
  EXPECT_EQ(r.tier_checks, 9);
  EXPECT_EQ(r.tier, ReferenceTier::kGpu);
  EXPECT_EQ(r.tier_answerers, "write: cpu-unfused");
  EXPECT_NE(r.summary().find("the gpu tier (write: cpu-unfused) answered 31 cases, the CPU "
                             "reference 9; the tier was judged against the CPU reference 9 times"),
            std::string::npos)
      << r.summary();
  // The same verdicts as the CPU reference's campaign.
  CheckOptions cpu = o;
  cpu.tier = ReferenceTier::kCpu;
  const CheckReport c = run_check(cpu, subjects);
  ASSERT_EQ(c.subjects.size(), r.subjects.size());
  EXPECT_EQ(c.subjects[0].count(spec::Outcome::kPass), r.subjects[0].count(spec::Outcome::kPass));
  EXPECT_EQ(c.cpu_cases, 40);
  EXPECT_EQ(c.tier_cases, 0);
}

TEST(ReferenceTier, ADivergentTierIsCaughtByTheFirstSample) {
  const CheckReport r = run_with_diverging_tier(0, 30, 2, 16);
  EXPECT_EQ(r.worst, spec::Outcome::kFailedToRun);
  EXPECT_EQ(r.cases_run, 0) << "the case the tier got wrong is not recorded";
  EXPECT_NE(r.tier_disagreement.find("case 0 seed 0x"), std::string::npos) << r.tier_disagreement;
  EXPECT_NE(r.tier_disagreement.find(
                "the gpu tier the write answerer diverging-tier disagrees with the CPU reference "
                "(mismatch)"),
            std::string::npos)
      << r.tier_disagreement;
  EXPECT_NE(r.summary().find("the campaign stopped"), std::string::npos);
}

// Outside the sample, a wrong answer shows as a subject failing against it: the case is judged
// again against the CPU reference, which convicts the tier, not the subject.
TEST(ReferenceTier, ADivergenceOutsideTheSampleIsCaughtWhereASubjectFails) {
  // Cases 0 and 1 (sampled) make a few layer writes through the check; the tier goes wrong after
  // 40, well inside the unsampled cases 2-1000.
  const CheckReport r = run_with_diverging_tier(40, 60, 1, 1000);
  EXPECT_EQ(r.worst, spec::Outcome::kFailedToRun) << r.summary();
  EXPECT_GT(r.cases_run, 1);
  EXPECT_LT(r.cases_run, 60);
  EXPECT_EQ(r.subjects[0].count(spec::Outcome::kMismatch), 0)
      << "cpu-fused is right: the tier is what disagrees";
  EXPECT_NE(r.tier_disagreement.find("case " + std::to_string(r.cases_run) + " seed"),
            std::string::npos)
      << r.tier_disagreement;
  EXPECT_EQ(r.tier_checks, 3) << "cases 0 and 1 (the first, then one in 1000), the failing one";
}

// A subject failing against the tier's answer keeps the CPU reference's verdict and report.
TEST(ReferenceTier, AFailingSubjectIsJudgedByTheCpuReference) {
  SubjectList subjects = make_subjects();
  add_named_mutants({"minus-one-wraps"}, subjects);
  CheckOptions o = tier_options(200, 0, 1000);
  o.subjects = {"minus-one-wraps"};
  o.tier_answerers[spec::Op::kWrite] = &find_subject(subjects, "cpu-unfused");
  const CheckReport r = run_check(o, subjects);
  CheckOptions cpu = o;
  cpu.tier = ReferenceTier::kCpu;
  const CheckReport c = run_check(cpu, subjects);
  ASSERT_EQ(c.worst, spec::Outcome::kMismatch) << c.summary();
  EXPECT_EQ(r.worst, spec::Outcome::kMismatch) << r.summary();
  EXPECT_EQ(r.subjects[0].first_failure, c.subjects[0].first_failure);
  EXPECT_EQ(r.subjects[0].count(spec::Outcome::kMismatch),
            c.subjects[0].count(spec::Outcome::kMismatch));
  EXPECT_GT(r.tier_cases, 0);
  // Case 0's sample, then one check per failing case the tier answered.
  EXPECT_GE(r.tier_checks, r.subjects[0].count(spec::Outcome::kMismatch));
  EXPECT_LE(r.tier_checks, 1 + r.subjects[0].count(spec::Outcome::kMismatch));
}

// The tier's answerer judged as a subject is judged against the CPU reference on every case.
TEST(ReferenceTier, TheAnswererAsASubjectIsNeverJudgedByItself) {
  SubjectList subjects = make_subjects();
  CheckOptions o = tier_options(20, 0, 1000);
  o.subjects = {"cpu-unfused"};
  o.tier_answerers[spec::Op::kWrite] = &find_subject(subjects, "cpu-unfused");
  const CheckReport r = run_check(o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass);
  EXPECT_EQ(r.tier_cases, 0);
  EXPECT_EQ(r.cpu_cases, 20);
}

// A campaign gives back the device memory the answerers' threads hold idle by running a task on
// each of them: once on each answering subject's own thread, where its calls run.
TEST(ReferenceTier, TasksRunOnEachAnswerersOwnThreadOnce) {
  SubjectList subjects = make_subjects();
  std::thread::id wrote_on;
  SubjectFunctions probe;
  probe.write = [&](const spec::ModelConfig&, const spec::LayerWrite&, spec::LayerCaches&) {
    wrote_on = std::this_thread::get_id();
  };
  const std::unique_ptr<Subject> probed = make_function_subject("probe", probe);
  const TierAnswerers tier =
      gpu_tier_answerers(subjects, {spec::Op::kWrite}, {{spec::Op::kWrite, probed.get()}}, {});
  std::vector<std::thread::id> tasks_on;
  tier.on_each_thread([&] { tasks_on.push_back(std::this_thread::get_id()); });
  ASSERT_EQ(tasks_on.size(), 1u);
  spec::LayerCaches caches;
  tier.of(spec::Op::kWrite)->write_layer(spec::ModelConfig{}, spec::LayerWrite{}, caches);
  EXPECT_EQ(wrote_on, tasks_on[0]);
  EXPECT_NE(tasks_on[0], std::this_thread::get_id());
}

TEST(ReferenceTier, BadTierSettingsAreNamed) {
  SubjectList subjects = make_subjects();
  CheckOptions o = tier_options(5, 0, 0);
  EXPECT_THROW(run_check(o, subjects), spec::InvalidInput);
  o = tier_options(5, -1, 4);
  EXPECT_THROW(run_check(o, subjects), spec::InvalidInput);
  o = tier_options(5, 1, 4);
  o.tier_answerers[spec::Op::kWrite] = &find_subject(subjects, "cpu-naive-f32");  // reads only
  EXPECT_THROW(run_check(o, subjects), spec::InvalidInput);
  SubjectFunctions gone;
  gone.write = [](const spec::ModelConfig&, const spec::LayerWrite&, spec::LayerCaches&) {};
  gone.unavailable_reason = [] { return std::string("no such device"); };
  const std::unique_ptr<Subject> unavailable = make_function_subject("gone", gone);
  o.tier_answerers[spec::Op::kWrite] = unavailable.get();
  try {
    run_check(o, subjects);
    ADD_FAILURE() << "expected FailedToRun";
  } catch (const spec::FailedToRun& e) {
    EXPECT_NE(std::string(e.what()).find("the gpu tier cannot run here: its write answerer gone "
                                         "is unavailable (no such device)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(parse_tier("auto", false), ReferenceTier::kCpu);
  EXPECT_EQ(parse_tier("auto", true), ReferenceTier::kGpu);
  EXPECT_THROW(parse_tier("tpu", true), spec::InvalidInput);
  // Out of range: InvalidInput naming the field.
  struct BadSetting {
    const char* field;
    std::int64_t value;
    std::int64_t CheckOptions::*member;
  };
  for (const BadSetting& bad :
       {BadSetting{"device_lanes", 0, &CheckOptions::device_lanes},
        BadSetting{"device_lanes", kMostDeviceLanes + 1, &CheckOptions::device_lanes},
        BadSetting{"heavy_lanes", 0, &CheckOptions::heavy_lanes},
        BadSetting{"heavy_lanes", 3, &CheckOptions::heavy_lanes},
        BadSetting{"resident_alone_bytes", -1, &CheckOptions::resident_alone_bytes}}) {
    o = tier_options(5, 1, 4);
    o.*bad.member = bad.value;
    try {
      run_check(o, subjects);
      ADD_FAILURE() << "expected InvalidInput for " << bad.field << " " << bad.value;
    } catch (const spec::InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(bad.field), std::string::npos) << e.what();
    }
  }
}

/// The GPU tier itself: the canonical CUDA write and dense insert answer, agree with the CPU
/// reference on its sample, and a planted fault in the tier's write is caught by it.
TEST(ReferenceTier, TheGpuTierAgreesAndAPlantedFaultInItIsCaught) {
  SubjectList subjects = make_subjects();
  const Subject& fused = find_subject(subjects, "cuda-fused");
  if (!fused.unavailable_reason().empty()) GTEST_SKIP() << fused.unavailable_reason();
  CheckOptions o = tier_options(200, 8, 16);
  o.ops = {spec::Op::kWrite, spec::Op::kDense};
  o.subjects = {"cpu-fused", "cpu-unfused", "cpu-dense"};
  o.jobs = 4;
  without_huge_caches(o);
  const CheckReport r = run_check(o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  EXPECT_EQ(r.tier_answerers, "write: cuda-fused, dense: cuda-dense-qknorm-rope");
  EXPECT_EQ(r.cpu_cases, 4);  // cases 1, 3, 5, 7 (then one in 16 from 8: even cases only)
  EXPECT_EQ(r.tier_cases, 96);
  add_named_mutants({"cuda-off-by-one-offset"}, subjects);
  o.tier_answerers[spec::Op::kWrite] = &find_subject(subjects, "cuda-off-by-one-offset");
  const CheckReport bad = run_check(o, subjects);
  EXPECT_EQ(bad.worst, spec::Outcome::kFailedToRun) << bad.summary();
  EXPECT_NE(bad.tier_disagreement.find("cuda-off-by-one-offset disagrees with the CPU reference"),
            std::string::npos)
      << bad.tier_disagreement;
}

/// `fn` handed a call whose K and V inputs are swapped (a launcher's argument order bug), on the
/// sparse layers only or on every layer.
DeviceWriteFn swapped_kv(DeviceWriteFn fn, bool sparse_only) {
  return [fn = std::move(fn), sparse_only](const gpu::DeviceWriteCall& call) {
    gpu::DeviceWriteCall swapped = call;
    if (!sparse_only || call.kind == spec::LayerKind::kSparse) std::swap(swapped.k, swapped.v);
    fn(swapped);
  };
}

/// The GPU tier's resident path (OpDriver::judge_on_device): a write campaign of a subject that
/// writes on the device is generated, written and compared there, with the verdicts of the same
/// campaign staged through the host; a subject's fault found there is judged again on the host
/// (the CPU reference's SPEC 7 report); a tier whose device write is not its host write is caught.
TEST(ReferenceTier, TheResidentPathJudgesWriteCasesOnTheDevice) {
  SubjectList subjects = make_subjects();
  const Subject& unfused = find_subject(subjects, "cuda-unfused");
  if (!unfused.unavailable_reason().empty()) GTEST_SKIP() << unfused.unavailable_reason();
  CheckOptions o = tier_options(200, 8, 16);
  o.subjects = {"cuda-unfused"};
  o.jobs = 4;
  without_huge_caches(o);
  const CheckReport r = run_check(o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  EXPECT_EQ(r.cpu_cases, 4);
  EXPECT_EQ(r.tier_cases, 96);
  // The tier's cases on the device (div_approx and legacy_wrap ones too: judged on the host by
  // their sets where a subject differs), and its device answer checked on the 4 sampled ones.
  EXPECT_GT(r.resident_cases, 80) << r.summary();
  EXPECT_EQ(r.resident_checks, 4) << r.summary();
  // cuda-unfused differs from cuda-fused on div_approx codes and colliding legacy_wrap slots: those
  // copies are judged from their device bytes by the sets, never sent back to the host path (whose
  // every case would check the tier once more).
  EXPECT_EQ(r.tier_checks, 4) << r.summary();
  EXPECT_NE(r.summary().find("of them on the device"), std::string::npos) << r.summary();
  // On the device lanes (cuda-unfused and cuda-fused launch statelessly), the verdicts of one.
  EXPECT_EQ(r.resident_lanes, kTestDeviceLanes) << r.summary();
  CheckOptions one_lane = o;
  one_lane.device_lanes = 1;
  const CheckReport r1 = run_check(one_lane, subjects);
  EXPECT_EQ(r1.resident_lanes, 1);
  expect_same_verdicts(r, r1);
  CheckOptions staged = o;
  staged.tier_resident = false;
  const CheckReport s = run_check(staged, subjects);
  EXPECT_EQ(s.worst, spec::Outcome::kPass) << s.summary();
  EXPECT_EQ(s.resident_cases, 0);
  EXPECT_EQ(s.tier_cases, r.tier_cases);

  // A subject's fault: found on the device, reported from the host (its host path runs the same
  // function on a staged call), as the staged campaign reports it.
  // Judged on the device lanes (its author says it launches statelessly) and on one.
  DeviceSubjectFunctions faulty;
  faulty.write = swapped_kv(unfused.device_write(), /*sparse_only=*/true);
  faulty.device_concurrent = true;
  subjects.push_back(make_device_subject("swapped-kv", faulty));
  o.subjects = staged.subjects = one_lane.subjects = {"swapped-kv"};
  const CheckReport bad = run_check(o, subjects);
  const CheckReport bad_staged = run_check(staged, subjects);
  EXPECT_EQ(bad.resident_lanes, kTestDeviceLanes) << bad.summary();
  expect_same_verdicts(bad, run_check(one_lane, subjects));
  EXPECT_EQ(bad.worst, spec::Outcome::kMismatch) << bad.summary();
  EXPECT_TRUE(bad.tier_disagreement.empty()) << bad.tier_disagreement;
  EXPECT_GT(bad.resident_cases, 80);
  EXPECT_GT(bad.subjects[0].count(spec::Outcome::kMismatch), 10) << bad.summary();
  EXPECT_EQ(bad.subjects[0].count(spec::Outcome::kMismatch),
            bad_staged.subjects[0].count(spec::Outcome::kMismatch));
  EXPECT_EQ(bad.subjects[0].first_failure, bad_staged.subjects[0].first_failure);

  // A tier whose device write is not its host write (right on the host, K and V swapped on the
  // device): caught by the first sampled case's device check ...
  SubjectFunctions two_faced;
  two_faced.write = [](const spec::ModelConfig& c, const spec::LayerWrite& w,
                       spec::LayerCaches& caches) { reference::write_layer(c, w, caches); };
  two_faced.device_write = swapped_kv(unfused.device_write(), /*sparse_only=*/false);
  two_faced.device_concurrent = true;  // on the lanes: the stop drops every case after it
  const std::unique_ptr<Subject> tier = make_function_subject("two-faced-tier", two_faced);
  o.subjects = {"cuda-unfused"};
  o.tier_answerers[spec::Op::kWrite] = tier.get();
  const CheckReport sampled = run_check(o, subjects);
  EXPECT_EQ(sampled.worst, spec::Outcome::kFailedToRun) << sampled.summary();
  EXPECT_EQ(sampled.cases_run, 0) << sampled.summary();
  EXPECT_EQ(sampled.resident_lanes, kTestDeviceLanes) << sampled.summary();
  EXPECT_NE(sampled.tier_disagreement.find("case 1 seed"), std::string::npos)
      << sampled.tier_disagreement;
  EXPECT_NE(sampled.tier_disagreement.find("the write answerer two-faced-tier writing on the "
                                           "device (inputs generated there) disagrees with the "
                                           "CPU reference"),
            std::string::npos)
      << sampled.tier_disagreement;
  // ... and, with no sampled case in the shard (only case 0 is), where the subject differs from it
  // on the device and passes on the host.
  o.tier_sample_first = 0;
  o.tier_sample_every = 1000;
  const CheckReport unsampled = run_check(o, subjects);
  EXPECT_EQ(unsampled.worst, spec::Outcome::kFailedToRun) << unsampled.summary();
  one_lane = o;
  one_lane.device_lanes = 1;
  expect_same_verdicts(unsampled, run_check(one_lane, subjects));
  EXPECT_EQ(unsampled.resident_checks, 0);
  EXPECT_NE(unsampled.tier_disagreement.find("resident path disagrees with the host: cuda-unfused, "
                                             "on the device: layer"),
            std::string::npos)
      << unsampled.tier_disagreement;
}

/// A resident campaign settles its cases in order while the admissible-set diffs of the copies
/// it downloaded finish off the main thread (Verdict::finish): with --fail-fast it stops at the
/// case a campaign judging one case at a time stops at, with the same first failure, and records
/// nothing past it.
TEST(ReferenceTier, AResidentCampaignStopsAtTheFirstFailureAStagedOneStopsAt) {
  SubjectList subjects = make_subjects();
  const Subject& unfused = find_subject(subjects, "cuda-unfused");
  if (!unfused.unavailable_reason().empty()) GTEST_SKIP() << unfused.unavailable_reason();
  DeviceSubjectFunctions faulty;
  faulty.write = swapped_kv(unfused.device_write(), /*sparse_only=*/true);
  faulty.device_concurrent = true;  // judged on the device lanes, cases in flight past the stop
  subjects.push_back(make_device_subject("swapped-kv", faulty));
  // No case of the odd shard sampled (only case 0 is): the first failure is a resident case's.
  CheckOptions o = tier_options(200, 0, 1000);
  o.subjects = {"swapped-kv"};
  o.jobs = 4;
  o.fail_fast = true;
  without_huge_caches(o);
  CheckOptions staged = o;
  staged.tier_resident = false;
  const CheckReport r = run_check(o, subjects);
  const CheckReport s = run_check(staged, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kMismatch) << r.summary();
  EXPECT_GT(r.resident_cases, 0) << r.summary();
  EXPECT_EQ(r.cases_run, s.cases_run);
  EXPECT_EQ(r.subjects[0].count(spec::Outcome::kMismatch), 1) << r.summary();
  EXPECT_EQ(r.subjects[0].first_failure, s.subjects[0].first_failure);
  EXPECT_EQ(r.resident_lanes, kTestDeviceLanes) << r.summary();
  CheckOptions one_lane = o;
  one_lane.device_lanes = 1;
  expect_same_verdicts(r, run_check(one_lane, subjects));
}

#ifdef KVO_HAVE_CUDA
/// A huge write case judged on the device, its tier copy holding only the pages its writes touch
/// (gpu::DefinedCopies::kFirst): a subject that writes the case right passes, and one that also
/// writes a few bytes far from every page the case names is caught there, as the host path (the
/// CPU reference's SPEC 7 report, which the campaign records) catches it.
TEST(ReferenceTier, AHugeCasesStrayWriteFarFromItsPagesIsCaughtOnTheDevice) {
  SubjectList subjects = make_subjects();
  const Subject& unfused = find_subject(subjects, "cuda-unfused");
  if (!unfused.unavailable_reason().empty()) GTEST_SKIP() << unfused.unavailable_reason();
  // Cases 6 and 14: the huge-cache theme's (kThemeHugeCache), neither sampled.
  CheckOptions o = tier_options(16, 0, 1000);
  o.total_shards = 8;
  o.shard_index = 6;
  o.subjects = {"cuda-unfused"};
  const CheckReport r = run_check(o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  EXPECT_EQ(r.resident_cases, 2) << r.summary();
  // Both on the heavy lane, whose pool keeps the first case's copies for the second.
  EXPECT_EQ(r.resident_lanes, kTestDeviceLanes) << r.summary();
  EXPECT_GT(r.resident_large_requests, 0) << r.summary();
  EXPECT_GT(r.resident_large_reused, 0) << r.summary();
  EXPECT_EQ(r.resident_alone, 0) << r.summary();
  // Past resident_alone_bytes (here 1 GiB; by default half the device's memory) each huge case
  // runs on the device alone, every lane's and the tier's idle device memory given back first:
  // the same verdicts, on any number of lanes.
  CheckOptions alone = o;
  alone.resident_alone_bytes = std::int64_t{1} << 30;
  const CheckReport ra = run_check(alone, subjects);
  EXPECT_EQ(ra.worst, spec::Outcome::kPass) << ra.summary();
  EXPECT_EQ(ra.resident_cases, 2) << ra.summary();
  EXPECT_EQ(ra.resident_alone, 2) << ra.summary();
  EXPECT_NE(ra.summary().find("2 cases of copies past 1 GiB ran on the device alone"),
            std::string::npos)
      << ra.summary();
  alone.device_lanes = 1;
  expect_same_verdicts(ra, run_check(alone, subjects));
  // Two heavy lanes: the two cases on lanes 0 and 1 side by side, the same verdicts.
  CheckOptions two_heavy = o;
  two_heavy.heavy_lanes = 2;
  expect_same_verdicts(r, run_check(two_heavy, subjects));

  DeviceSubjectFunctions stray;
  stray.write = [fn = unfused.device_write()](const gpu::DeviceWriteCall& call) {
    fn(call);
    // Eight bytes in K's fourth page: a huge case writes near its cache's end (and a padding
    // slot's wrap lands in the last block).
    auto* k = static_cast<std::uint8_t*>(call.caches.k_cache.data);
    ASSERT_EQ(cudaMemsetAsync(k + 3 * 4096 + 1, 0xA5, 8, static_cast<cudaStream_t>(call.stream)),
              cudaSuccess);
  };
  stray.device_concurrent = true;  // the huge cases on the heavy lane
  subjects.push_back(make_device_subject("stray-far", stray));
  o.subjects = {"stray-far"};
  const CheckReport bad = run_check(o, subjects);
  EXPECT_EQ(bad.worst, spec::Outcome::kMismatch) << bad.summary();
  EXPECT_TRUE(bad.tier_disagreement.empty()) << bad.tier_disagreement;
  EXPECT_EQ(bad.resident_cases, 2) << bad.summary();
  EXPECT_EQ(bad.subjects[0].count(spec::Outcome::kMismatch), 2) << bad.summary();
  EXPECT_EQ(bad.resident_lanes, kTestDeviceLanes) << bad.summary();
}
#endif  // KVO_HAVE_CUDA

}  // namespace
}  // namespace kvo::oracle
