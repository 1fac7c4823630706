#pragma once
/// \file resident_writes.hpp
/// Layer writes resident on the device, for a trace replay's GPU tier (issue 15 item 3): every
/// selected layer's caches live on the GPU across steps, one copy per writer (writer 0 the tier's
/// answerer, the others the judged subjects), each step's K, V and index-K are generated on the
/// device from SPEC 8's rules, each writer's Subject::device_write writes its copy, and copies are
/// compared on the device; only the verdicts, and the pages a report or a tier check reads, come
/// back. The oracle's view of kvo/gpu/resident.hpp: subjects for functions, host caches of the
/// layer's shape for pages. Everything is called from one host thread.

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvo/gpu/resident.hpp"
#include "kvo/oracle/subject.hpp"
#include "kvo/reference/generator.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::oracle {

/// Bytes [begin, end) of one buffer of a layer (kvo/gpu/resident.hpp: an index into
/// LayerCaches::buffers, storage offsets).
using BufferBytes = gpu::BufferByteRange;

/// The guard bands of every buffer a `kind` layer of `layout` has, and the bytes of `blocks` in
/// each (block_byte_ranges): what a step's comparison reads, as disjoint ranges ascending by buffer
/// and offset (each byte read once, however the blocks' bytes interleave). The buffers of a dense
/// layer are the first ones of a sparse layer's, so the sparse list serves both (a comparison skips
/// a buffer a layer does not have).
std::vector<BufferBytes> step_bytes(const reference::PagedCacheLayout& layout, spec::LayerKind kind,
                                    const std::vector<std::int64_t>& blocks);
/// The cache blocks the slots of `mappings` land in, ascending and once each: a negative slot
/// wrapped as legacy_wrap does (slot + capacity; in strict mode it writes nothing, and a block too
/// many is harmless to a comparison), slots past the capacity left out.
std::vector<std::int64_t> touched_blocks(
    const spec::CacheGeometry& geometry,
    std::initializer_list<std::span<const std::int64_t>> mappings);
/// Every byte of every buffer of a `kind` layer.
std::vector<BufferBytes> whole_bytes(const reference::PagedCacheLayout& layout,
                                     spec::LayerKind kind);

/// A comparison's verdict on one layer (kvo/gpu/resident.hpp: the count of differing bytes and
/// the first; buffer -1: outside every buffer and its guard bands).
using LayerDifference = gpu::ResidentDifference;

class ResidentWrites {
 public:
  /// Empty when `writers` can all write resident on the device here, else why not (a subject
  /// without a device write, a build without CUDA).
  static std::string unavailable(const std::vector<Subject*>& writers);
  /// Empty when the writes of `config` have one right answer, byte for byte, so that copies can
  /// be compared with the tier's on the device; else why not (colliding slots admit several
  /// writers' bytes, div_approx several codes: those are judged on the host by their sets).
  static std::string config_blocker(const spec::ModelConfig& config);
  /// Device bytes `copies` copies of the layers `initial` take (what the constructor checks
  /// against the device's free memory); 0 in a build without CUDA.
  static std::int64_t device_bytes_needed(const spec::ModelConfig& config,
                                          const std::vector<spec::LayerCaches>& initial,
                                          std::size_t copies);

  /// `initial[li]`: layer layers[li]'s caches as every copy starts (host, guarded; lazy storage
  /// costs only its held pages). `gen`: the replay's generator (seed, range, edge values, act).
  /// k_scale, v_scale: one set for every layer or one per layer, each [1] or [nkv].
  /// spec::FailedToRun, before anything is allocated, when the copies do not fit on the device.
  ResidentWrites(const spec::ModelConfig& config, std::vector<std::int64_t> layers,
                 const std::vector<spec::LayerCaches>& initial, std::vector<Subject*> writers,
                 const reference::ValueGenerator& gen,
                 const std::vector<std::vector<float>>& k_scale,
                 const std::vector<std::vector<float>>& v_scale, std::int64_t max_tokens);
  /// The same with the writers' device writes given as functions, the generated rows' bias per
  /// tensor field (K, V, index-K: reference::generated_rows' bias; none when empty), and the byte
  /// ranges that alone start poisoned in buffers that start so (gpu::ResidentReplay's `defined`;
  /// empty: all of them) in which copies (gpu::DefinedCopies: every copy, or the tier's alone).
  ResidentWrites(const spec::ModelConfig& config, std::vector<std::int64_t> layers,
                 const std::vector<spec::LayerCaches>& initial, std::vector<DeviceWriteFn> writers,
                 const reference::ValueGenerator& gen,
                 const std::vector<std::vector<float>>& k_scale,
                 const std::vector<std::vector<float>>& v_scale, std::int64_t max_tokens,
                 std::span<const float> bias, std::span<const BufferBytes> defined = {},
                 gpu::DefinedCopies limits = gpu::DefinedCopies::kEvery);
  /// The Subject* constructor's, with the tier's copy (writer 0) defined only over `defined`
  /// (gpu::DefinedCopies::kFirst: a huge write case, whose tier copy holds the pages it writes).
  ResidentWrites(const spec::ModelConfig& config, std::vector<std::int64_t> layers,
                 const std::vector<spec::LayerCaches>& initial, std::vector<Subject*> writers,
                 const reference::ValueGenerator& gen,
                 const std::vector<std::vector<float>>& k_scale,
                 const std::vector<std::vector<float>>& v_scale, std::int64_t max_tokens,
                 std::span<const BufferBytes> tier_defined);
  ~ResidentWrites();
  ResidentWrites(const ResidentWrites&) = delete;
  ResidentWrites& operator=(const ResidentWrites&) = delete;

  /// Device bytes the copies hold.
  std::int64_t device_bytes() const;
  /// One step: each source row's generator key (rows past the slot mapping: CUDA-graph padding),
  /// the slot mappings (index_slots null unless config.separate_index_slots), the bytes its
  /// comparison reads, and the source rows that are all zero.
  void stage_step(std::span<const reference::RowKey> keys, const spec::SlotMapping& slots,
                  const spec::SlotMapping* index_slots, std::span<const BufferBytes> compared,
                  std::span<const std::int64_t> zero_rows = {},
                  std::span<const gpu::SourcePatch> patches = {});
  /// Writer `writer` writes layer li of the staged step (its inputs generated on the device
  /// first); not waited for. What the subject's function throws propagates.
  void write(std::size_t li, std::size_t writer);
  /// Writer `writer`'s copies (>= 1) against the tier's, over the staged bytes or (`whole`) every
  /// byte; waits for the device: a CUDA error is spec::FailedToRun. One verdict per layer.
  std::vector<LayerDifference> compare(std::size_t writer, bool whole);
  /// Waits for the device: a CUDA error is spec::FailedToRun.
  void synchronize();
  /// The tier's copy of layer li over writer `writer`'s.
  void resync(std::size_t li, std::size_t writer);
  /// `bytes` (rounded out to whole pages) of writer `writer`'s copy of layer li, into `into`.
  void download(std::size_t li, std::size_t writer, std::span<const BufferBytes> bytes,
                spec::LayerCaches& into);
  /// The same for every layer at once (`into[li]`: layer li's; one copy back for all).
  void download(std::size_t writer, std::span<const BufferBytes> bytes,
                std::span<spec::LayerCaches> into);
  /// The same, not waited for (gpu::ResidentReplay::download_async): the pages as the writes
  /// issued before this call leave them, stored into host caches when and where the caller needs
  /// them (gpu::PagesInFlight::store, from any thread); `like` as there.
  std::unique_ptr<gpu::PagesInFlight> download_async(std::size_t writer,
                                                     std::span<const BufferBytes> bytes,
                                                     const gpu::PagesInFlight* like = nullptr);
  /// Writer `writer`'s copy of layer li as a call's views, and the stream every launch runs on:
  /// what a read of the copy is handed (gpu::run_resident_indexer, gpu::run_resident_attention).
  const gpu::DeviceKvCaches& views(std::size_t li, std::size_t writer) const;
  void* stream() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvo::oracle
