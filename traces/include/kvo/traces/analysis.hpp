#pragma once
/// \file analysis.hpp
/// What `kvoracle trace info` and `kvoracle trace validate` compute. The reader guarantees
/// structure (shapes agree, every request's tokens fit its block-table row); validation checks the
/// values against the cache and the block tables, and names every problem by step, tensor, index
/// and value.

#include <cstdint>
#include <string>
#include <vector>

#include "kvo/traces/trace.hpp"

namespace kvo::traces {

struct TraceInfo {
  std::int64_t steps = 0;
  std::int64_t tokens = 0;        ///< real tokens written (sum of query lengths)
  std::int64_t slot_entries = 0;  ///< slot-mapping entries, padding included
  std::int64_t padding = 0;       ///< negative entries past the real tokens (CUDA-graph tail)
  std::int64_t requests = 0;      ///< distinct request ids
  std::int64_t max_batch = 0;
  std::int64_t max_step_tokens = 0;
  std::int64_t longest_sequence = 0;
  std::int64_t decode_steps = 0;  ///< steps where every request writes the same q_len <= 8
  std::int64_t multi_token_decode_steps = 0;  ///< of which q_len > 1 (MTP)
  double internal_fragmentation = 0;          ///< unused slots / slots of the blocks in use (mean)
  double scatter = 0;  ///< block-table neighbours not physically adjacent / neighbours
  std::int64_t max_blocks_in_use = 0;  ///< distinct blocks referenced in one step

  double padding_share() const {
    return slot_entries ? static_cast<double>(padding) / static_cast<double>(slot_entries) : 0.0;
  }
  std::string report(const spec::ModelConfig& config) const;
};

TraceInfo trace_info(const Trace& trace);

/// One problem found by validate_trace.
struct TraceProblem {
  std::int64_t step = 0;
  std::string tensor;      ///< "step.3.slot_mapping"
  std::int64_t index = 0;  ///< flat element index within the tensor
  std::int64_t value = 0;
  std::string what;

  std::string describe() const;  ///< "step 3: step.3.slot_mapping[5] = 77: ..."
};

struct TraceValidation {
  std::vector<TraceProblem> problems;  ///< the first `limit` found, in step order
  std::int64_t count = 0;              ///< all problems found
  bool ok() const { return count == 0; }
};

/// Checks every step: slots out of range (>= capacity; below -capacity in legacy_wrap; any
/// negative slot inside a request's tokens in strict mode), a non-negative slot in the padding
/// tail, duplicate non-negative slots in one step, a slot outside its request's block table or
/// disagreeing with it at the token's position, block-table entries in use that lie outside the
/// cache; the same range and duplicate checks on the index slot mapping, whose padding must match.
TraceValidation validate_trace(const Trace& trace, std::size_t limit = 100);

}  // namespace kvo::traces
