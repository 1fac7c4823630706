#pragma once
/// \file dense_diff.hpp
/// The dense insert's answer judged (SPEC 4): a canonical subject's caches byte for byte (SPEC 7's
/// admissible sets where the modes admit several codes: div_approx, legacy-wrap races) and q_out
/// exactly; a foreign subject's (another reduction order, rsqrtf: declared spec::Ordering::
/// kForeign) by admissible sets around the float64 truth and its derived bound: each K code and
/// each q_out code one of those of the float32 values within the bound, V, the slots, the layout,
/// untouched bytes and guards exact.

#include <cstdint>
#include <string>

#include "kvo/oracle/cache_diff.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/dense_insert.hpp"
#include "kvo/spec/read.hpp"

namespace kvo::oracle {

/// One dense answer judged; `report` says why it fails (or, passing, what was compared).
struct DenseJudgement {
  bool pass = false;
  std::string report;
  std::int64_t mismatch_size = 0, bytes_compared = 0;
  std::string failure_class;  ///< Verdict::failure_class: the cache's first mismatch, else q_out's
};

/// `expected` and `q_expected` are the reference's for the same inputs from the same initial
/// caches; `layer` names the layer in reports; up to `samples` differing elements are described.
DenseJudgement judge_dense(const spec::ModelConfig& config,
                           const reference::PagedCacheLayout& layout, const spec::DenseInsert& in,
                           const spec::LayerCaches& expected, const spec::HostTensor& q_expected,
                           const spec::LayerCaches& actual, const spec::HostTensor& q_out,
                           spec::Ordering ordering, std::int64_t layer, std::size_t samples);

}  // namespace kvo::oracle
