// The pieces of case files the op drivers share (op_drivers.hpp): a write call's tensors, the
// check of a stored expected answer, a result's caches.
#include "op_drivers.hpp"

namespace kvo::oracle {

std::string layer_prefix(const char* part, std::size_t l) {
  return std::string(part) + ".layer." + std::to_string(l) + ".";
}

void put_layer_write(TensorWriter& out, const std::string& prefix, const spec::ModelConfig& config,
                     const spec::LayerWrite& w) {
  const bool sparse = w.kind == spec::LayerKind::kSparse;
  out.put_host(prefix + "k", w.k);
  out.put_host(prefix + "v", w.v);
  if (sparse) out.put_host(prefix + "index_k", w.index_k);
  out.put_slots(prefix + "slot_mapping", w.slots);
  if (sparse && config.separate_index_slots)
    out.put_slots(prefix + "index_slot_mapping", w.index_slots);
  out.put_f32(prefix + "k_scale", w.k_scale);
  out.put_f32(prefix + "v_scale", w.v_scale);
}

spec::LayerWrite take_layer_write(TensorReader& in, const std::string& prefix,
                                  const spec::ModelConfig& config, spec::LayerKind kind,
                                  std::int64_t rows, std::int64_t tokens) {
  const spec::CacheGeometry& g = config.geometry;
  const bool sparse = kind == spec::LayerKind::kSparse;
  const std::int64_t nscale = config.kv.per_head_scale ? g.num_kv_heads : 1;
  spec::LayerWrite w;
  w.kind = kind;
  w.k = in.take_host(prefix + "k", config.act_dtype, {rows, g.num_kv_heads, g.head_dim});
  w.v = in.take_host(prefix + "v", config.act_dtype, {rows, g.num_kv_heads, g.head_dim});
  if (sparse) w.index_k = in.take_host(prefix + "index_k", config.act_dtype, {rows, g.index_dim});
  w.slots = in.take_slots(prefix + "slot_mapping", config.slot_type, tokens);
  if (sparse && config.separate_index_slots)
    w.index_slots = in.take_slots(prefix + "index_slot_mapping", config.slot_type, tokens);
  w.k_scale = in.take_f32(prefix + "k_scale", nscale);
  w.v_scale = in.take_f32(prefix + "v_scale", nscale);
  validate_as(prefix, [&] { spec::validate_write(config, w); });
  return w;
}

std::map<std::string, std::vector<std::uint8_t>> tensors_by_name(const TensorSet& result) {
  std::map<std::string, std::vector<std::uint8_t>> out;
  for (const NamedTensor& t : result.tensors) out[t.name] = t.bytes;
  return out;
}

void check_expected(TensorReader& in, const std::string& name, TensorDType dtype,
                    const std::vector<std::int64_t>& shape,
                    const std::vector<std::uint8_t>& computed) {
  const std::string stored = "expected." + name;
  require_reference_answer(stored, element_size(dtype), in.take(stored, dtype, shape), computed);
}

void check_expected_caches(TensorReader& in, const std::string& prefix,
                           const spec::LayerCaches& computed) {
  for (const spec::CacheBuffer& b : computed.buffers) {
    check_expected(in, prefix + std::string(spec::name_of(b.kind)), TensorDType::kU8,
                   {b.storage.size()}, storage_bytes(b));
  }
}

void fill_caches(const std::map<std::string, std::vector<std::uint8_t>>& result,
                 const std::string& prefix, spec::LayerCaches& caches) {
  for (spec::CacheBuffer& b : caches.buffers)
    b.storage = spec::ByteStorage(result.at(prefix + std::string(spec::name_of(b.kind))));
}

}  // namespace kvo::oracle
