// Properties over the whole generated domain (fuzz/include/kvo/fuzz/generators.hpp): a failure
// shrinks to a small case and prints the flags and seed that replay it with `kvoracle check`.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>

#include "kvo/fuzz/generators.hpp"
#include "kvo/oracle/campaign.hpp"
#include "kvo/reference/read_path.hpp"
#include "kvo/truth/truth.hpp"

namespace kvo::fuzz {
namespace {

RC_GTEST_PROP(Campaign, CpuWriteFormsAgreeOnEveryGeneratedCase, ()) {
  const oracle::CaseOverrides o = *write_overrides();
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  oracle::CheckOptions opt;
  opt.case_seed = seed;
  opt.overrides.write = o;
  opt.ops = {spec::Op::kWrite};
  auto subjects = oracle::make_subjects();
  const oracle::CheckReport r = oracle::run_check(opt, subjects);
  for (const auto& s : r.subjects) {
    if (!s.skipped.empty()) continue;
    RC_ASSERT(s.count(spec::Outcome::kPass) == 1);
  }
}

RC_GTEST_PROP(Campaign, CanonicalAttentionStaysWithinItsBoundOnEveryGeneratedCase, ()) {
  const oracle::ReadOverrides r = *read_overrides();
  const oracle::ReadCase rc = oracle::make_read_case(*rc::gen::arbitrary<std::uint64_t>(), r);
  const reference::TopkSelection sel =
      reference::indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
  const auto got = reference::attention(rc.config, rc.attention, rc.batch, rc.q, rc.caches,
                                        rc.k_scale, rc.v_scale, &sel);
  const auto truth =
      truth::attention_truth(rc.config, rc.attention, rc.batch, rc.q, rc.caches, rc.k_scale,
                             rc.v_scale, &sel, spec::Ordering::kCanonical);
  for (std::size_t i = 0; i < got.out_f32.size(); ++i) {
    RC_ASSERT(std::fabs(static_cast<double>(got.out_f32[i]) - truth.out[i]) <= truth.bound[i]);
  }
}

}  // namespace
}  // namespace kvo::fuzz
