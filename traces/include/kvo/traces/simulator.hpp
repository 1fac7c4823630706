#pragma once
/// \file simulator.hpp
/// A serving-scheduler simulator that produces synthetic traces, deterministic from a seed. It
/// models what makes production slot mappings hard: continuous batching (requests arrive and
/// finish every step), a paged block allocator whose freed blocks are reused (LRU free queue, as
/// vLLM's), prefix sharing (a new request maps a running request's full prefix blocks, ref-counted,
/// and writes only past them), preemption with recompute (out of blocks: the newest running
/// request loses its blocks and later re-prefills every token it had), chunked prefill under a
/// per-step token budget, CUDA-graph padding of the slot mapping to the next capture size (-1
/// tail), and MTP decode (q_len = 1 + drafts; rejected drafts' slots are rewritten next step).

#include <cstdint>
#include <vector>

#include "kvo/spec/config.hpp"
#include "kvo/traces/trace.hpp"

namespace kvo::traces {

struct SimOptions {
  SimOptions() { config.layers = spec::parse_layer_mix(spec::kDefaultLayerMix); }
  std::uint64_t seed = 1;
  std::int64_t steps = 64;
  spec::ModelConfig config;        ///< geometry, dtypes, slot type; num_blocks bounds memory
  std::int64_t max_batch = 16;     ///< running requests at most
  std::int64_t token_budget = 64;  ///< tokens scheduled per step (prefills are chunked)
  std::int64_t prompt_min = 1, prompt_max = 96;
  std::int64_t output_min = 1, output_max = 48;
  std::uint32_t arrival_percent = 50;  ///< chance per step that a request arrives (twice drawn)
  std::uint32_t prefix_share_percent = 30;  ///< chance a new request shares a running prefix
  std::int64_t mtp = 0;                     ///< draft tokens per decode step (q_len = 1 + mtp)
  std::vector<std::int64_t> capture_sizes{1, 2, 4, 8, 16, 32, 64, 128, 256, 512};  ///< empty: none
  bool query_lens_form = false;  ///< write query_lens [B] instead of query_start_loc [B+1]
};

/// What happened during a simulation (the simulator tests assert each feature occurred).
struct SimStats {
  std::int64_t requests_admitted = 0;
  std::int64_t requests_finished = 0;
  std::int64_t preemptions = 0;
  std::int64_t shared_blocks = 0;     ///< block references taken by prefix sharing
  std::int64_t chunked_prefills = 0;  ///< prefill chunks that did not finish the prompt
  std::int64_t padded_steps = 0;
  std::int64_t rejected_drafts = 0;
  std::int64_t blocks_reused = 0;  ///< allocations of a block that an earlier request had freed
};

/// Runs the simulator. Throws spec::InvalidInput naming the knob when options are inconsistent
/// (a request that cannot fit the whole cache, empty ranges, capture sizes not increasing).
Trace simulate(const SimOptions& options, SimStats* stats = nullptr);

}  // namespace kvo::traces
