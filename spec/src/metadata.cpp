#include "kvo/spec/metadata.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>

namespace kvo::spec {

std::string metadata_field(std::string_view key) {
  return "__metadata__ '" + std::string(key) + "'";
}

std::optional<std::int64_t> parse_count(std::string_view text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  if (text.size() > 1 && text[0] == '0') return std::nullopt;
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 0) return std::nullopt;
  return v;
}

const std::string& MetadataReader::text(std::string_view key) {
  const auto it = m_.find(std::string(key));
  if (it == m_.end()) {
    throw InvalidInput(metadata_field(key), -1, "missing", "required configuration key");
  }
  read_.insert(it->first);
  return it->second;
}

std::int64_t MetadataReader::count(std::string_view key) {
  const std::string& v = text(key);
  const auto n = parse_count(v);
  if (!n) {
    throw InvalidInput(metadata_field(key), -1, "\"" + v + "\"",
                       "expected a non-negative decimal integer");
  }
  return *n;
}

bool MetadataReader::flag(std::string_view key) {
  const std::string& v = text(key);
  if (v == "true") return true;
  if (v == "false") return false;
  throw InvalidInput(metadata_field(key), -1, "\"" + v + "\"", "expected true or false");
}

std::vector<float> MetadataReader::floats(std::string_view key) {
  const std::string& v = text(key);
  std::vector<float> out;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = std::min(v.find(',', at), v.size());
    const std::string item = v.substr(at, comma - at);
    char* end = nullptr;
    errno = 0;
    const float x = item.empty() ? 0.0f : std::strtof(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size() || errno == ERANGE ||
        std::isspace(static_cast<unsigned char>(item[0]))) {
      throw InvalidInput(metadata_field(key), static_cast<std::int64_t>(out.size()),
                         "\"" + item + "\"", "expected comma-separated float32 values");
    }
    out.push_back(x);
    if (comma == v.size()) break;
    at = comma + 1;
    if (out.size() > 4096) break;
  }
  return out;
}

std::vector<std::string> MetadataReader::unread() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : m_) {
    if (!read_.count(k)) out.push_back(k);
  }
  return out;
}

void MetadataReader::require_all_read() const {
  const std::vector<std::string> rest = unread();
  if (!rest.empty()) {
    throw InvalidInput(metadata_field(rest.front()), -1, "\"" + m_.at(rest.front()) + "\"",
                       "unknown key");
  }
}

std::string floats_text(std::span<const float> values) {
  std::string out;
  for (float x : values) {
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", static_cast<double>(x));
    if (!out.empty()) out += ',';
    out += b;
  }
  return out;
}

void write_config(const ModelConfig& c, Metadata& m) {
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  m["layers"] = format_layer_mix(c.layers);
  m["num_blocks"] = std::to_string(c.geometry.num_blocks);
  m["block_size"] = std::to_string(c.geometry.block_size);
  m["num_kv_heads"] = std::to_string(c.geometry.num_kv_heads);
  m["head_dim"] = std::to_string(c.geometry.head_dim);
  m["index_dim"] = std::to_string(c.geometry.index_dim);
  m["act_dtype"] = name_of(c.act_dtype);
  m["kv_dtype"] = name_of(c.kv.cache_dtype);
  m["saturation"] = name_of(c.kv.saturation);
  m["scale_mode"] = name_of(c.kv.scale_mode);
  m["per_head_scale"] = b(c.kv.per_head_scale);
  m["via_model_dtype"] = b(c.kv.via_model_dtype);
  m["layout"] = name_of(c.layout);
  m["index_layout"] = name_of(c.index.layout);
  m["index_dtype"] = name_of(c.index.flat_dtype);
  m["ue8m0"] = b(c.index.ue8m0);
  if (c.kv.scale_in_model_dtype) m["scale_in_model_dtype"] = b(true);
  if (c.index.blockscale_scale != BlockScaleFormula::kDivide)
    m["blockscale_scale"] = name_of(c.index.blockscale_scale);
  m["slot_mode"] = name_of(c.slot_mode);
  m["slot_type"] = name_of(c.slot_type);
  m["separate_index_slots"] = b(c.separate_index_slots);
  if (!c.kv_strides.dense()) m["kv_strides"] = kv_strides_text(c.kv_strides);
  if (!c.index_strides.dense()) m["index_strides"] = index_strides_text(c.index_strides);
}

ModelConfig read_config(MetadataReader& r) {
  ModelConfig c;
  c.layers = parse_layer_mix(r.text("layers"));
  c.geometry.num_blocks = r.count("num_blocks");
  c.geometry.block_size = r.count("block_size");
  c.geometry.num_kv_heads = r.count("num_kv_heads");
  c.geometry.head_dim = r.count("head_dim");
  c.geometry.index_dim = r.count("index_dim");
  c.act_dtype = r.choice<DType>("act_dtype");
  c.kv.cache_dtype = r.choice<DType>("kv_dtype");
  c.kv.saturation = r.choice<Saturation>("saturation");
  c.kv.scale_mode = r.choice<ScaleMode>("scale_mode");
  c.kv.per_head_scale = r.flag("per_head_scale");
  c.kv.via_model_dtype = r.flag("via_model_dtype");
  c.layout = r.choice<KvLayout>("layout");
  c.index.layout = r.choice<IndexLayout>("index_layout");
  c.index.flat_dtype = r.choice<DType>("index_dtype");
  c.index.ue8m0 = r.flag("ue8m0");
  c.kv.scale_in_model_dtype = r.optional("scale_in_model_dtype", false, &MetadataReader::flag);
  c.index.blockscale_scale = r.optional_choice("blockscale_scale", BlockScaleFormula::kDivide);
  c.slot_mode = r.choice<SlotMode>("slot_mode");
  c.slot_type = r.choice<SlotType>("slot_type");
  c.separate_index_slots = r.flag("separate_index_slots");
  if (r.has("kv_strides"))
    c.kv_strides = parse_kv_strides(r.text("kv_strides"), metadata_field("kv_strides"));
  if (r.has("index_strides")) {
    c.index_strides = parse_index_strides(r.text("index_strides"), metadata_field("index_strides"));
  }
  validate(c);
  return c;
}

}  // namespace kvo::spec
