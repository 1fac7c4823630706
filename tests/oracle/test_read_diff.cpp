// The read-side oracle: a foreign float32 implementation is accepted by the bounded and tie-aware
// modes, and every planted bug (anchors_kvcache.md 6 and issue 4) is rejected, with a report that
// says where.
#include <gtest/gtest.h>

#include <cstring>

#include "kvo/oracle/cpu_subjects.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/read_diff.hpp"
#include "kvo/reference/numbers.hpp"

namespace kvo::oracle {
namespace {

struct Verdict {
  bool topk_ok, attention_ok;
  std::string report;
};

/// Judges one subject on one case the way `kvoracle check` does.
Verdict judge(Subject& s, const ReadCase& c) {
  const reference::TopkSelection sel =
      reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches);
  const std::vector<std::int32_t> ids = s.indexer(c);
  const spec::HostTensor out = s.attention(c, &sel);
  Verdict v;
  if (s.ordering() == spec::Ordering::kCanonical) {
    const TopkDiff t = diff_topk_exact(sel, ids);
    const AttentionDiff a =
        diff_attention_exact(reference::attention(c.config, c.attention, c.batch, c.q, c.caches,
                                                  c.k_scale, c.v_scale, &sel)
                                 .out,
                             out);
    v = {t.equal(), a.pass(), t.report() + "\n" + a.report()};
  } else {
    const auto truth =
        truth::indexer_truth(c.config, c.indexer, c.batch, c.index_q, c.caches, s.ordering());
    const TopkDiff t = diff_topk_tie_aware(sel, truth, c.indexer, ids, s.topk_form());
    const auto at = truth::attention_truth(c.config, c.attention, c.batch, c.q, c.caches, c.k_scale,
                                           c.v_scale, &sel, s.ordering());
    const AttentionDiff a = diff_attention_bounded(at, out);
    v = {t.equal(), a.pass(), t.report() + "\n" + a.report()};
  }
  return v;
}

ReadOverrides small() {
  ReadOverrides o;
  o.max_seq_len = 200;
  return o;
}

TEST(ReadDiff, ForeignFloat32SubjectIsAcceptedInBoundedAndTieAwareMode) {
  auto naive = make_cpu_naive_subject();
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const ReadCase c = make_read_case(seed, small());
    const Verdict v = judge(*naive, c);
    EXPECT_TRUE(v.topk_ok && v.attention_ok) << "seed " << seed << ": " << c.describe() << "\n"
                                             << v.report;
  }
}

TEST(ReadDiff, TiesAreAcceptedInTieAwareModeAndCaughtInExactMode) {
  // Zero index-Q: every block scores 0, so only forced blocks differ and every other choice is a
  // tie.
  ReadCase c = make_read_case(7, small());
  std::fill(c.index_q.bytes.begin(), c.index_q.bytes.end(), 0);
  auto naive = make_cpu_naive_subject();  // ties to the higher id, descending-score order
  EXPECT_TRUE(judge(*naive, c).topk_ok) << judge(*naive, c).report;
  ReadMutation reversed;
  reversed.ties_to_higher_id = true;
  auto mutant = make_canonical_mutant(reversed, "canonical-reversed-ties");
  bool caught = false;
  for (std::uint64_t seed = 1; seed <= 20 && !caught; ++seed) {
    ReadCase t = make_read_case(seed, small());
    std::fill(t.index_q.bytes.begin(), t.index_q.bytes.end(), 0);
    const Verdict v = judge(*mutant, t);
    caught = !v.topk_ok;
    if (caught) {
      EXPECT_NE(v.report.find("missing"), std::string::npos) << v.report;
    }
  }
  EXPECT_TRUE(caught);
}

/// How many of `cases` random cases catch the mutant (topk or attention as asked).
int kills(Subject& s, bool topk, int cases) {
  int killed = 0;
  for (std::uint64_t seed = 100; seed < 100u + static_cast<unsigned>(cases); ++seed) {
    const Verdict v = judge(s, make_read_case(seed, small()));
    killed += topk ? !v.topk_ok : !v.attention_ok;
  }
  return killed;
}

TEST(ReadDiff, PlantedBugsAreCaught) {
  ReadMutation m;
  m.no_causal_mask = true;
  auto no_mask = make_cpu_naive_subject(m, "naive-no-causal-mask");
  EXPECT_GT(kills(*no_mask, false, 30), 0) << "missing causal mask survived";

  m = {};
  m.n_valid_offset = 1;
  auto off_by_one = make_cpu_naive_subject(m, "naive-n-valid-plus-one");
  EXPECT_GT(kills(*off_by_one, true, 30), 0) << "off-by-one n_valid survived";

  m = {};
  m.ignore_local = true;
  auto no_local = make_cpu_naive_subject(m, "naive-ignores-local");
  EXPECT_GT(kills(*no_local, true, 30), 0) << "ignored local block survived";

  m = {};
  m.scale_twice = true;
  auto twice = make_cpu_naive_subject(m, "naive-scale-twice");
  EXPECT_GT(kills(*twice, false, 30), 0) << "softmax scale applied twice survived (foreign mode)";
  auto twice_canonical = make_canonical_mutant(m, "canonical-scale-twice");
  EXPECT_GT(kills(*twice_canonical, false, 30), 0)
      << "softmax scale applied twice survived (exact mode)";
}

TEST(ReadDiff, ExactAttentionDiffNamesTheFirstElementWithBitsAndUlps) {
  spec::HostTensor a;
  a.dtype = spec::DType::kBF16;
  a.shape = {2, 3, 8};
  a.bytes.assign(2 * 3 * 8 * 2, 0);
  spec::HostTensor b = a;
  reference::store_code(0x3F80, spec::DType::kBF16, &a.bytes[(1 * 24 + 2 * 8 + 5) * 2]);  // 1.0
  reference::store_code(0x3F82, spec::DType::kBF16,
                        &b.bytes[(1 * 24 + 2 * 8 + 5) * 2]);  // 1.015625
  const AttentionDiff d = diff_attention_exact(a, b);
  ASSERT_TRUE(d.first.has_value());
  EXPECT_EQ(d.differing, 1);
  EXPECT_EQ(d.first->query, 1);
  EXPECT_EQ(d.first->head, 2);
  EXPECT_EQ(d.first->dim, 5);
  EXPECT_EQ(d.first->ulps, 2u);
  EXPECT_NE(d.report().find("0x3F80 vs 0x3F82, 2 ulp"), std::string::npos) << d.report();
  EXPECT_EQ(ulp_distance(0x8000, 0x0000, spec::DType::kBF16), 0u);  // -0 and +0
  EXPECT_EQ(ulp_distance(0x8001, 0x0001, spec::DType::kBF16), 2u);
}

}  // namespace
}  // namespace kvo::oracle
