// The scheduler simulator: deterministic from its seed, every feature it claims occurs, and the
// invariants of a real engine hold in every step (no slot twice, padding only at the tail and to a
// capture size, slots agree with the block tables, freed blocks are reused).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "kvo/spec/outcome.hpp"
#include "kvo/traces/analysis.hpp"
#include "kvo/traces/simulator.hpp"

namespace kvo::traces {
namespace {

SimOptions options(std::uint64_t seed) {
  SimOptions o;
  o.seed = seed;
  o.steps = 150;
  o.config.layers = spec::parse_layer_mix("S");
  o.config.geometry.num_blocks = 40;
  o.config.geometry.block_size = 8;
  o.prompt_max = 120;
  o.output_max = 60;
  o.mtp = seed % 3;
  o.config.separate_index_slots = seed % 2 == 1;
  return o;
}

TEST(Simulator, DeterministicFromTheSeed) {
  const SimOptions o = options(17);
  EXPECT_TRUE(simulate(o) == simulate(o));
  SimOptions other = o;
  other.seed = 18;
  EXPECT_FALSE(simulate(o) == simulate(other));
}

TEST(Simulator, InvariantsHoldInEveryStep) {
  for (std::uint64_t seed = 1; seed <= 24; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const SimOptions o = options(seed);
    SimStats stats;
    const Trace t = simulate(o, &stats);
    ASSERT_EQ(static_cast<std::int64_t>(t.steps.size()), o.steps);
    const TraceValidation v = validate_trace(t);
    ASSERT_TRUE(v.ok()) << v.problems.front().describe();
    const std::int64_t bs = o.config.geometry.block_size;
    for (std::size_t s = 0; s < t.steps.size(); ++s) {
      const TraceStep& st = t.steps[s];
      const std::int64_t real = st.starts().back();
      std::set<std::int64_t> seen;
      for (std::int64_t i = 0; i < st.tokens(); ++i) {
        const std::int64_t slot = st.slot_mapping.values[static_cast<std::size_t>(i)];
        if (i < real) {
          ASSERT_GE(slot, 0) << "step " << s << " index " << i << ": padding before the tail";
          ASSERT_TRUE(seen.insert(slot).second) << "step " << s << ": slot " << slot << " twice";
        } else {
          ASSERT_EQ(slot, -1) << "step " << s << " index " << i;
        }
      }
      if (real <= o.capture_sizes.back()) {
        EXPECT_TRUE(std::binary_search(o.capture_sizes.begin(), o.capture_sizes.end(), st.tokens()))
            << "step " << s << ": " << st.tokens() << " entries is not a capture size";
        const auto next = std::lower_bound(o.capture_sizes.begin(), o.capture_sizes.end(), real);
        EXPECT_EQ(st.tokens(), *next) << "step " << s << ": padded past the next capture size";
      }
      EXPECT_LE(real, o.token_budget);
      EXPECT_LE(st.batch(), o.max_batch);
      for (std::int64_t b = 0; b < st.batch(); ++b) {
        const auto q =
            st.starts()[static_cast<std::size_t>(b) + 1] - st.starts()[static_cast<std::size_t>(b)];
        EXPECT_LE(st.seq_lens.values[static_cast<std::size_t>(b)],
                  o.prompt_max + o.output_max + o.mtp);
        (void)q;
      }
      (void)bs;
    }
    EXPECT_GT(stats.requests_admitted, 0);
    EXPECT_GT(stats.blocks_reused, 0) << "a 40-block cache must reuse freed blocks";
    EXPECT_GT(stats.chunked_prefills, 0);
    EXPECT_GT(stats.padded_steps, 0);
    if (o.mtp > 0) {
      EXPECT_GT(stats.rejected_drafts, 0);
    }
  }
}

/// Features seen from the trace alone, not from the simulator's own counters.
TEST(Simulator, FeaturesAreVisibleInTheTrace) {
  std::int64_t preempted = 0, shared = 0, reused = 0, mtp_rewrites = 0, multi_token_decodes = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    SimOptions o = options(seed);
    o.mtp = 2;
    const Trace t = simulate(o);
    std::map<std::int64_t, std::int64_t> last_pos;  // request -> last position written
    std::map<std::int64_t, std::int64_t> owner;     // block -> first request seen holding it
    std::map<std::int64_t, std::set<std::int64_t>> prev_slots;  // request -> last step's slots
    for (const TraceStep& st : t.steps) {
      const auto starts = st.starts();
      std::map<std::int64_t, std::set<std::int64_t>> slots;
      for (std::int64_t b = 0; b < st.batch(); ++b) {
        const auto bi = static_cast<std::size_t>(b);
        const std::int64_t id = st.request_id(b);
        const std::int64_t q = starts[bi + 1] - starts[bi];
        const std::int64_t first = st.seq_lens.values[bi] - q;
        const auto it = last_pos.find(id);
        if (it == last_pos.end() && first > 0) ++shared;      // starts past a shared prefix
        if (it != last_pos.end() && first == 0) ++preempted;  // recomputes from position 0
        if (q == 1 + o.mtp && it != last_pos.end() && first <= it->second) ++mtp_rewrites;
        if (q == 1 + o.mtp && first > 0) ++multi_token_decodes;
        last_pos[id] = first + q - 1;
        for (std::int64_t j = 0; j < q; ++j) {
          const std::int64_t slot =
              st.slot_mapping.values[static_cast<std::size_t>(starts[bi] + j)];
          slots[id].insert(slot);
          const auto [o_it, inserted] = owner.emplace(slot / o.config.geometry.block_size, id);
          if (!inserted && o_it->second != id) {
            ++reused;
            o_it->second = id;
          }
        }
      }
      prev_slots = std::move(slots);
    }
  }
  EXPECT_GT(preempted, 0);
  EXPECT_GT(shared, 0);
  EXPECT_GT(reused, 0);
  EXPECT_GT(mtp_rewrites, 0) << "rejected drafts' positions are written again";
  EXPECT_GT(multi_token_decodes, 0);
}

TEST(Simulator, InconsistentKnobsAreRejected) {
  SimOptions o = options(1);
  o.config.geometry.num_blocks = 4;  // 32 slots; a request may need 180
  try {
    (void)simulate(o);
    ADD_FAILURE();
  } catch (const spec::InvalidInput& e) {
    EXPECT_EQ(e.field(), "num_blocks");
  }
  o = options(1);
  o.capture_sizes = {4, 2};
  EXPECT_THROW((void)simulate(o), spec::InvalidInput);
  o = options(1);
  o.mtp = 5;
  o.token_budget = 4;
  EXPECT_THROW((void)simulate(o), spec::InvalidInput);
}

}  // namespace
}  // namespace kvo::traces
