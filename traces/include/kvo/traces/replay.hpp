#pragma once
/// \file replay.hpp
/// Replay of a trace (`kvoracle replay`): every step, every selected layer, through the reference
/// and through each subject, into caches that persist across steps, with the generated values of
/// SPEC 8 keyed by (seed, layer, tensor, request id, position, head, dim), so the bytes step n
/// wrote are still compared at step n+k. After each layer of each step the pages the step's slot
/// mappings name and the guard bands are diffed byte for byte against the reference's; every
/// `full_diff_every` steps and at the end, the whole caches are (a write outside the named pages
/// is caught there). Opt-in read ops run, after each layer's writes, the indexer with top-k
/// (sparse layers) and attention (sparse over the reference's selection; dense on dense layers)
/// over the caches the writes of this and earlier steps built, with generated queries.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/read_subject.hpp"
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
  /// Of write, indexer, attention. Default write only: the reference read path is slow.
  std::vector<std::string> ops{"write"};
  /// Whole-cache comparison every this many replayed steps (and always after the last); between
  /// them only the pages a step's slot mappings name, and the guards, are compared. 1: every step.
  std::int64_t full_diff_every = 32;
};

/// The ops `kvoracle replay --ops` takes.
inline const std::vector<std::string> kReplayOps{"write", "indexer", "attention"};

struct ReplaySubjectResult {
  std::string name;
  std::string op = "write";  ///< write, indexer or attention
  spec::Outcome outcome = spec::Outcome::kPass;
  std::string note;               ///< why unavailable, unsupported or failed
  std::int64_t layer_writes = 0;  ///< layer calls (writes, or reads for the read ops)
  std::int64_t mismatching_steps = 0;
};

struct ReplayReport {
  spec::Outcome worst = spec::Outcome::kPass;
  std::int64_t steps_run = 0;
  std::vector<ReplaySubjectResult> subjects;
  std::vector<std::string> mismatches;  ///< one SPEC 7 report per mismatching (subject, step)
  std::int64_t compared_bytes = 0;      ///< cache bytes compared (touched pages, guards, sweeps)
  std::string summary() const;
};

/// The value generator of a replay (activation dtype from the trace).
reference::ValueGenerator replay_generator(const Trace& trace, const ReplayOptions& options);

/// Layer `layer`'s write call at `step`: K, V (and index-K) [T, ...] with T the slot mapping's
/// length; row t is keyed by (request id, position) for real tokens and (-1, t) for padding.
spec::LayerWrite make_step_write(const Trace& trace, std::int64_t step, std::int64_t layer,
                                 const reference::ValueGenerator& gen);

/// Layer `layer`'s read case at `step` (caches left empty: the caller moves the layer's in): the
/// step's batch (block table, sequence lengths, query start locations; queries are the real
/// tokens), the trace's indexer and attention parameters, index-Q and Q generated per SPEC 8 with
/// GenTensor::kIndexQ / kQ keyed by (request id, position, head, dim).
oracle::ReadCase make_step_read(const Trace& trace, std::int64_t step, std::int64_t layer,
                                const reference::ValueGenerator& gen);

/// (done, total) steps.
using ReplayProgress = std::function<void(std::int64_t, std::int64_t)>;

/// Replays `trace`. Throws spec::InvalidInput for a trace that fails validate_trace, an unknown
/// subject, a step range or layer outside the trace.
ReplayReport replay_trace(const Trace& trace, const ReplayOptions& options,
                          std::vector<std::unique_ptr<oracle::WriteSubject>>& subjects,
                          const ReplayProgress& progress = {});

/// Also the read subjects, for the ops indexer and attention (options.ops); an unknown op is
/// InvalidInput. Canonical read subjects are judged exactly, foreign ones against the float64 truth
/// (oracle::judge_read). A read mismatch names subject, op, step, layer and query row.
ReplayReport replay_trace(const Trace& trace, const ReplayOptions& options,
                          std::vector<std::unique_ptr<oracle::WriteSubject>>& write_subjects,
                          std::vector<std::unique_ptr<oracle::ReadSubject>>& read_subjects,
                          const ReplayProgress& progress = {});

}  // namespace kvo::traces
