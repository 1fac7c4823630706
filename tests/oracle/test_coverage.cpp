// Reach (issue 14): the stratified stress themes and the coverage table. Under the default
// distribution every rare condition of every op's table comes up within the first 20 cases of a
// campaign and in at least 1 case of 20 over a longer one; a case's theme is its seed's.
#include <gtest/gtest.h>

#include <iostream>

#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/cpu_subjects.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/report_files.hpp"
#include "kvo/oracle/write_case.hpp"

namespace kvo::oracle {
namespace {

TEST(Coverage, CaseSeedsCycleThroughTheThemeSlots) {
  for (std::uint64_t campaign : {0x6B766F72ull, 1ull, 0xFFFFFFFFFFFFFFFFull}) {
    for (std::uint64_t i = 0; i < 40; ++i)
      EXPECT_EQ(theme_slot(case_seed(campaign, i)), i % kThemeSlots) << campaign << " " << i;
  }
  // The themes as the generators read them, from the seed alone.
  const std::uint64_t inside = case_seed(5, kThemeMinusOneInside);
  const WriteCase w = make_write_case(inside, {});
  EXPECT_TRUE(w.padding_interleaved) << w.describe();
  EXPECT_GT(w.padding, 0);
  const WriteCase z = make_write_case(case_seed(5, kThemeZeros), {});
  EXPECT_GT(z.zero_rows, 0) << z.describe();
  const WriteCase legacy = make_write_case(case_seed(5, kThemeLegacyWrap), {});
  EXPECT_EQ(legacy.config.slot_mode, spec::SlotMode::kLegacyWrap);
  const ReadCase longc = make_read_case(case_seed(5, kThemeLongContext), {});
  EXPECT_GT(longc.batch.seq_lens.at(0), 4096) << longc.describe();
  EXPECT_EQ(longc.indexer.sparse_block, 4);
  // An override of what a theme sets wins.
  ReadOverrides fixed;
  fixed.sparse_block = 32;
  fixed.max_seq_len = 100;
  const ReadCase pinned = make_read_case(case_seed(5, kThemeLongContext), fixed);
  EXPECT_EQ(pinned.indexer.sparse_block, 32);
  EXPECT_LE(pinned.batch.seq_lens.at(0), 100);
}

TEST(Coverage, EveryConditionIsReachedWithin20CasesAndOneInTwenty) {
  SubjectList subjects = make_cpu_subjects();
  for (const std::uint64_t seed : {0x6B766F72ull, 0xC0FFEEull}) {
    CheckOptions o;
    o.seed = seed;
    o.cases = 160;
    o.subjects = {"cpu-fused", "cpu-dense", "cpu-naive-f32"};
    const CheckReport r = run_check(o, subjects);
    std::cout << r.coverage_table();
    ASSERT_FALSE(r.coverage.empty());
    for (const CoverageRow& c : r.coverage) {
      SCOPED_TRACE(std::string(spec::name_of(c.op)) + " " + c.condition + " seed " +
                   std::to_string(seed));
      EXPECT_EQ(c.cases, 160);
      EXPECT_GE(c.first_case, 0);
      EXPECT_LT(c.first_case, 20);
      EXPECT_GE(c.reached * 20, c.cases);
    }
    const std::string json = report_json(r);
    EXPECT_NE(json.find("\"coverage\": ["), std::string::npos);
    EXPECT_NE(json.find("\"condition\": \"block_ids_past_1024\""), std::string::npos);
  }
}

}  // namespace
}  // namespace kvo::oracle
