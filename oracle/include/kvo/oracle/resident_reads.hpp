#pragma once
/// \file resident_reads.hpp
/// A read case resident on the device, for the GPU tier's read path (issue 15 item 4): the case's
/// sparse layer generated on the device from its ReadCaseValues (SPEC 8's rows, the planted
/// patches) and written there by the canonical fused write (the write tier's answerer) into two
/// copies, the tier's (0) and the judged subjects' (1); the tier's answerer and the subjects read
/// their copy through their device reads (Subject::device_indexer, Subject::device_attention), so
/// that only inputs, ids, scores and outputs cross to the host. A read must leave its copy as it
/// found it: compare() finds where copy 1 differs from copy 0, over every byte of the allocations,
/// or, for a huge cache (copies past 1 GiB), over the guard bands and the blocks the case's table
/// names, the only bytes poisoned and written there (a stray write into a huge cache's other
/// gigabytes is looked for on the other cases, whose allocations are compared whole). Everything
/// is called from one host thread, but for a reader made with its own stream (reader()), which
/// runs on side_thread().

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvo/oracle/one_thread.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/resident_writes.hpp"
#include "kvo/oracle/subject.hpp"
#include "kvo/spec/op.hpp"

namespace kvo::oracle {

class ResidentRead {
 public:
  /// Empty when `subject`'s `op` (kIndexer or kAttention) can be judged on a resident copy: a
  /// canonical subject (judged bit for bit: its answer needs no float64 truth over host caches)
  /// with that device read; else why not.
  static std::string unavailable(const Subject& subject, spec::Op op);

  /// What case `c`'s copies start as, found on the host alone (a campaign's worker finds it while
  /// the device thread judges earlier cases: for a huge cache it costs milliseconds): the layer's
  /// caches, lazy and holding nothing (the device poisons them), and for a huge cache the bytes
  /// its table names, the only ones poisoned, written and compared there.
  struct Plan {
    std::vector<spec::LayerCaches> initial;  ///< [1]: the case's sparse layer
    std::vector<BufferBytes> defined;        ///< empty: every byte (not a huge cache)
    bool whole = true;                       ///< compared over every byte of the allocations
  };
  static Plan plan(const ReadCase& c);

  /// Case `c`'s layer on the device, poisoned as `plan` (plan(c)) says, then written from
  /// c.values (c.caches are not read: a deferred case's hold nothing). spec::FailedToRun when the
  /// copies do not fit; spec::Unsupported built without CUDA.
  ResidentRead(const ReadCase& c, Plan plan);
  explicit ResidentRead(const ReadCase& c) : ResidentRead(c, plan(c)) {}
  ~ResidentRead();
  ResidentRead(const ResidentRead&) = delete;
  ResidentRead& operator=(const ResidentRead&) = delete;

  /// `inner` reading copy `copy`: a subject of inner's name, ordering and form whose indexer,
  /// attention and indexer_selection (the ids with the scores its indexer fills) run inner's
  /// device reads on that copy (spec::Unsupported for an op inner has no device read of). Valid
  /// while this lives. Its reads launch on the copies' stream, or (`own_stream`) on the stream of
  /// the thread that calls them (gpu::calling_thread_stream): a reader used on side_thread(),
  /// after synchronize(), while this thread reads the other copy.
  std::unique_ptr<Subject> reader(Subject& inner, std::size_t copy, bool own_stream = false);
  /// Waits for the copies' writes (before another thread reads them).
  void synchronize();
  /// The host thread the tier's reads of copy 0 run on beside the subjects' reads of copy 1 (two
  /// streams, so the device runs both at once): one per calling thread (the campaign's main thread
  /// or a device lane), kept for the process with its device memory pool and staging block.
  static OneThread& side_thread();
  /// Copy 1 against copy 0 (count 0: equal).
  LayerDifference compare();
  /// Copy 0 over copy 1 (after a read that changed it).
  void resync();
  /// `bytes` (whole pages) of copy 0 into `into` (caches of the case's layer shape).
  void download(std::span<const BufferBytes> bytes, spec::LayerCaches& into);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvo::oracle
