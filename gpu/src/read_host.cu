// Host entry points of the read side (kvo/gpu/read.hpp): validate on the host, copy the caches and
// inputs to the device, run a launcher (attention_kernels.cu, indexer_kernels.cu, or one of
// kvo_gpu_testing's with a planted bug), copy the result back. Every attention family shares one
// host path (attention_host_common).
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kvo/gpu/read.hpp"
#include "kvo/gpu/write.hpp"
#include "kvo/spec/outcome.hpp"
#include "launch.cuh"
#include "read_launch.cuh"

namespace kvo::gpu {
namespace {

using detail::check_cuda;

/// A device copy of a host vector, freed on scope exit.
template <class T>
struct Dev {
  T* ptr = nullptr;
  Dev() = default;
  explicit Dev(std::size_t n) {
    if (n) check_cuda(cudaMalloc(&ptr, n * sizeof(T)), "cudaMalloc");
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) {
    if (!v.empty())
      check_cuda(cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
                 "cudaMemcpy");
  }
  Dev(Dev&& o) noexcept : ptr(o.ptr) { o.ptr = nullptr; }
  Dev& operator=(Dev&& o) noexcept {
    std::swap(ptr, o.ptr);
    return *this;
  }
  ~Dev() {
    if (ptr) cudaFree(ptr);
  }
};

const spec::CacheBuffer& buffer(const spec::LayerCaches& c, spec::BufferKind k) {
  const spec::CacheBuffer* b = c.find(k);
  if (b == nullptr)
    throw spec::InvalidInput("caches", -1, std::string(spec::name_of(k)),
                             "the layer has no such buffer");
  return *b;
}

/// The body of a cache buffer (guards stripped), checked against the size the config implies.
std::vector<unsigned char> body(const spec::CacheBuffer& b, std::int64_t expected,
                                const char* name) {
  if (b.body_bytes() != expected)
    throw spec::InvalidInput("caches", -1, name,
                             "wrong buffer size: expected " + std::to_string(expected) + " bytes");
  return {b.storage.begin() + b.guard_bytes, b.storage.begin() + b.guard_bytes + b.body_bytes()};
}

void check_tensor(const spec::HostTensor& t, const char* field, spec::DType dt, std::int64_t rows,
                  std::int64_t heads, std::int64_t dim) {
  if (t.dtype != dt || t.shape != std::vector<std::int64_t>{rows, heads, dim} ||
      static_cast<std::int64_t>(t.bytes.size()) !=
          rows * heads * dim * static_cast<std::int64_t>(spec::dtype_bytes(dt))) {
    throw spec::InvalidInput(field, -1, "tensor",
                             "expected " + std::string(spec::name_of(dt)) + " [" +
                                 std::to_string(rows) + ", " + std::to_string(heads) + ", " +
                                 std::to_string(dim) + "]");
  }
}

/// A validated batch's query rows (request, position) on the host and on the device.
struct Rows {
  std::vector<long long> req, pos;
  Dev<int> table;
  Dev<long long> d_req, d_pos, d_seq;
  DeviceReadBatch dev;

  Rows(const spec::ModelConfig& c, const spec::ReadBatch& b) {
    spec::validate_batch(c, b);
    for (std::int64_t r = 0; r < b.num_requests(); ++r) {
      const std::int64_t q_len = b.query_start_loc[static_cast<std::size_t>(r + 1)] -
                                 b.query_start_loc[static_cast<std::size_t>(r)];
      for (std::int64_t j = 0; j < q_len; ++j) {
        req.push_back(r);
        pos.push_back(b.seq_lens[static_cast<std::size_t>(r)] - q_len + j);
      }
    }
  }
  /// Copies to the device (after every host-side check has passed).
  void upload(const spec::ReadBatch& b) {
    // Unused table entries (-1) are never read: validate_batch checked the ones a request reads.
    table = Dev<int>(b.block_table);
    d_req = Dev<long long>(req);
    d_pos = Dev<long long>(pos);
    d_seq = Dev<long long>(std::vector<long long>(b.seq_lens.begin(), b.seq_lens.end()));
    dev = {table.ptr,
           reinterpret_cast<const std::int64_t*>(d_req.ptr),
           reinterpret_cast<const std::int64_t*>(d_pos.ptr),
           reinterpret_cast<const std::int64_t*>(d_seq.ptr),
           static_cast<std::int64_t>(req.size()),
           b.max_blocks};
  }
  std::int64_t n_valid(const spec::ReadBatch& b, std::size_t row, std::int64_t sb) const {
    return b.seq_lens[static_cast<std::size_t>(req[row])] == 0 ? 0 : pos[row] / sb + 1;
  }
};

}  // namespace

std::vector<std::int32_t> indexer_topk_host(const spec::ModelConfig& c,
                                            const spec::IndexerParams& p, const spec::ReadBatch& b,
                                            const spec::HostTensor& index_q,
                                            const spec::LayerCaches& caches, ReadKernel kernel) {
  return detail::indexer_topk_host_via(launch_indexer_topk, c, p, b, index_q, caches, kernel);
}

spec::HostTensor attention_host(const spec::ModelConfig& c, const spec::AttentionParams& p,
                                const spec::ReadBatch& b, const spec::HostTensor& q,
                                const spec::LayerCaches& caches, const std::vector<float>& k_scale,
                                const std::vector<float>& v_scale,
                                const std::vector<std::int32_t>& selection, std::int64_t topk,
                                ReadKernel kernel) {
  return detail::attention_host_via(launch_attention, c, p, b, q, caches, k_scale, v_scale,
                                    selection, topk, kernel);
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
    ReadKernel kernel) {
  Rows rows(c, b);
  spec::validate_indexer(c, p);
  const auto tq = static_cast<std::int64_t>(rows.req.size());
  check_tensor(index_q, "index_q", c.act_dtype, tq, p.num_index_heads, c.geometry.index_dim);
  const std::vector<unsigned char> cache =
      body(buffer(caches, spec::BufferKind::kIndexK), index_buffer_bytes(c), "index_k");
  std::int64_t max_nvalid = 1;
  for (std::size_t i = 0; i < rows.req.size(); ++i)
    max_nvalid = std::max(max_nvalid, rows.n_valid(b, i, p.sparse_block));
  std::vector<std::int32_t> ids(static_cast<std::size_t>(tq * c.geometry.num_kv_heads * p.topk),
                                -1);
  if (tq == 0) return ids;
  rows.upload(b);
  Dev<unsigned char> d_cache(cache), d_q(index_q.bytes);
  Dev<std::int32_t> d_out(ids.size());
  Dev<float> d_scores(static_cast<std::size_t>(tq * c.geometry.num_kv_heads * max_nvalid));
  launch(c, p, rows.dev, {d_cache.ptr, d_q.ptr, max_nvalid, d_scores.ptr, d_out.ptr}, kernel,
         nullptr);
  check_cuda(cudaMemcpy(ids.data(), d_out.ptr, ids.size() * sizeof(int), cudaMemcpyDeviceToHost),
             "indexer");
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
  Rows rows(c, b);
  spec::validate_attention(c, p);
  spec::validate_scales(c, k_scale, "k_scale");
  spec::validate_scales(c, v_scale, "v_scale");
  const auto tq = static_cast<std::int64_t>(rows.req.size());
  const std::int64_t nkv = c.geometry.num_kv_heads, hd = c.geometry.head_dim;
  check_tensor(q, "q", c.act_dtype, tq, p.num_q_heads, hd);
  std::int64_t slots = 1;
  if (!selection.empty()) {
    if (topk < 1 || static_cast<std::int64_t>(selection.size()) != tq * nkv * topk) {
      throw spec::InvalidInput(
          "selection", -1, std::to_string(selection.size()) + " ids",
          "expected [" + std::to_string(tq) + ", " + std::to_string(nkv) + ", topk]");
    }
    slots = topk;
    for (std::int64_t qi = 0; qi < tq; ++qi) {
      const std::int64_t n_valid = rows.n_valid(b, static_cast<std::size_t>(qi), p.sparse_block);
      for (std::int64_t g = 0; g < nkv; ++g) {
        const std::int32_t* row = &selection[static_cast<std::size_t>((qi * nkv + g) * topk)];
        for (std::int64_t k = 0; k < topk; ++k) {
          const std::int32_t id = row[k];
          const bool dup = id >= 0 && std::find(row, row + k, id) != row + k;
          if (id >= 0 && (id >= n_valid || dup)) {
            throw spec::InvalidInput(
                "selection", (qi * nkv + g) * topk + k, std::to_string(id),
                "a duplicate or a block past n_valid = " + std::to_string(n_valid));
          }
        }
      }
    }
  } else {
    for (std::size_t i = 0; i < rows.req.size(); ++i)
      slots = std::max(slots, rows.n_valid(b, i, p.sparse_block));
  }
  const bool one_tensor = spec::kv_in_one_tensor(c.layout);
  const std::vector<unsigned char> k_body =
      body(buffer(caches, one_tensor ? spec::BufferKind::kKv : spec::BufferKind::kK),
           kv_buffer_bytes(c), "k");
  const std::vector<unsigned char> v_body =
      one_tensor ? std::vector<unsigned char>{}
                 : body(buffer(caches, spec::BufferKind::kV), kv_buffer_bytes(c), "v");
  spec::HostTensor out;
  out.dtype = p.out_dtype;
  out.shape = {tq, p.num_q_heads, hd};
  out.bytes.assign(static_cast<std::size_t>(out.numel()) * spec::dtype_bytes(p.out_dtype), 0);
  if (tq == 0) return out;
  rows.upload(b);
  Dev<unsigned char> d_k(k_body), d_v(v_body), d_q(q.bytes), d_out(out.bytes.size());
  Dev<std::int32_t> d_sel(selection);
  Dev<float> d_ks(k_scale), d_vs(v_scale);
  Dev<float> d_ws(workspace ? attention_workspace_floats(tq, p.num_q_heads, hd, slots) : 0);
  DeviceAttention a;
  a.k_cache = d_k.ptr;
  a.v_cache = one_tensor ? d_k.ptr : d_v.ptr;
  a.q = d_q.ptr;
  a.k_scale = d_ks.ptr;
  a.v_scale = d_vs.ptr;
  a.selection = selection.empty() ? nullptr : d_sel.ptr;
  a.topk = selection.empty() ? 0 : topk;
  a.slots = slots;
  a.workspace = d_ws.ptr;
  a.out = d_out.ptr;
  run(rows.dev, a);
  check_cuda(cudaMemcpy(out.bytes.data(), d_out.ptr, out.bytes.size(), cudaMemcpyDeviceToHost),
             "attention");
  return out;
}

}  // namespace

spec::HostTensor detail::attention_host_via(
    AttentionLaunch launch, const spec::ModelConfig& c, const spec::AttentionParams& p,
    const spec::ReadBatch& b, const spec::HostTensor& q, const spec::LayerCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk, ReadKernel kernel) {
  const RunAttention run = [&](const DeviceReadBatch& rows, const DeviceAttention& a) {
    launch(c, p, rows, a, kernel, nullptr);
  };
  return attention_host_common(run, true, c, p, b, q, caches, k_scale, v_scale, selection, topk);
}

spec::HostTensor detail::flash_attention_host_via(
    FlashLaunch launch, const spec::ModelConfig& c, const spec::AttentionParams& p,
    const spec::ReadBatch& b, const spec::HostTensor& q, const spec::LayerCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk) {
  const RunAttention run = [&](const DeviceReadBatch& rows, const DeviceAttention& a) {
    launch(c, p, rows, a, nullptr);
  };
  return attention_host_common(run, false, c, p, b, q, caches, k_scale, v_scale, selection, topk);
}

}  // namespace kvo::gpu
