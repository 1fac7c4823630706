// Replay with the GPU tier's caches resident on the device (issue 15 item 3, ReplayOptions::
// residence): when a replay may stay on the device (resident_blocker, on any machine), and on a GPU
// the device's generated values against the CPU generator's, a committed trace replayed resident
// with the same verdicts as staged, and planted faults of a subject (a wrong byte on a step's
// pages, a stray write past them, a write into a margin) and of the tier (on a sampled step, and
// on an unsampled one where a subject fails) each caught where they happened.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <thread>

#include "kvo/oracle/device_subject.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/mutants.hpp"
#include "kvo/oracle/resident_writes.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/reference/generator.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/traces/replay.hpp"
#include "trace_fixture.hpp"
#ifdef KVO_HAVE_CUDA
#include <cuda_runtime.h>

#include "kvo/gpu/device_caches.hpp"
#include "kvo/gpu/memory_pool.hpp"
#include "kvo/gpu/resident.hpp"
#include "kvo/gpu/write.hpp"
#endif

namespace kvo::traces {
namespace {

oracle::Subject* named(oracle::SubjectList& subjects, const std::string& name) {
  for (auto& s : subjects)
    if (s->name() == name) return s.get();
  return nullptr;
}

ReplayOptions resident_options(Residence residence = Residence::kResident) {
  ReplayOptions o;
  o.tier = oracle::ReferenceTier::kGpu;
  o.residence = residence;
  o.tier_sample_first = 2;
  o.tier_sample_every = 8;
  return o;
}

TEST(TraceReplayResident, WhatKeepsAReplayOffTheDeviceIsNamed) {
  const Trace t = testing::small_trace();
  oracle::SubjectList subjects = oracle::make_subjects();
  oracle::Subject* cpu = named(subjects, "cpu-fused");
  ASSERT_NE(cpu, nullptr);
  ReplayOptions o = resident_options();
  // A CPU subject has no device write, whatever the build.
  EXPECT_NE(resident_blocker(t, o, {cpu, cpu}).find("cpu-fused has no device write"),
            std::string::npos);
  o.ops = {spec::Op::kWrite, spec::Op::kIndexer};
  EXPECT_EQ(resident_blocker(t, o, {cpu, cpu}), "op indexer reads the CPU reference's caches");
  o.ops = {spec::Op::kWrite};
  Trace wrap = t;
  wrap.config.slot_mode = spec::SlotMode::kLegacyWrap;
  EXPECT_NE(resident_blocker(wrap, o, {cpu, cpu}).find("legacy_wrap"), std::string::npos);
  Trace approx = t;
  approx.config.kv.scale_mode = spec::ScaleMode::kDivApprox;
  EXPECT_EQ(resident_blocker(approx, o, {cpu, cpu}), "scale mode div_approx admits several codes");
  EXPECT_EQ(resident_blocker(t, o, {cpu}), "no write subject to judge");
}

/// What a step's (or a write case's) comparison reads (oracle::step_bytes): disjoint ranges,
/// ascending, that cover exactly the guard bands and the bytes of the blocks the slots land in,
/// over the write cases' own geometries and strided views (where one block's bytes span another's,
/// a byte read twice would count its difference twice).
TEST(TraceReplayResident, TheBytesAComparisonReadsAreDisjointAndCoverEveryTouchedBlock) {
  int checked = 0;
  for (std::uint64_t i = 0; checked < 60 && i < 400; ++i) {
    const oracle::WriteCase wc =
        oracle::make_write_case(oracle::case_seed(0x5B7E, i), {}, oracle::CaseValues::kDeferred);
    const reference::PagedCacheLayout layout(wc.config);
    const spec::LayerKind kind = wc.writes.back().kind;
    const std::vector<spec::BufferKind> buffers = layout.buffers(kind);
    bool small = true;
    for (const spec::BufferKind b : buffers) small = small && layout.buffer_bytes(b) < (1 << 24);
    if (!small) continue;  // a huge cache's bitmap below would be gigabytes
    ++checked;
    SCOPED_TRACE("case " + std::to_string(i) + ": " + wc.describe());
    const std::vector<std::int64_t> blocks = oracle::touched_blocks(
        wc.config.geometry, {wc.writes.back().slots.slots, wc.writes.back().index_slots.slots});
    const std::vector<oracle::BufferBytes> got = oracle::step_bytes(layout, kind, blocks);
    for (std::size_t k = 1; k < got.size(); ++k) {
      ASSERT_TRUE(got[k - 1].buffer < got[k].buffer ||
                  (got[k - 1].buffer == got[k].buffer && got[k - 1].end < got[k].begin))
          << "ranges " << k - 1 << " and " << k << " overlap, touch or are out of order";
    }
    for (std::size_t b = 0; b < buffers.size(); ++b) {
      const std::int64_t size = layout.buffer_bytes(buffers[b]) + 2 * spec::kGuardBytes;
      std::vector<bool> want(static_cast<std::size_t>(size), false), have = want;
      const auto mark = [](std::vector<bool>& bits, std::int64_t from, std::int64_t to) {
        for (std::int64_t x = from; x < to; ++x) bits[static_cast<std::size_t>(x)] = true;
      };
      mark(want, 0, spec::kGuardBytes);
      mark(want, size - spec::kGuardBytes, size);
      for (const std::int64_t blk : blocks) {
        for (const auto& [from, to] : oracle::block_byte_ranges(layout, buffers[b], blk))
          mark(want, spec::kGuardBytes + from, spec::kGuardBytes + to);
      }
      for (const oracle::BufferBytes& r : got) {
        if (r.buffer == static_cast<std::int32_t>(b)) mark(have, r.begin, r.end);
      }
      EXPECT_EQ(have, want) << "buffer " << b;
    }
  }
  EXPECT_EQ(checked, 60);
}

TEST(TraceReplayResident, AskedForAndImpossibleIsRefusedAndAutoSaysWhyItStaged) {
  const Trace t = testing::small_trace();
  oracle::SubjectList subjects = oracle::make_subjects();
  // The CPU tier has no device caches.
  ReplayOptions cpu_tier;
  cpu_tier.residence = Residence::kResident;
  cpu_tier.subjects = {"cpu-fused"};
  EXPECT_THROW(replay_trace(t, cpu_tier, subjects), spec::InvalidInput);
  // The GPU tier with a CPU subject standing in for its answerer: no device write.
  auto answerer = oracle::make_subjects();
  ReplayOptions o = resident_options();
  o.subjects = {"cpu-unfused"};
  o.tier_answerers[spec::Op::kWrite] = named(answerer, "cpu-fused");
  try {
    replay_trace(t, o, subjects);
    ADD_FAILURE() << "a resident replay it cannot run was not refused";
  } catch (const spec::InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("the caches cannot stay on the device: cpu-fused has no "
                                         "device write"),
              std::string::npos)
        << e.what();
  }
  o.residence = Residence::kAuto;
  const ReplayReport r = replay_trace(t, o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  EXPECT_NE(r.summary().find("caches: staged through the host (cpu-fused has no device write"),
            std::string::npos)
      << r.summary();
}

#ifdef KVO_HAVE_CUDA

#define SKIP_WITHOUT_GPU(subjects)                                                         \
  do {                                                                                     \
    const oracle::Subject* fused = named(subjects, "cuda-fused");                          \
    if (fused == nullptr) GTEST_SKIP() << "built without CUDA";                            \
    if (!fused->unavailable_reason().empty()) GTEST_SKIP() << fused->unavailable_reason(); \
  } while (0)

/// SPEC 8 on the device: every activation dtype, ordinary and edge values (with and without the
/// non-finite ones), real and padding keys, against reference::generated_rows byte for byte.
TEST(TraceReplayResident, TheDeviceGeneratesTheCpuGeneratorsBytes) {
  oracle::SubjectList subjects = oracle::make_subjects();
  SKIP_WITHOUT_GPU(subjects);
  std::vector<reference::RowKey> keys;
  std::vector<gpu::GeneratedRowKey> device_keys;
  for (std::int64_t r = 0; r < 300; ++r) {
    const reference::RowKey k{r % 7 == 6 ? -1 : r * 977 + 3, r % 7 == 6 ? r : 5 * r + 1};
    keys.push_back(k);
    device_keys.push_back({k.request, k.position});
  }
  for (const spec::DType act : {spec::DType::kBF16, spec::DType::kF16, spec::DType::kF32}) {
    for (const int edges : {0, 1, 2}) {
      reference::ValueGenerator gen;
      gen.seed = 0x6B766F72 + static_cast<std::uint64_t>(edges);
      gen.act = act;
      gen.edge_values = edges > 0;
      gen.allow_nonfinite = edges > 1;
      gpu::GeneratedValues values{gen.seed, {gen.range, gen.edge_values, gen.allow_nonfinite}, act};
      for (const auto& [tensor, heads, dim] : {std::tuple{reference::GenTensor::kK, 4, 128},
                                               std::tuple{reference::GenTensor::kV, 3, 40},
                                               std::tuple{reference::GenTensor::kIndexK, 0, 128}}) {
        SCOPED_TRACE(std::string(spec::name_of(act)) + " edges " + std::to_string(edges) +
                     " tensor " + std::to_string(static_cast<int>(tensor)));
        const spec::HostTensor cpu = reference::generated_rows(gen, 7, tensor, keys, heads, dim);
        const std::vector<std::uint8_t> device = gpu::generated_rows_on_device(
            values, 7, static_cast<std::int64_t>(tensor), device_keys, std::max(heads, 1), dim);
        ASSERT_EQ(device.size(), cpu.bytes.size());
        const auto at = std::mismatch(cpu.bytes.begin(), cpu.bytes.end(), device.begin());
        EXPECT_TRUE(at.first == cpu.bytes.end())
            << "first differing byte " << (at.first - cpu.bytes.begin()) << ": CPU 0x" << std::hex
            << static_cast<int>(*at.first) << ", device 0x" << static_cast<int>(*at.second);
      }
    }
  }
}

/// The committed serving trace replayed resident: every verdict the staged replay gives, the tier
/// checked on its sample.
TEST(TraceReplayResident, ACommittedTraceReplaysResidentWithTheStagedVerdicts) {
  oracle::SubjectList subjects = oracle::make_subjects();
  SKIP_WITHOUT_GPU(subjects);
  const Trace t = load_trace(testing::trace_data_dir() / "serving_bf16_nhd.st");
  const auto layers = static_cast<std::int64_t>(t.config.layers.size());
  ReplayOptions o = resident_options();
  o.step_begin = 3;
  o.step_end = 43;
  o.full_diff_every = 16;
  o.subjects = {"cuda-unfused", "cuda-fused-generic"};
  const ReplayReport r = replay_trace(t, o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  EXPECT_EQ(r.residence.rfind("resident on the device", 0), 0u) << r.summary();
  EXPECT_EQ(r.tier_checks, 7 * layers) << "steps 3, 4, then 5, 13, 21, 29, 37";
  EXPECT_EQ(r.tier_layers, 40 * layers);
  EXPECT_GT(r.compared_bytes, 0);
  o.residence = Residence::kStaged;
  const ReplayReport staged = replay_trace(t, o, subjects);
  EXPECT_EQ(staged.worst, spec::Outcome::kPass) << staged.summary();
  EXPECT_EQ(staged.residence, "staged through the host (--resident off)");
  ASSERT_EQ(r.subjects.size(), staged.subjects.size());
  for (std::size_t i = 0; i < r.subjects.size(); ++i) {
    EXPECT_EQ(r.subjects[i].outcome, staged.subjects[i].outcome) << r.subjects[i].name;
    EXPECT_EQ(r.subjects[i].layer_writes, staged.subjects[i].layer_writes) << r.subjects[i].name;
    EXPECT_EQ(r.subjects[i].layer_writes, 40 * layers) << r.subjects[i].name;
  }
}

/// The fused write, then (on the first layer of step `step`, counted by calls: a resident replay
/// writes each layer of each step once, in order) two bytes at `k_byte` from K's first element set
/// to 0xFF (a bf16 NaN no generated value has).
oracle::DeviceWriteFn planted(std::int64_t layers, std::int64_t step, std::int64_t k_byte) {
  const gpu::DeviceWriteFunction fused = gpu::device_write_function(gpu::WritePath::kFused);
  auto calls = std::make_shared<std::int64_t>(0);
  return [=](const gpu::DeviceWriteCall& call) {
    fused(call);
    if ((*calls)++ != step * layers) return;
    auto* k = static_cast<std::uint8_t*>(call.caches.k_cache.data);
    ASSERT_EQ(cudaMemsetAsync(k + k_byte, 0xFF, 2, static_cast<cudaStream_t>(call.stream)),
              cudaSuccess);
  };
}

std::unique_ptr<oracle::Subject> planted_subject(const std::string& name, std::int64_t layers,
                                                 std::int64_t step, std::int64_t k_byte) {
  oracle::DeviceSubjectFunctions f;
  f.write = planted(layers, step, k_byte);
  return oracle::make_device_subject(name, std::move(f));
}

/// K's byte of the first real token of step `step` (head 0, dim 0).
std::int64_t written_k_byte(const Trace& t, std::size_t step) {
  const std::vector<std::int64_t>& slots = t.steps[step].slot_mapping.values;
  const std::int64_t slot =
      *std::find_if(slots.begin(), slots.end(), [](std::int64_t s) { return s >= 0; });
  const std::int64_t bs = t.config.geometry.block_size;
  const reference::PagedCacheLayout layout(t.config);
  return layout.kv_element(0, slot / bs, slot % bs, 0, 0) *
         static_cast<std::int64_t>(spec::dtype_bytes(t.config.kv.cache_dtype));
}

/// A simulated serving trace (3 layers, bf16 nhd) with more blocks than its 20 steps name.
Trace roomy_trace() {
  return testing::sim_trace({.layers = "DSS",
                             .steps = 20,
                             .num_blocks = 256,
                             .block_size = 16,
                             .num_kv_heads = 2,
                             .head_dim = 64,
                             .prompt_max = 96,
                             .output_max = 48},
                            11);
}

TEST(TraceReplayResident, ASubjectsWrongBytesStrayWritesAndMarginWritesAreCaught) {
  oracle::SubjectList subjects = oracle::make_subjects();
  SKIP_WITHOUT_GPU(subjects);
  const Trace t = roomy_trace();
  const auto layers = static_cast<std::int64_t>(t.config.layers.size());
  const reference::PagedCacheLayout layout(t.config);
  // The last block no step names (a padding slot -1 names the last block: replay compares the
  // blocks negative slots would wrap to as well).
  const std::int64_t capacity = t.config.geometry.capacity();
  std::vector<bool> named(static_cast<std::size_t>(t.config.geometry.num_blocks), false);
  for (const TraceStep& st : t.steps) {
    for (const std::int64_t slot : st.slot_mapping.values) {
      const std::int64_t wrapped = slot < 0 ? slot + capacity : slot;
      named[static_cast<std::size_t>(wrapped / t.config.geometry.block_size)] = true;
    }
  }
  const auto unnamed = std::find(named.rbegin(), named.rend(), false);
  ASSERT_NE(unnamed, named.rend()) << "every block is named";
  const std::int64_t free_block = named.rend() - unnamed - 1;
  const std::int64_t stray = layout.kv_element(0, free_block, 1, 0, 0) *
                             static_cast<std::int64_t>(spec::dtype_bytes(t.config.kv.cache_dtype));
  struct Plant {
    const char* what;
    std::int64_t k_byte;
    std::string expected;
  };
  const Plant plants[] = {
      {"wrong bytes", written_k_byte(t, 5), "step 5, layer 0\n"},
      {"stray write", stray,
       "whole-cache comparison after step 7, layer 0: a write outside the pages steps 4..7 named"},
      {"margin write", -spec::kGuardBytes - 2, "wrote outside every cache buffer and its guard"},
  };
  for (const Plant& p : plants) {
    SCOPED_TRACE(p.what);
    oracle::SubjectList list = oracle::make_subjects();
    list.push_back(planted_subject("planted-device", layers, 5, p.k_byte));
    ReplayOptions o = resident_options();
    o.full_diff_every = 4;
    o.subjects = {"planted-device"};
    const ReplayReport r = replay_trace(t, o, list);
    EXPECT_EQ(r.worst, spec::Outcome::kMismatch) << r.summary();
    EXPECT_TRUE(r.tier_disagreement.empty()) << r.tier_disagreement;
    ASSERT_EQ(r.mismatches.size(), 1u) << r.summary();
    EXPECT_NE(r.mismatches[0].find(p.expected), std::string::npos) << r.mismatches[0];
    if (p.k_byte >= 0) {
      // SPEC 7: the first differing byte with its coordinates and both values.
      EXPECT_NE(r.mismatches[0].find("first: layer 0, buffer=k"), std::string::npos)
          << r.mismatches[0];
    }
    EXPECT_EQ(r.reproduce[0].rfind("--steps ", 0), 0u) << r.reproduce[0];
  }
}

TEST(TraceReplayResident, ADivergentTierIsCaughtOnItsSampleAndWhereASubjectFails) {
  oracle::SubjectList subjects = oracle::make_subjects();
  SKIP_WITHOUT_GPU(subjects);
  const Trace t = load_trace(testing::trace_data_dir() / "serving_bf16_nhd.st");
  const auto layers = static_cast<std::int64_t>(t.config.layers.size());
  // Sampled steps 0, 1, 2, 10, ...: step 2 is one, step 5 is not. `shared`: the judged subject has
  // the tier's own fault and agrees with it, so only the sampled check (its layers on the check
  // threads, its pages brought back without waiting) can catch the tier, over a longer replay.
  for (const auto& [step, shared] :
       {std::pair<std::int64_t, bool>{2, false}, {5, false}, {2, true}}) {
    SCOPED_TRACE("tier diverging at step " + std::to_string(step) + (shared ? ", shared" : ""));
    const std::int64_t k_byte = written_k_byte(t, static_cast<std::size_t>(step));
    oracle::SubjectList list = oracle::make_subjects();
    auto tier = planted_subject("diverging-device-tier", layers, step, k_byte);
    list.push_back(planted_subject("same-fault-device", layers, step, k_byte));
    ReplayOptions o = resident_options();
    o.step_end = shared ? 30 : 12;
    o.subjects = {shared ? "same-fault-device" : "cuda-unfused"};
    o.tier_answerers[spec::Op::kWrite] = tier.get();
    const ReplayReport r = replay_trace(t, o, list);
    EXPECT_EQ(r.worst, spec::Outcome::kFailedToRun) << r.summary();
    EXPECT_TRUE(r.mismatches.empty()) << "no subject is blamed for the tier's fault";
    const std::string where = "step " + std::to_string(step) +
                              ", layer 0: the write answerer diverging-device-tier disagrees with "
                              "the CPU reference ";
    EXPECT_NE(r.tier_disagreement.find(where + (step == 2 ? "on a sampled step"
                                                          : "(its caches replayed from step 0 "
                                                            "through 5")),
              std::string::npos)
        << r.tier_disagreement;
    EXPECT_NE(r.tier_disagreement.find("first: layer 0, buffer=k"), std::string::npos)
        << r.tier_disagreement;
    EXPECT_EQ(r.steps_run, step + 1) << "the step it was caught on counts";
    if (!shared) continue;
    EXPECT_EQ(r.tier_checks, (step + 1) * layers) << "steps 0, 1, 2";
    EXPECT_EQ(r.tier_layers, (step + 1) * layers);
    ASSERT_EQ(r.subjects.size(), 1u) << r.summary();
    EXPECT_EQ(r.subjects[0].layer_writes, (step + 1) * layers);
    EXPECT_EQ(r.subjects[0].outcome, spec::Outcome::kPass) << "it agreed with the tier";
  }
}

/// A huge cache's copies are poisoned only where the case's table names pages: one range per run
/// of pages per buffer per copy. Past 65,535 ranges (the grid's y limit) every range is still
/// poisoned, the last as the first, and the copies agree there.
TEST(TraceReplayResident, PoisonOfMoreRangesThanAGridRowLimitReachesEveryRange) {
  oracle::SubjectList subjects = oracle::make_subjects();
  SKIP_WITHOUT_GPU(subjects);
  spec::ModelConfig config;
  config.layers = {spec::LayerKind::kDense};
  config.geometry.num_kv_heads = 1;
  config.geometry.head_dim = 128;
  config.geometry.block_size = 16;         // one K block: 16 x 128 bf16 = one 4 KiB page
  constexpr std::int64_t kRanges = 40000;  // per copy; two copies: 80,000 poison ranges
  config.geometry.num_blocks = 2 * kRanges + 2;
  const reference::PagedCacheLayout layout(config);
  const std::vector<spec::LayerCaches> initial{oracle::make_layer_caches(
      layout, 0, spec::LayerKind::kDense, /*lazy=*/true, /*hold_guards=*/false)};
  constexpr std::int64_t kPage = spec::ByteStorage::kPageBytes;
  std::vector<gpu::BufferByteRange> defined;  // every other page of buffer 0
  for (std::int64_t r = 0; r < kRanges; ++r)
    defined.push_back({0, 2 * r * kPage + 5, 2 * r * kPage + 9});
  gpu::GeneratedValues values{7, {}, spec::DType::kBF16};
  std::unique_ptr<gpu::ResidentReplay> device;
  ASSERT_NO_THROW(device = std::make_unique<gpu::ResidentReplay>(
                      config, std::vector<std::int64_t>{0}, initial, 2, values,
                      std::vector<std::vector<float>>{{1.0f}},
                      std::vector<std::vector<float>>{{1.0f}}, 1, defined));
  const std::vector<gpu::ResidentDifference> same = device->compare(1, false);
  ASSERT_EQ(same.size(), 1u);
  EXPECT_EQ(same[0].count, 0);
  const spec::ByteStorage& poison = initial[0].buffers[0].storage;
  for (const std::size_t copy : {std::size_t{0}, std::size_t{1}}) {
    for (const std::int64_t r : {std::int64_t{0}, kRanges / 2, kRanges - 1}) {
      SCOPED_TRACE("copy " + std::to_string(copy) + ", range " + std::to_string(r));
      spec::LayerCaches into = initial[0];
      const gpu::BufferByteRange page{0, 2 * r * kPage, 2 * r * kPage + kPage};
      device->download(0, copy, std::span(&page, 1), into);
      const spec::ByteStorage& got = into.buffers[0].storage;
      for (std::int64_t i = page.begin; i < page.end; ++i) {
        ASSERT_EQ(got.byte(i), poison.byte(i)) << "byte " << i << " of buffer 0";
      }
    }
  }
}

/// Pages brought back without waiting (download_async) are the pages a waited download brings
/// back, for one layer or all at once; `same_as` tells them from caches that differ in one byte;
/// a second download over the same list (`like`) sees what the device changed since; a layer none
/// of whose buffers the ranges name holds no page and matches anything.
TEST(TraceReplayResident, PagesBroughtBackWithoutWaitingAreTheWaitedDownloadsPages) {
  oracle::SubjectList subjects = oracle::make_subjects();
  SKIP_WITHOUT_GPU(subjects);
  spec::ModelConfig config;
  config.layers = {spec::LayerKind::kSparse, spec::LayerKind::kDense};
  config.geometry.num_kv_heads = 2;
  config.geometry.head_dim = 64;
  config.geometry.block_size = 16;
  config.geometry.num_blocks = 40;
  const reference::PagedCacheLayout layout(config);
  std::vector<spec::LayerCaches> initial;
  for (std::int64_t l = 0; l < 2; ++l)
    initial.push_back(oracle::make_layer_caches(layout, l, config.layers[l], /*lazy=*/true));
  gpu::GeneratedValues values{7, {}, spec::DType::kBF16};
  std::unique_ptr<gpu::ResidentReplay> device;
  ASSERT_NO_THROW(device = std::make_unique<gpu::ResidentReplay>(
                      config, std::vector<std::int64_t>{0, 1}, initial, 1, values,
                      std::vector<std::vector<float>>{{1.0f}},
                      std::vector<std::vector<float>>{{1.0f}}, 1));
  constexpr std::int64_t kPage = spec::ByteStorage::kPageBytes;
  // Odd edges (rounded out to pages), K's and V's; index-K (buffer 2) only the sparse layer has.
  const std::vector<gpu::BufferByteRange> ranges{
      {0, 3 * kPage + 17, 5 * kPage - 3}, {1, 0, 10}, {2, kPage + 1, kPage + 2}};
  const std::vector<gpu::BufferByteRange> index_only{{2, 0, 2 * kPage}};
  std::vector<spec::LayerCaches> waited = initial, all = initial, async = initial;
  for (std::size_t li = 0; li < 2; ++li) device->download(li, 0, ranges, waited[li]);
  device->download(0, ranges, all);
  const std::shared_ptr<const gpu::PagesInFlight> pages = device->download_async(0, ranges);
  EXPECT_GT(pages->bytes(), 4 * kPage);
  for (std::size_t li = 0; li < 2; ++li) {
    SCOPED_TRACE("layer " + std::to_string(li));
    pages->store(li, async[li]);
    for (std::size_t b = 0; b < waited[li].buffers.size(); ++b) {
      EXPECT_EQ(all[li].buffers[b].storage.materialised(),
                waited[li].buffers[b].storage.materialised());
      EXPECT_EQ(async[li].buffers[b].storage.materialised(),
                waited[li].buffers[b].storage.materialised());
      EXPECT_TRUE(async[li].buffers[b].storage == waited[li].buffers[b].storage);
      EXPECT_TRUE(all[li].buffers[b].storage == waited[li].buffers[b].storage);
    }
    EXPECT_TRUE(pages->same_as(li, async[li]));
  }
  // One byte of the sparse layer's V page differs on the host.
  async[0].buffers[1].storage[5] ^= 0x40;
  EXPECT_FALSE(pages->same_as(0, async[0]));
  // The device changes K's page 4 of the sparse layer; the same list again sees it.
  const gpu::DeviceKvCaches& views = device->views(0, 0);
  auto* k = static_cast<std::uint8_t*>(views.k_cache.data);
  const std::int64_t at = 4 * kPage + 8 - spec::kGuardBytes;  // a body offset in page 4
  ASSERT_EQ(cudaMemsetAsync(k + at, 0x7F, 2, static_cast<cudaStream_t>(device->stream())),
            cudaSuccess);
  const std::unique_ptr<gpu::PagesInFlight> again = device->download_async(0, ranges, pages.get());
  EXPECT_FALSE(again->same_as(0, waited[0]));
  EXPECT_TRUE(again->same_as(1, waited[1]));
  spec::LayerCaches changed = initial[0];
  again->store(0, changed);
  EXPECT_EQ(changed.buffers[0].storage.byte(4 * kPage + 8), 0x7F);
  EXPECT_EQ(changed.buffers[0].storage.byte(4 * kPage + 9), 0x7F);
  // The dense layer has no index-K: nothing of it comes back, and nothing differs.
  const std::unique_ptr<gpu::PagesInFlight> none = device->download_async(0, index_only);
  EXPECT_EQ(none->bytes(), 2 * kPage);
  EXPECT_TRUE(none->same_as(1, initial[1]));
}

/// A dense layer of about `bytes` of caches: K and V of 16-token blocks of one 128-dim bf16 head,
/// 8 KiB a block.
spec::ModelConfig one_head_dense_layer(std::int64_t bytes) {
  spec::ModelConfig config;
  config.layers = {spec::LayerKind::kDense};
  config.geometry.num_kv_heads = 1;
  config.geometry.head_dim = 128;
  config.geometry.block_size = 16;
  config.geometry.num_blocks = bytes / 8192;
  return config;
}

/// gpu::KeepLargeBlocks' rule (a resident campaign's huge copies): a freed allocation past 1 GiB is
/// kept, up to the count asked, and a large request is served by the smallest kept block that
/// holds it, however much larger; one that none holds frees them all and allocates. Each copy
/// here is a DeviceCacheMirror of one lazy dense layer: one pooled allocation of its size.
TEST(TraceReplayResident, KeptLargeBlocksServeARequestFromTheSmallestThatHoldsIt) {
  oracle::SubjectList subjects = oracle::make_subjects();
  SKIP_WITHOUT_GPU(subjects);
  constexpr std::int64_t kMiB = std::int64_t{1} << 20;
  // A mirror of about `mib` MiB.
  const auto mirror = [](std::int64_t mib) {
    const spec::ModelConfig config = one_head_dense_layer(mib * kMiB);
    const reference::PagedCacheLayout layout(config);
    const spec::LayerCaches caches = oracle::make_layer_caches(
        layout, 0, spec::LayerKind::kDense, /*lazy=*/true, /*hold_guards=*/false);
    std::vector<gpu::PendingPoison> pending;  // never launched: nothing here reads the bytes
    return std::make_unique<gpu::DeviceCacheMirror>(config, caches, &pending);
  };
  // On a thread of its own: its pool (one per host thread) starts with no block kept.
  std::thread([&] {
    gpu::KeepLargeBlocks keep(2);
    { const auto a = mirror(1536), b = mirror(2560); }  // both allocated, then kept
    EXPECT_EQ(keep.use().requests, 2);
    EXPECT_EQ(keep.use().reused, 0);
    {
      // 1.2 GiB from the 1.5 GiB block, so that 2.2 GiB finds the 2.5 GiB one: both reused.
      const auto c = mirror(1228), d = mirror(2252);
      EXPECT_EQ(keep.use().reused, 2) << "the 1.2 GiB request was not served by the smaller block";
    }
    { const auto e = mirror(3072); }  // none holds 3 GiB: all freed, one allocated
    EXPECT_EQ(keep.use().requests, 5);
    EXPECT_EQ(keep.use().reused, 2);
    { const auto f = mirror(1100), g = mirror(1100); }  // the 3 GiB block, then an allocation
    EXPECT_EQ(keep.use().requests, 7);
    EXPECT_EQ(keep.use().reused, 3);
  }).join();
}

/// The device memory a resident replay may take counts what its thread's pool holds idle: a
/// resident campaign keeps its huge copies for the next case (KeepLargeBlocks), which the driver
/// counts as in use, and a copy that fits once they are given back is not refused (session 26:
/// 62 of 10,000 write cases went to the host path, 230 ms each, for "not fitting" beside the
/// blocks kept for them).
TEST(TraceReplayResident, WhatTheThreadsPoolHoldsIdleCountsAsFreeForTheCopies) {
  oracle::SubjectList subjects = oracle::make_subjects();
  SKIP_WITHOUT_GPU(subjects);
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  const auto free_now = static_cast<std::int64_t>(free_bytes);
  if (free_now < (std::int64_t{24} << 30)) GTEST_SKIP() << "less than 24 GiB free";
  const auto caches = [](const spec::ModelConfig& config) {
    const reference::PagedCacheLayout layout(config);
    return std::vector<spec::LayerCaches>{oracle::make_layer_caches(
        layout, 0, spec::LayerKind::kDense, /*lazy=*/true, /*hold_guards=*/false)};
  };
  std::thread([&] {
    gpu::KeepLargeBlocks keep(1);
    {
      // Half the free memory, allocated and given back: kept by this thread's pool.
      const spec::ModelConfig half = one_head_dense_layer(free_now / 2);
      std::vector<gpu::PendingPoison> pending;  // never launched: nothing reads the bytes
      const gpu::DeviceCacheMirror kept(half, caches(half)[0], &pending);
    }
    // 0.6 of what was free: more than the driver has free now, less than that and the kept block.
    const spec::ModelConfig big = one_head_dense_layer(free_now / 10 * 6);
    gpu::GeneratedValues values{7, {}, spec::DType::kBF16};
    EXPECT_NO_THROW(gpu::ResidentReplay(big, {0}, caches(big), 1, values, {{1.0f}}, {{1.0f}}, 1));
  }).join();
}

/// A huge write case's copies (gpu::DefinedCopies::kFirst): the tier's copy (0) holds only the
/// pages its writes touch and the guard bands; a subject's copy is poisoned whole and a whole
/// comparison reads it against copy 0 there and against the poison pattern everywhere else. Every
/// byte a subject should not have changed is still caught, with its coordinates: in a page the
/// writes touch, far from them (at an odd offset: the byte paths at a piece's ends), in V's last
/// page before its trailing guard, in a guard band and in a margin.
TEST(TraceReplayResident, ATierCopyHoldingOnlyItsPagesStillJudgesEverySubjectByte) {
  oracle::SubjectList subjects = oracle::make_subjects();
  SKIP_WITHOUT_GPU(subjects);
  spec::ModelConfig config;
  config.layers = {spec::LayerKind::kDense};
  config.layout = spec::KvLayout::kNhd;
  config.geometry.num_kv_heads = 1;
  config.geometry.head_dim = 128;
  config.geometry.block_size = 16;  // one K block: 16 x 128 bf16 = one 4 KiB page
  config.geometry.num_blocks = 64;
  const reference::PagedCacheLayout layout(config);
  const std::vector<spec::LayerCaches> initial{oracle::make_layer_caches(
      layout, 0, spec::LayerKind::kDense, /*lazy=*/true, /*hold_guards=*/false)};
  spec::SlotMapping slots;
  slots.slots = {3 * 16 + 1, 3 * 16 + 2, 10 * 16 + 5};
  const std::vector<gpu::GeneratedRowKey> keys{{0, 1}, {0, 2}, {1, 5}};
  const std::vector<gpu::BufferByteRange> defined = oracle::step_bytes(
      layout, spec::LayerKind::kDense, oracle::touched_blocks(config.geometry, {slots.slots}));
  const gpu::DeviceWriteFunction fused = gpu::device_write_function(gpu::WritePath::kFused);
  constexpr std::int64_t kPage = spec::ByteStorage::kPageBytes;
  constexpr std::int64_t kGuard = spec::kGuardBytes;
  const std::int64_t body = layout.buffer_bytes(layout.kv_buffer(0));
  struct Plant {
    const char* what;
    int buffer;          // 0 K, 1 V, -1 the margin before K's storage
    std::int64_t at;     // storage offset (buffer >= 0), or bytes before K's storage
    std::int32_t found;  // the buffer the comparison names
  };
  const Plant plants[] = {
      {"nothing", 0, -1, 0},
      {"a byte of a touched page the writes leave", 0, kGuard + 3 * kPage + 7 * 256 + 5, 0},
      {"far from every touched page, at an odd offset", 0, kGuard + 40 * kPage + 3, 0},
      {"V's last byte before its trailing guard", 1, kGuard + body - 1, 1},
      {"V's trailing guard band", 1, kGuard + body + 9, 1},
      {"K's leading guard band", 0, 17, 0},
      {"the margin before K", -1, 2, -1},
  };
  for (const Plant& p : plants) {
    SCOPED_TRACE(p.what);
    gpu::GeneratedValues values{7, {}, spec::DType::kBF16};
    gpu::ResidentReplay device(config, {0}, initial, 2, values, {{1.0f}}, {{1.0f}}, 3, defined,
                               gpu::DefinedCopies::kFirst);
    device.stage_step(keys, slots, nullptr, {});
    device.write(0, 0, fused);
    // The subject's copy: the same write, then one byte made what its poison is not.
    std::uint8_t planted_value = 0;
    if (p.at >= 0 && p.buffer >= 0) {
      planted_value = static_cast<std::uint8_t>(
          ~initial[0].buffers[static_cast<std::size_t>(p.buffer)].storage.byte(p.at));
    }
    device.write(0, 1, [&](const gpu::DeviceWriteCall& call) {
      fused(call);
      if (p.at < 0) return;
      auto* target = static_cast<std::uint8_t*>(p.buffer == 1 ? call.caches.v_cache.data
                                                              : call.caches.k_cache.data);
      target += p.buffer < 0 ? -kGuard - p.at : p.at - kGuard;
      ASSERT_EQ(cudaMemsetAsync(target, p.buffer < 0 ? 0xA5 : planted_value, 1,
                                static_cast<cudaStream_t>(call.stream)),
                cudaSuccess);
    });
    const std::vector<gpu::ResidentDifference> d = device.compare(1, /*whole=*/true);
    ASSERT_EQ(d.size(), 1u);
    if (p.at < 0) {
      EXPECT_EQ(d[0].count, 0) << "buffer " << d[0].buffer << " byte " << d[0].byte;
      continue;
    }
    EXPECT_EQ(d[0].count, 1);
    EXPECT_EQ(d[0].buffer, p.found);
    if (p.buffer >= 0) {
      EXPECT_EQ(d[0].byte, p.at);
    }
  }
  // Copy 0 outside its pages holds nothing a resync could copy.
  gpu::GeneratedValues values{7, {}, spec::DType::kBF16};
  gpu::ResidentReplay device(config, {0}, initial, 2, values, {{1.0f}}, {{1.0f}}, 3, defined,
                             gpu::DefinedCopies::kFirst);
  EXPECT_THROW(device.resync(0, 1), spec::InvalidInput);
}

#endif  // KVO_HAVE_CUDA

}  // namespace
}  // namespace kvo::traces
