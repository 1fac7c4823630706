#pragma once
/// \file op_driver.hpp
/// The op registry: one driver per op of spec::Op (the shape of ggml's test_case and CUTLASS's
/// testbed), and the only place that knows what an op's case is, how the reference answers it, how
/// a subject runs it, how its answer is judged, how a failing case shrinks and how it is
/// explained. The campaign (campaign.hpp), shrinking, explain, the mutants and replay go through
/// these drivers and never through an op's name. Adding an op is one new driver source plus its
/// line in op_registry.cpp.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvo/oracle/case_tensors.hpp"
#include "kvo/oracle/dense_case.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/subject.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/spec/op.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {

/// Every dimension a user (or shrinking) fixes instead of drawing it. The write overrides also
/// hold the dimensions shared with the read and dense cases (block size, head dim, KV heads,
/// index dim, cache dtype, layouts, ...): each op's driver reads the fields its cases have.
struct Overrides {
  CaseOverrides write;
  ReadOverrides read;
  DenseOverrides dense;
};

/// One case of one op, drawn and answered by the reference once, then judged against every
/// subject of the op. Drivers that share a case kind (indexer and attention) share the case.
class PreparedCase {
 public:
  virtual ~PreparedCase() = default;
  virtual std::uint64_t seed() const = 0;
  /// One line: the configuration and sizes.
  virtual std::string describe() const = 0;
};

/// One subject's answer to one case, judged.
struct Verdict {
  spec::Outcome outcome = spec::Outcome::kPass;
  std::string report;               ///< the SPEC 7 diff (a pass's too) or why it did not run
  std::int64_t bytes_compared = 0;  ///< cache bytes compared (the ops that write caches)
  /// How far a mismatch is from passing (differing bytes, or elements outside their bound): mode
  /// detection ranks the closest combination by it.
  std::int64_t mismatch_size = 0;
  /// Set by OpDriver::judge_on_device where what is left of the judging needs no device (a copy
  /// downloaded, to be diffed by the admissible sets): the campaign runs it off the main thread
  /// and records the verdict it returns in this one's place, in case order. Empty otherwise.
  std::function<Verdict()> finish = nullptr;
  /// What kind of wrong answer a mismatch is, in words that do not depend on the case (a write
  /// into a guard band, an element not written, a wrong element, top-k ids that differ, ...):
  /// a campaign counts its failures by class, and shrinking keeps a reduction only when the
  /// smaller case fails in the same class. Empty: the outcome alone is the class.
  std::string failure_class{};
  /// SPEC principle 4: the planted bug classes (spec::AttentionBug names) that the subject's
  /// declared profile is too loose to catch on this case (a foreign attention's bound admits
  /// their whole effect). A pass says nothing about them here; a campaign counts them.
  std::vector<std::string> blind_spots{};
};

/// The class a campaign counts a non-passing verdict under: "mismatch: <failure_class>", or the
/// outcome's name with the first line of its error for the other outcomes (a failure to run).
std::string failure_class_of(const Verdict& v);

/// One reduction tried while shrinking: fixes one dimension to a smaller value. `apply` returns
/// false when the overrides already have it (nothing to try).
struct Reduction {
  std::string what;
  std::function<bool(Overrides&)> apply;
};

/// One axis of an op's modes for mode detection (SPEC 7): the mode's name and its values' names,
/// tightest (or the contract's default) first.
struct ModeAxis {
  std::string name;
  std::vector<std::string> values;
};

/// One combination of mode values: ModeChoice[i] indexes OpDriver::mode_axes()[i].values.
using ModeChoice = std::vector<std::size_t>;

/// A subject's answer to one case, run once and kept, so that mode detection can judge it under
/// many mode combinations without running the subject again.
class CapturedAnswer {
 public:
  virtual ~CapturedAnswer() = default;
  /// Judges the answer as if the contract's modes were `choice` (the subject was told the pinned
  /// choice). Only called when run_outcome is kPass.
  virtual Verdict judge_under(const ModeChoice& choice) = 0;

  spec::Outcome run_outcome = spec::Outcome::kPass;  ///< kPass: the subject produced an answer
  std::string run_error;                             ///< why it did not
};

/// A rare condition real bugs hide behind (issue 14): its name, what it means, and whether a
/// prepared case of the op reaches it. Each driver's table is the one definition; the campaign
/// counts how often its cases reach each (`kvoracle check --coverage`).
struct CaseCondition {
  std::string_view name;
  std::string_view means;
};

class OpDriver {
 public:
  virtual ~OpDriver() = default;
  virtual spec::Op op() const = 0;
  /// Drivers with the same kind draw the same case from a seed (the campaign prepares it once).
  virtual std::string_view case_kind() const = 0;
  /// The case of `seed`, with the reference's answer. Throws spec::InvalidInput when the overrides
  /// are inconsistent.
  std::unique_ptr<PreparedCase> prepare(std::uint64_t seed, const Overrides& overrides) const {
    return prepare(seed, overrides, nullptr);
  }
  /// The case of `seed` answered by `answerer` instead of the CPU reference: a verified tier's
  /// canonical implementation of the op (reference_tier.hpp), judged bit for bit against the
  /// reference on a sample of cases. Null: the CPU reference. An op whose cases no tier answers
  /// (answers_through_tier() false) takes the reference's answer whatever it is given.
  virtual std::unique_ptr<PreparedCase> prepare(std::uint64_t seed, const Overrides& overrides,
                                                Subject* answerer) const = 0;
  /// Whether prepare takes its answer from an answerer (every op of the registry: the write and
  /// dense caches, the read case's selection with its scores and its exact attention output).
  virtual bool answers_through_tier() const { return false; }
  /// A tier's answerer judged on a case the CPU reference answered (prepare(seed, overrides)),
  /// bit for bit over everything the tier answers a case with: by default judge (the answer is
  /// what a subject gives); an op whose tier answers more than a subject does (the read case's
  /// block scores) checks that too.
  virtual Verdict judge_answerer(Subject& answerer, PreparedCase& c) const {
    return judge(answerer, c);
  }
  /// The GPU tier's resident path (issue 15 item 4): the case of `seed` drawn without its input
  /// values and without an answer, for judge_on_device; null for an op without that path (the
  /// default) or a case it cannot take.
  virtual std::unique_ptr<PreparedCase> prepare_for_device(std::uint64_t /*seed*/,
                                                           const Overrides& /*overrides*/) const {
    return nullptr;
  }
  /// Whether `subject` runs this op on the device for the resident path: write, a device write
  /// (Subject::device_write); the reads, a canonical subject's device read of the op. The campaign
  /// takes a case kind resident where every judged row of it does and the tier's answerer does
  /// for each of the kind's ops.
  virtual bool runs_on_device(const Subject& /*subject*/) const { return false; }
  /// One row of a case kind judged on the device: the op and its subject.
  struct DeviceRow {
    spec::Op op;
    Subject* subject;
  };
  /// A prepare_for_device case run on the device by `answerer` and by each of `rows` (every one
  /// runs_on_device), the inputs generated there, each row's answer compared with the answerer's:
  /// one verdict per row, a pass or a mismatch (the campaign judges a non-pass again on the host
  /// against the CPU reference, for SPEC 7's report; a write's device report says only where the
  /// first difference is). spec::Unsupported when a row's subject does not take the case (the
  /// campaign answers it on the host then); what a subject throws and a CUDA error propagate.
  virtual std::vector<Verdict> judge_on_device(PreparedCase& /*c*/, Subject& /*answerer*/,
                                               const std::vector<DeviceRow>& /*rows*/) const {
    throw spec::Unsupported("this op has no resident path on the device");
  }
  /// Whether the conditions of a prepare_for_device case (reached) are known before
  /// judge_on_device: false where they read the answer the device gives (the read case's
  /// selection), so that the campaign asks reached() after judging.
  virtual bool conditions_before_device() const { return true; }
  /// Whether a prepare_for_device case has one right answer, byte for byte: false where the
  /// contract admits several (div_approx codes, colliding legacy_wrap slots), so that a subject
  /// differing from the answerer on the device is judged on the host by the admissible sets, and
  /// its passing there is no disagreement.
  virtual bool device_answer_exact(const PreparedCase& /*c*/) const { return true; }
  /// Whether judging case `c` on the device takes copies of gigabytes (a huge cache): the
  /// campaign judges every such case on one device lane, whose memory pool keeps their
  /// allocations case after case, so that two never hold the device's memory at once.
  virtual bool device_heavy(const PreparedCase& /*c*/) const { return false; }
  /// Device bytes the resident path's copies of case `c` take with `copies` copies (the tier's
  /// answerer's and one per judged row: judge_on_device; the answerer's alone: check_on_device):
  /// a case past half the device's memory runs there alone, every other thread's idle device
  /// memory given back first, so that whether it fits does not depend on what else ran. 0 (the
  /// default): small.
  virtual std::int64_t device_bytes(const PreparedCase& /*c*/, std::size_t /*copies*/) const {
    return 0;
  }
  /// The trust chain of the resident path: `answerer` runs a case the CPU reference answered
  /// (prepare(seed, overrides)) on the device, its inputs generated there as judge_on_device
  /// generates them, and its caches are diffed against the reference's (as judge does): empty
  /// when equal, else the disagreement with the diff's report.
  virtual std::string check_on_device(PreparedCase& /*c*/, Subject& /*answerer*/) const {
    throw spec::Unsupported("this op has no resident path on the device");
  }
  /// Computes, on a worker thread, what judging `subject` on the case will read (a foreign read
  /// subject's float64 truth), so that the main thread, which judges the subjects that are not
  /// concurrent (GPU, device, Python), only runs them and diffs. Optional: judge computes what was
  /// not.
  virtual void ready_to_judge(const Subject& /*subject*/, PreparedCase& /*c*/) const {}
  /// Runs the op of `subject` on the case and judges it: canonical subjects bit for bit, foreign
  /// ones by their admissible sets (tie-aware top-k, bounded attention). What the subject throws
  /// is classified (spec::Outcome), never folded into a pass.
  virtual Verdict judge(Subject& subject, PreparedCase& c) const = 0;
  /// The whole story of one case for `kvoracle explain`: the verdict with a longer report.
  virtual Verdict explain(Subject& subject, PreparedCase& c) const = 0;
  /// What shrinking tries, in order, for a failing case of this op.
  virtual std::vector<Reduction> reductions() const = 0;
  /// The command-line flags that reproduce the overrides this op's cases read.
  virtual std::string flags(const Overrides& overrides) const = 0;

  /// The rare conditions this op's cases can reach, and which of them case `c` reaches (one flag
  /// per condition, in the same order).
  virtual std::vector<CaseCondition> conditions() const { return {}; }
  virtual std::vector<bool> reached(const PreparedCase& /*c*/) const { return {}; }

  // Mode detection (SPEC 7). An op without modes returns no axes and is not detected.

  /// The axes of this op's modes that can change a result.
  virtual std::vector<ModeAxis> mode_axes() const { return {}; }
  /// False for a combination the contract calls impossible (e.g. a scale rounded to the model
  /// dtype with no scale); detection never tries those.
  virtual bool possible(const ModeChoice& /*choice*/) const { return true; }
  /// The overrides with every mode axis pinned: the value the overrides give, else the contract's
  /// default. The subject is told the pinned modes; `pinned` gets them as a choice.
  virtual Overrides pin_modes(const Overrides& overrides, ModeChoice& pinned) const {
    pinned.clear();
    return overrides;
  }
  /// Runs `subject` on the case once and keeps its answer.
  virtual std::unique_ptr<CapturedAnswer> capture(Subject& subject, PreparedCase& c) const;

  // Case files (traces/case_file.hpp): a case and a subject's answer as tensors and metadata,
  // named as case_tensors.hpp says. The case file module goes through these and never asks which
  // op a case is.

  /// The case: its configuration (spec::write_config) and sizes in the metadata; its inputs
  /// (`input.*`), its caches (`cache.*`) and the reference's answer (`expected.*`).
  virtual void encode_case(PreparedCase& c, TensorWriter& out) const = 0;
  /// The case rebuilt from a file's tensors and metadata (not drawn from `seed`, which is only
  /// its name in reports), strictly: each tensor and key of encode_case required with exactly the
  /// dtype and shape the metadata implies, the inputs validated as a subject's would be; then the
  /// reference's answer is recomputed and must equal the stored `expected.*` one. Throws
  /// spec::InvalidInput naming the key, the tensor or the first differing element. The caller
  /// rejects what is left unread (TensorReader::require_all_read).
  virtual std::unique_ptr<PreparedCase> decode_case(TensorReader& in, std::uint64_t seed) const = 0;
  /// Runs `subject` on the case and writes its answer: the `expected.*` tensors' names without the
  /// prefix. What the subject throws propagates.
  virtual void encode_answer(Subject& subject, PreparedCase& c, TensorWriter& out) const = 0;
  /// Sets this op's function of `into` to one that answers the case with `result`'s tensors
  /// (which the caller has checked: exactly the case's `expected.*` names, dtypes and shapes).
  virtual void answer_from(const TensorSet& result, PreparedCase& c,
                           SubjectFunctions& into) const = 0;
};

/// Every op's driver, in spec::Op order.
const std::vector<const OpDriver*>& op_registry();
const OpDriver& driver_of(spec::Op op);

/// Every op, in registry order.
std::vector<spec::Op> all_ops();
/// Parses op names ("write", ...); an unknown one is InvalidInput naming `field`[i].
std::vector<spec::Op> parse_ops(const std::vector<std::string>& names, const char* field = "ops");

/// Runs `fn` (returning an Outcome) and classifies what it throws: InvalidInput on a valid case,
/// Unsupported (and a case skipped for want of device memory: spec::DeviceMemoryShort), a write
/// outside every buffer (a mismatch: spec::WroteOutside), anything else failed-to-run; `error`
/// gets the reason.
template <class Fn>
spec::Outcome run_guarded(Fn&& fn, std::string& error) {
  try {
    return fn();
  } catch (const spec::InvalidInput& e) {
    error = std::string("rejected a valid case: ") + e.what();
    return spec::Outcome::kInvalidInput;
  } catch (const spec::Unsupported& e) {
    error = std::string("unsupported: ") + e.what();
    return spec::Outcome::kUnsupported;
  } catch (const spec::WroteOutside& e) {
    error = e.what();
    return spec::Outcome::kMismatch;
  } catch (const spec::DeviceMemoryShort& e) {
    error = std::string("unsupported: skipped: ") + e.what();
    return spec::Outcome::kUnsupported;
  } catch (const std::exception& e) {
    error = std::string("failed to run: ") + e.what();
    return spec::Outcome::kFailedToRun;
  } catch (...) {
    error = "failed to run: a non-standard exception";
    return spec::Outcome::kFailedToRun;
  }
}

}  // namespace kvo::oracle
