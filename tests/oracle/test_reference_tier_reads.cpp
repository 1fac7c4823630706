// The reference tier on the read ops (issue 15): a tier's answerer answers the whole read case, its
// selection with the block scores that order it and the exact attention output over the selection
// handed to attention, and is judged bit for bit against the CPU reference on the sample and where
// a subject fails. The same tests run with a CPU answerer standing in for the GPU tier
// (everywhere) and with the CUDA answerer itself (where a GPU answers).
#include <gtest/gtest.h>
#ifdef KVO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "kvo/gpu/read.hpp"
#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/device_subject.hpp"
#include "kvo/oracle/mutants.hpp"
#include "kvo/oracle/reference_tier.hpp"
#include "kvo/reference/read_path.hpp"
#include "tier_test_options.hpp"

namespace kvo::oracle {
namespace {

/// What a read answerer standing in for the tier gets wrong, from its `good_cases`-th case on.
enum class ReadDamage { kNone, kScore, kIds, kOutput };

/// The CPU reference as a read answerer (the GPU tier's stand-in): each case's selection with its
/// scores, and the exact output; `damage` planted from its `good_cases`-th selection on: one
/// valid block's score one ulp up (the ids unchanged), the first id of the first row with a
/// choice replaced by -1, or the output's first element's lowest bit flipped.
std::unique_ptr<Subject> read_answerer(ReadDamage damage = ReadDamage::kNone,
                                       std::int64_t good_cases = 0) {
  auto cases = std::make_shared<std::int64_t>(0);
  auto damaged = std::make_shared<bool>(false);
  SubjectFunctions f;
  f.indexer_selection = [=](const ReadCase& c) {
    reference::TopkSelection s =
        reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches);
    *damaged = (*cases)++ >= good_cases && damage != ReadDamage::kNone;
    if (!*damaged) return s;
    if (damage == ReadDamage::kScore) {
      for (std::int64_t q = 0; q < s.num_queries; ++q) {
        if (s.n_valid[static_cast<std::size_t>(q)] == 0) continue;
        float& v =
            s.scores[reference::score_index(q, 0, 0, s.num_kv_heads * s.lanes, s.max_blocks)];
        v = std::nextafter(v, INFINITY);
        break;
      }
    } else if (damage == ReadDamage::kIds) {
      for (std::int32_t& id : s.ids) {
        if (id >= 0) {
          id = -1;
          break;
        }
      }
    }
    return s;
  };
  f.indexer = [](const ReadCase& c) {
    return reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches).ids;
  };
  f.attention = [=](const ReadCase& c, const reference::TopkSelection* sel) {
    spec::HostTensor out = reference::attention(c.config, c.attention, c.batch, c.q, c.caches,
                                                c.k_scale, c.v_scale, sel)
                               .out;
    if (*damaged && damage == ReadDamage::kOutput && !out.bytes.empty()) out.bytes[0] ^= 1;
    return out;
  };
  return make_function_subject("stand-in-read-tier", f);
}

/// A canonical read subject judged bit for bit: the CPU reference's ids and output.
std::unique_ptr<Subject> canonical_reads() {
  SubjectFunctions f;
  f.indexer = [](const ReadCase& c) {
    return reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches).ids;
  };
  f.attention = [](const ReadCase& c, const reference::TopkSelection* sel) {
    return reference::attention(c.config, c.attention, c.batch, c.q, c.caches, c.k_scale, c.v_scale,
                                sel)
        .out;
  };
  f.concurrent = true;
  return make_function_subject("canonical-reads", f);
}

CheckOptions read_tier_options(std::int64_t cases, std::int64_t first, std::int64_t every) {
  CheckOptions o;
  o.seed = 0x2EAD;
  o.cases = cases;
  o.ops = {spec::Op::kIndexer, spec::Op::kAttention};
  o.subjects = {"cpu-naive-f32", "canonical-reads"};
  o.jobs = 2;
  o.tier = ReferenceTier::kGpu;
  o.tier_sample_first = first;
  o.tier_sample_every = every;
  o.device_lanes = kTestDeviceLanes;
  return o;
}

/// The same campaign on the CPU tier, whose passes per subject must be `r`'s.
CheckReport cpu_tier_passes_alike(const CheckOptions& o, SubjectList& subjects,
                                  const CheckReport& r) {
  CheckOptions cpu = o;
  cpu.tier = ReferenceTier::kCpu;
  CheckReport c = run_check(cpu, subjects);
  EXPECT_EQ(c.subjects.size(), r.subjects.size());
  for (std::size_t i = 0; i < std::min(c.subjects.size(), r.subjects.size()); ++i) {
    EXPECT_EQ(c.subjects[i].count(spec::Outcome::kPass), r.subjects[i].count(spec::Outcome::kPass))
        << c.subjects[i].name;
  }
  return c;
}

/// A read campaign whose tier is the stand-in with `damage` from its `good_cases`-th case on.
CheckReport run_read_tier(ReadDamage damage, std::int64_t good_cases, std::int64_t cases,
                          std::int64_t first, std::int64_t every) {
  SubjectList subjects = make_subjects();
  subjects.push_back(canonical_reads());
  const std::unique_ptr<Subject> tier = read_answerer(damage, good_cases);
  CheckOptions o = read_tier_options(cases, first, every);
  o.jobs = 1;  // the damage counts cases in order
  o.tier_answerers[spec::Op::kIndexer] = tier.get();
  o.tier_answerers[spec::Op::kAttention] = tier.get();
  return run_check(o, subjects);
}

TEST(ReferenceTierReads, ATierAnswersReadCasesWithTheCpuReferencesVerdicts) {
  SubjectList subjects = make_subjects();
  subjects.push_back(canonical_reads());
  const std::unique_ptr<Subject> tier = read_answerer();
  CheckOptions o = read_tier_options(30, 4, 8);
  o.tier_answerers[spec::Op::kIndexer] = tier.get();
  o.tier_answerers[spec::Op::kAttention] = tier.get();
  const CheckReport r = run_check(o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  // Cases 0-3, then 4, 12, 20, 28: answered by the CPU reference, the tier checked on each.
  EXPECT_EQ(r.cpu_cases, 8);
  EXPECT_EQ(r.tier_cases, 22);
  EXPECT_EQ(r.tier_checks, 8);
  EXPECT_EQ(r.tier_answerers, "indexer: stand-in-read-tier, attention: stand-in-read-tier");
  // The CPU tier's campaign: the same verdicts and the same rare conditions reached (the tier's
  // scores order the selection handed to attention and mark the ties at the cut).
  const CheckReport c = cpu_tier_passes_alike(o, subjects, r);
  EXPECT_EQ(c.tier_cases, 0);
  ASSERT_EQ(c.coverage.size(), r.coverage.size());
  std::int64_t reached = 0;
  for (std::size_t i = 0; i < c.coverage.size(); ++i) {
    EXPECT_EQ(c.coverage[i].reached, r.coverage[i].reached) << c.coverage[i].condition;
    EXPECT_EQ(c.coverage[i].first_case, r.coverage[i].first_case) << c.coverage[i].condition;
    reached += r.coverage[i].reached;
  }
  EXPECT_GT(reached, 30) << r.coverage_table();
}

TEST(ReferenceTierReads, ATierWhoseScoresAreOffIsCaughtByTheFirstSample) {
  const CheckReport r = run_read_tier(ReadDamage::kScore, 0, 20, 2, 16);
  EXPECT_EQ(r.worst, spec::Outcome::kFailedToRun) << r.summary();
  EXPECT_EQ(r.cases_run, 0);
  EXPECT_NE(r.tier_disagreement.find("case 0 seed 0x"), std::string::npos) << r.tier_disagreement;
  EXPECT_NE(r.tier_disagreement.find("stand-in-read-tier disagrees with the CPU reference "
                                     "(mismatch)"),
            std::string::npos)
      << r.tier_disagreement;
  EXPECT_NE(r.tier_disagreement.find("the selection: block score of query row"), std::string::npos)
      << r.tier_disagreement;
}

TEST(ReferenceTierReads, ATierWhoseIdsAreOffIsCaughtByTheFirstSample) {
  const CheckReport r = run_read_tier(ReadDamage::kIds, 0, 20, 1, 16);
  EXPECT_EQ(r.worst, spec::Outcome::kFailedToRun) << r.summary();
  EXPECT_NE(r.tier_disagreement.find("the selection: "), std::string::npos) << r.tier_disagreement;
}

// Outside the sample, a wrong output shows as the canonical subject failing against it: judged
// again against the CPU reference, the tier is convicted, not the subject.
TEST(ReferenceTierReads, AWrongOutputOutsideTheSampleIsCaughtWhereASubjectFails) {
  // Cases 0 and 1 are sampled (the CPU reference answers them: the stand-in's selections there
  // come from the checks); the damage starts at the stand-in's 4th selection, in case 2 or 3.
  const CheckReport r = run_read_tier(ReadDamage::kOutput, 4, 40, 1, 1000);
  EXPECT_EQ(r.worst, spec::Outcome::kFailedToRun) << r.summary();
  EXPECT_GT(r.cases_run, 0);
  for (const auto& s : r.subjects) EXPECT_EQ(s.count(spec::Outcome::kMismatch), 0) << s.name;
  EXPECT_NE(r.tier_disagreement.find("the attention output: "), std::string::npos)
      << r.tier_disagreement;
  EXPECT_NE(r.tier_disagreement.find("case " + std::to_string(r.cases_run) + " seed"),
            std::string::npos)
      << r.tier_disagreement;
}

TEST(ReferenceTierReads, OneAnswererAnswersAReadCase) {
  SubjectList subjects = make_subjects();
  subjects.push_back(canonical_reads());
  const std::unique_ptr<Subject> one = read_answerer(), two = read_answerer();
  CheckOptions o = read_tier_options(4, 1, 4);
  o.tier_answerers[spec::Op::kIndexer] = one.get();
  o.tier_answerers[spec::Op::kAttention] = two.get();
  try {
    run_check(o, subjects);
    ADD_FAILURE() << "expected InvalidInput";
  } catch (const spec::InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("one answerer answers a case"), std::string::npos)
        << e.what();
  }
  // An answerer judged on a read op answers none of the read case (the CPU reference does).
  o.subjects = {"canonical-reads"};
  o.tier_answerers[spec::Op::kIndexer] = o.tier_answerers[spec::Op::kAttention] =
      &find_subject(subjects, "canonical-reads");
  const CheckReport r = run_check(o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  EXPECT_EQ(r.tier_cases, 0);
  EXPECT_EQ(r.cpu_cases, 4);
}

TEST(ReferenceTierReads, AKernelsScoreTableBecomesTheReferencesSelection) {
  ReadOverrides ro;
  ro.requests = 3;
  const ReadCase c = make_read_case(0x5C0E, ro);
  const reference::TopkSelection want =
      reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches);
  // The kernel's table: one column wider than the reference's, garbage past each row's n_valid.
  const std::int64_t rows = want.num_kv_heads * want.lanes, wide = want.max_blocks + 1;
  std::vector<float> table(static_cast<std::size_t>(want.num_queries * rows * wide), 12345.0f);
  for (std::int64_t q = 0; q < want.num_queries; ++q)
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < want.n_valid[static_cast<std::size_t>(q)]; ++j)
        table[static_cast<std::size_t>((q * rows + r) * wide + j)] =
            want.scores[reference::score_index(q, r, j, rows, want.max_blocks)];
  const reference::TopkSelection got = selection_from_scores(c, want.ids, table, wide);
  EXPECT_EQ(diff_selection_exact(want, got), "");
  EXPECT_EQ(got.scores.size(), want.scores.size());
  EXPECT_EQ(0, std::memcmp(got.scores.data(), want.scores.data(), want.scores.size() * 4));
  EXPECT_THROW(selection_from_scores(c, want.ids, table, wide - 1), spec::InvalidInput);
  EXPECT_THROW(selection_from_scores(c, want.ids, {}, 1), spec::InvalidInput);
}

/// The GPU tier itself: the canonical CUDA reads (cuda-canonical-generic) answer, agree with the
/// CPU reference on the sample, and a tie rule planted in the tier's selection is caught by it.
TEST(ReferenceTierReads, TheGpuTierAgreesAndAPlantedFaultInItIsCaught) {
  SubjectList subjects = make_subjects();
  const Subject& generic = find_subject(subjects, "cuda-canonical-generic");
  if (!generic.unavailable_reason().empty()) GTEST_SKIP() << generic.unavailable_reason();
  subjects.push_back(canonical_reads());
  // KVO_TIER_READ_CASES: fewer under compute-sanitizer (gpu/run_on_device.sh).
  const char* env = std::getenv("KVO_TIER_READ_CASES");
  const std::int64_t n = env != nullptr ? std::atoll(env) : 120;
  CheckOptions o = read_tier_options(n, 8, 16);
  o.subjects = {"cuda-canonical", "cuda-fast", "canonical-reads"};
  o.jobs = 4;
  without_huge_caches(o);
  const CheckReport r = run_check(o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  EXPECT_EQ(r.tier_answerers, "indexer: cuda-canonical-generic, attention: cuda-canonical-generic");
  // Cases 1, 3, 5 and 7 are sampled: the CPU reference's.
  const std::int64_t odd = n / 2, sampled = std::min<std::int64_t>(odd, 4);
  EXPECT_EQ(r.cpu_cases, sampled);
  EXPECT_EQ(r.tier_cases, odd - sampled);
  cpu_tier_passes_alike(o, subjects, r);
  // Ties at every cut (zero index-Q): the higher id winning them in the tier's selection.
  add_named_mutants({"cuda-ties-to-higher-id"}, subjects);
  Subject& ties = find_subject(subjects, "cuda-ties-to-higher-id");
  o.tier_answerers[spec::Op::kIndexer] = o.tier_answerers[spec::Op::kAttention] = &ties;
  o.overrides.read.tied_scores = true;
  const CheckReport bad = run_check(o, subjects);
  EXPECT_EQ(bad.worst, spec::Outcome::kFailedToRun) << bad.summary();
  EXPECT_NE(bad.tier_disagreement.find("cuda-ties-to-higher-id disagrees with the CPU reference"),
            std::string::npos)
      << bad.tier_disagreement;
}

#ifdef KVO_HAVE_CUDA
/// Flips every bit of the first byte at `p` (device memory) after the stream's work.
void flip_first_byte(void* p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  std::uint8_t b = 0;
  ASSERT_EQ(cudaMemcpyAsync(&b, p, 1, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  b ^= 0xFF;
  ASSERT_EQ(cudaMemcpyAsync(p, &b, 1, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
}
#endif

/// kvoracle's canonical read kernels as a user's device subject; `damage`: its attention's first
/// output byte flipped (kOutput), or its indexer writing into the index-K cache it read (kIds).
std::unique_ptr<Subject> device_reads(const std::string& name, [[maybe_unused]] ReadDamage damage) {
  DeviceSubjectFunctions f;
  f.indexer = gpu::device_indexer_function(gpu::ReadKernel::kCanonical);
  f.attention = gpu::device_attention_function(gpu::ReadKernel::kCanonical);
  f.device_concurrent = true;  // stateless launches on the call's stream, damage included
#ifdef KVO_HAVE_CUDA
  if (damage == ReadDamage::kOutput) {
    f.attention = [good = f.attention](const gpu::DeviceAttentionCall& call) {
      good(call);
      if (call.out.numel() > 0) flip_first_byte(call.out.data, call.stream);
    };
  } else if (damage == ReadDamage::kIds) {
    f.indexer = [good = f.indexer](const gpu::DeviceIndexerCall& call) {
      good(call);
      flip_first_byte(call.caches.index_cache.data, call.stream);
    };
  }
#endif
  return make_device_subject(name, f);
}

/// The resident read path (issue 15): canonical subjects with device reads are judged on a copy of
/// the case's layer generated and written on the device, the tier reading its own copy: the CPU
/// tier's verdicts and coverage; a wrong output and a read that writes into its caches caught
/// there and confirmed on the host; a tier wrong on the device caught by the first sample.
TEST(ReferenceTierReads, TheResidentPathJudgesReadCasesOnTheDevice) {
  SubjectList subjects = make_subjects();
  const Subject& generic = find_subject(subjects, "cuda-canonical-generic");
  if (!generic.unavailable_reason().empty()) GTEST_SKIP() << generic.unavailable_reason();
  subjects.push_back(device_reads("device-reads", ReadDamage::kNone));
  subjects.push_back(device_reads("device-reads-bad-output", ReadDamage::kOutput));
  subjects.push_back(device_reads("device-reads-write-caches", ReadDamage::kIds));
  const char* env = std::getenv("KVO_TIER_READ_CASES");
  const std::int64_t n = env != nullptr ? std::atoll(env) : 120;
  CheckOptions o = read_tier_options(n, 8, 16);
  o.subjects = {"cuda-canonical", "device-reads"};
  without_huge_caches(o);
  const CheckReport r = run_check(o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  const std::int64_t odd = n / 2, sampled = std::min<std::int64_t>(odd, 4);
  EXPECT_EQ(r.cpu_cases, sampled);
  EXPECT_EQ(r.tier_cases, odd - sampled);
  EXPECT_EQ(r.resident_cases, odd - sampled) << r.summary();
  EXPECT_EQ(r.resident_checks, sampled) << r.summary();
  EXPECT_EQ(r.resident_lanes, kTestDeviceLanes) << r.summary();
  CheckOptions one_lane = o;
  one_lane.device_lanes = 1;
  expect_same_verdicts(r, run_check(one_lane, subjects));
  const CheckReport c = cpu_tier_passes_alike(o, subjects, r);
  ASSERT_EQ(c.coverage.size(), r.coverage.size());
  for (std::size_t i = 0; i < c.coverage.size(); ++i) {
    EXPECT_EQ(c.coverage[i].reached, r.coverage[i].reached) << c.coverage[i].condition;
    EXPECT_EQ(c.coverage[i].first_case, r.coverage[i].first_case) << c.coverage[i].condition;
  }
  // Planted: judged on the device, then again on the host, where the same verdict stands.
  CheckOptions bad = o;
  bad.cases = 40;
  bad.subjects = {"device-reads-bad-output", "device-reads-write-caches"};
  const CheckReport b = run_check(bad, subjects);
  EXPECT_GT(b.resident_cases, 0) << b.summary();
  one_lane = bad;
  one_lane.device_lanes = 1;
  expect_same_verdicts(b, run_check(one_lane, subjects));
  ASSERT_EQ(b.subjects.size(), 4u) << b.summary();
  EXPECT_TRUE(b.tier_disagreement.empty()) << b.tier_disagreement;
  for (const auto& s : b.subjects) {
    if (s.name == "device-reads-bad-output" && s.op == spec::Op::kAttention) {
      EXPECT_GT(s.count(spec::Outcome::kMismatch), 0) << b.summary();
    }
    if (s.name == "device-reads-write-caches" && s.op == spec::Op::kIndexer) {
      EXPECT_GT(s.count(spec::Outcome::kFailedToRun), 0) << b.summary();
    }
  }
  // A tier right on the host (the CPU reference) and off on the device (the flipped output): the
  // first sampled case's device check.
  SubjectFunctions split = {};
  split.indexer = [](const ReadCase& rc) {
    return reference::indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches).ids;
  };
  split.indexer_selection = [](const ReadCase& rc) {
    return reference::indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
  };
  split.attention = [](const ReadCase& rc, const reference::TopkSelection* sel) {
    return reference::attention(rc.config, rc.attention, rc.batch, rc.q, rc.caches, rc.k_scale,
                                rc.v_scale, sel)
        .out;
  };
  const Subject& off = find_subject(subjects, "device-reads-bad-output");
  split.device_indexer = off.device_indexer();
  split.device_attention = off.device_attention();
  const std::unique_ptr<Subject> split_tier = make_function_subject("split-tier", split);
  CheckOptions t = o;
  t.tier_answerers[spec::Op::kIndexer] = t.tier_answerers[spec::Op::kAttention] = split_tier.get();
  const CheckReport tb = run_check(t, subjects);
  EXPECT_EQ(tb.worst, spec::Outcome::kFailedToRun) << tb.summary();
  EXPECT_EQ(tb.cases_run, 0) << tb.summary();
  EXPECT_NE(tb.tier_disagreement.find("split-tier reading on the device"), std::string::npos)
      << tb.tier_disagreement;
}

}  // namespace
}  // namespace kvo::oracle
