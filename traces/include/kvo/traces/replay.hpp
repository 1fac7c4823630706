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

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/reference_tier.hpp"
#include "kvo/oracle/subject.hpp"
#include "kvo/reference/generator.hpp"
#include "kvo/spec/dense_insert.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/spec/write.hpp"
#include "kvo/traces/trace.hpp"

namespace kvo::traces {

/// Where the GPU tier's caches live during a replay (issue 15 item 3). kAuto: resident on the
/// device where the replay allows it (resident_blocker), else staged through the host; kResident:
/// resident, or spec::InvalidInput saying why not; kStaged: staged through the host per layer.
enum class Residence : std::uint8_t { kAuto, kResident, kStaged };

}  // namespace kvo::traces

namespace kvo::spec {
template <>
struct EnumInfo<traces::Residence> {
  static constexpr std::string_view kNoun = "residence";
  static constexpr std::array<EnumName<traces::Residence>, 3> kNames{
      {{traces::Residence::kAuto, "auto"},
       {traces::Residence::kResident, "on"},
       {traces::Residence::kStaged, "off"}}};
};
}  // namespace kvo::spec

namespace kvo::traces {

struct ReplayOptions {
  std::uint64_t value_seed = 0x6B766F72;
  bool edge_values = false;
  std::int64_t step_begin = 0;        ///< steps before it are written by the reference only
  std::int64_t step_end = -1;         ///< exclusive; -1: to the end
  std::vector<std::int64_t> layers;   ///< empty: every layer
  std::vector<std::string> subjects;  ///< empty: every available subject
  bool keep_going = false;  ///< report every mismatching step (resyncing the subject after each)
  /// Of kReplayOps. Default write only: the reference read path is slow.
  std::vector<spec::Op> ops{spec::Op::kWrite};
  /// Whole-cache comparison every this many replayed steps (and always after the last); between
  /// them only the pages a step's slot mappings name, and the guards, are compared. 1: every step.
  std::int64_t full_diff_every = 32;
  /// Layers worked on at once (0: one per hardware thread): generated, written by the reference
  /// and by the concurrent subjects (oracle::Subject::concurrent) on worker threads; the others,
  /// the reads and every comparison on the calling thread, in layer order, so the report is the
  /// same for any number.
  std::int64_t jobs = 0;
  /// Who answers the layer writes of the replayed steps (issue 15; the steps before the range are
  /// the CPU reference's): the CPU reference, or the GPU tier (oracle::kGpuTierAnswerers:
  /// cuda-fused for the write layers, cuda-dense-qknorm-rope for fused dense ones), checked bit
  /// for bit against the CPU reference on every layer of the first `tier_sample_first` replayed
  /// steps and then of one step in `tier_sample_every`, and on every layer where a write subject
  /// fails (against the CPU reference's own caches of that layer, replayed from the start); a
  /// disagreement stops the replay, failed to run. Where the modes admit several codes (SPEC 7:
  /// div_approx, legacy-wrap races) the CPU reference answers the layer. Reads are answered by
  /// the CPU reference over the caches the writes built.
  oracle::ReferenceTier tier = oracle::ReferenceTier::kCpu;
  std::int64_t tier_sample_first = 8, tier_sample_every = 64;
  /// The GPU tier's caches resident on the device across steps (Residence): the values generated
  /// on the device, the tier's answerer and every judged write subject writing through their
  /// device writes (oracle::Subject::device_write) into copies on the device, the copies compared
  /// there (the step's pages and guards after each step, whole caches every full_diff_every
  /// steps); the host sees verdicts, and the pages of a report or a tier check. The tier is
  /// checked against the CPU reference on the sampled steps (the tier's pages before the step
  /// brought back, the CPU reference's write of the CPU-generated values applied to them,
  /// compared with the tier's pages after it) and wherever a subject fails (the CPU reference's
  /// own caches of the layer, replayed from the start).
  Residence residence = Residence::kAuto;
  /// The tier's answerers by op, in place of kGpuTierAnswerers' subjects (a test plants a
  /// divergent one).
  std::map<spec::Op, oracle::Subject*> tier_answerers;
};

/// The ops a trace holds cases for (`kvoracle replay --ops`). On a trace whose dense layers use the
/// fused insert (dense_rotary_dim > 0), op write covers its sparse layers and op dense its dense
/// ones; elsewhere op dense has no cases.
inline const std::vector<spec::Op> kReplayOps{spec::Op::kWrite, spec::Op::kDense,
                                              spec::Op::kIndexer, spec::Op::kAttention};

struct ReplaySubjectResult {
  std::string name;
  spec::Op op = spec::Op::kWrite;
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
  /// Per mismatch, the `kvoracle replay TRACE` flags that rerun it alone: its steps (the steps
  /// before them written by the reference), its layer, subject and op, the value seed.
  std::vector<std::string> reproduce;
  std::int64_t compared_bytes = 0;  ///< cache bytes compared (touched pages, guards, sweeps)
  /// The reference tier: its name, its answerers ("write: cuda-fused"), the layer writes it
  /// answered, those the CPU reference answered (the steps before the range excluded), the layer
  /// writes on which the tier was checked against the CPU reference, and a disagreement (empty:
  /// none; the replay stopped, failed to run).
  oracle::ReferenceTier tier = oracle::ReferenceTier::kCpu;
  std::string tier_answerers;
  std::int64_t tier_layers = 0, cpu_layers = 0, tier_checks = 0;
  std::string tier_disagreement;
  /// The GPU tier's caches: "resident on the device (...)", or "staged through the host" and why.
  std::string residence;
  /// A resident replay's wall time by phase (seconds): the caches put on the device, and per
  /// replayed step the staging of its inputs, the writes issued, the wait for the device, the
  /// tier's checks against the CPU reference, the comparisons and the whole-cache sweeps.
  std::string resident_times;
  std::string summary() const;
};

/// Empty when a replay with these options can keep the GPU tier's caches resident on the device
/// (given its judged write subjects and the tier's write answerer), else why not: read ops, a
/// fused dense insert, modes that admit several answers (legacy_wrap, div_approx), a writer without
/// a device write.
std::string resident_blocker(const Trace& trace, const ReplayOptions& options,
                             const std::vector<oracle::Subject*>& writers);

/// The value generator of a replay (activation dtype from the trace).
reference::ValueGenerator replay_generator(const Trace& trace, const ReplayOptions& options);

/// Layer `layer`'s write call at `step`: K, V (and index-K) [T, ...] with T the slot mapping's
/// length; row t is keyed by (request id, position) for real tokens and (-1, t) for padding.
spec::LayerWrite make_step_write(const Trace& trace, std::int64_t step, std::int64_t layer,
                                 const reference::ValueGenerator& gen);

/// The cos/sin table of a trace whose dense layers use the fused insert (dense_rotary_dim > 0):
/// [max position + 1, rotary_dim], row p = cos(p * theta_i) for i < rotary_dim / 2, then the sines,
/// theta_i = 10000^(-2i / rotary_dim), computed in double and rounded once. Empty otherwise.
std::vector<float> rope_table(const Trace& trace);

/// Layer `layer`'s fused qknorm + rope + insert at `step` (a dense layer of a trace with
/// dense_rotary_dim > 0): the K/V write of make_step_write; q [T, nq, hd] generated with
/// GenTensor::kQ keyed as K; q and k norm weights per layer (generated with keys of request -2,
/// scaled by 1/8); eps 1e-6; the positions of the tokens (0 for padding rows); `cos_sin` from
/// rope_table.
spec::DenseInsert make_step_dense(const Trace& trace, std::int64_t step, std::int64_t layer,
                                  const reference::ValueGenerator& gen,
                                  const std::vector<float>& cos_sin);

/// Layer `layer`'s read case at `step` (caches left empty: the caller moves the layer's in): the
/// step's batch (block table, sequence lengths, query start locations; queries are the real
/// tokens), the trace's indexer and attention parameters, index-Q and Q generated per SPEC 8 with
/// GenTensor::kIndexQ / kQ keyed by (request id, position, head, dim).
oracle::ReadCase make_step_read(const Trace& trace, std::int64_t step, std::int64_t layer,
                                const reference::ValueGenerator& gen);

/// (done, total) steps.
using ReplayProgress = std::function<void(std::int64_t, std::int64_t)>;

/// Replays `trace` through every selected subject on every op of options.ops it implements
/// (oracle::select_subject_ops). Throws spec::InvalidInput for a trace that fails validate_trace,
/// an unknown subject, an op a trace has no cases for, a step range or layer outside the trace.
/// Canonical read subjects are judged exactly, foreign ones against the float64 truth
/// (oracle::judge_read). A read mismatch names subject, op, step, layer and query row.
ReplayReport replay_trace(const Trace& trace, const ReplayOptions& options,
                          oracle::SubjectList& subjects, const ReplayProgress& progress = {});

}  // namespace kvo::traces
