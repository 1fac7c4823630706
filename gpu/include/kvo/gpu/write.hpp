#pragma once
/// \file write.hpp
/// CUDA layer writes (SPEC 3-4): the fused one-launch kernel and the unfused 12/8-launch baseline.
/// No CUDA type appears here, so host code links kvo_gpu without nvcc; streams are passed as
/// `void*` (a cudaStream_t).
///
/// Two entry points per path:
///  - the host-memory convenience (write_layer_host): validates the whole call on the host
///    (spec::validate, spec::validate_write) before anything is copied or launched, copies the
///    LayerCaches (guards included) and the inputs to the device, writes, and copies the caches
///    back. This is what the oracle's `cuda-fused` / `cuda-unfused` subjects call.
///  - the device-pointer API (launch_fused_write, launch_unfused_write): caches and inputs already
///    on the device, one stream, no synchronisation and no host validation of slot values (those
///    live on the device): for benchmarks and CUDA-graph capture, where the engine guarantees the
///    slot mapping. Configuration and pointers are still checked on the host.
///
/// Errors: bad input is spec::InvalidInput (before any launch); a CUDA error is spec::FailedToRun
/// carrying the CUDA error string. legacy_wrap: the kernels wrap negative slots themselves; when
/// two tokens resolve to one slot (last writer wins on the CPU, an undefined order on the GPU), the
/// host convenience resolves the mapping first (the last writer keeps the slot, the others become
/// padding) and runs a strict call; the device API leaves such a mapping to the caller.
///
/// Planted bugs for the oracle's self-tests live in kvo_gpu_testing (kvo/gpu/testing/faults.hpp),
/// never here.

#include <cstdint>
#include <vector>

#include "kvo/gpu/device_calls.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/dense_insert.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::gpu {

/// Which GPU implementation writes the layer: the fused write (its specialised kernel where
/// fused_write_is_specialised, else the generic one), the unfused launches, or the fused write
/// through its generic kernel only (launch_fused_write_generic).
enum class WritePath : std::uint8_t { kFused, kUnfused, kFusedGeneric };

/// One layer's inputs on the device. Every pointer is 16-byte aligned.
struct DeviceWriteInputs {
  const void* k = nullptr;            ///< [>= T, nkv, hd] act dtype, row-contiguous
  const void* v = nullptr;            ///< [>= T, nkv, hd] act dtype, row-contiguous
  const void* index_k = nullptr;      ///< [>= T, index_dim] act dtype; sparse layers only
  const void* slots = nullptr;        ///< [T] int32 or int64 (config.slot_type)
  const void* index_slots = nullptr;  ///< [T] same type; only with config.separate_index_slots
  const float* k_scale = nullptr;     ///< [1] or [nkv] (config.kv.per_head_scale)
  const float* v_scale = nullptr;     ///< [1] or [nkv]
  std::int64_t num_tokens = 0;        ///< T, the slot mapping's length
};

/// One layer's cache bodies on the device (no guards; 16-byte aligned).
struct DeviceLayerCaches {
  /// K [layout of SPEC 3], or the one K/V tensor of packed/split layouts: its first element
  /// (element (0, 0, 0, 0); a strided view's offset into its buffer is the caller's, SPEC 3).
  void* k = nullptr;
  void* v = nullptr;  ///< V's first element; null for the one-tensor layouts
  void* index_k =
      nullptr;  ///< index-K (flat [nb, bs, index_dim] or blockscale blocks); sparse only
};

/// Body bytes of each buffer of a layer in this configuration (gpu's own arithmetic).
std::int64_t kv_buffer_bytes(const spec::ModelConfig& config);     ///< K, V, or the one KV tensor
std::int64_t index_buffer_bytes(const spec::ModelConfig& config);  ///< index-K

/// Launches the fused write: one kernel for K, V and (sparse) index-K. Returns the launch count (1,
/// or 0 when there are no tokens). `pdl`: programmatic dependent launch (sm_90): the kernel waits
/// for the stream's previous kernel (griddepcontrol.wait) before its first read and lets the next
/// kernel's launch overlap its own run, as vLLM's fused kernels do inside CUDA graphs.
int launch_fused_write(const spec::ModelConfig& config, spec::LayerKind kind,
                       const DeviceWriteInputs& in, const DeviceLayerCaches& caches, void* stream,
                       bool pdl = false);

/// The fused write through its generic kernel whatever the configuration (runtime modes, every
/// dtype and mode): the baseline launch_fused_write's specialised kernel is measured and tested
/// against. The same contract and bytes as launch_fused_write.
int launch_fused_write_generic(const spec::ModelConfig& config, spec::LayerKind kind,
                               const DeviceWriteInputs& in, const DeviceLayerCaches& caches,
                               void* stream, bool pdl = false);

/// Whether launch_fused_write runs this layer through its specialised kernel (16-bit activations;
/// bf16 or satfinite e4m3 caches; scale none, divide or mul_recip without model-dtype roundings;
/// strict slots; index-K none, flat bf16 or blockscale; a token's K and V rows of at most 8192
/// elements): the modes, dtypes and index layout compiled in, one thread per 8-element item and
/// no barrier. Host-only; needs no GPU.
bool fused_write_is_specialised(const spec::ModelConfig& config, spec::LayerKind kind);

/// Device scratch of the unfused path: per tensor (K, V, index-K) the block and offset vectors in
/// the slot type and as int64, i.e. 3 x 4 x [max_tokens] int64.
class UnfusedWorkspace {
 public:
  explicit UnfusedWorkspace(std::int64_t max_tokens);
  ~UnfusedWorkspace();
  UnfusedWorkspace(const UnfusedWorkspace&) = delete;
  UnfusedWorkspace& operator=(const UnfusedWorkspace&) = delete;

  std::int64_t max_tokens() const { return max_tokens_; }
  /// Scratch vector `which` (0..3) of tensor `tensor` (0 K, 1 V, 2 index-K): [max_tokens] int64.
  std::int64_t* vec(int tensor, int which) const;
  /// Bytes a workspace of `max_tokens` needs (for callers that carve it from their own memory).
  static std::int64_t bytes_for(std::int64_t max_tokens);
  /// A workspace over caller-owned device memory of bytes_for(max_tokens) bytes (not freed).
  UnfusedWorkspace(std::int64_t max_tokens, void* memory);

 private:
  std::int64_t max_tokens_ = 0;
  std::int64_t* base_ = nullptr;
  bool owned_ = false;
};

/// Launches the unfused path: per tensor a division, a remainder, an index cast and a scatter
/// launch. Returns the launch count: 12 on a sparse layer, 8 on a dense one (0 without tokens).
int launch_unfused_write(const spec::ModelConfig& config, spec::LayerKind kind,
                         const DeviceWriteInputs& in, const DeviceLayerCaches& caches,
                         UnfusedWorkspace& workspace, void* stream);

/// The write of `path` as a DeviceWriteFunction (device_calls.hpp): one call's tensors handed to
/// launch_fused_write, launch_fused_write_generic or launch_unfused_write on the call's stream, no
/// synchronisation (the unfused path's workspace is one per host thread and stream, grown to the
/// largest call so far: threads may call it at once, each on its own stream). Slot values are the
/// caller's to check (the device API's contract), and a legacy_wrap mapping whose tokens collide is
/// not resolved.
DeviceWriteFunction device_write_function(WritePath path);

/// The host-memory convenience: validates, copies to the device, writes, copies `caches` (guards
/// included) back. Synchronous.
void write_layer_host(WritePath path, const spec::ModelConfig& config,
                      const spec::LayerWrite& write, spec::LayerCaches& caches);

/// The dense-layer fused insert (SPEC 4, vLLM MiniMax-M3 qknorm + rope + insert) in one launch:
/// validates (spec::validate_dense_insert), copies to the device, runs, copies the K/V buffers
/// (guards included) back and returns q_out [T, nq, hd] in the activation dtype. head_dim 32, 64,
/// 128 or 256 (else spec::Unsupported). Synchronous.
spec::HostTensor dense_insert_host(const spec::ModelConfig& config, const spec::DenseInsert& in,
                                   spec::LayerCaches& caches);

/// The same kernel on device memory: one launch on call.stream, no synchronisation (a
/// DeviceDenseFunction, kvo/gpu/device_calls.hpp: dense_insert_host is run_device_dense of it).
/// Contiguous inputs and caches only (else spec::Unsupported).
void launch_dense_insert(const DeviceDenseCall& call);

/// The dense insert in vLLM's arithmetic (fma squares per lane, an xor butterfly, rsqrtf, the rope
/// in plain operators): the same meaning in another order, a foreign subject that SPEC 4's
/// admissible sets judge (cuda-dense-engine). The same limits as launch_dense_insert.
void launch_dense_insert_engine(const DeviceDenseCall& call);
spec::HostTensor dense_insert_engine_host(const spec::ModelConfig& config,
                                          const spec::DenseInsert& in, spec::LayerCaches& caches);

/// Self-check of the kernels' division rule (a power of two by multiply; else, in range, a
/// correctly rounded reciprocal with two exact-residual corrections; else __fdiv_rn): the number of
/// float32 bit patterns x, of all 2^32, where the kernels' fl(x / s) differs from __fdiv_rn(x, s).
std::int64_t count_division_mismatches(float s);

/// Self-check of the index-K block scale's division-free rules (blockscale_scale's fl(amax / 448)
/// by the corrected reciprocal, a ue8m0 scale's reciprocal from its exponent bits): over all 2^31
/// non-negative float32 amax (NaN and infinity included), the number where the scale differs from
/// fmaxf(amax, 1e-4) / 448 by __fdiv_rn (ue8m0: rounded up to a power of two), plus, under ue8m0,
/// the number of (amax, x) where x * recip differs from __fdiv_rn(x, scale), for x = +-amax and
/// ten edge values (zeros, infinities, NaN, the largest and smallest floats).
std::int64_t count_block_scale_mismatches(bool ue8m0);

/// Self-check of the division's bf16 range tests on raw words (bf16_words_in_range, and the
/// RecipPair's exponent range): the number of (32-bit word, position in an item, test) of all
/// 2^32 x 4 x 2 where one differs from the same test on the two widened values.
std::int64_t count_bf16_range_mismatches();

/// Self-check of the specialised write's divide mode on bf16 activations: its warp check of the
/// scales for the two-operation division (write_decode.cuh warp_recip_pair_exact), run by whole
/// and partial warps whose lanes hold four scales interleaved, then, for each scale, every bf16 x
/// divided by the kernel's item division (divide8_bf16) with the check's answer. Returns the
/// number of (lane, x) whose quotient differs from __fdiv_rn(x, s) in any bit; `passed`
/// (optional) gets the check's answer for each of `scales` (1 to 4096).
std::int64_t count_recip_pair_mismatches(const std::vector<float>& scales,
                                         std::vector<bool>* passed);

}  // namespace kvo::gpu
