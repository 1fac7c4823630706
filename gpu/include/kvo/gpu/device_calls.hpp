#pragma once
/// \file device_calls.hpp
/// A user's CUDA kernel judged in device memory: for each op, the call it receives (every input and
/// output as a DeviceTensor with shape and strides, the caches with their guard bands around them,
/// a stream) and a runner that turns one of kvoracle's host cases into that call and the answer
/// back. The oracle wraps a set of such functions into a subject (kvo/oracle/device_subject.hpp);
/// any test can call the runners directly too.
///
/// Every runner validates the case on the host first (spec::InvalidInput), copies it to the
/// device, calls the function once with a stream of its own (a cudaStream_t as void*), waits for
/// the stream and the device, turns a CUDA error into spec::FailedToRun (a kernel that faults
/// leaves the context unusable for the rest of the process, as CUDA does), and copies every cache
/// byte (guards included) and the outputs back. What the function throws propagates unchanged
/// (spec::Unsupported for a configuration it does not implement). Outputs start poisoned, so an
/// element the kernel never writes is a mismatch, never a pass: float outputs 0xFF bytes (NaN),
/// ids INT32_MIN. Built without CUDA, the runners throw spec::FailedToRun.

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "kvo/gpu/device_caches.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/dense_insert.hpp"
#include "kvo/spec/read.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::gpu {

/// The poison of a device indexer's ids before the call.
inline constexpr std::int32_t kIdPoison = std::numeric_limits<std::int32_t>::min();

/// kWrite (SPEC 3-4): one layer's write. T = slot_mapping.shape[0]; k, v and index_k may have more
/// rows than T (CUDA-graph padding), which the kernel must not read.
struct DeviceWriteCall {
  const spec::ModelConfig* config = nullptr;
  spec::LayerKind kind = spec::LayerKind::kDense;
  DeviceTensor k, v;                ///< [T_src, nkv, hd] act dtype
  DeviceTensor index_k;             ///< [T_src, index_dim] act dtype; sparse layers only
  DeviceTensor slot_mapping;        ///< [T] i32 or i64 (config->slot_type)
  DeviceTensor index_slot_mapping;  ///< [T]; sparse with config->separate_index_slots only
  DeviceTensor k_scale, v_scale;    ///< [1] or [nkv] (config->kv.per_head_scale) f32
  DeviceKvCaches caches;
  void* stream = nullptr;  ///< cudaStream_t
};

/// kDense (SPEC 4): the dense layer's fused qknorm + rope + insert.
struct DeviceDenseCall {
  const spec::ModelConfig* config = nullptr;
  DeviceTensor q;                 ///< [T_src, nq, hd] act dtype
  DeviceTensor k, v;              ///< [T_src, nkv, hd] act dtype
  DeviceTensor slot_mapping;      ///< [T] i32 or i64
  DeviceTensor k_scale, v_scale;  ///< [1] or [nkv] f32
  DeviceTensor q_norm_weight;     ///< [hd] f32: y = x * r * (1 + w)
  DeviceTensor k_norm_weight;     ///< [hd] f32
  DeviceTensor cos_sin;           ///< [max_pos, rotary_dim] f32: cos of the pairs, then sin
  DeviceTensor positions;         ///< [T] i64
  float eps = 1e-6f;              ///< RMSNorm epsilon
  std::int64_t rotary_dim = 0;    ///< dims [0, rotary_dim) rotated (NeoX halves)
  /// SPEC 4: K and V scaled by the scale mode with k_scale / v_scale, or (identity) with scale 1
  spec::DenseFp8Store fp8_store = spec::DenseFp8Store::kScaled;
  DeviceTensor q_out;  ///< [T, nq, hd] act dtype (output)
  DeviceKvCaches caches;
  void* stream = nullptr;
};

/// The batch of a read call on the device.
struct DeviceBatch {
  DeviceTensor block_table;      ///< [R, max_blocks] i32 physical block of each logical block
  DeviceTensor seq_lens;         ///< [R] i64; 0 marks a padded request
  DeviceTensor query_start_loc;  ///< [R + 1] i64
  DeviceTensor row_request;      ///< [Tq] i64: the request of each query row (derived)
  DeviceTensor row_position;     ///< [Tq] i64: its position p = seq_len - q_len + j (derived)
  /// Host value: the largest n_valid (SPEC 5: floor(p / sparse_block) + 1) of any row of a request
  /// with tokens, at least 1; what a launcher sizes its grid and workspaces by without reading the
  /// positions back.
  std::int64_t max_n_valid = 1;
};

/// kIndexer (SPEC 5): writes ids [Tq, nkv, topk] i32.
struct DeviceIndexerCall {
  const spec::ModelConfig* config = nullptr;
  spec::IndexerParams params;
  DeviceTensor index_q;  ///< [Tq, num_index_heads, index_dim] act dtype
  DeviceBatch batch;
  DeviceKvCaches caches;  ///< the sparse layer's (index_cache is what the indexer reads)
  DeviceTensor ids;       ///< [Tq, nkv, topk] i32 (output, poisoned with kIdPoison)
  /// Optional output (absent unless the caller asks): the block scores the selection ranked, after
  /// SPEC 5's forcing, [Tq, nkv * spec::selection_lanes, batch.max_n_valid] f32 (a row's entries
  /// past its n_valid unspecified). kvoracle's own indexer fills it (the GPU reference tier answers
  /// a read case with them); a user's kernel may ignore it.
  DeviceTensor scores;
  void* stream = nullptr;
};

/// kAttention (SPEC 6): writes out [Tq, nq, hd] in params.out_dtype.
struct DeviceAttentionCall {
  const spec::ModelConfig* config = nullptr;
  spec::AttentionParams params;
  DeviceTensor q;  ///< [Tq, nq, hd] act dtype
  DeviceBatch batch;
  DeviceKvCaches caches;
  DeviceTensor k_scale, v_scale;  ///< [1] or [nkv] f32
  /// [Tq, nkv, topk] i32 logical block ids in any order, -1 unused; absent: dense attention over
  /// every token t <= p.
  DeviceTensor selection;
  DeviceTensor out;  ///< [Tq, nq, hd] params.out_dtype (output)
  void* stream = nullptr;
};

using DeviceWriteFunction = std::function<void(const DeviceWriteCall&)>;
using DeviceDenseFunction = std::function<void(const DeviceDenseCall&)>;
using DeviceIndexerFunction = std::function<void(const DeviceIndexerCall&)>;
using DeviceAttentionFunction = std::function<void(const DeviceAttentionCall&)>;

/// Runs `fn` on one layer write; `caches` (host, guarded) receives every byte back.
void run_device_write(const DeviceWriteFunction& fn, const spec::ModelConfig& config,
                      const spec::LayerWrite& write, spec::LayerCaches& caches);

/// Runs `fn` on one dense insert; returns q_out [T, nq, hd] and `caches` receives every byte back.
spec::HostTensor run_device_dense(const DeviceDenseFunction& fn, const spec::ModelConfig& config,
                                  const spec::DenseInsert& in, spec::LayerCaches& caches);

/// Runs `fn` on one indexer call; returns ids [Tq, nkv, topk].
std::vector<std::int32_t> run_device_indexer(const DeviceIndexerFunction& fn,
                                             const spec::ModelConfig& config,
                                             const spec::IndexerParams& params,
                                             const spec::ReadBatch& batch,
                                             const spec::HostTensor& index_q,
                                             const spec::LayerCaches& caches);

/// Runs `fn` on one attention call; `selection` [Tq, nkv, topk] (empty: dense). Returns out.
spec::HostTensor run_device_attention(
    const DeviceAttentionFunction& fn, const spec::ModelConfig& config,
    const spec::AttentionParams& params, const spec::ReadBatch& batch, const spec::HostTensor& q,
    const spec::LayerCaches& caches, const std::vector<float>& k_scale,
    const std::vector<float>& v_scale, const std::vector<std::int32_t>& selection,
    std::int64_t topk);

// The same calls in host memory (CPU implementations; the Python package's NumPy functions): every
// tensor a host pointer with the same shapes and strides, the caches a copy of the guarded host
// buffers (guard bands in place around each body) brought back whole, no stream (null). Validation,
// poisoned outputs and the unchanged-caches rule of a read are the device runners' (one
// definition: call_runner.hpp). Built with or without CUDA.

void run_host_write(const DeviceWriteFunction& fn, const spec::ModelConfig& config,
                    const spec::LayerWrite& write, spec::LayerCaches& caches);
spec::HostTensor run_host_dense(const DeviceDenseFunction& fn, const spec::ModelConfig& config,
                                const spec::DenseInsert& in, spec::LayerCaches& caches);
std::vector<std::int32_t> run_host_indexer(const DeviceIndexerFunction& fn,
                                           const spec::ModelConfig& config,
                                           const spec::IndexerParams& params,
                                           const spec::ReadBatch& batch,
                                           const spec::HostTensor& index_q,
                                           const spec::LayerCaches& caches);
spec::HostTensor run_host_attention(const DeviceAttentionFunction& fn,
                                    const spec::ModelConfig& config,
                                    const spec::AttentionParams& params,
                                    const spec::ReadBatch& batch, const spec::HostTensor& q,
                                    const spec::LayerCaches& caches,
                                    const std::vector<float>& k_scale,
                                    const std::vector<float>& v_scale,
                                    const std::vector<std::int32_t>& selection, std::int64_t topk);

// The read calls over caches already on the device (a resident copy: kvo/gpu/resident.hpp's
// ResidentReplay::views), for the GPU tier's resident read path: the inputs validated on the host
// and staged, `fn` called once on `stream` (a cudaStream_t, the copy's), waited for, the answer
// brought back. The caches are neither copied nor checked here: the caller compares its copies on
// the device (a read must leave them unchanged).

/// `scores`: when non-null, the call's scores output is given (DeviceIndexerCall::scores,
/// poisoned) and brought back into it.
std::vector<std::int32_t> run_resident_indexer(const DeviceIndexerFunction& fn,
                                               const spec::ModelConfig& config,
                                               const spec::IndexerParams& params,
                                               const spec::ReadBatch& batch,
                                               const spec::HostTensor& index_q,
                                               const DeviceKvCaches& caches, void* stream,
                                               std::vector<float>* scores = nullptr);
spec::HostTensor run_resident_attention(
    const DeviceAttentionFunction& fn, const spec::ModelConfig& config,
    const spec::AttentionParams& params, const spec::ReadBatch& batch, const spec::HostTensor& q,
    const DeviceKvCaches& caches, const std::vector<float>& k_scale,
    const std::vector<float>& v_scale, const std::vector<std::int32_t>& selection,
    std::int64_t topk, void* stream);

/// The calling host thread's own non-blocking stream (a cudaStream_t; null built without CUDA):
/// the one its run_device_* calls and a ResidentReplay it builds launch on. A second host thread
/// reading a resident copy passes its own, so that its reads run beside the first thread's (it
/// must wait for the copy's writes first: ResidentReplay::synchronize).
void* calling_thread_stream();

}  // namespace kvo::gpu
