#pragma once
// What the reference tier's tests (test_reference_tier*.cpp) share.

#include "kvo/oracle/campaign.hpp"

namespace kvo::oracle {

/// The odd cases of a campaign: every stress theme but the huge caches' (theme slot 6,
/// kThemeHugeCache), whose device mirrors of several GiB, held by the tier's thread and the main
/// thread, would crowd the other test shards sharing the GPU (the device script's `tier` stage
/// runs the whole default distribution in a process of its own). Of the default sample (the first
/// 8, then one in 16 from 8: even cases only), cases 1, 3, 5 and 7 remain.
inline void without_huge_caches(CheckOptions& o) {
  o.total_shards = 2;
  o.shard_index = 1;
}

}  // namespace kvo::oracle
