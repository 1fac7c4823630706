// Users' device calls (kvo/gpu/device_calls.hpp): each runner validates a host case, stages it on
// the device (the caches in a DeviceCacheMirror, everything else in pooled buffers), calls the
// user's function once on the call stream, waits, and brings the caches and outputs back.
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kvo/gpu/device_calls.hpp"
#include "kvo/spec/outcome.hpp"
#include "launch.cuh"
#include "staging.cuh"

namespace kvo::gpu {
namespace {

using detail::DeviceBuffer;
using detail::poisoned_tensor;
using detail::upload_tensor;
using detail::upload_values;

/// The poison byte of float outputs (0xFF...: a NaN in every float dtype).
constexpr std::uint8_t kOutputPoison = 0xFF;

ElementType slot_element(const spec::SlotMapping& m) {
  return m.type == spec::SlotType::kI64 ? ElementType::kI64 : ElementType::kI32;
}

DeviceTensor upload_slots(std::vector<DeviceBuffer>& keep, const spec::SlotMapping& m) {
  const std::vector<std::uint8_t> bytes = detail::slot_storage(m);
  return upload_values(keep, bytes.data(), slot_element(m),
                       {static_cast<std::int64_t>(m.slots.size())});
}

DeviceTensor upload_floats(std::vector<DeviceBuffer>& keep, const std::vector<float>& v,
                           std::vector<std::int64_t> shape) {
  return upload_values(keep, v.data(), ElementType::kF32, std::move(shape));
}

DeviceTensor upload_scales(std::vector<DeviceBuffer>& keep, const std::vector<float>& s) {
  return upload_floats(keep, s, {static_cast<std::int64_t>(s.size())});
}

/// Calls `fn` once with `call` on the call stream, then waits for the stream and the device. If
/// `fn` throws, the device is drained first (the call's buffers return to the pool only after every
/// kernel it launched is done).
template <class Call>
void invoke(const std::function<void(const Call&)>& fn, Call& call) {
  call.stream = detail::call_stream();
  // The staging (copies, and the poison fills on the legacy default stream) must be done before a
  // kernel on the non-blocking call stream starts.
  detail::check_cuda(cudaDeviceSynchronize(), "staging the call");
  try {
    fn(call);
  } catch (...) {
    (void)cudaDeviceSynchronize();
    throw;
  }
  detail::check_cuda(cudaGetLastError(), "the subject's launch");
  detail::check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(call.stream)),
                     "the subject's kernels");
  detail::check_cuda(cudaDeviceSynchronize(), "the subject's kernels (device)");
}

/// A read op must leave its caches as they were: spec::FailedToRun naming the first changed byte.
void require_caches_unchanged(const DeviceCacheMirror& mirror, const spec::LayerCaches& caches) {
  spec::LayerCaches after = caches;
  mirror.download(after);
  for (std::size_t i = 0; i < caches.buffers.size(); ++i) {
    const std::vector<std::uint8_t>& was = caches.buffers[i].storage;
    const std::vector<std::uint8_t>& now = after.buffers[i].storage;
    for (std::size_t j = 0; j < was.size(); ++j) {
      if (was[j] != now[j]) {
        throw spec::FailedToRun(
            "a read changed its caches: buffer " +
            std::string(spec::name_of(caches.buffers[i].kind)) + " byte " +
            std::to_string(static_cast<std::int64_t>(j) - caches.buffers[i].guard_bytes) +
            " of its body");
      }
    }
  }
}

/// The batch on the device, rows derived on the host.
DeviceBatch upload_batch(std::vector<DeviceBuffer>& keep, const spec::ReadBatch& b,
                         const detail::QueryRows& rows) {
  DeviceBatch d;
  d.block_table = upload_values(keep, b.block_table.data(), ElementType::kI32,
                                {b.num_requests(), b.max_blocks});
  d.seq_lens = upload_values(keep, b.seq_lens.data(), ElementType::kI64, {b.num_requests()});
  d.query_start_loc =
      upload_values(keep, b.query_start_loc.data(), ElementType::kI64, {b.num_requests() + 1});
  d.row_request = upload_values(keep, rows.request.data(), ElementType::kI64, {rows.size()});
  d.row_position = upload_values(keep, rows.position.data(), ElementType::kI64, {rows.size()});
  return d;
}

void require_layer(const spec::LayerCaches& caches, spec::LayerKind kind, const char* op) {
  if (caches.kind != kind) {
    throw spec::InvalidInput(
        "caches.kind", -1, std::string(spec::name_of(caches.kind)),
        std::string(op) + " needs a " + std::string(spec::name_of(kind)) + " layer's caches");
  }
}

}  // namespace

void run_device_write(const DeviceWriteFunction& fn, const spec::ModelConfig& c,
                      const spec::LayerWrite& w, spec::LayerCaches& caches) {
  spec::validate(c);
  spec::validate_write(c, w);
  require_layer(caches, w.kind, "the write");
  const DeviceCacheMirror mirror(c, caches);
  std::vector<DeviceBuffer> keep;
  DeviceWriteCall call;
  call.config = &c;
  call.kind = w.kind;
  call.k = upload_tensor(keep, w.k);
  call.v = upload_tensor(keep, w.v);
  call.slot_mapping = upload_slots(keep, w.slots);
  if (w.kind == spec::LayerKind::kSparse) {
    call.index_k = upload_tensor(keep, w.index_k);
    if (c.separate_index_slots) call.index_slot_mapping = upload_slots(keep, w.index_slots);
  }
  call.k_scale = upload_scales(keep, w.k_scale);
  call.v_scale = upload_scales(keep, w.v_scale);
  call.caches = mirror.views();
  invoke(fn, call);
  mirror.download(caches);
}

spec::HostTensor run_device_dense(const DeviceDenseFunction& fn, const spec::ModelConfig& c,
                                  const spec::DenseInsert& in, spec::LayerCaches& caches) {
  spec::validate(c);
  spec::validate_dense_insert(c, in);
  require_layer(caches, spec::LayerKind::kDense, "the dense insert");
  const DeviceCacheMirror mirror(c, caches);
  const auto tokens = static_cast<std::int64_t>(in.kv.slots.slots.size());
  const std::int64_t nq = in.q.shape[1], hd = c.geometry.head_dim;
  std::vector<DeviceBuffer> keep;
  DeviceDenseCall call;
  call.config = &c;
  call.q = upload_tensor(keep, in.q);
  call.k = upload_tensor(keep, in.kv.k);
  call.v = upload_tensor(keep, in.kv.v);
  call.slot_mapping = upload_slots(keep, in.kv.slots);
  call.k_scale = upload_scales(keep, in.kv.k_scale);
  call.v_scale = upload_scales(keep, in.kv.v_scale);
  call.q_norm_weight = upload_floats(keep, in.q_norm_weight, {hd});
  call.k_norm_weight = upload_floats(keep, in.k_norm_weight, {hd});
  const auto cos_sin_rows = static_cast<std::int64_t>(in.cos_sin.size()) / in.rotary_dim;
  call.cos_sin = upload_floats(keep, in.cos_sin, {cos_sin_rows, in.rotary_dim});
  call.positions = upload_values(keep, in.positions.data(), ElementType::kI64, {tokens});
  call.eps = in.eps;
  call.rotary_dim = in.rotary_dim;
  call.q_out = poisoned_tensor(keep, element_type_of(c.act_dtype), {tokens, nq, hd}, kOutputPoison);
  call.caches = mirror.views();
  invoke(fn, call);
  spec::HostTensor q_out{c.act_dtype, {tokens, nq, hd}, {}};
  q_out.bytes.resize(static_cast<std::size_t>(q_out.numel()) * spec::dtype_bytes(c.act_dtype));
  keep.back().download(q_out.bytes.data(), q_out.bytes.size());
  mirror.download(caches);
  return q_out;
}

std::vector<std::int32_t> run_device_indexer(const DeviceIndexerFunction& fn,
                                             const spec::ModelConfig& c,
                                             const spec::IndexerParams& p, const spec::ReadBatch& b,
                                             const spec::HostTensor& index_q,
                                             const spec::LayerCaches& caches) {
  spec::validate(c);
  const detail::QueryRows rows(c, b);
  spec::validate_indexer(c, p);
  require_layer(caches, spec::LayerKind::kSparse, "the indexer");
  detail::check_tensor(index_q, "index_q", c.act_dtype, rows.size(), p.num_index_heads,
                       c.geometry.index_dim);
  const DeviceCacheMirror mirror(c, caches);
  std::vector<DeviceBuffer> keep;
  DeviceIndexerCall call;
  call.config = &c;
  call.params = p;
  call.index_q = upload_tensor(keep, index_q);
  call.batch = upload_batch(keep, b, rows);
  call.caches = mirror.views();
  std::vector<std::int32_t> ids(
      static_cast<std::size_t>(rows.size() * c.geometry.num_kv_heads * p.topk), kIdPoison);
  call.ids = upload_values(keep, ids.data(), ElementType::kI32,
                           {rows.size(), c.geometry.num_kv_heads, p.topk});
  invoke(fn, call);
  keep.back().download(ids.data(), ids.size() * sizeof(std::int32_t));
  require_caches_unchanged(mirror, caches);
  return ids;
}

spec::HostTensor run_device_attention(const DeviceAttentionFunction& fn, const spec::ModelConfig& c,
                                      const spec::AttentionParams& p, const spec::ReadBatch& b,
                                      const spec::HostTensor& q, const spec::LayerCaches& caches,
                                      const std::vector<float>& k_scale,
                                      const std::vector<float>& v_scale,
                                      const std::vector<std::int32_t>& selection,
                                      std::int64_t topk) {
  spec::validate(c);
  const detail::QueryRows rows(c, b);
  spec::validate_attention(c, p);
  spec::validate_scales(c, k_scale, "k_scale");
  spec::validate_scales(c, v_scale, "v_scale");
  const std::int64_t tq = rows.size(), hd = c.geometry.head_dim;
  detail::check_tensor(q, "q", c.act_dtype, tq, p.num_q_heads, hd);
  if (!selection.empty()) detail::check_selection(c, p, b, rows, selection, topk);
  const DeviceCacheMirror mirror(c, caches);
  std::vector<DeviceBuffer> keep;
  DeviceAttentionCall call;
  call.config = &c;
  call.params = p;
  call.q = upload_tensor(keep, q);
  call.batch = upload_batch(keep, b, rows);
  call.caches = mirror.views();
  call.k_scale = upload_scales(keep, k_scale);
  call.v_scale = upload_scales(keep, v_scale);
  if (!selection.empty()) {
    call.selection = upload_values(keep, selection.data(), ElementType::kI32,
                                   {tq, c.geometry.num_kv_heads, topk});
  }
  call.out =
      poisoned_tensor(keep, element_type_of(p.out_dtype), {tq, p.num_q_heads, hd}, kOutputPoison);
  invoke(fn, call);
  spec::HostTensor out{p.out_dtype, {tq, p.num_q_heads, hd}, {}};
  out.bytes.resize(static_cast<std::size_t>(out.numel()) * spec::dtype_bytes(p.out_dtype));
  keep.back().download(out.bytes.data(), out.bytes.size());
  require_caches_unchanged(mirror, caches);
  return out;
}

}  // namespace kvo::gpu
