// Host entry points of the read side (kvo/gpu/read.hpp): validate on the host, copy the caches and
// inputs to the device, run a launcher (attention_kernels.cu, indexer_kernels.cu, or one of
// kvo_gpu_testing's with a planted bug), copy the result back. Every attention family shares one
// host path (attention_host_common).
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kvo/gpu/device_caches.hpp"
#include "kvo/gpu/read.hpp"
#include "kvo/gpu/write.hpp"
#include "kvo/spec/outcome.hpp"
#include "launch.cuh"
#include "read_launch.cuh"
#include "staging.cuh"

namespace kvo::gpu {
namespace {

using detail::check_cuda;
using detail::DeviceBuffer;
using detail::QueryRows;

/// A validated batch's query rows on the device.
struct DeviceRows {
  DeviceBuffer table, request, position, seq_lens;
  DeviceReadBatch view;

  DeviceRows(const spec::ReadBatch& b, const QueryRows& rows)
      : table(b.block_table),
        request(rows.request),
        position(rows.position),
        seq_lens(b.seq_lens),
        view{table.as<const std::int32_t>(),
             request.as<const std::int64_t>(),
             position.as<const std::int64_t>(),
             seq_lens.as<const std::int64_t>(),
             rows.size(),
             b.max_blocks} {}
};

/// The first K (or one KV) and V elements of a mirror's bodies (a strided view's offset in, SPEC
/// 3; V == K for the packed and split layouts, whose kernels offset V themselves; nhd / hnd as one
/// allocation: V kv_part elements after K, its own view).
const void* first_element(const DeviceCacheMirror& m, const spec::ModelConfig& c,
                          spec::BufferKind b) {
  return static_cast<const std::uint8_t*>(m.body(b)) +
         detail::kv_strides(c).offset *
             static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
}
const void* k_body(const DeviceCacheMirror& m, const spec::ModelConfig& c) {
  return first_element(m, c,
                       spec::kv_in_one_tensor(c) ? spec::BufferKind::kKv : spec::BufferKind::kK);
}
const void* v_body(const DeviceCacheMirror& m, const spec::ModelConfig& c) {
  if (spec::kv_in_one_tensor(c.layout)) return k_body(m, c);
  if (!spec::kv_in_one_tensor(c)) return first_element(m, c, spec::BufferKind::kV);
  return static_cast<const std::uint8_t*>(k_body(m, c)) +
         detail::kv_strides(c).kv_part *
             static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
}

}  // namespace

std::vector<std::int32_t> indexer_topk_host(const spec::ModelConfig& c,
                                            const spec::IndexerParams& p, const spec::ReadBatch& b,
                                            const spec::HostTensor& index_q,
                                            const spec::LayerCaches& caches, ReadKernel kernel,
                                            const spec::TopkForm& form, IndexerPath path,
                                            FusedShape shape) {
  return detail::indexer_topk_host_via(launch_indexer_topk, c, p, b, index_q, caches, kernel, form,
                                       path, nullptr, shape);
}

std::vector<std::int32_t> indexer_selection_host(const spec::ModelConfig& c,
                                                 const spec::IndexerParams& p,
                                                 const spec::ReadBatch& b,
                                                 const spec::HostTensor& index_q,
                                                 const spec::LayerCaches& caches, ReadKernel kernel,
                                                 BlockScores& scores) {
  return detail::indexer_topk_host_via(launch_indexer_topk, c, p, b, index_q, caches, kernel, {},
                                       IndexerPath::kTwoLaunch, &scores);
}

bool indexer_is_fused(const spec::ModelConfig& config, const spec::IndexerParams& params,
                      ReadKernel kernel, std::int64_t max_n_valid) {
  // The view's start: a 256-byte-aligned allocation plus the view's offset. The largest span, so
  // the most shared memory any device's launch asks.
  const long long start = spec::index_view(config).offset * spec::index_stride_bytes(config);
  return detail::fused_indexer_plan(config, params, kernel, 1, max_n_valid, 256 + start, 1,
                                    {0, detail::kMaxFusedSpan})
             .span > 0;
}

spec::HostTensor attention_host(const spec::ModelConfig& c, const spec::AttentionParams& p,
                                const spec::ReadBatch& b, const spec::HostTensor& q,
                                const spec::LayerCaches& caches, const std::vector<float>& k_scale,
                                const std::vector<float>& v_scale,
                                const std::vector<std::int32_t>& selection, std::int64_t topk,
                                ReadKernel kernel, AttentionPath path) {
  return detail::attention_host_via(
      path == AttentionPath::kGeneric ? launch_attention_generic : launch_attention, c, p, b, q,
      caches, k_scale, v_scale, selection, topk, kernel);
}

spec::HostTensor flash_attention_host(const spec::ModelConfig& c, const spec::AttentionParams& p,
                                      const spec::ReadBatch& b, const spec::HostTensor& q,
                                      const spec::LayerCaches& caches,
                                      const std::vector<float>& k_scale,
                                      const std::vector<float>& v_scale,
                                      const std::vector<std::int32_t>& selection,
                                      std::int64_t topk) {
  return detail::flash_attention_host_via(launch_flash_attention, c, p, b, q, caches, k_scale,
                                          v_scale, selection, topk);
}

std::vector<std::int32_t> detail::indexer_topk_host_via(
    IndexerLaunch launch, const spec::ModelConfig& c, const spec::IndexerParams& p,
    const spec::ReadBatch& b, const spec::HostTensor& index_q, const spec::LayerCaches& caches,
    ReadKernel kernel, const spec::TopkForm& form, IndexerPath path, BlockScores* scores,
    FusedShape shape) {
  const QueryRows rows = detail::check_indexer_inputs(c, p, b, index_q, caches.kind);
  const std::int64_t tq = rows.size();
  const std::int64_t max_nvalid = rows.max_n_valid(b, p.sparse_block);
  std::vector<std::int32_t> ids(
      static_cast<std::size_t>(tq * c.geometry.num_kv_heads *
                               spec::selection_width(p, c.geometry.num_kv_heads)),
      -1);
  // Checks the buffers; the indexer reads the index-K alone.
  const DeviceCacheMirror mirror(c, caches, nullptr, {spec::BufferKind::kIndexK});
  const std::size_t score_count =
      static_cast<std::size_t>(tq * c.geometry.num_kv_heads *
                               spec::selection_lanes(p, c.geometry.num_kv_heads) * max_nvalid);
  if (scores != nullptr) *scores = {std::vector<float>(score_count), max_nvalid};
  if (tq == 0) return ids;
  const DeviceRows d_rows(b, rows);
  const DeviceBuffer d_q(index_q.bytes), d_out(ids.size() * sizeof(std::int32_t));
  const DeviceBuffer d_scores(score_count * sizeof(float));
  // The one-launch path's counters (IndexerPath::kFused): zero before, and zero after
  // (checked: a row whose last CUDA block never selected would leave its counter behind).
  const DeviceBuffer d_done(static_cast<std::size_t>(tq) * sizeof(std::uint32_t));
  d_done.fill(0);
  launch(c, p, d_rows.view,
         {static_cast<const std::uint8_t*>(mirror.body(spec::BufferKind::kIndexK)) +
              spec::index_view(c).offset * spec::index_stride_bytes(c),
          d_q.data(), max_nvalid, d_scores.as<float>(), d_out.as<std::int32_t>(), form,
          path == IndexerPath::kTwoLaunch ? nullptr : d_done.as<std::uint32_t>(), shape},
         kernel, nullptr);
  check_cuda(cudaDeviceSynchronize(), "indexer");
  d_out.download(ids.data(), ids.size() * sizeof(std::int32_t));
  if (scores != nullptr) d_scores.download(scores->scores.data(), score_count * sizeof(float));
  std::vector<std::uint32_t> done(static_cast<std::size_t>(tq));
  d_done.download(done.data(), done.size() * sizeof(std::uint32_t));
  for (std::size_t i = 0; i < done.size(); ++i) {
    if (done[i] != 0) {
      throw std::runtime_error("indexer: row " + std::to_string(i) + "'s counter left at " +
                               std::to_string(done[i]) + " (must return to 0)");
    }
  }
  return ids;
}

namespace {

/// What a launch of an attention family gets: the query rows and the call's device buffers.
using RunAttention = std::function<void(const DeviceReadBatch&, const DeviceAttention&)>;

/// The host-memory attention path of every family: validates on the host, copies the caches and
/// inputs to the device, runs `run`, copies the output back. `workspace`: the family combines
/// per-chunk partial results (attention_workspace_floats); the flash family does not.
spec::HostTensor attention_host_common(const RunAttention& run, bool workspace,
                                       const spec::ModelConfig& c, const spec::AttentionParams& p,
                                       const spec::ReadBatch& b, const spec::HostTensor& q,
                                       const spec::LayerCaches& caches,
                                       const std::vector<float>& k_scale,
                                       const std::vector<float>& v_scale,
                                       const std::vector<std::int32_t>& selection,
                                       std::int64_t topk) {
  const QueryRows rows =
      detail::check_attention_inputs(c, p, b, q, k_scale, v_scale, selection, topk);
  const std::int64_t tq = rows.size(), hd = c.geometry.head_dim;
  const std::int64_t slots = selection.empty() ? rows.max_n_valid(b, p.sparse_block) : topk;
  // Checks the buffers; attention reads K and V alone.
  const DeviceCacheMirror mirror(
      c, caches, nullptr, {spec::BufferKind::kK, spec::BufferKind::kV, spec::BufferKind::kKv});
  spec::HostTensor out;
  out.dtype = p.out_dtype;
  out.shape = {tq, p.num_q_heads, hd};
  out.bytes.assign(static_cast<std::size_t>(out.numel()) * spec::dtype_bytes(p.out_dtype), 0);
  if (tq == 0) return out;
  const DeviceRows d_rows(b, rows);
  const DeviceBuffer d_q(q.bytes), d_out(out.bytes.size()), d_sel(selection);
  const DeviceBuffer d_ks(k_scale), d_vs(v_scale);
  const DeviceBuffer d_ws(
      workspace ? attention_workspace_floats(tq, p.num_q_heads, hd, slots) * sizeof(float) : 0);
  DeviceAttention a;
  a.k_cache = k_body(mirror, c);
  a.v_cache = v_body(mirror, c);
  a.q = d_q.data();
  a.k_scale = d_ks.as<const float>();
  a.v_scale = d_vs.as<const float>();
  a.selection = selection.empty() ? nullptr : d_sel.as<const std::int32_t>();
  a.topk = selection.empty() ? 0 : topk;
  a.slots = slots;
  a.workspace = d_ws.as<float>();
  a.out = d_out.data();
  run(d_rows.view, a);
  check_cuda(cudaDeviceSynchronize(), "attention");
  d_out.download(out.bytes.data(), out.bytes.size());
  return out;
}

}  // namespace

spec::HostTensor detail::attention_host_via(
    AttentionLaunch launch, const spec::ModelConfig& c, const spec::AttentionParams& p,
    const spec::ReadBatch& b, const spec::HostTensor& q, const spec::LayerCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk, ReadKernel kernel,
    int slots_per_block) {
  const RunAttention run = [&](const DeviceReadBatch& rows, const DeviceAttention& a) {
    DeviceAttention forced = a;
    forced.slots_per_block = slots_per_block;
    launch(c, p, rows, forced, kernel, nullptr);
  };
  return attention_host_common(run, true, c, p, b, q, caches, k_scale, v_scale, selection, topk);
}

spec::HostTensor detail::flash_attention_host_via(
    FlashLaunch launch, const spec::ModelConfig& c, const spec::AttentionParams& p,
    const spec::ReadBatch& b, const spec::HostTensor& q, const spec::LayerCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk, int slots_per_block) {
  const RunAttention run = [&](const DeviceReadBatch& rows, const DeviceAttention& a) {
    DeviceAttention forced = a;
    forced.slots_per_block = slots_per_block;
    launch(c, p, rows, forced, nullptr);
  };
  // The decode kernels' chunk results need the workspace; the one-block kernel has none.
  return attention_host_common(run, flash_is_decode(c, p), c, p, b, q, caches, k_scale, v_scale,
                               selection, topk);
}

namespace {

DeviceReadBatch read_batch(const DeviceBatch& b) {
  return {b.block_table.as<const std::int32_t>(),
          b.row_request.as<const std::int64_t>(),
          b.row_position.as<const std::int64_t>(),
          b.seq_lens.as<const std::int64_t>(),
          b.row_request.shape.at(0),
          b.block_table.shape.at(1)};
}

/// Device scratch of a call, allocated and freed on its stream (stream-ordered: the memory
/// returns to the pool once the call's kernels are done with it).
class StreamScratch {
 public:
  StreamScratch(std::size_t bytes, void* stream) : stream_(static_cast<cudaStream_t>(stream)) {
    if (bytes > 0) check_cuda(cudaMallocAsync(&p_, bytes, stream_), "cudaMallocAsync(scratch)");
  }
  ~StreamScratch() {
    if (p_ != nullptr) (void)cudaFreeAsync(p_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  float* floats() const { return static_cast<float*>(p_); }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace

DeviceIndexerFunction device_indexer_function(ReadKernel kernel) {
  return [kernel](const DeviceIndexerCall& call) {
    const spec::ModelConfig& c = *call.config;
    const std::int64_t tq = call.index_q.shape.at(0);
    if (tq == 0) return;
    const std::int64_t nkv = c.geometry.num_kv_heads;
    const std::int64_t n = call.batch.max_n_valid;
    const auto count =
        static_cast<std::size_t>(tq * nkv * spec::selection_lanes(call.params, nkv) * n);
    // The scores land in the call's output where it asks for them, else in scratch.
    const StreamScratch scratch(call.scores.present() ? 0 : count * sizeof(float), call.stream);
    float* scores = call.scores.present() ? call.scores.as<float>() : scratch.floats();
    launch_indexer_topk(c, call.params, read_batch(call.batch),
                        {call.caches.index_cache.data,
                         call.index_q.data,
                         n,
                         scores,
                         call.ids.as<std::int32_t>(),
                         {},
                         nullptr,
                         {}},
                        kernel, call.stream);
  };
}

DeviceAttentionFunction device_attention_function(ReadKernel kernel, AttentionPath path) {
  return [kernel, path](const DeviceAttentionCall& call) {
    const spec::ModelConfig& c = *call.config;
    const std::int64_t tq = call.q.shape.at(0);
    if (tq == 0) return;
    const bool sparse = call.selection.present();
    const std::int64_t slots = sparse ? call.selection.shape.at(2) : call.batch.max_n_valid;
    const StreamScratch ws(
        attention_workspace_floats(tq, call.params.num_q_heads, c.geometry.head_dim, slots) *
            sizeof(float),
        call.stream);
    DeviceAttention a;
    a.k_cache = call.caches.k_cache.data;
    a.v_cache = call.caches.v_cache.present() ? call.caches.v_cache.data : call.caches.k_cache.data;
    a.q = call.q.data;
    a.k_scale = call.k_scale.as<const float>();
    a.v_scale = call.v_scale.as<const float>();
    a.selection = sparse ? call.selection.as<const std::int32_t>() : nullptr;
    a.topk = sparse ? call.selection.shape.at(2) : 0;
    a.slots = slots;
    a.workspace = ws.floats();
    a.out = call.out.data;
    (path == AttentionPath::kGeneric ? launch_attention_generic : launch_attention)(
        c, call.params, read_batch(call.batch), a, kernel, call.stream);
  };
}

}  // namespace kvo::gpu
