// Validation names planted inconsistencies by step, tensor, index and value; replay of the
// committed traces is clean on the CPU subjects, finds planted subject bugs at the right step, and
// carries what step n wrote into the comparison of step n+k.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "kvo/oracle/cpu_subjects.hpp"
#include "kvo/oracle/harness.hpp"
#include "kvo/oracle/op_driver.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/reference/read_path.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/traces/analysis.hpp"
#include "kvo/traces/replay.hpp"
#include "kvo/traces/trace.hpp"
#include "trace_fixture.hpp"

namespace kvo::traces {
namespace {

using testing::small_trace;

std::vector<std::filesystem::path> committed_traces() {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(testing::trace_data_dir())) {
    if (e.path().extension() == ".st" && e.path().filename().string().rfind("planted", 0) != 0) {
      out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

oracle::SubjectList cpu_subjects() {
  oracle::SubjectList out;
  for (auto& s : oracle::make_subjects()) {
    if (s->name().rfind("cpu-", 0) == 0 && s->implements(spec::Op::kWrite))
      out.push_back(std::move(s));
  }
  return out;
}

/// Every subject of the read ops this build has.
oracle::SubjectList read_subjects() {
  oracle::SubjectList out;
  for (auto& s : oracle::make_subjects()) {
    if (s->implements(spec::Op::kIndexer) || s->implements(spec::Op::kAttention))
      out.push_back(std::move(s));
  }
  return out;
}

/// Replays through the write subjects and the read subjects as one list, handing both back.
ReplayReport replay_trace(const Trace& t, const ReplayOptions& o, oracle::SubjectList& writes,
                          oracle::SubjectList& reads) {
  const std::size_t n = writes.size();
  for (auto& s : reads) writes.push_back(std::move(s));
  ReplayReport r;
  try {
    r = traces::replay_trace(t, o, writes);
  } catch (...) {
    for (std::size_t i = n; i < writes.size(); ++i) reads[i - n] = std::move(writes[i]);
    writes.resize(n);
    throw;
  }
  for (std::size_t i = n; i < writes.size(); ++i) reads[i - n] = std::move(writes[i]);
  writes.resize(n);
  return r;
}

TEST(TraceValidate, PlantedDuplicateSlotIsNamed) {
  Trace t = small_trace();
  std::size_t s = 0;
  while (t.steps[s].starts().back() < 3) ++s;
  auto& slots = t.steps[s].slot_mapping.values;
  const std::int64_t dup = slots[0];
  slots[2] = dup;
  const TraceValidation v = validate_trace(t);
  ASSERT_FALSE(v.ok());
  const TraceProblem& p = v.problems.front();
  EXPECT_EQ(p.step, static_cast<std::int64_t>(s));
  EXPECT_EQ(p.tensor, "step." + std::to_string(s) + ".slot_mapping");
  EXPECT_EQ(p.index, 2);
  EXPECT_EQ(p.value, dup);
  EXPECT_NE(p.what.find("duplicate slot: entry 0"), std::string::npos) << p.describe();
}

TEST(TraceValidate, EachClassOfProblemIsNamed) {
  const Trace base = small_trace();
  const std::int64_t cap = base.config.geometry.capacity();
  std::size_t s = 0;
  while (base.steps[s].starts().back() < 2 ||
         base.steps[s].tokens() == base.steps[s].starts().back())
    ++s;
  const std::int64_t real = base.steps[s].starts().back();
  struct Case {
    const char* name;
    std::function<void(TraceStep&)> plant;
    std::string tensor;
    std::int64_t index;
    std::string what;
  };
  const std::vector<Case> cases{
      {"out of range", [&](TraceStep& st) { st.slot_mapping.values[1] = cap; }, "slot_mapping", 1,
       "out of range"},
      {"padding inside tokens", [&](TraceStep& st) { st.slot_mapping.values[1] = -1; },
       "slot_mapping", 1, "padding slot inside"},
      {"real slot in tail",
       [&](TraceStep& st) { st.slot_mapping.values[static_cast<std::size_t>(real)] = cap - 1; },
       "slot_mapping", real, "padding tail"},
      {"outside block table",
       [&](TraceStep& st) {
         // A block no request of the step holds.
         std::set<std::int64_t> held(st.block_table.values.begin(), st.block_table.values.end());
         std::int64_t b = 0;
         while (held.count(b)) ++b;
         st.slot_mapping.values[0] = b * base.config.geometry.block_size;
       },
       "slot_mapping", 0, "outside request 0"},
      {"block table past the cache",
       [&](TraceStep& st) { st.block_table.values[0] = base.config.geometry.num_blocks; },
       "block_table", 0, "past the cache"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Trace t = base;
    c.plant(t.steps[s]);
    const TraceValidation v = validate_trace(t);
    ASSERT_FALSE(v.ok());
    const auto hit = std::find_if(v.problems.begin(), v.problems.end(), [&](const TraceProblem& p) {
      return p.tensor == "step." + std::to_string(s) + "." + c.tensor && p.index == c.index &&
             p.what.find(c.what) != std::string::npos;
    });
    EXPECT_NE(hit, v.problems.end()) << v.problems.front().describe();
  }
}

TEST(TraceValidate, CommittedTracesAreValid) {
  const auto files = committed_traces();
  ASSERT_GE(files.size(), 3u);
  for (const auto& f : files) {
    const TraceValidation v = validate_trace(load_trace(f));
    EXPECT_TRUE(v.ok()) << f << ": " << (v.ok() ? "" : v.problems.front().describe());
  }
}

TEST(TraceReplay, CommittedTracesReplayCleanOnCpuSubjects) {
  for (const auto& f : committed_traces()) {
    SCOPED_TRACE(f.string());
    const Trace t = load_trace(f);
    auto subjects = cpu_subjects();
    // A trace whose dense layers use the fused insert: op write runs its sparse layers only, and
    // op dense its dense ones (cpu-dense joins).
    const bool fused = t.read.dense_rotary_dim > 0;
    ReplayOptions o;
    if (fused) {
      o.ops = {spec::Op::kWrite, spec::Op::kDense};
      for (auto& s : oracle::make_subjects()) {
        if (s->name() == "cpu-dense") subjects.push_back(std::move(s));
      }
    }
    const ReplayReport r = replay_trace(t, o, subjects);
    EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
    EXPECT_EQ(r.steps_run, static_cast<std::int64_t>(t.steps.size()));
    std::int64_t dense_layers = 0;
    for (spec::LayerKind k : t.config.layers) dense_layers += k == spec::LayerKind::kDense;
    const auto layers = static_cast<std::int64_t>(t.config.layers.size());
    for (const auto& s : r.subjects) {
      const std::int64_t judged = !fused                     ? layers
                                  : s.op == spec::Op::kDense ? dense_layers
                                                             : layers - dense_layers;
      EXPECT_EQ(s.layer_writes, static_cast<std::int64_t>(t.steps.size()) * judged) << s.name;
    }
    EXPECT_EQ(r.subjects.size(), fused ? 3u : 2u) << r.summary();
  }
}

TEST(TraceReplay, PlantedTraceIsRejectedWithItsLocation) {
  const Trace t = load_trace(testing::trace_data_dir() / "planted_duplicate_slot.st");
  auto subjects = cpu_subjects();
  try {
    (void)replay_trace(t, ReplayOptions{}, subjects);
    ADD_FAILURE() << "replayed a trace with a duplicate slot";
  } catch (const spec::InvalidInput& e) {
    EXPECT_EQ(e.field(), "step.3.slot_mapping");
    EXPECT_EQ(e.index(), 2);
  }
}

/// A subject that writes correctly except at one step, where it skips the last real token.
/// `layers` is how many layers each step writes (calls are counted from the first replayed step).
std::unique_ptr<oracle::Subject> drops_token_at(std::int64_t bad_step, std::int64_t layers) {
  auto calls = std::make_shared<std::int64_t>(0);
  return oracle::make_function_subject(
      "drops-token", [calls, bad_step, layers](const spec::ModelConfig& c,
                                               const spec::LayerWrite& w, spec::LayerCaches& out) {
        const std::int64_t step = (*calls)++ / layers;
        spec::LayerWrite bad = w;
        if (step == bad_step) {
          auto& slots = bad.slots.slots;
          const auto last =
              std::find_if(slots.rbegin(), slots.rend(), [](std::int64_t x) { return x >= 0; });
          if (last != slots.rend()) *last = -1;
        }
        reference::write_layer(c, bad, out);
      });
}

TEST(TraceReplay, PlantedSubjectBugStopsAtItsStep) {
  const Trace t = small_trace();
  oracle::SubjectList subjects;
  subjects.push_back(drops_token_at(7, 2));
  const ReplayReport r = replay_trace(t, ReplayOptions{}, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kMismatch);
  ASSERT_EQ(r.mismatches.size(), 1u);
  EXPECT_NE(r.mismatches[0].find("step 7, layer 0"), std::string::npos) << r.mismatches[0];
  EXPECT_EQ(r.steps_run, 8) << "stops at the first mismatching step";
}

TEST(TraceReplay, KeepGoingCollectsAndResyncs) {
  const Trace t = small_trace();
  oracle::SubjectList subjects;
  subjects.push_back(drops_token_at(4, 2));
  ReplayOptions o;
  o.keep_going = true;
  const ReplayReport r = replay_trace(t, o, subjects);
  EXPECT_EQ(r.steps_run, static_cast<std::int64_t>(t.steps.size()));
  // One report per layer of step 4, none after: the resync keeps later steps clean.
  EXPECT_EQ(r.mismatches.size(), t.config.layers.size());
  EXPECT_EQ(r.subjects[0].mismatching_steps, 1);
}

/// The report of a replay does not depend on how many layers are worked on at once: the
/// concurrent subjects (the CPU ones and a pure planted bug) write on the workers, the others
/// (a stateful planted bug counting its calls) on the calling thread, in layer order.
TEST(TraceReplay, TheReportIsTheSameForAnyNumberOfJobs) {
  const Trace t = small_trace();
  // Pure, so concurrent: a wrong first byte of K wherever the slot mapping names slot 5.
  const oracle::WriteFunction pure_bug = [](const spec::ModelConfig& c, const spec::LayerWrite& w,
                                            spec::LayerCaches& out) {
    reference::write_layer(c, w, out);
    const auto& slots = w.slots.slots;
    if (std::find(slots.begin(), slots.end(), 5) != slots.end()) {
      const reference::PagedCacheLayout layout(c);
      spec::CacheBuffer* k = out.find(layout.kv_buffer(0));
      const std::int64_t bs = c.geometry.block_size;
      k->body()[layout.kv_element(0, 5 / bs, 5 % bs, 0, 0) *
                static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype))] ^= 0x40;
    }
  };
  for (const bool keep_going : {false, true}) {
    std::vector<ReplayReport> reports;
    for (const std::int64_t jobs : {1, 2, 5}) {
      SCOPED_TRACE("keep_going " + std::to_string(keep_going) + ", jobs " + std::to_string(jobs));
      oracle::SubjectList subjects = cpu_subjects();
      subjects.push_back(oracle::make_function_subject("pure-bug", pure_bug, true));
      subjects.push_back(drops_token_at(9, static_cast<std::int64_t>(t.config.layers.size())));
      ASSERT_TRUE(subjects.front()->concurrent());
      ReplayOptions o;
      o.keep_going = keep_going;
      o.full_diff_every = 4;
      o.jobs = jobs;
      reports.push_back(replay_trace(t, o, subjects));
      const ReplayReport& r = reports.back();
      EXPECT_EQ(r.worst, spec::Outcome::kMismatch);
      ASSERT_FALSE(r.mismatches.empty());
      const ReplayReport& first = reports.front();
      EXPECT_EQ(r.summary(), first.summary());
      EXPECT_EQ(r.mismatches, first.mismatches);
      EXPECT_EQ(r.steps_run, first.steps_run);
      EXPECT_EQ(r.compared_bytes, first.compared_bytes);
    }
  }
}

/// A replay whose caches cannot fit in the host memory says so, with its figures, before it
/// allocates or runs anything (issue 15), instead of being killed by the OOM killer.
TEST(TraceReplay, AReplayThatCannotFitSaysSoBeforeItStarts) {
  const Trace t = small_trace();
  oracle::SubjectList subjects = cpu_subjects();
  ::setenv("KVO_HOST_MEMORY_BYTES", "4096", 1);
  try {
    replay_trace(t, ReplayOptions{}, subjects);
    ADD_FAILURE() << "expected FailedToRun";
  } catch (const spec::FailedToRun& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the replay needs about"), std::string::npos) << m;
    EXPECT_NE(m.find(" x " + std::to_string(subjects.size() + 1) + " copies: the reference's, " +
                     std::to_string(subjects.size()) + " write subject(s)'; "),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("are available (KVO_HOST_MEMORY_BYTES)"), std::string::npos) << m;
  }
  // The GPU tier's rechecks may keep the CPU reference's own copy of the caches: one more.
  oracle::SubjectList answerers = cpu_subjects();
  ReplayOptions tier;
  tier.tier = oracle::ReferenceTier::kGpu;
  tier.tier_answerers[spec::Op::kWrite] = answerers.front().get();
  try {
    replay_trace(t, tier, subjects);
    ADD_FAILURE() << "expected FailedToRun";
  } catch (const spec::FailedToRun& e) {
    const std::string m = e.what();
    EXPECT_NE(
        m.find(" x " + std::to_string(subjects.size() + 2) + " copies: the reference's, " +
               std::to_string(subjects.size()) + " write subject(s)' and the tier's CPU check's; "),
        std::string::npos)
        << m;
  }
  ::setenv("KVO_HOST_MEMORY_BYTES", "40", 1);  // not a replay's worth, whatever the subjects
  EXPECT_THROW(replay_trace(t, ReplayOptions{}, subjects), spec::FailedToRun);
  ::setenv("KVO_HOST_MEMORY_BYTES", "lots", 1);
  EXPECT_THROW(replay_trace(t, ReplayOptions{}, subjects), spec::InvalidInput);
  ::unsetenv("KVO_HOST_MEMORY_BYTES");
  EXPECT_EQ(replay_trace(t, ReplayOptions{}, subjects).worst, spec::Outcome::kPass);
}

/// What step n wrote is compared at step n+k: a subject that, from step 6 on, starts every layer
/// from freshly poisoned caches (forgetting earlier steps) must be caught at step 6.
TEST(TraceReplay, EarlierStepsAreReadBackLater) {
  const Trace t = small_trace();
  const reference::PagedCacheLayout layout(t.config);
  auto calls = std::make_shared<std::int64_t>(0);
  oracle::SubjectList subjects;
  subjects.push_back(oracle::make_function_subject(
      "forgets",
      [&, calls](const spec::ModelConfig& c, const spec::LayerWrite& w, spec::LayerCaches& out) {
        const std::int64_t n = (*calls)++;
        const std::int64_t layer = n % static_cast<std::int64_t>(c.layers.size());
        if (n / static_cast<std::int64_t>(c.layers.size()) == 6) {
          out = oracle::make_layer_caches(layout, layer, c.layers[static_cast<std::size_t>(layer)]);
        }
        reference::write_layer(c, w, out);
      }));
  const ReplayReport r = replay_trace(t, ReplayOptions{}, subjects);
  ASSERT_EQ(r.mismatches.size(), 1u);
  EXPECT_NE(r.mismatches[0].find("step 6, layer 0"), std::string::npos) << r.mismatches[0];
}

TEST(TraceReplay, StepRangeStartsFromTheReferenceState) {
  const Trace t = small_trace();
  oracle::SubjectList subjects;
  subjects.push_back(drops_token_at(2, 1));  // counts calls from the range start: step 5 + 2 = 7
  ReplayOptions o;
  o.step_begin = 5;
  o.step_end = 10;
  o.layers = {1};
  const ReplayReport r = replay_trace(t, o, subjects);
  ASSERT_EQ(r.mismatches.size(), 1u);
  EXPECT_NE(r.mismatches[0].find("step 7, layer 1"), std::string::npos) << r.mismatches[0];
  auto clean = cpu_subjects();
  const ReplayReport ok = replay_trace(t, o, clean);
  EXPECT_EQ(ok.worst, spec::Outcome::kPass);
  EXPECT_EQ(ok.steps_run, 5);
}

TEST(TraceReplay, BadRangesLayersAndSubjectsAreInvalidInput) {
  const Trace t = small_trace();
  auto subjects = cpu_subjects();
  ReplayOptions o;
  o.step_begin = 5;
  o.step_end = 3;
  EXPECT_THROW((void)replay_trace(t, o, subjects), spec::InvalidInput);
  o = ReplayOptions{};
  o.step_end = 99;
  EXPECT_THROW((void)replay_trace(t, o, subjects), spec::InvalidInput);
  o = ReplayOptions{};
  o.layers = {2};
  EXPECT_THROW((void)replay_trace(t, o, subjects), spec::InvalidInput);
  o = ReplayOptions{};
  o.subjects = {"nonesuch"};
  EXPECT_THROW((void)replay_trace(t, o, subjects), spec::InvalidInput);
}

TEST(TraceReplay, ValuesAreKeyedByRequestAndPosition) {
  SimOptions so;
  so.seed = 9;
  so.steps = 30;
  so.mtp = 2;  // rejected drafts' positions are written again in the next step
  so.config.layers = spec::parse_layer_mix("D");
  so.config.geometry.num_blocks = 32;
  so.config.geometry.head_dim = 16;
  const Trace t = simulate(so);
  const auto gen = replay_generator(t, ReplayOptions{});
  // Find a (request, position) written in two steps (a rewrite after preemption or MTP), and
  // check both writes carry the same K bytes; and padding rows differ from real ones.
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<std::uint8_t>> seen;
  const std::int64_t row = t.config.geometry.num_kv_heads * t.config.geometry.head_dim * 2;
  std::int64_t repeats = 0;
  for (std::int64_t s = 0; s < static_cast<std::int64_t>(t.steps.size()); ++s) {
    const spec::LayerWrite w = make_step_write(t, s, 0, gen);
    const TraceStep& st = t.steps[static_cast<std::size_t>(s)];
    const auto starts = st.starts();
    for (std::int64_t b = 0; b < st.batch(); ++b) {
      const auto bi = static_cast<std::size_t>(b);
      const std::int64_t q = starts[bi + 1] - starts[bi];
      for (std::int64_t j = 0; j < q; ++j) {
        const std::int64_t tok = starts[bi] + j;
        std::vector<std::uint8_t> bytes(w.k.bytes.begin() + tok * row,
                                        w.k.bytes.begin() + (tok + 1) * row);
        const auto key = std::make_pair(st.request_id(b), st.seq_lens.values[bi] - q + j);
        const auto [it, inserted] = seen.emplace(key, bytes);
        if (!inserted) {
          ++repeats;
          EXPECT_EQ(it->second, bytes) << "request " << key.first << " position " << key.second;
        }
      }
    }
  }
  EXPECT_GT(repeats, 0) << "the fixture should rewrite some token (preemption or MTP)";
}

}  // namespace
}  // namespace kvo::traces

namespace kvo::traces {
namespace {

/// small_trace with read parameters that make top-k choose: 4-token selection blocks (sequences
/// run to ~60 tokens, so up to 15 valid blocks), 2 kept, 4 query heads per KV head.
Trace read_trace(std::int64_t topk = 2) {
  Trace t = testing::small_trace();
  t.read.sparse_block = 4;
  t.read.topk = topk;
  t.read.num_q_heads = 4;
  t.read.num_index_heads = 4;
  return t;
}

ReplayOptions read_ops() {
  ReplayOptions o;
  o.ops = {spec::Op::kWrite, spec::Op::kIndexer, spec::Op::kAttention};
  return o;
}

oracle::SubjectList one_read_subject(std::unique_ptr<oracle::Subject> s) {
  oracle::SubjectList out;
  out.push_back(std::move(s));
  return out;
}

/// A canonical read subject whose attention applies sm_scale twice.
std::unique_ptr<oracle::Subject> scale_twice_mutant() {
  oracle::ReadMutation m;
  m.scale_twice = true;
  return oracle::make_canonical_mutant(m, "mutant-scale");
}

/// The step a read mismatch report names ("step 7, layer 1" -> 7).
std::int64_t reported_step(const std::string& report) {
  const auto at = report.find("), step ");
  return at == std::string::npos ? -1 : std::stoll(report.substr(at + 8));
}

TEST(TraceReadReplay, CommittedTraceReadsPassOnEveryReadSubject) {
  const Trace t = load_trace(testing::trace_data_dir() / "mtp_fp8_split_hnd.st");
  auto writes = cpu_subjects();
  auto reads = read_subjects();
  ReplayOptions o = read_ops();
  o.step_end = 40;
  const ReplayReport r = replay_trace(t, o, writes, reads);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  bool naive_ran = false;
  for (const auto& s : r.subjects) {
    if (s.name == "cpu-naive-f32") {
      naive_ran = true;
      // Every layer of the trace is sparse: one indexer and one attention call per layer and step.
      EXPECT_EQ(s.layer_writes, 40 * static_cast<std::int64_t>(t.config.layers.size()))
          << spec::name_of(s.op);
    }
  }
  EXPECT_TRUE(naive_ran) << r.summary();
}

TEST(TraceReadReplay, DenseLayersRunDenseAttentionOnly) {
  const Trace t = read_trace();  // layers DS
  oracle::SubjectList writes;
  auto reads = read_subjects();
  const ReplayReport r = replay_trace(t, read_ops(), writes, reads);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  const auto steps = static_cast<std::int64_t>(t.steps.size());
  for (const auto& s : r.subjects) {
    if (s.name != "cpu-naive-f32") continue;
    EXPECT_EQ(s.layer_writes, s.op == spec::Op::kIndexer ? steps : 2 * steps)
        << spec::name_of(s.op);
  }
}

/// A planted read bug is reported with its step, layer and query row, and the replay stops there:
/// the steps before it replay clean with the same subject, so the named step is the first bad one.
TEST(TraceReadReplay, PlantedReadBugsAreReportedAtTheirStep) {
  struct Case {
    const char* name;
    std::unique_ptr<oracle::Subject> (*make)();
    const char* op;
    std::int64_t topk;  ///< 1: only the forced local block is kept, so unforcing it shows
  };
  const Case cases[] = {
      {"foreign, local block unforced",
       [] {
         oracle::ReadMutation m;
         m.ignore_local = true;
         return oracle::make_cpu_naive_subject(m, "naive-no-local");
       },
       "indexer", 1},
      {"canonical, sm_scale twice", scale_twice_mutant, "attention", 2},
      {"foreign, no causal mask",
       [] {
         oracle::ReadMutation m;
         m.no_causal_mask = true;
         return oracle::make_cpu_naive_subject(m, "naive-no-mask");
       },
       "attention", 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Trace t = read_trace(c.topk);
    oracle::SubjectList writes;
    auto reads = one_read_subject(c.make());
    ReplayOptions o = read_ops();
    o.ops = oracle::parse_ops({"write", c.op});
    o.layers = {1};  // the sparse layer: attention over the selection (dense layers: below)
    const ReplayReport r = replay_trace(t, o, writes, reads);
    EXPECT_EQ(r.worst, spec::Outcome::kMismatch) << r.summary();
    ASSERT_EQ(r.mismatches.size(), 1u) << r.summary();
    const std::string& m = r.mismatches[0];
    EXPECT_NE(m.find(std::string("(") + c.op), std::string::npos) << m;
    EXPECT_NE(m.find(", layer 1, query row "), std::string::npos) << m;
    EXPECT_NE(m.find("request id "), std::string::npos) << m;
    const std::int64_t step = reported_step(m);
    ASSERT_GE(step, 0) << m;
    EXPECT_EQ(r.steps_run, step + 1) << "stops at the first mismatching step";
    ReplayOptions before = o;
    before.step_end = step;
    auto again = one_read_subject(c.make());
    EXPECT_EQ(replay_trace(t, before, writes, again).worst, spec::Outcome::kPass);
  }
}

TEST(TraceReadReplay, PlantedBugInDenseAttentionIsReported) {
  const Trace t = read_trace();
  oracle::SubjectList writes;
  auto reads = one_read_subject(scale_twice_mutant());
  ReplayOptions o = read_ops();
  o.layers = {0};  // dense
  const ReplayReport r = replay_trace(t, o, writes, reads);
  ASSERT_EQ(r.mismatches.size(), 1u) << r.summary();
  EXPECT_NE(r.mismatches[0].find("(attention, dense), step 0, layer 0, query row "),
            std::string::npos)
      << r.mismatches[0];
}

TEST(TraceReadReplay, KeepGoingCountsEveryMismatchingStep) {
  const Trace t = read_trace();
  oracle::SubjectList writes;
  auto reads = one_read_subject(scale_twice_mutant());
  ReplayOptions o = read_ops();
  o.ops = {spec::Op::kAttention};
  o.keep_going = true;
  const ReplayReport r = replay_trace(t, o, writes, reads);
  EXPECT_EQ(r.steps_run, static_cast<std::int64_t>(t.steps.size()));
  ASSERT_EQ(r.subjects.size(), 1u);
  EXPECT_GT(r.subjects[0].mismatching_steps, 1);
  EXPECT_EQ(r.mismatches.size(), 2 * static_cast<std::size_t>(r.subjects[0].mismatching_steps))
      << "one report per layer (both layers attend) of each mismatching step";
}

TEST(TraceReadReplay, QueriesAreKeyedByRequestAndPosition) {
  const Trace t = read_trace();
  const auto gen = replay_generator(t, ReplayOptions{});
  const oracle::ReadCase rc = make_step_read(t, 5, 1, gen);
  const TraceStep& st = t.steps[5];
  ASSERT_EQ(rc.q.shape[0], st.starts().back()) << "one query row per real token";
  const auto rows = reference::query_rows(rc.batch);
  const std::int64_t hd = t.config.geometry.head_dim;
  const std::int64_t row = rc.q.shape[0] - 1;
  const auto& q = rows[static_cast<std::size_t>(row)];
  const float x =
      gen.value(1, reference::GenTensor::kQ, st.request_id(q.request), q.position, 3, hd - 1);
  std::uint16_t code = 0;
  std::memcpy(&code, &rc.q.bytes[static_cast<std::size_t>(((row * 4 + 3) * hd + hd - 1) * 2)], 2);
  EXPECT_EQ(code, reference::encode(x, t.config.act_dtype, spec::Saturation::kSatFinite));
}

TEST(TraceReadReplay, UnknownOpIsInvalidInput) {
  const Trace t = read_trace();
  auto writes = cpu_subjects();
  EXPECT_THROW((void)oracle::parse_ops({"write", "softmax"}), spec::InvalidInput);
  ReplayOptions o;
  o.ops = {spec::Op::kWrite, spec::Op::kDense};  // a trace holds no dense-insert cases
  EXPECT_THROW((void)replay_trace(t, o, writes), spec::InvalidInput);
}

/// Between whole-cache comparisons only the pages a step names are compared; a subject that also
/// writes one byte into a page no slot of the step names must still be reported: at the next
/// whole-cache comparison (naming the steps it happened in), or at its step with
/// full_diff_every = 1. A stray write into a guard band is reported at its step and layer.
std::unique_ptr<oracle::Subject> stray_byte_at(std::int64_t bad_step, std::int64_t layers,
                                               std::int64_t page /* -1: the guard */) {
  auto calls = std::make_shared<std::int64_t>(0);
  return oracle::make_function_subject(
      "stray", [calls, bad_step, layers, page](const spec::ModelConfig& c,
                                               const spec::LayerWrite& w, spec::LayerCaches& out) {
        const std::int64_t n = (*calls)++;
        reference::write_layer(c, w, out);
        if (n != bad_step * layers) return;  // layer 0 of the bad step
        spec::CacheBuffer& k = out.buffers.front();
        if (page < 0) {
          k.storage[static_cast<std::size_t>(k.storage.size() - 1)] ^= 0x01;
          return;
        }
        const std::int64_t block_bytes = k.body_bytes() / c.geometry.num_blocks;
        k.body()[page * block_bytes + block_bytes / 2] ^= 0x10;
      });
}

/// A cache block no slot of steps [from, end) names.
std::int64_t unnamed_page(const Trace& t, std::size_t from) {
  std::vector<bool> named(static_cast<std::size_t>(t.config.geometry.num_blocks), false);
  for (std::size_t s = from; s < t.steps.size(); ++s) {
    for (std::int64_t slot : t.steps[s].slot_mapping.values) {
      if (slot >= 0) named[static_cast<std::size_t>(slot / t.config.geometry.block_size)] = true;
    }
  }
  return std::find(named.begin(), named.end(), false) - named.begin();
}

TEST(TraceReplay, StrayWriteOutsideTheNamedPagesIsCaught) {
  const Trace t = small_trace();
  for (const std::int64_t every : {std::int64_t{1}, std::int64_t{4}, std::int64_t{32}}) {
    SCOPED_TRACE("full_diff_every " + std::to_string(every));
    oracle::SubjectList subjects;
    const std::int64_t page = unnamed_page(t, 5);
    ASSERT_LT(page, t.config.geometry.num_blocks) << "the fixture should leave a page unnamed";
    subjects.push_back(stray_byte_at(5, 2, page));
    ReplayOptions o;
    o.full_diff_every = every;
    const ReplayReport r = replay_trace(t, o, subjects);
    EXPECT_EQ(r.worst, spec::Outcome::kMismatch);
    ASSERT_EQ(r.mismatches.size(), 1u);
    const std::string& m = r.mismatches[0];
    // Steps 0-11: whole-cache comparisons after steps 0, 1, 2, ... (every 1), 3, 7 (every 4),
    // or only after the last, 11 (every 32).
    const std::int64_t found = every == 1 ? 5 : every == 4 ? 7 : 11;
    EXPECT_NE(m.find("whole-cache comparison after step " + std::to_string(found) + ", layer 0"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find(std::to_string(every == 1   ? 5
                                    : every == 4 ? 4
                                                 : 0) +
                     ".." + std::to_string(found)),
              std::string::npos)
        << m;
    EXPECT_EQ(r.steps_run, found + 1);
  }
}

/// Each mismatch carries the replay flags that rerun it alone (the steps before its range written
/// by the reference): rerun with them, the same subject mismatches at the same step and layer. A
/// step's mismatch names that step; a whole-cache comparison's, the steps since the last one.
TEST(TraceReplay, EveryMismatchCarriesTheFlagsThatRerunItAlone) {
  const Trace t = small_trace();
  const std::int64_t page = unnamed_page(t, 5);
  ASSERT_LT(page, t.config.geometry.num_blocks);
  const auto planted = [&] {
    oracle::SubjectList s;
    s.push_back(testing::planted_at("flips-k", t, 4));
    s.push_back(testing::planted_at("strays", t, 5, page));
    return s;
  };
  oracle::SubjectList subjects = planted();
  ReplayOptions o;
  o.keep_going = true;
  o.full_diff_every = 4;  // whole caches after steps 3, 7, 11
  const ReplayReport r = replay_trace(t, o, subjects);
  ASSERT_EQ(r.reproduce.size(), r.mismatches.size());
  std::set<std::string> seen;
  for (std::size_t i = 0; i < r.reproduce.size(); ++i) {
    SCOPED_TRACE(r.reproduce[i]);
    std::istringstream flags(r.reproduce[i]);
    std::string steps_flag, steps, layers_flag, subject_flag, subject, ops_flag, op;
    std::int64_t layer = -1;
    flags >> steps_flag >> steps >> layers_flag >> layer >> subject_flag >> subject >> ops_flag >>
        op;
    ASSERT_EQ(steps_flag + layers_flag + subject_flag + ops_flag, "--steps--layers--subject--ops");
    EXPECT_EQ(op, "write");
    seen.insert(subject + " " + steps);
    ReplayOptions again;
    again.step_begin = std::stoll(steps.substr(0, steps.find(':')));
    again.step_end = std::stoll(steps.substr(steps.find(':') + 1));
    again.layers = {layer};
    again.subjects = {subject};
    oracle::SubjectList fresh = planted();
    const ReplayReport rr = replay_trace(t, again, fresh);
    EXPECT_EQ(rr.worst, spec::Outcome::kMismatch) << rr.summary();
    ASSERT_FALSE(rr.mismatches.empty());
    EXPECT_NE(rr.mismatches[0].find("subject " + subject), std::string::npos) << rr.mismatches[0];
    EXPECT_NE(rr.mismatches[0].find("layer " + std::to_string(layer)), std::string::npos)
        << rr.mismatches[0];
    EXPECT_EQ(rr.reproduce[0], r.reproduce[i]) << "the rerun's own flags are the same";
  }
  EXPECT_EQ(seen, (std::set<std::string>{"flips-k 4:5", "strays 4:8"}));
}

TEST(TraceReplay, StrayWriteIntoAGuardIsCaughtAtItsStep) {
  const Trace t = small_trace();
  oracle::SubjectList subjects;
  subjects.push_back(stray_byte_at(5, 2, -1));
  const ReplayReport r = replay_trace(t, ReplayOptions{}, subjects);
  ASSERT_EQ(r.mismatches.size(), 1u);
  EXPECT_NE(r.mismatches[0].find("step 5, layer 0\n"), std::string::npos) << r.mismatches[0];
}

/// A trace whose dense layers use the fused qknorm + rope + insert: op write covers its sparse
/// layer, op dense its dense one.
Trace fused_dense_trace() {
  Trace t = testing::small_trace();  // layers DS, head_dim 16
  t.read.dense_rotary_dim = 8;
  return t;
}

oracle::SubjectList write_and_dense_subjects() {
  oracle::SubjectList out;
  for (auto& s : oracle::make_subjects()) {
    if (s->name() == "cpu-fused" || s->name() == "cpu-dense") out.push_back(std::move(s));
  }
  return out;
}

TEST(TraceDenseReplay, FusedDenseLayersReplayCleanThroughTheDenseOp) {
  const Trace t = fused_dense_trace();
  auto subjects = write_and_dense_subjects();
  ReplayOptions o;
  o.ops = {spec::Op::kWrite, spec::Op::kDense};
  o.full_diff_every = 3;
  const ReplayReport r = replay_trace(t, o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  const auto steps = static_cast<std::int64_t>(t.steps.size());
  ASSERT_EQ(r.subjects.size(), 2u) << r.summary();
  // One layer each: cpu-fused writes the sparse layer, cpu-dense inserts into the dense one.
  EXPECT_EQ(r.subjects[0].name, "cpu-fused");
  EXPECT_EQ(r.subjects[0].layer_writes, steps);
  EXPECT_EQ(r.subjects[1].name, "cpu-dense");
  EXPECT_EQ(r.subjects[1].op, spec::Op::kDense);
  EXPECT_EQ(r.subjects[1].layer_writes, steps);
  // The dense layer's caches hold normed and rotated K: not what a plain write stores.
  const reference::ValueGenerator gen = replay_generator(t, o);
  const spec::DenseInsert d = make_step_dense(t, 0, 0, gen, rope_table(t));
  EXPECT_EQ(d.rotary_dim, 8);
  EXPECT_EQ(d.q.shape[1], attention_params(t).num_q_heads);
  EXPECT_EQ(d.kv.k.bytes, make_step_write(t, 0, 0, gen).k.bytes);
}

TEST(TraceDenseReplay, APlantedDenseBugIsReportedAtItsStepAndLayer) {
  const Trace t = fused_dense_trace();
  oracle::SubjectList subjects;
  subjects.push_back(oracle::make_cpu_dense_subject({.gptj_rope = true}, "dense-gptj"));
  ReplayOptions o;
  o.ops = {spec::Op::kDense};
  const ReplayReport r = replay_trace(t, o, subjects);
  ASSERT_EQ(r.worst, spec::Outcome::kMismatch) << r.summary();
  ASSERT_EQ(r.mismatches.size(), 1u);
  EXPECT_NE(r.mismatches[0].find("subject dense-gptj (dense), step 0, layer 0"), std::string::npos)
      << r.mismatches[0];
  EXPECT_NE(r.mismatches[0].find("q_out"), std::string::npos) << r.mismatches[0];
}

TEST(TraceDenseReplay, TheDenseFp8StoreKeyDecidesWhatIsRight) {
  // An fp8 cache with scales other than 1: a dense subject storing with scale 1 (vLLM's fused M3
  // insert) is right on a trace whose dense_fp8_store says identity and wrong on a scaled one; a
  // scaled subject the other way round.
  Trace t = fused_dense_trace();
  t.config.kv.cache_dtype = spec::DType::kFp8E4M3;
  t.config.kv.scale_mode = spec::ScaleMode::kDivide;
  t.k_scale = {0.5f};
  t.v_scale = {0.25f};
  ReplayOptions o;
  o.ops = {spec::Op::kDense};
  for (const auto store : {spec::DenseFp8Store::kScaled, spec::DenseFp8Store::kIdentity}) {
    t.read.dense_fp8_store = store;
    const Trace back = parse_trace(serialize_trace(t));
    ASSERT_EQ(back.read.dense_fp8_store, store);
    oracle::SubjectList subjects;
    subjects.push_back(oracle::make_cpu_dense_subject({}, "cpu-dense"));
    subjects.push_back(oracle::make_cpu_dense_subject({.fp8_store_unscaled = true}, "unit-scale"));
    const ReplayReport r = replay_trace(back, o, subjects);
    ASSERT_EQ(r.subjects.size(), 2u) << r.summary();
    const bool identity = store == spec::DenseFp8Store::kIdentity;
    EXPECT_EQ(r.subjects[0].outcome, spec::Outcome::kPass) << r.summary();
    EXPECT_EQ(r.subjects[1].outcome, identity ? spec::Outcome::kPass : spec::Outcome::kMismatch)
        << r.summary();
  }
}

TEST(TraceDenseReplay, DenseOpNeedsATraceThatSaysSo) {
  auto subjects = write_and_dense_subjects();
  ReplayOptions o;
  o.ops = {spec::Op::kDense};
  EXPECT_THROW((void)replay_trace(testing::small_trace(), o, subjects), spec::InvalidInput);
  Trace wide = fused_dense_trace();
  wide.read.dense_rotary_dim = 32;  // > head_dim 16
  EXPECT_THROW((void)replay_trace(wide, o, subjects), spec::InvalidInput);
}

TEST(TraceDenseReplay, RotaryDimRoundTripsAndAnOddOneIsRejected) {
  const Trace t = fused_dense_trace();
  const std::string path = ::testing::TempDir() + "kvo_dense_trace.st";
  save_trace(t, path);
  EXPECT_EQ(load_trace(path).read.dense_rotary_dim, 8);
  // Without the key, a trace keeps its bytes: plain dense writes.
  EXPECT_EQ(testing::small_trace().read.dense_rotary_dim, 0);
  EXPECT_EQ(testing::split(serialize_trace(testing::small_trace()))
                .header["__metadata__"]
                .count("dense_rotary_dim"),
            0u);
  testing::FileParts odd = testing::split(serialize_trace(t));
  odd.header["__metadata__"]["dense_rotary_dim"] = "7";
  try {
    (void)parse_trace(testing::join(odd));
    FAIL();
  } catch (const spec::InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("dense_rotary_dim"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvo::traces
