#pragma once
/// \file call_inputs.hpp
/// The host side of every call kvo_gpu makes or hands to a user, compiled with or without CUDA:
/// the layout strides and shapes of SPEC 3 as gpu computes them, slot mappings in their storage
/// type, a validated read batch's query rows, and the one validation of each read op's inputs
/// (shared by the built-in kernels' host paths, read_host.cu, and by users' calls in host or device
/// memory, call_runner.hpp).

#include <cstdint>
#include <vector>

#include "kvo/spec/config.hpp"
#include "kvo/spec/read.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::gpu::detail {

/// Element strides of a K/V cache view: element(b, o, h, kv, d) = offset + b*block + o*token +
/// h*head + kv*kv_part + d (kv_part 0 when K and V are separate tensors). The innermost dim is
/// contiguous.
struct KvStrides {
  std::int64_t block = 0, token = 0, head = 0, kv_part = 0, offset = 0;
};

/// The dense strides of `layout` for this geometry (elements).
KvStrides kv_strides(const spec::CacheGeometry& g, spec::KvLayout layout);
/// The strides of the configuration's K/V caches: its strided view (SPEC 3), else the dense ones.
KvStrides kv_strides(const spec::ModelConfig& c);

/// The K (or one KV) tensor's SPEC 3 shape for `layout`.
std::vector<std::int64_t> layout_shape(spec::KvLayout layout, const spec::CacheGeometry& g);

/// Throws spec::InvalidInput unless `caches` has exactly the buffers a layer of its kind has in
/// `config` (K and V or the one KV tensor; index-K on sparse layers) with the body sizes the config
/// implies, naming the buffer.
void require_buffers(const spec::ModelConfig& config, const spec::LayerCaches& caches);

/// The mapping's values in its storage type (int32 or int64), [T].
std::vector<std::uint8_t> slot_storage(const spec::SlotMapping& m);

/// A validated batch's query rows on the host (spec::validate_batch first).
struct QueryRows {
  std::vector<std::int64_t> request;   ///< [Tq] request of each query row
  std::vector<std::int64_t> position;  ///< [Tq] its position p

  QueryRows(const spec::ModelConfig& config, const spec::ReadBatch& batch);
  std::int64_t size() const { return static_cast<std::int64_t>(request.size()); }
  /// floor(p / sparse_block) + 1, or 0 for a padded request's row.
  std::int64_t n_valid(const spec::ReadBatch& batch, std::int64_t row,
                       std::int64_t sparse_block) const;
  /// The largest n_valid of any row, at least 1.
  std::int64_t max_n_valid(const spec::ReadBatch& batch, std::int64_t sparse_block) const;
};

/// Throws spec::InvalidInput unless `t` is `dtype` [rows, heads, dim] with its bytes.
void check_tensor(const spec::HostTensor& t, const char* field, spec::DType dtype,
                  std::int64_t rows, std::int64_t heads, std::int64_t dim);

/// Throws spec::InvalidInput unless `selection` is [Tq, nkv, topk] (topk >= 1) whose ids >= 0 are
/// distinct within their row (SPEC 6: negative ids and ids past n_valid select nothing).
void check_selection(const spec::ModelConfig& config, const QueryRows& rows,
                     const std::vector<std::int32_t>& selection, std::int64_t topk);

/// Validates an indexer call on the host (SPEC principle 5: before anything moves): the config,
/// the batch, the params, index_q [Tq, num_index_heads, index_dim] and the kind of the caches read
/// (a sparse layer's). Returns the query rows.
QueryRows check_indexer_inputs(const spec::ModelConfig& config, const spec::IndexerParams& params,
                               const spec::ReadBatch& batch, const spec::HostTensor& index_q,
                               spec::LayerKind caches);

/// Validates an attention call on the host: the config, the batch, the params, the scales, q
/// [Tq, nq, hd] and the selection when there is one (empty: dense). Returns the query rows.
QueryRows check_attention_inputs(const spec::ModelConfig& config,
                                 const spec::AttentionParams& params, const spec::ReadBatch& batch,
                                 const spec::HostTensor& q, const std::vector<float>& k_scale,
                                 const std::vector<float>& v_scale,
                                 const std::vector<std::int32_t>& selection, std::int64_t topk);

}  // namespace kvo::gpu::detail
