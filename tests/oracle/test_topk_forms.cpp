// Declared top-k forms of foreign indexers (SPEC 5): the text form, score keys and their step,
// head-major layouts, the key-widened tie-aware bound, the order a canonical subject may declare,
// and mode detection naming a subject's order and layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "kvo/oracle/cpu_subjects.hpp"
#include "kvo/oracle/detect.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/read_diff.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {
namespace {

using spec::TopkLayout;

TEST(TopkForm, TextRoundTripsAndBadTextIsNamed) {
  const TopkForm vllm{TopkOrder::kDescendingScore, TopkLayout::kHeadMajor};
  const TopkForm msa{TopkOrder::kAscendingIds, TopkLayout::kTokenMajor, 16};
  EXPECT_EQ(spec::topk_form_text(TopkForm{}), "ascending_ids");
  EXPECT_EQ(spec::topk_form_text(vllm), "descending_score,head_major");
  EXPECT_EQ(spec::topk_form_text(msa), "ascending_ids,keys16");
  for (const TopkForm& f : {TopkForm{}, vllm, msa})
    EXPECT_EQ(spec::parse_topk_form(spec::topk_form_text(f), "f"), f);
  EXPECT_EQ(spec::parse_topk_form("unordered,keys9,head_major", "f"),
            (TopkForm{TopkOrder::kUnordered, TopkLayout::kHeadMajor, 9}));
  for (const char* bad : {"", "descending", "ascending_ids,", "ascending_ids,keys8",
                          "ascending_ids,keys33", "ascending_ids,keysx", "ascending_ids,rows"}) {
    try {
      spec::parse_topk_form(bad, "--topk-order");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const spec::InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find("--topk-order"), std::string::npos) << e.what();
    }
  }
}

float from_bits(std::uint32_t b) {
  float f = 0.0f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(TopkForm, ScoreKeysRoundTowardMinusInfinityWithinOneStep) {
  // 16-bit keys keep 7 mantissa bits: 1 + 2^-7 + 2^-9 keys to 1 + 2^-7; -1 keys to the most
  // negative float whose image shares -1's top 16 bits, -(1 + (2^16 - 1) * 2^-23).
  EXPECT_EQ(spec::topk_score_key(1.0f + 0x1p-7f + 0x1p-9f, 16), 1.0f + 0x1p-7f);
  EXPECT_EQ(spec::topk_score_key(-1.0f, 16), from_bits(0xBF80FFFFu));
  EXPECT_EQ(spec::topk_score_key(1e30f, 32), 1e30f);
  EXPECT_EQ(spec::topk_score_key(-INFINITY, 16), -INFINITY);
  EXPECT_EQ(spec::topk_score_key(INFINITY, 16), INFINITY);
  EXPECT_EQ(spec::topk_key_step(1.5, 16), 0x1p-7);
  EXPECT_EQ(spec::topk_key_step(-3.0, 12), 0x1p-2);
  EXPECT_EQ(spec::topk_key_step(0.0, 16), std::ldexp(1.0, -133));
  EXPECT_EQ(spec::topk_key_step(7.0, 32), 0.0);
  // Every key lies at most one step below its score, over a sweep of magnitudes and signs.
  for (int e = -30; e <= 30; ++e) {
    for (const float m : {1.0f, 1.3f, 1.99f, -1.0f, -1.51f, -1.999f}) {
      const float x = std::ldexp(m, e);
      for (int bits : {9, 12, 16, 24}) {
        const float k = spec::topk_score_key(x, bits);
        EXPECT_LE(k, x);
        EXPECT_LT(static_cast<double>(x) - k, spec::topk_key_step(x, bits)) << x << " " << bits;
      }
    }
  }
}

TEST(TopkForm, HeadMajorRowsAreReadBackTokenMajor) {
  reference::TopkSelection shape;
  shape.num_queries = 2;
  shape.num_kv_heads = 3;
  shape.topk = 2;
  shape.ids.assign(12, -1);
  // Head-major [H=3, T=2, K=2]: row (q, g) holds {10 g + q, -1}.
  std::vector<std::int32_t> head_major(12, -1);
  for (int g = 0; g < 3; ++g)
    for (int q = 0; q < 2; ++q) head_major[static_cast<std::size_t>((g * 2 + q) * 2)] = 10 * g + q;
  const std::vector<std::int32_t> rows = token_major_ids(shape, head_major, TopkLayout::kHeadMajor);
  for (int q = 0; q < 2; ++q)
    for (int g = 0; g < 3; ++g)
      EXPECT_EQ(rows[static_cast<std::size_t>((q * 3 + g) * 2)], 10 * g + q);
  EXPECT_EQ(token_major_ids(shape, head_major, TopkLayout::kTokenMajor), head_major);
  EXPECT_EQ(spec::topk_offset(TopkLayout::kHeadMajor, 1, 2, 1, 2, 3, 2), (2 * 2 + 1) * 2 + 1);
}

/// The reference selection and score truth of a case, for judging a subject's ids by hand.
struct Judged {
  explicit Judged(const ReadCase& c)
      : sel(reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches)),
        truth(truth::indexer_truth(c.config, c.indexer, c.batch, c.index_q, c.caches,
                                   spec::Ordering::kForeign)) {}
  reference::TopkSelection sel;
  truth::ScoreTruth truth;
};

TEST(TopkForm, KeyedSelectionNeedsItsDeclaredStepAndNoMore) {
  // cpu-naive-keys16 ranks by 16-bit keys: accepted under its declared keys16 on every case; on
  // some cases its choice is outside the exact-score bound (the keys mattered), and a 12-bit-key
  // ranking is rejected under the declared 16 bits. Seeds fixed; printed on failure.
  auto keyed = make_cpu_naive_indexer("keys16", {kNaiveIndexerForms[1].second, std::nullopt});
  auto coarse =
      make_cpu_naive_indexer("keys12", {kNaiveIndexerForms[1].second, std::nullopt, true, 12});
  ReadOverrides o;
  o.tied_scores = false;
  int keys_mattered = 0, coarse_caught = 0;
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    const ReadCase c = make_read_case(seed, o);
    const Judged j(c);
    const TopkForm declared = keyed->topk_form();
    ASSERT_EQ(declared.key_bits, 16);
    const std::vector<std::int32_t> ids = keyed->indexer(c);
    const TopkDiff d = diff_topk_tie_aware(j.sel, j.truth, c.indexer, ids, declared);
    ASSERT_TRUE(d.equal()) << "seed " << seed << ": " << d.report();
    TopkForm exact = declared;
    exact.key_bits = 32;
    keys_mattered += !diff_topk_tie_aware(j.sel, j.truth, c.indexer, ids, exact).equal();
    coarse_caught +=
        !diff_topk_tie_aware(j.sel, j.truth, c.indexer, coarse->indexer(c), declared).equal();
  }
  std::printf("keys16 outside the exact bound on %d of 300 cases; 12-bit keys caught on %d\n",
              keys_mattered, coarse_caught);
  EXPECT_GT(keys_mattered, 0);
  EXPECT_GT(coarse_caught, 0);
}

TEST(TopkForm, HeadMajorSubjectIsJudgedByItsLayoutAndCaughtWhenMisdeclared) {
  auto honest = make_cpu_naive_indexer("hm", {kNaiveIndexerForms[0].second, std::nullopt});
  auto misdeclared = make_cpu_naive_indexer(
      "hm-as-tm", {{TopkOrder::kDescendingScore}, TopkLayout::kHeadMajor, true});
  int caught = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    const ReadCase c = make_read_case(seed, {});
    const Judged j(c);
    const TopkDiff ok = diff_topk_declared(j.sel, &j.truth, c.indexer, honest->indexer(c),
                                           spec::Ordering::kForeign, honest->topk_form());
    ASSERT_TRUE(ok.equal()) << "seed " << seed << ": " << ok.report();
    caught += !diff_topk_declared(j.sel, &j.truth, c.indexer, misdeclared->indexer(c),
                                  spec::Ordering::kForeign, misdeclared->topk_form())
                   .equal();
  }
  EXPECT_GT(caught, 20);  // every case with several KV heads and query rows
}

TEST(TopkForm, CanonicalRowsHoldOnlyAscendingIds) {
  // A canonical subject's rows are the reference's, ascending: declared descending_score they are
  // wrong on a row of two ids with distinct scores, and the report says why.
  ReadOverrides o;
  o.num_kv_heads = 1;
  o.topk = 4;
  o.seq_len = 200;
  o.sparse_block = 16;
  const ReadCase c = make_read_case(7, o);
  const reference::TopkSelection sel =
      reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches);
  EXPECT_TRUE(
      diff_topk_declared(sel, nullptr, c.indexer, sel.ids, spec::Ordering::kCanonical, {}).equal());
  const TopkDiff d = diff_topk_declared(sel, nullptr, c.indexer, sel.ids,
                                        spec::Ordering::kCanonical, {TopkOrder::kDescendingScore});
  ASSERT_FALSE(d.equal());
  EXPECT_NE(d.report().find("not in the declared order (descending score)"), std::string::npos)
      << d.report();
}

TEST(TopkForm, DetectionNamesTheOrderAndLayout) {
  SubjectList subjects;
  subjects.push_back(make_cpu_naive_indexer("hm", {kNaiveIndexerForms[0].second, std::nullopt}));
  CheckOptions o;
  o.ops = {spec::Op::kIndexer};
  o.cases = 40;
  const std::vector<DetectResult> r = detect_modes(o, subjects, "hm");
  ASSERT_EQ(r.size(), 1u);
  ASSERT_FALSE(r[0].matched.empty()) << r[0].report();
  for (const ModeCombination& m : r[0].matched) {
    const std::string d = r[0].describe(m.choice);
    EXPECT_NE(d.find("topk_order=descending_score"), std::string::npos) << d;
    EXPECT_NE(d.find("topk_layout=head_major"), std::string::npos) << d;
  }
}

}  // namespace
}  // namespace kvo::oracle
