#pragma once
/// \file subject.hpp
/// A subject is a named implementation that the oracle judges against the reference: the CPU
/// emulations always, the CUDA kernels when a GPU answers, the planted mutants, a user's own
/// kernel. One model for all of them (Ginkgo's one signature per op): a subject declares which ops
/// it implements and how it orders its arithmetic, and implements those ops' signatures. The
/// campaign, shrinking, explain, the mutants and replay take any subject; adding one touches none
/// of them.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/read_diff.hpp"
#include "kvo/reference/read_path.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/dense_insert.hpp"
#include "kvo/spec/op.hpp"
#include "kvo/spec/read.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::gpu {
struct DeviceWriteCall;      // kvo/gpu/device_calls.hpp
struct DeviceIndexerCall;    // kvo/gpu/device_calls.hpp
struct DeviceAttentionCall;  // kvo/gpu/device_calls.hpp
}  // namespace kvo::gpu

namespace kvo::oracle {

/// A write on device memory (gpu::DeviceWriteFunction): the call's tensors and caches in device
/// memory, launched on its stream.
using DeviceWriteFn = std::function<void(const gpu::DeviceWriteCall&)>;
/// The reads on device memory (gpu::DeviceIndexerFunction, gpu::DeviceAttentionFunction).
using DeviceIndexerFn = std::function<void(const gpu::DeviceIndexerCall&)>;
using DeviceAttentionFn = std::function<void(const gpu::DeviceAttentionCall&)>;

class Subject {
 public:
  virtual ~Subject() = default;
  virtual std::string name() const = 0;
  /// Empty when the subject can run here; otherwise why not ("no CUDA device").
  virtual std::string unavailable_reason() const { return {}; }
  virtual bool implements(spec::Op op) const = 0;
  /// Canonical subjects are judged bit for bit; foreign ones (another summation order, hardware
  /// exp2) against the float64 truth with the derived bound and the tie-aware top-k rules.
  virtual spec::Ordering ordering() const { return spec::Ordering::kCanonical; }
  /// What the indexer's output declares (SPEC 5): its rows' order and layout, and its key
  /// precision.
  virtual TopkForm topk_form() const { return {}; }
  /// The arithmetic profile of a foreign attention (SPEC principle 4): the bound it is judged by.
  virtual spec::AttentionProfile attention_profile() const { return spec::AttentionProfile::kFp32; }
  /// Whether the subject may judge several cases at once on different threads (a pure CPU
  /// function of its arguments). A GPU, device or Python subject is not: the campaign calls it
  /// from one thread, one case after another.
  virtual bool concurrent() const { return false; }
  /// Whether its device functions (device_write, device_indexer, device_attention) may run on
  /// several host threads at once, each call on the stream it is handed (a stateless launcher):
  /// the resident campaign then judges cases on several device lanes (CheckOptions::device_lanes).
  /// A subject that keeps state between calls (a user's device subject, Python) is not.
  virtual bool device_concurrent() const { return false; }

  // One signature per op. Each throws spec::InvalidInput on rejected input, spec::FailedToRun on a
  // runtime error and spec::Unsupported for a configuration it does not implement; the default
  // (an op the subject does not implement) throws spec::Unsupported.

  /// kWrite on device memory: what a replay resident on the device calls (issue 15; caches that
  /// stay on the GPU across steps). Empty where the subject has none: a CPU, Python or host-call
  /// subject, a CUDA twin with a planted fault. Where present it writes the bytes write_layer
  /// writes.
  virtual DeviceWriteFn device_write() const { return {}; }
  /// kIndexer and kAttention on device memory: what the GPU tier's resident read path calls (a
  /// read case's caches generated and written on the device, read there by the tier and the
  /// subjects). Empty where the subject has none. Where present they answer what indexer and
  /// attention answer; the tier's answerer's indexer also fills the call's scores output.
  virtual DeviceIndexerFn device_indexer() const { return {}; }
  virtual DeviceAttentionFn device_attention() const { return {}; }
  /// kWrite: one layer into `caches` (host buffers, guards included; the subject moves them to
  /// its device and back as it needs).
  virtual void write_layer(const spec::ModelConfig& config, const spec::LayerWrite& write,
                           spec::LayerCaches& caches);
  /// kDense: inserts k and v of a dense layer into `caches`; returns q_out [T, nq, hd].
  virtual spec::HostTensor dense_insert(const spec::ModelConfig& config,
                                        const spec::DenseInsert& in, spec::LayerCaches& caches);
  /// kIndexer: top-k ids [Tq, nkv, topk] of the case.
  virtual std::vector<std::int32_t> indexer(const ReadCase& c);
  /// kAttention: [Tq, nq, hd] in c.attention.out_dtype over `selection` (null: dense).
  virtual spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* selection);
  /// kIndexer's whole answer, as reference::indexer_topk gives it: the ids with the block scores
  /// they were ranked by and each row's n_valid. What a reference tier's read answerer gives
  /// (reference_tier.hpp: a read case answered by the tier carries its scores, which order the
  /// selection handed to attention); a judged subject never needs it. The default throws
  /// spec::Unsupported.
  virtual reference::TopkSelection indexer_selection(const ReadCase& c);
};

using SubjectList = std::vector<std::unique_ptr<Subject>>;

using WriteFunction =
    std::function<void(const spec::ModelConfig&, const spec::LayerWrite&, spec::LayerCaches&)>;
using DenseFunction = std::function<spec::HostTensor(const spec::ModelConfig&,
                                                     const spec::DenseInsert&, spec::LayerCaches&)>;
using IndexerFunction = std::function<std::vector<std::int32_t>(const ReadCase&)>;
using AttentionFunction =
    std::function<spec::HostTensor(const ReadCase&, const reference::TopkSelection*)>;
using IndexerSelectionFunction = std::function<reference::TopkSelection(const ReadCase&)>;

/// A subject from plain functions: the ops it implements are the functions given.
struct SubjectFunctions {
  WriteFunction write;
  DenseFunction dense;
  IndexerFunction indexer;
  AttentionFunction attention;
  IndexerSelectionFunction indexer_selection;  ///< Subject::indexer_selection (a tier's answerer)
  spec::Ordering ordering = spec::Ordering::kCanonical;
  TopkForm topk_form;
  spec::AttentionProfile attention_profile = spec::AttentionProfile::kFp32;
  DeviceWriteFn device_write;                       ///< Subject::device_write (empty: none)
  DeviceIndexerFn device_indexer;                   ///< Subject::device_indexer (empty: none)
  DeviceAttentionFn device_attention;               ///< Subject::device_attention (empty: none)
  std::function<std::string()> unavailable_reason;  ///< empty: always available
  bool concurrent = false;  ///< Subject::concurrent: the functions are pure and thread-safe
  /// Subject::device_concurrent: the device functions launch on the stream they are handed and
  /// keep no state, so several threads may call them at once.
  bool device_concurrent = false;
};
std::unique_ptr<Subject> make_function_subject(std::string name, SubjectFunctions functions);
/// A write-only subject (a user's kernel wrapper, or a test's planted bug); `concurrent` when
/// `write` is a pure, thread-safe CPU function (Subject::concurrent).
std::unique_ptr<Subject> make_function_subject(std::string name, WriteFunction write,
                                               bool concurrent = false);

/// Every subject this build knows, available here or not, in a fixed order: the CPU subjects, then
/// (built with CUDA) the CUDA ones.
SubjectList make_subjects();

/// Names of make_subjects(), for usage messages.
std::vector<std::string> subject_names();

/// The ops `subject` implements, as "write,dense".
std::string implemented_ops(const Subject& subject);

}  // namespace kvo::oracle
