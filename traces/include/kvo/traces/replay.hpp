#pragma once
/// \file replay.hpp
/// Write-path replay of a trace (`kvoracle replay`): every step, every selected layer, through the
/// reference and through each subject, into caches that persist across steps, with the generated
/// values of SPEC 8 keyed by (seed, layer, tensor, request id, position, head, dim), so the bytes
/// step n wrote are still compared at step n+k. After each layer of each step the subject's caches
/// (guards included) are diffed byte for byte against the reference's.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvo/oracle/subject.hpp"
#include "kvo/reference/generator.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/spec/write.hpp"
#include "kvo/traces/trace.hpp"

namespace kvo::traces {

struct ReplayOptions {
  std::uint64_t value_seed = 0x6B766F72;
  bool edge_values = false;
  std::int64_t step_begin = 0;        ///< steps before it are written by the reference only
  std::int64_t step_end = -1;         ///< exclusive; -1: to the end
  std::vector<std::int64_t> layers;   ///< empty: every layer
  std::vector<std::string> subjects;  ///< empty: every available subject
  bool keep_going = false;  ///< report every mismatching step (resyncing the subject after each)
};

struct ReplaySubjectResult {
  std::string name;
  spec::Outcome outcome = spec::Outcome::kPass;
  std::string note;  ///< why unavailable, unsupported or failed
  std::int64_t layer_writes = 0;
  std::int64_t mismatching_steps = 0;
};

struct ReplayReport {
  spec::Outcome worst = spec::Outcome::kPass;
  std::int64_t steps_run = 0;
  std::vector<ReplaySubjectResult> subjects;
  std::vector<std::string> mismatches;  ///< one SPEC 7 report per mismatching (subject, step)
  std::string summary() const;
};

/// The value generator of a replay (activation dtype from the trace).
reference::ValueGenerator replay_generator(const Trace& trace, const ReplayOptions& options);

/// Layer `layer`'s write call at `step`: K, V (and index-K) [T, ...] with T the slot mapping's
/// length; row t is keyed by (request id, position) for real tokens and (-1, t) for padding.
spec::LayerWrite make_step_write(const Trace& trace, std::int64_t step, std::int64_t layer,
                                 const reference::ValueGenerator& gen);

/// (done, total) steps.
using ReplayProgress = std::function<void(std::int64_t, std::int64_t)>;

/// Replays `trace`. Throws spec::InvalidInput for a trace that fails validate_trace, an unknown
/// subject, a step range or layer outside the trace.
ReplayReport replay_trace(const Trace& trace, const ReplayOptions& options,
                          std::vector<std::unique_ptr<oracle::WriteSubject>>& subjects,
                          const ReplayProgress& progress = {});

}  // namespace kvo::traces
