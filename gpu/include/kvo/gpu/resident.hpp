#pragma once
/// \file resident.hpp
/// Layer writes resident on the device (issue 15 item 3): a trace replay whose caches stay on the
/// GPU across steps. Each selected layer has `copies` device copies of its guarded caches (copy 0
/// the reference tier's, the others the judged subjects'), each a DeviceCacheMirror (guards and
/// poisoned margins around the buffers); every step's K, V and index-K are generated on the device
/// from SPEC 8's rules (spec/generated_values.hpp); a write function (DeviceWriteFunction) writes
/// a copy; copies are compared byte for byte on the device, and only the verdicts (a count and
/// the first differing byte per layer) come back to the host. Everything runs on one stream, in
/// call order, from one host thread (PagesInFlight's stores excepted).
///
/// The rounding of a generated value to the activation dtype is the device's own conversion:
/// `generated_rows_on_device` is tested against reference::generated_rows byte for byte.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvo/gpu/device_calls.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/generated_values.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::gpu {

/// The generator key fields of one row past (layer, tensor): the request id and the position.
struct GeneratedRowKey {
  std::int64_t request = 0, position = 0;
};

/// What a replay generates: SPEC 8's seed and rule, in the activation dtype.
struct GeneratedValues {
  std::uint64_t seed = 0;
  spec::GeneratedValueRule rule;
  spec::DType act = spec::DType::kBF16;
  /// reference::generated_rows' bias, per tensor field (K 0, V 1, index-K 2): when `biased`, a
  /// value is round(x + bias[tensor]) of the generated x, in the activation dtype (a read case's
  /// rows: its adversarial V's large common offset, the others' + 0).
  bool biased = false;
  float bias[3] = {0.0f, 0.0f, 0.0f};
};

/// One element of a generated source row overwritten after generation (a read case's planted
/// NaN index-K values and -inf blocks): tensor field (K 0, V 1, index-K 2), source row, element
/// within the row ([heads * dim]), and its activation code. A step's patches name distinct
/// elements.
struct SourcePatch {
  std::int32_t tensor = 2;
  std::int64_t row = 0, element = 0;
  std::uint32_t code = 0;
};

/// SPEC 8's rows generated on the device: [keys, heads, dim] activation codes (little-endian),
/// row r, head h, dim d the value of key (seed, layer, tensor, keys[r], h, d): the device twin of
/// reference::generated_rows (without a bias). Synchronous.
std::vector<std::uint8_t> generated_rows_on_device(const GeneratedValues& values,
                                                   std::int64_t layer, std::int64_t tensor,
                                                   std::span<const GeneratedRowKey> keys,
                                                   std::int64_t heads, std::int64_t dim);

/// Bytes [begin, end) of buffer `buffer` of a layer's caches (an index into LayerCaches::buffers;
/// storage offsets: the leading guard band starts at 0).
struct BufferByteRange {
  std::int32_t buffer = 0;
  std::int64_t begin = 0, end = 0;
};

/// A comparison's verdict on one layer: the number of differing bytes and the first of them (by
/// buffer, then byte). `buffer` -1 with a `byte`: a byte of the allocation outside every buffer
/// (a margin), at that offset from the allocation's start.
struct ResidentDifference {
  std::int64_t count = 0;
  std::int32_t buffer = -1;
  std::int64_t byte = -1;
};

/// Which copies a replay's `defined` ranges limit. kEvery: every copy's lazy buffers start
/// poisoned over those ranges alone (a read case, whose reads name a few pages of gigabytes).
/// kFirst: copy 0's alone (a write case's huge cache: the tier's copy need hold only what it
/// writes); every other copy starts poisoned whole, and a whole comparison reads it against copy 0
/// inside the ranges and against the poison pattern outside them, so that a huge copy is poisoned
/// and read once a case instead of twice.
enum class DefinedCopies { kEvery, kFirst };

/// Pages of a resident copy on their way to the host (ResidentReplay::download_async): gathered on
/// the device when asked, copied to pinned host memory in the background. Unlike the rest of this
/// file, any host thread may store them, and destroy it (it waits for the copy first).
class PagesInFlight {
 public:
  ~PagesInFlight();
  PagesInFlight(const PagesInFlight&) = delete;
  PagesInFlight& operator=(const PagesInFlight&) = delete;
  /// The host bytes it holds.
  std::int64_t bytes() const;
  /// Waits for the copy (spec::FailedToRun on a CUDA error), then stores the pages of layer li
  /// into `into` (the layer's host caches, lazy or dense), as ResidentReplay::download does.
  void store(std::size_t li, spec::LayerCaches& into) const;
  /// Waits for the copy, then whether every page of layer li equals the bytes `caches` (the
  /// layer's host caches, holding those pages) holds there.
  bool same_as(std::size_t li, const spec::LayerCaches& caches) const;

 private:
  friend class ResidentReplay;
  struct State;
  explicit PagesInFlight(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

class ResidentReplay {
 public:
  /// Copies `copies` (>= 1) of every layer's caches to the device, each as `initial[li]` holds them
  /// (host, guarded; lazy storage uploads only its held pages, the rest poisoned on the device).
  /// `kinds[li]` is layer li's kind, `layers[li]` its index in the model (the generator's layer
  /// key). k_scale and v_scale: one set for every layer, or one per layer (a campaign's write case
  /// draws each layer's), each [1] or [nkv]. `max_tokens`: the most source rows a step will stage.
  /// Before allocating anything, spec::FailedToRun with the figures when the copies do not fit in
  /// the device's free memory. `defined`: when given, the poison of a buffer that starts poisoned
  /// (lazy, nothing held) covers only these byte ranges of it (rounded out to whole 4 KiB pages),
  /// in every layer and copy, and the rest of it holds what the memory held before: only a
  /// comparison over ranges inside them (compare(copy, false)) means anything there (a read case's
  /// huge cache, of which its reads name a few pages among gigabytes). `limits`: which copies
  /// `defined` limits (DefinedCopies; with kFirst, copy 0 outside the ranges is neither compared,
  /// downloaded nor resynced from).
  ResidentReplay(const spec::ModelConfig& config, std::vector<std::int64_t> layers,
                 const std::vector<spec::LayerCaches>& initial, std::size_t copies,
                 const GeneratedValues& values, const std::vector<std::vector<float>>& k_scale,
                 const std::vector<std::vector<float>>& v_scale, std::int64_t max_tokens,
                 std::span<const BufferByteRange> defined = {},
                 DefinedCopies limits = DefinedCopies::kEvery);
  ~ResidentReplay();
  ResidentReplay(const ResidentReplay&) = delete;
  ResidentReplay& operator=(const ResidentReplay&) = delete;

  /// Device bytes the copies of these layers take (what the constructor checks).
  static std::int64_t device_bytes_needed(const spec::ModelConfig& config,
                                          const std::vector<spec::LayerCaches>& initial,
                                          std::size_t copies);
  std::int64_t device_bytes() const;

  /// One step: the generator key of each source row [T_src] (T_src >= T: rows past the slot
  /// mapping are CUDA-graph padding a writer must not read), the slot mappings [T] (index_slots
  /// only with config.separate_index_slots, else null), the byte ranges a step's comparison reads
  /// in every layer (a range of a buffer a layer does not have is skipped), and the source rows
  /// that are all zero in every layer's K, V and index-K (SPEC 8's zero rows of a write case).
  /// `patches`: elements of the generated rows overwritten after generation (SourcePatch).
  void stage_step(std::span<const GeneratedRowKey> keys, const spec::SlotMapping& slots,
                  const spec::SlotMapping* index_slots, std::span<const BufferByteRange> compared,
                  std::span<const std::int64_t> zero_rows = {},
                  std::span<const SourcePatch> patches = {});
  /// Calls `fn` once on copy `copy` of layer li with the staged step's inputs, generated on the
  /// device first unless layer li's are current (the stream's work is not waited for; what `fn`
  /// throws propagates).
  void write(std::size_t li, std::size_t copy, const DeviceWriteFunction& fn);
  /// Compares copy `copy` (>= 1) of every layer with copy 0: over the staged ranges, or (`whole`)
  /// every byte of the allocations, margins included. Waits for the stream; a CUDA error (a write
  /// function's kernel that faulted) is spec::FailedToRun. One verdict per layer.
  std::vector<ResidentDifference> compare(std::size_t copy, bool whole);
  /// Copy 0 of layer li over copy `copy` (a resync after a reported mismatch); spec::InvalidInput
  /// when copy 0 is defined only in part (DefinedCopies::kFirst).
  void resync(std::size_t li, std::size_t copy);
  /// The bytes of `ranges` of copy `copy` of layer li, rounded out to whole pages
  /// (spec::ByteStorage::kPageBytes), stored into `into` (the layer's host caches, lazy or dense).
  void download(std::size_t li, std::size_t copy, std::span<const BufferByteRange> ranges,
                spec::LayerCaches& into);
  /// The same for every layer at once (`into[li]`: layer li's host caches; one gather on the
  /// device and one copy back for all of them).
  void download(std::size_t copy, std::span<const BufferByteRange> ranges,
                std::span<spec::LayerCaches> into);
  /// The bytes of `ranges` of copy `copy` of every layer, rounded out to whole pages, gathered on
  /// the device in stream order (as the launches before this call leave them) and copied to the
  /// host in the background, without waiting: the host stores them where and when it needs them
  /// (a replay's sampled checks, on threads of their own).
  /// `like`: an earlier download_async of the same ranges (a step's pages before and after its
  /// writes): its list of pages is reused.
  std::unique_ptr<PagesInFlight> download_async(std::size_t copy,
                                                std::span<const BufferByteRange> ranges,
                                                const PagesInFlight* like = nullptr);
  /// Waits for the stream; a CUDA error is spec::FailedToRun.
  void synchronize();
  /// Copy `copy` of layer li as the views a call receives (its buffers' bodies on the device), and
  /// the stream every launch of this replay runs on (a cudaStream_t): what a read of a resident
  /// copy is handed (kvo/gpu/device_calls.hpp: run_resident_indexer, run_resident_attention).
  const DeviceKvCaches& views(std::size_t li, std::size_t copy) const;
  void* stream() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvo::gpu
