// The host glue every read launcher shares (read_launch.cuh): the kernels' geometry and batch
// views, and the limit check.
#include "read_launch.cuh"

#include <mutex>
#include <unordered_map>

#include "kvo/spec/outcome.hpp"

namespace kvo::gpu::detail {

void raise_smem_limit(const void* kernel, std::size_t bytes) {
  static std::mutex mu;
  static std::unordered_map<const void*, std::size_t> limit;  // per kernel, as set so far
  const std::lock_guard<std::mutex> lock(mu);
  std::size_t& now = limit[kernel];
  if (bytes <= now) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)),
             "cudaFuncSetAttribute");
  now = bytes;
}

ReadGeom make_geom(const spec::ModelConfig& c, std::int64_t max_blocks) {
  const KvStrides st = kv_strides(c);
  // The kernels offset V by kv_part in the one-tensor layouts (packed, split: V == K's pointer);
  // nhd and hnd views of one allocation hand V's own first element, as two separate tensors do.
  const std::int64_t v_from_k = spec::kv_in_one_tensor(c.layout) ? st.kv_part : 0;
  return {c.geometry.num_blocks,
          c.geometry.block_size,
          c.geometry.num_kv_heads,
          c.geometry.head_dim,
          c.geometry.index_dim,
          max_blocks,
          static_cast<int>(c.kv.cache_dtype),
          static_cast<int>(c.act_dtype),
          static_cast<int>(c.index.layout),
          static_cast<int>(c.index.flat_dtype),
          c.kv.scale_mode == spec::ScaleMode::kNone ? 1 : 0,
          c.kv.per_head_scale ? 1 : 0,
          st.block,
          st.token,
          st.head,
          v_from_k};
}

BatchView batch_view(const spec::ModelConfig& c, const DeviceReadBatch& b) {
  return {make_geom(c, b.max_blocks), b.block_table,
          reinterpret_cast<const long long*>(b.row_request),
          reinterpret_cast<const long long*>(b.row_position),
          reinterpret_cast<const long long*>(b.seq_lens)};
}

void require(bool ok, const std::string& what) {
  if (!ok) throw spec::Unsupported(what);
}

}  // namespace kvo::gpu::detail
