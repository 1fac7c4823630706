#pragma once
/// \file call_runner.hpp
/// The one definition of what a user's call of each op receives (kvo/gpu/device_calls.hpp), for
/// both memories it can live in: the runners below turn one of kvoracle's host cases into a call,
/// invoke the function once and bring the answer back, over a Stager that owns where the call's
/// tensors live (device memory: device_calls.cu; host memory: host_calls.cpp). A Stager has
///   DeviceTensor input(const spec::HostTensor&)                a copy of a host tensor
///   DeviceTensor input(const void*, ElementType, shape)        a copy of numel values
///   DeviceTensor output(ElementType, shape, std::uint8_t)      an output, every byte poisoned
///   void fetch(const DeviceTensor&, void* dst)                 an output's bytes back
///   DeviceKvCaches caches(config, const spec::LayerCaches&)    the guarded caches, as views
///   void download(spec::LayerCaches&)                          every cache byte back
///   void invoke(const std::function<void(const Call&)>&, Call&)
/// Every input is validated on the host before anything is staged (SPEC principle 5).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "call_inputs.hpp"
#include "kvo/gpu/device_calls.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::gpu::detail {

/// The poison byte of float outputs (0xFF...: a NaN in every float dtype).
inline constexpr std::uint8_t kOutputPoison = 0xFF;

inline ElementType slot_element(const spec::SlotMapping& m) {
  return m.type == spec::SlotType::kI64 ? ElementType::kI64 : ElementType::kI32;
}

inline void require_layer(const spec::LayerCaches& caches, spec::LayerKind kind, const char* op) {
  if (caches.kind != kind) {
    throw spec::InvalidInput(
        "caches.kind", -1, std::string(spec::name_of(caches.kind)),
        std::string(op) + " needs a " + std::string(spec::name_of(kind)) + " layer's caches");
  }
}

/// A read op must leave its caches as they were: spec::FailedToRun naming the first changed byte
/// (`after` is what the stager downloaded).
inline void require_caches_unchanged(const spec::LayerCaches& before,
                                     const spec::LayerCaches& after) {
  for (std::size_t i = 0; i < before.buffers.size(); ++i) {
    const spec::ByteStorage& was = before.buffers[i].storage;
    const spec::ByteStorage& now = after.buffers[i].storage;
    if (was.same_as(now)) continue;
    for (const auto& [from, to] : was.compare_ranges(now))
      for (std::int64_t j = from; j < to; ++j) {
        if (was.byte(j) != now.byte(j)) {
          throw spec::FailedToRun(
              "a read changed its caches: buffer " +
              std::string(spec::name_of(before.buffers[i].kind)) + " byte " +
              std::to_string(static_cast<std::int64_t>(j) - before.buffers[i].guard_bytes) +
              " of its body");
        }
      }
  }
}

template <class Stager>
DeviceTensor stage_slots(Stager& s, const spec::SlotMapping& m) {
  const std::vector<std::uint8_t> bytes = slot_storage(m);
  return s.input(bytes.data(), slot_element(m), {static_cast<std::int64_t>(m.slots.size())});
}

template <class Stager>
DeviceTensor stage_floats(Stager& s, const std::vector<float>& v, std::vector<std::int64_t> shape) {
  return s.input(v.data(), ElementType::kF32, std::move(shape));
}

template <class Stager>
DeviceTensor stage_scales(Stager& s, const std::vector<float>& v) {
  return stage_floats(s, v, {static_cast<std::int64_t>(v.size())});
}

/// The batch, its query rows derived on the host.
template <class Stager>
DeviceBatch stage_batch(Stager& s, const spec::ReadBatch& b, const QueryRows& rows) {
  DeviceBatch d;
  d.block_table =
      s.input(b.block_table.data(), ElementType::kI32, {b.num_requests(), b.max_blocks});
  d.seq_lens = s.input(b.seq_lens.data(), ElementType::kI64, {b.num_requests()});
  d.query_start_loc = s.input(b.query_start_loc.data(), ElementType::kI64, {b.num_requests() + 1});
  d.row_request = s.input(rows.request.data(), ElementType::kI64, {rows.size()});
  d.row_position = s.input(rows.position.data(), ElementType::kI64, {rows.size()});
  return d;
}

/// An output's bytes as a host tensor of `dtype`.
template <class Stager>
spec::HostTensor fetch_host(Stager& s, const DeviceTensor& t, spec::DType dtype) {
  spec::HostTensor out{dtype, t.shape, {}};
  out.bytes.resize(static_cast<std::size_t>(out.numel()) * spec::dtype_bytes(dtype));
  s.fetch(t, out.bytes.data());
  return out;
}

template <class Stager>
void run_write_call(Stager& s, const DeviceWriteFunction& fn, const spec::ModelConfig& c,
                    const spec::LayerWrite& w, spec::LayerCaches& caches) {
  spec::validate(c);
  spec::validate_write(c, w);
  require_layer(caches, w.kind, "the write");
  DeviceWriteCall call;
  call.config = &c;
  call.kind = w.kind;
  call.caches = s.caches(c, caches);
  call.k = s.input(w.k);
  call.v = s.input(w.v);
  call.slot_mapping = stage_slots(s, w.slots);
  if (w.kind == spec::LayerKind::kSparse) {
    call.index_k = s.input(w.index_k);
    if (c.separate_index_slots) call.index_slot_mapping = stage_slots(s, w.index_slots);
  }
  call.k_scale = stage_scales(s, w.k_scale);
  call.v_scale = stage_scales(s, w.v_scale);
  s.invoke(fn, call);
  s.download(caches);
}

template <class Stager>
spec::HostTensor run_dense_call(Stager& s, const DeviceDenseFunction& fn,
                                const spec::ModelConfig& c, const spec::DenseInsert& in,
                                spec::LayerCaches& caches) {
  spec::validate(c);
  spec::validate_dense_insert(c, in);
  require_layer(caches, spec::LayerKind::kDense, "the dense insert");
  const auto tokens = static_cast<std::int64_t>(in.kv.slots.slots.size());
  const std::int64_t nq = in.q.shape[1], hd = c.geometry.head_dim;
  DeviceDenseCall call;
  call.config = &c;
  call.caches = s.caches(c, caches);
  call.q = s.input(in.q);
  call.k = s.input(in.kv.k);
  call.v = s.input(in.kv.v);
  call.slot_mapping = stage_slots(s, in.kv.slots);
  call.k_scale = stage_scales(s, in.kv.k_scale);
  call.v_scale = stage_scales(s, in.kv.v_scale);
  call.q_norm_weight = stage_floats(s, in.q_norm_weight, {hd});
  call.k_norm_weight = stage_floats(s, in.k_norm_weight, {hd});
  const auto cos_sin_rows = static_cast<std::int64_t>(in.cos_sin.size()) / in.rotary_dim;
  call.cos_sin = stage_floats(s, in.cos_sin, {cos_sin_rows, in.rotary_dim});
  call.positions = s.input(in.positions.data(), ElementType::kI64, {tokens});
  call.eps = in.eps;
  call.rotary_dim = in.rotary_dim;
  call.fp8_store = in.fp8_store;
  call.q_out = s.output(element_type_of(c.act_dtype), {tokens, nq, hd}, kOutputPoison);
  s.invoke(fn, call);
  spec::HostTensor q_out = fetch_host(s, call.q_out, c.act_dtype);
  s.download(caches);
  return q_out;
}

/// The indexer call over `views` (caches staged already, or resident on the device): the inputs
/// staged, the ids poisoned, `fn` invoked once, the ids (and, when `scores` is non-null, the
/// scores output it was given) brought back. `rows`: check_indexer_inputs' answer.
template <class Stager>
std::vector<std::int32_t> indexer_call_answer(
    Stager& s, const DeviceIndexerFunction& fn, const spec::ModelConfig& c,
    const spec::IndexerParams& p, const spec::ReadBatch& b, const spec::HostTensor& index_q,
    const QueryRows& rows, const DeviceKvCaches& views, std::vector<float>* scores) {
  const std::int64_t nkv = c.geometry.num_kv_heads;
  DeviceIndexerCall call;
  call.config = &c;
  call.params = p;
  call.caches = views;
  call.index_q = s.input(index_q);
  call.batch = stage_batch(s, b, rows);
  call.batch.max_n_valid = rows.max_n_valid(b, p.sparse_block);
  const std::vector<std::int32_t> poison(
      static_cast<std::size_t>(rows.size() * nkv * spec::selection_width(p, nkv)), kIdPoison);
  call.ids =
      s.input(poison.data(), ElementType::kI32, {rows.size(), nkv, spec::selection_width(p, nkv)});
  if (scores != nullptr) {
    call.scores = s.output(
        ElementType::kF32,
        {rows.size(), nkv * spec::selection_lanes(p, nkv), call.batch.max_n_valid}, kOutputPoison);
  }
  s.invoke(fn, call);
  std::vector<std::int32_t> ids(poison.size());
  s.fetch(call.ids, ids.data());
  if (scores != nullptr) {
    scores->resize(static_cast<std::size_t>(call.scores.numel()));
    s.fetch(call.scores, scores->data());
  }
  return ids;
}

template <class Stager>
std::vector<std::int32_t> run_indexer_call(Stager& s, const DeviceIndexerFunction& fn,
                                           const spec::ModelConfig& c, const spec::IndexerParams& p,
                                           const spec::ReadBatch& b,
                                           const spec::HostTensor& index_q,
                                           const spec::LayerCaches& caches) {
  const QueryRows rows = check_indexer_inputs(c, p, b, index_q, caches.kind);
  std::vector<std::int32_t> ids =
      indexer_call_answer(s, fn, c, p, b, index_q, rows, s.caches(c, caches), nullptr);
  spec::LayerCaches after = caches;
  s.download(after);
  require_caches_unchanged(caches, after);
  return ids;
}

/// The attention call over `views` (as indexer_call_answer): out [Tq, nq, hd] in p.out_dtype.
template <class Stager>
spec::HostTensor attention_call_answer(Stager& s, const DeviceAttentionFunction& fn,
                                       const spec::ModelConfig& c, const spec::AttentionParams& p,
                                       const spec::ReadBatch& b, const spec::HostTensor& q,
                                       const QueryRows& rows, const DeviceKvCaches& views,
                                       const std::vector<float>& k_scale,
                                       const std::vector<float>& v_scale,
                                       const std::vector<std::int32_t>& selection,
                                       std::int64_t topk) {
  const std::int64_t tq = rows.size(), hd = c.geometry.head_dim;
  DeviceAttentionCall call;
  call.config = &c;
  call.params = p;
  call.caches = views;
  call.q = s.input(q);
  call.batch = stage_batch(s, b, rows);
  call.batch.max_n_valid = rows.max_n_valid(b, p.sparse_block);
  call.k_scale = stage_scales(s, k_scale);
  call.v_scale = stage_scales(s, v_scale);
  if (!selection.empty()) {
    call.selection =
        s.input(selection.data(), ElementType::kI32, {tq, c.geometry.num_kv_heads, topk});
  }
  call.out = s.output(element_type_of(p.out_dtype), {tq, p.num_q_heads, hd}, kOutputPoison);
  s.invoke(fn, call);
  return fetch_host(s, call.out, p.out_dtype);
}

template <class Stager>
spec::HostTensor run_attention_call(Stager& s, const DeviceAttentionFunction& fn,
                                    const spec::ModelConfig& c, const spec::AttentionParams& p,
                                    const spec::ReadBatch& b, const spec::HostTensor& q,
                                    const spec::LayerCaches& caches,
                                    const std::vector<float>& k_scale,
                                    const std::vector<float>& v_scale,
                                    const std::vector<std::int32_t>& selection, std::int64_t topk) {
  const QueryRows rows = check_attention_inputs(c, p, b, q, k_scale, v_scale, selection, topk);
  spec::HostTensor out = attention_call_answer(s, fn, c, p, b, q, rows, s.caches(c, caches),
                                               k_scale, v_scale, selection, topk);
  spec::LayerCaches after = caches;
  s.download(after);
  require_caches_unchanged(caches, after);
  return out;
}

}  // namespace kvo::gpu::detail
