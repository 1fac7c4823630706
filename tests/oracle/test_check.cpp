// The campaign: clean subjects pass; a planted bug is found, its report carries the case seed and a
// command that replays exactly that case; bad campaign input is rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>

#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/explain.hpp"
#include "kvo/oracle/report_files.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {
namespace {

SubjectList planted_subjects() {
  SubjectList s;
  // Index-K written through the main mapping even when the model has its own index mapping.
  s.push_back(make_function_subject(
      "index-k-through-main-mapping",
      [](const spec::ModelConfig& c, const spec::LayerWrite& w, spec::LayerCaches& out) {
        spec::LayerWrite bad = w;
        if (c.separate_index_slots) bad.index_slots = w.slots;
        reference::write_layer(c, bad, out);
      }));
  return s;
}

TEST(Check, CpuSubjectsPass) {
  CheckOptions o;
  o.seed = 11;
  o.cases = 40;
  o.ops = {spec::Op::kWrite};
  auto subjects = make_subjects();
  const CheckReport r = run_check(o, subjects);
  EXPECT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  EXPECT_EQ(r.cases_run, 40);
  int ran = 0;
  for (const auto& s : r.subjects) {
    if (!s.skipped.empty()) continue;  // a GPU subject on a machine without a GPU
    EXPECT_EQ(s.count(spec::Outcome::kPass), 40) << s.name;
    ++ran;
  }
  EXPECT_GE(ran, 2);  // cpu-fused and cpu-unfused always run
}

TEST(Check, PlantedBugIsFoundAndItsReproReplaysTheSameCase) {
  CheckOptions o;
  o.seed = 5;
  o.cases = 60;
  o.overrides.write.separate_index_slots = true;
  o.overrides.write.layers = "DS";
  auto subjects = planted_subjects();
  const CheckReport r = run_check(o, subjects);
  ASSERT_EQ(r.worst, spec::Outcome::kMismatch) << r.summary();
  const std::string& failure = r.subjects[0].first_failure;
  EXPECT_NE(failure.find("layer 1 index_k"), std::string::npos) << failure;
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(failure, m,
                        std::regex("reproduce: kvoracle check --case-seed (0x[0-9A-F]{16}) "
                                   "--subject index-k-through-main-mapping --ops write --layers DS "
                                   "--separate-index-slots true")))
      << failure;
  CheckOptions replay = o;
  replay.case_seed = std::stoull(m[1].str(), nullptr, 16);
  const CheckReport again = run_check(replay, subjects);
  EXPECT_EQ(again.cases_run, 1);
  EXPECT_EQ(again.worst, spec::Outcome::kMismatch);
  // Same case, same first mismatch.
  const auto tail = [](const std::string& s) { return s.substr(s.find('\n')); };
  EXPECT_EQ(tail(again.subjects[0].first_failure), tail(failure));
}

TEST(Check, OutcomeClassesStayApart) {
  SubjectList s;
  s.push_back(make_function_subject("throws-runtime", [](const auto&, const auto&, auto&) {
    throw std::runtime_error("cudaErrorIllegalAddress");
  }));
  s.push_back(make_function_subject("unsupported", [](const auto&, const auto&, auto&) {
    throw spec::Unsupported("legacy_wrap");
  }));
  s.push_back(make_function_subject("rejects", [](const auto&, const auto&, auto&) {
    throw spec::InvalidInput("slot_mapping", 0, "1", "made up");
  }));
  CheckOptions o;
  o.cases = 3;
  const CheckReport r = run_check(o, s);
  EXPECT_EQ(r.subjects[0].count(spec::Outcome::kFailedToRun), 3);
  EXPECT_NE(r.subjects[0].first_failure.find("cudaErrorIllegalAddress"), std::string::npos);
  EXPECT_EQ(r.subjects[1].count(spec::Outcome::kUnsupported), 3);
  EXPECT_EQ(r.subjects[2].count(spec::Outcome::kInvalidInput), 3);
  EXPECT_EQ(r.worst, spec::Outcome::kFailedToRun);
  EXPECT_EQ(spec::exit_status(r.worst), 3);
}

/// The campaign of `o` run as two shards, each report through its JSON, merged.
CheckReport merged_halves(const CheckOptions& o, SubjectList& subjects) {
  CheckOptions half = o;
  half.total_shards = 2;
  std::vector<CheckReport> shards;
  for (std::int64_t i = 0; i < 2; ++i) {
    half.shard_index = i;
    shards.push_back(read_report_json(report_json(run_check(half, subjects)), "shard"));
  }
  return merge_reports(shards, {"a", "b"});
}

TEST(Check, EveryFailureClassIsCountedWithACaseToReplay) {
  // One subject, three causes over the cases: a wrong element where the case has an odd seed, a
  // failure to run (with a number in its message that differs case to case) on a third of the
  // rest, a guard-band write on the others. The report names all three with their counts.
  SubjectList s;
  s.push_back(make_function_subject(
      "three-causes",
      [](const spec::ModelConfig& c, const spec::LayerWrite& w, spec::LayerCaches& out) {
        reference::write_layer(c, w, out);
        const std::uint64_t key = static_cast<std::uint64_t>(w.slots.slots.size()) * 7919u +
                                  static_cast<std::uint64_t>(c.geometry.block_size);
        spec::CacheBuffer& b = out.buffers.front();
        if (key % 3 == 0)
          throw std::runtime_error("cudaMalloc: out of memory asking " + std::to_string(key) +
                                   " bytes");
        if (key % 3 == 1) {
          b.storage.data()[b.guard_bytes - 1] ^= 0x40;  // the byte before the body
        } else {
          b.storage.data()[b.storage.size() / 2] ^= 0x01;
        }
      }));
  CheckOptions o;
  o.cases = 60;
  o.ops = {spec::Op::kWrite};
  o.overrides.write.layers = "D";
  const CheckReport r = run_check(o, s);
  const SubjectSummary& sum = r.subjects.at(0);
  ASSERT_GE(sum.failure_classes.size(), 3u) << r.summary();
  std::int64_t counted = 0;
  for (const FailureClassCount& c : sum.failure_classes) {
    counted += c.cases;
    EXPECT_GE(c.first_case, 0) << c.name;
    EXPECT_EQ(c.first_seed, case_seed(o.seed, static_cast<std::uint64_t>(c.first_case))) << c.name;
  }
  EXPECT_EQ(counted, sum.cases - sum.count(spec::Outcome::kPass));
  const auto has = [&](const std::string& name) {
    return std::any_of(sum.failure_classes.begin(), sum.failure_classes.end(),
                       [&](const FailureClassCount& c) { return c.name == name; });
  };
  EXPECT_TRUE(has("failed-to-run: cudaMalloc: out of memory asking N bytes")) << r.summary();
  EXPECT_TRUE(has("mismatch: a write into a guard band")) << r.summary();
  const std::string text = r.summary();
  EXPECT_NE(text.find("cases that did not pass, by class: three-causes (write)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("  failed-to-run: cudaMalloc: out of memory asking N bytes (first: case "),
            std::string::npos)
      << text;
  // The JSON report carries them, and a merge of shards adds them up.
  const std::string json = report_json(r);
  EXPECT_NE(json.find("\"failure_classes\": [{\"class\": "), std::string::npos) << json;
  EXPECT_NE(junit_xml(r).find("cases: mismatch: a write into a guard band (first: case "),
            std::string::npos);
  const CheckReport merged = merged_halves(o, s);
  ASSERT_EQ(merged.subjects.at(0).failure_classes.size(), sum.failure_classes.size());
  for (const FailureClassCount& c : sum.failure_classes) {
    const auto& m = merged.subjects.at(0).failure_classes;
    const auto it = std::find_if(m.begin(), m.end(),
                                 [&](const FailureClassCount& x) { return x.name == c.name; });
    ASSERT_NE(it, m.end()) << c.name;
    EXPECT_EQ(it->cases, c.cases) << c.name;
    EXPECT_EQ(it->first_case, c.first_case) << c.name;
    EXPECT_EQ(it->first_seed, c.first_seed) << c.name;
  }
}

TEST(Check, BlindSpotsOfTheDeclaredProfileAreCountedWhereThePassIsReported) {
  // SPEC principle 4: a flash-style attention declared bf16_p passes, and the campaign says in
  // how many cases that profile could not have caught each planted bug class: the same cases
  // `explain` names one by one.
  CheckOptions o;
  o.cases = 60;
  o.ops = {spec::Op::kAttention};
  o.subjects = {"cpu-flash-bf16"};
  SubjectList subjects = make_subjects();
  const CheckReport r = run_check(o, subjects);
  ASSERT_EQ(r.worst, spec::Outcome::kPass) << r.summary();
  const SubjectSummary& sum = r.subjects.at(0);
  ASSERT_FALSE(sum.blind_spots.empty()) << r.summary();
  std::map<std::string, std::int64_t> explained;
  for (std::int64_t i = 0; i < o.cases; ++i) {
    const Explanation e = explain_case(o, case_seed(o.seed, static_cast<std::uint64_t>(i)),
                                       "cpu-flash-bf16", spec::Op::kAttention, subjects);
    for (const auto& [bug, n] : sum.blind_spots) {
      if (e.text.find("to catch planted bug " + bug + " ") != std::string::npos) ++explained[bug];
    }
  }
  EXPECT_EQ(explained, sum.blind_spots);
  const std::string text = r.summary();
  EXPECT_NE(text.find("blind spots of cpu-flash-bf16 (attention): its declared profile is too "
                      "loose"),
            std::string::npos)
      << text;
  const auto& [bug, cases] = *sum.blind_spots.begin();
  EXPECT_NE(text.find(std::to_string(cases) + " of 60 cases  " + bug), std::string::npos) << text;
  EXPECT_NE(report_json(r).find("\"blind_spots\": {\"" + bug + "\": " + std::to_string(cases)),
            std::string::npos);
  EXPECT_NE(junit_xml(r).find("<property name=\"blind_spot." + bug + "\" value=\"" +
                              std::to_string(cases) + " of 60 cases\"/>"),
            std::string::npos);
  // A merge of shards adds them up.
  EXPECT_EQ(merged_halves(o, subjects).subjects.at(0).blind_spots, sum.blind_spots);
  // A tighter profile (fp32) is blind less often.
  o.subjects = {"cpu-naive-f32"};
  std::int64_t tight = 0, loose = 0;
  for (const auto& [name, n] : run_check(o, subjects).subjects.at(0).blind_spots) tight += n;
  for (const auto& [name, n] : sum.blind_spots) loose += n;
  EXPECT_LT(tight, loose);
}

TEST(Check, ACaseThatDoesNotFitTheDevicesFreeMemoryIsSkippedNeverFailed) {
  // What the device memory pool throws when an allocation does not fit, even after waiting for
  // other processes (spec::DeviceMemoryShort): the case is skipped with the sizes, not the
  // subject's failure; the other cases are judged.
  SubjectList s;
  s.push_back(make_function_subject(
      "big-cases-short",
      [](const spec::ModelConfig& c, const spec::LayerWrite& w, spec::LayerCaches& out) {
        if (c.geometry.num_blocks > 40) {
          throw spec::DeviceMemoryShort(
              "needs 9.00 GiB of device memory, 2.50 GiB free of 79.10 GiB (waited 120 s for other "
              "processes to free it)");
        }
        reference::write_layer(c, w, out);
      }));
  CheckOptions o;
  o.cases = 40;
  o.ops = {spec::Op::kWrite};
  const CheckReport r = run_check(o, s);
  const SubjectSummary& sum = r.subjects.at(0);
  EXPECT_EQ(sum.count(spec::Outcome::kFailedToRun), 0) << r.summary();
  EXPECT_GT(sum.count(spec::Outcome::kUnsupported), 0) << r.summary();
  EXPECT_GT(sum.count(spec::Outcome::kPass), 0) << r.summary();
  EXPECT_EQ(r.worst, spec::Outcome::kUnsupported) << r.summary();
  EXPECT_NE(r.summary().find("unsupported: skipped: needs N.N GiB of device memory, N.N GiB free "
                             "of N.N GiB"),
            std::string::npos)
      << r.summary();
}

TEST(Check, UnknownSubjectIsInvalidInput) {
  CheckOptions o;
  o.subjects = {"cpu-fused", "cuda-nonesuch"};
  auto subjects = make_subjects();
  try {
    run_check(o, subjects);
    FAIL();
  } catch (const spec::InvalidInput& e) {
    EXPECT_EQ(e.field(), "subject");
    EXPECT_EQ(e.index(), 1);
    EXPECT_EQ(e.value(), "cuda-nonesuch");
  }
}

TEST(Check, CasesAreAPureFunctionOfTheSeed) {
  const WriteCase a = make_write_case(42, {});
  const WriteCase b = make_write_case(42, {});
  EXPECT_EQ(a.describe(), b.describe());
  ASSERT_EQ(a.writes.size(), b.writes.size());
  for (std::size_t l = 0; l < a.writes.size(); ++l) {
    EXPECT_EQ(a.writes[l].k.bytes, b.writes[l].k.bytes);
    EXPECT_EQ(a.writes[l].slots.slots, b.writes[l].slots.slots);
  }
  EXPECT_NE(make_write_case(43, {}).describe(), a.describe());
}

}  // namespace
}  // namespace kvo::oracle
