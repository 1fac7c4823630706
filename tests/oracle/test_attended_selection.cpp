// SPEC 6: the selection handed to attention is an input in its own right. Per drawn case, the
// rows attention is handed (arrange_selection under the case's AttendedForm, every order forced in
// turn) hold the reference's chosen ids and nothing else below n_valid, each once, in the form's
// order; and the reference's attention over them is bit for bit its attention over the
// reference's own ascending rows.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/read_judge.hpp"
#include "kvo/reference/read_path.hpp"

namespace kvo::oracle {
namespace {

RC_GTEST_PROP(AttendedSelection, RowsAreTheReferenceSetInTheFormsOrder, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  ReadOverrides o;
  o.max_seq_len = 200;
  o.selection_order =
      *rc::gen::element(spec::SelectionOrder::kAscendingIds, spec::SelectionOrder::kDescendingScore,
                        spec::SelectionOrder::kMinusOneFirst, spec::SelectionOrder::kShuffled);
  const ReadCase rc = make_read_case(seed, o);
  ReadExpectation e(rc);
  const reference::TopkSelection& ref = e.selection();
  const reference::TopkSelection& got = *e.attended();
  RC_ASSERT(got.topk == ref.topk + rc.attended.extra);
  RC_ASSERT(got.ids.size() ==
            static_cast<std::size_t>(got.num_queries * got.num_kv_heads * got.topk));
  for (std::int64_t q = 0; q < ref.num_queries; ++q) {
    const std::int64_t n_valid = ref.n_valid[static_cast<std::size_t>(q)];
    for (std::int64_t g = 0; g < ref.num_kv_heads; ++g) {
      std::vector<std::int32_t> want, chosen, rest;
      for (std::int64_t k = 0; k < ref.topk; ++k)
        if (ref.id(q, g, k) >= 0) want.push_back(ref.id(q, g, k));
      std::set<std::int32_t> seen;
      std::int64_t last_chosen = -1, first_rest = got.topk;
      for (std::int64_t k = 0; k < got.topk; ++k) {
        const std::int32_t id = got.id(q, g, k);
        if (id >= 0) RC_ASSERT(seen.insert(id).second);
        if (id >= 0 && id < n_valid) {
          chosen.push_back(id);
          last_chosen = k;
        } else {
          rest.push_back(id);
          first_rest = std::min(first_rest, k);
        }
      }
      std::vector<std::int32_t> sorted = chosen;
      std::sort(sorted.begin(), sorted.end());
      RC_ASSERT(sorted == want);
      const bool has_minus_one = std::count(rest.begin(), rest.end(), -1) > 0;
      RC_ASSERT(!rc.attended.past_n_valid || rest.empty() ||
                std::any_of(rest.begin(), rest.end(), [](std::int32_t id) { return id >= 0; }));
      RC_ASSERT(rc.attended.past_n_valid ||
                std::all_of(rest.begin(), rest.end(), [](std::int32_t id) { return id == -1; }));
      switch (rc.attended.order) {
        case spec::SelectionOrder::kAscendingIds:
          RC_ASSERT(chosen == sorted);
          RC_ASSERT(last_chosen < first_rest);
          break;
        case spec::SelectionOrder::kDescendingScore:
          RC_ASSERT(last_chosen < first_rest);
          for (std::size_t i = 1; i < chosen.size(); ++i) {
            const auto best = [&](std::int32_t j) {
              float b = -INFINITY;
              for (std::int64_t l = 0; l < ref.lanes; ++l) b = std::max(b, ref.score(q, g, j, l));
              return b;
            };
            RC_ASSERT(!(best(chosen[i - 1]) < best(chosen[i])));
          }
          break;
        case spec::SelectionOrder::kMinusOneFirst:
          RC_ASSERT(chosen == sorted);
          RC_ASSERT(rest.empty() || (first_rest == 0 && (!has_minus_one || got.id(q, g, 0) == -1)));
          RC_ASSERT(last_chosen < 0 || last_chosen == got.topk - 1);
          break;
        case spec::SelectionOrder::kShuffled:
          break;
      }
    }
  }
  // The output depends only on the set (SPEC 6), bit for bit.
  const reference::AttentionResult over_ref = reference::attention(
      rc.config, rc.attention, rc.batch, rc.q, rc.caches, rc.k_scale, rc.v_scale, &ref);
  RC_ASSERT(e.exact().bytes == over_ref.out.bytes);
}

// The default distribution reaches each arrangement: over 200 cases every order, extra columns
// and ids past n_valid are drawn.
TEST(AttendedSelection, TheDefaultDistributionDrawsEveryArrangement) {
  std::array<int, 4> orders{};
  int extra = 0, past = 0;
  constexpr int kCases = 200;
  for (int i = 0; i < kCases; ++i) {
    const ReadCase rc = make_read_case(0xA77E4D00ull + static_cast<std::uint64_t>(i), {});
    ++orders[static_cast<std::size_t>(rc.attended.order)];
    extra += rc.attended.extra > 0;
    past += rc.attended.past_n_valid;
  }
  for (int n : orders) EXPECT_GT(n, kCases / 8);
  EXPECT_GT(extra, kCases / 4);
  EXPECT_GT(past, kCases / 4);
  std::printf("[attended] %d cases from 0xA77E4D00: orders %d/%d/%d/%d, extra %d, past %d\n",
              kCases, orders[0], orders[1], orders[2], orders[3], extra, past);
}

}  // namespace
}  // namespace kvo::oracle
