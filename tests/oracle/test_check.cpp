// The campaign: clean subjects pass; a planted bug is found, its report carries the case seed and a
// command that replays exactly that case; bad campaign input is rejected.
#include <gtest/gtest.h>

#include <regex>

#include "kvo/oracle/campaign.hpp"
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
