#pragma once
// Internal to the oracle: the page picture of `kvoracle explain` for the ops that write caches
// (write, dense), so that both explain a cache diff the same way.

#include <cstdint>
#include <sstream>
#include <vector>

#include "kvo/oracle/cache_diff.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::oracle {

/// Up to this many differing elements are decoded in an explanation.
inline constexpr std::size_t kExplainSamples = 12;

/// Diffs layer `layer` (up to kExplainSamples elements described) and, when it differs, appends
/// "layer L (kind):" and, per buffer, one row per block involved and one character per offset (o
/// written as expected, X targeted but wrong, ! not targeted but changed, . untouched).
CacheDiff explain_layer(std::ostringstream& s, const reference::PagedCacheLayout& layout,
                        std::int64_t layer, const spec::ModelConfig& config,
                        const spec::LayerWrite& write, const spec::LayerCaches& expected,
                        const spec::LayerCaches& actual);

/// The diff's first differing elements decoded, one line each.
void list_samples(std::ostringstream& s, const CacheDiff& diff);

}  // namespace kvo::oracle
