#include "kvo/traces/trace.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "kvo/spec/metadata.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/traces/safetensors.hpp"

namespace kvo::traces {
namespace {

static_assert(std::endian::native == std::endian::little,
              "trace tensors are little-endian and read with memcpy");

/// Longest sequence a trace may describe; positions stay far from any overflow.
constexpr std::int64_t kMaxSeqLen = std::int64_t{1} << 40;

/// The tensors of one step, as named in the file.
enum class Part : std::uint8_t {
  kSlotMapping,
  kIndexSlotMapping,
  kBlockTable,
  kSeqLens,
  kQueryStartLoc,
  kQueryLens,
  kRequestIds,
  kTopkIds,
};
constexpr std::array<std::string_view, 8> kPartNames{
    "slot_mapping",    "index_slot_mapping", "block_table", "seq_lens",
    "query_start_loc", "query_lens",         "request_ids", "topk_ids"};

std::string tensor_name(std::int64_t step, Part p) {
  return "step." + std::to_string(step) + "." +
         std::string(kPartNames[static_cast<std::size_t>(p)]);
}

std::string field_of(std::int64_t step, Part p) { return "tensor '" + tensor_name(step, p) + "'"; }

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Largest head count, top-k or block count read from metadata: far beyond any model, small
/// enough that a hostile file cannot make read replay allocate without bound.
constexpr std::int64_t kMaxReadParam = std::int64_t{1} << 20;

/// The optional read-side keys; absent ones keep the TraceReadParams defaults.
TraceReadParams parse_read_params(spec::MetadataReader& m) {
  TraceReadParams r;
  const auto bounded = [&](const char* key, std::int64_t fallback) {
    const std::int64_t v = m.optional(key, fallback, &spec::MetadataReader::count);
    if (v > kMaxReadParam) {
      throw spec::InvalidInput(std::string("__metadata__ '") + key + "'", -1, std::to_string(v),
                               "expected at most " + std::to_string(kMaxReadParam));
    }
    return v;
  };
  r.num_index_heads = bounded("num_index_heads", r.num_index_heads);
  r.num_q_heads = bounded("num_q_heads", r.num_q_heads);
  r.sparse_block = bounded("sparse_block", r.sparse_block);
  r.topk = bounded("topk", r.topk);
  r.init_blocks = bounded("init_blocks", r.init_blocks);
  r.local_blocks = bounded("local_blocks", r.local_blocks);
  const std::vector<float> sm =
      m.optional("sm_scale", std::vector<float>{r.sm_scale}, &spec::MetadataReader::floats);
  if (sm.size() != 1) {
    throw spec::InvalidInput("__metadata__ 'sm_scale'", -1, m.text("sm_scale"),
                             "expected one float32 (0: the default)");
  }
  r.sm_scale = sm.front();
  r.out_dtype = m.optional_choice("out_dtype", r.out_dtype);
  for_each_read_mode(
      [&](const char* key, auto member) { r.*member = m.optional_choice(key, r.*member); });
  r.dense_rotary_dim = bounded("dense_rotary_dim", r.dense_rotary_dim);
  if (r.dense_rotary_dim < 0 || r.dense_rotary_dim % 2 != 0) {
    throw spec::InvalidInput("__metadata__ 'dense_rotary_dim'", -1,
                             std::to_string(r.dense_rotary_dim),
                             "expected 0 (plain dense writes) or an even rotary dim");
  }
  return r;
}

/// The smallest multiple of nkv that is at least `spec_default`.
std::int64_t default_heads(std::int64_t requested, std::int64_t spec_default, std::int64_t nkv) {
  if (requested != 0 || nkv < 1) return requested;
  return (spec_default + nkv - 1) / nkv * nkv;
}

IntTensor decode_int(const StTensor& t) {
  IntTensor out;
  out.shape = t.shape;
  const std::size_t eb = t.dtype == StDType::kI32 ? 4 : 8;
  out.type = t.dtype == StDType::kI32 ? spec::SlotType::kI32 : spec::SlotType::kI64;
  const std::size_t n = t.bytes.size() / eb;
  out.values.resize(n);
  if (eb == 8) {
    if (n) std::memcpy(out.values.data(), t.bytes.data(), n * 8);
  } else {
    const std::uint8_t* p = t.bytes.data();
    for (std::size_t i = 0; i < n; ++i) {
      std::int32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      out.values[i] = v;
    }
  }
  return out;
}

StTensorOut encode_int(std::string name, const IntTensor& t) {
  StTensorOut out;
  out.name = std::move(name);
  out.shape = t.shape;
  out.dtype = t.type == spec::SlotType::kI32 ? StDType::kI32 : StDType::kI64;
  const std::size_t n = t.values.size();
  if (t.type == spec::SlotType::kI64) {
    out.bytes.resize(n * 8);
    if (n) std::memcpy(out.bytes.data(), t.values.data(), n * 8);
  } else {
    out.bytes.resize(n * 4);
    for (std::size_t i = 0; i < n; ++i) {
      const auto v = static_cast<std::int32_t>(t.values[i]);
      std::memcpy(out.bytes.data() + 4 * i, &v, 4);
    }
  }
  return out;
}

void expect_rank(const IntTensor& t, std::size_t rank, std::int64_t step, Part p) {
  if (t.shape.size() != rank) {
    throw spec::InvalidInput(field_of(step, p) + " shape", -1, shape_text(t.shape),
                             "expected " + std::to_string(rank) + " dimension(s)");
  }
}

void expect_shape(const IntTensor& t, const std::vector<std::int64_t>& shape, std::int64_t step,
                  Part p, const std::string& why) {
  if (t.shape != shape) {
    throw spec::InvalidInput(field_of(step, p) + " shape", -1, shape_text(t.shape),
                             "expected " + shape_text(shape) + " (" + why + ")");
  }
}

/// The step's structure: shapes agree on B and T, query ranges tile a prefix of the slot
/// mapping, every request's tokens fit its sequence and its block-table row.
void check_step(const spec::ModelConfig& c, std::int64_t s, const TraceStep& st) {
  expect_rank(st.slot_mapping, 1, s, Part::kSlotMapping);
  const std::int64_t tokens = st.slot_mapping.dim(0);
  if (st.slot_mapping.type != c.slot_type) {
    throw spec::InvalidInput(field_of(s, Part::kSlotMapping) + " dtype", -1,
                             st.slot_mapping.type == spec::SlotType::kI32 ? "I32" : "I64",
                             "expected the model's slot type " +
                                 std::string(spec::name_of(c.slot_type)) +
                                 " (__metadata__ "
                                 "'slot_type')");
  }
  if (c.separate_index_slots != st.index_slot_mapping.has_value()) {
    throw spec::InvalidInput(
        field_of(s, Part::kIndexSlotMapping), -1, st.index_slot_mapping ? "present" : "missing",
        std::string("expected ") + (c.separate_index_slots ? "present" : "absent") +
            " (__metadata__ 'separate_index_slots' = " +
            (c.separate_index_slots ? "true" : "false") + ")");
  }
  if (st.index_slot_mapping) {
    expect_shape(*st.index_slot_mapping, {tokens}, s, Part::kIndexSlotMapping,
                 "one per slot_mapping entry");
    if (st.index_slot_mapping->type != c.slot_type) {
      throw spec::InvalidInput(
          field_of(s, Part::kIndexSlotMapping) + " dtype", -1,
          st.index_slot_mapping->type == spec::SlotType::kI32 ? "I32" : "I64",
          "expected the model's slot type " + std::string(spec::name_of(c.slot_type)));
    }
  }
  expect_rank(st.block_table, 2, s, Part::kBlockTable);
  const std::int64_t batch = st.block_table.dim(0);
  const std::int64_t max_blocks = st.block_table.dim(1);
  expect_shape(st.seq_lens, {batch}, s, Part::kSeqLens, "one per block_table row");
  if (st.query_start_loc.has_value() == st.query_lens.has_value()) {
    throw spec::InvalidInput(field_of(s, Part::kQueryStartLoc), -1,
                             st.query_start_loc ? "present with query_lens" : "missing",
                             "expected exactly one of step." + std::to_string(s) +
                                 ".query_start_loc [B+1] and step." + std::to_string(s) +
                                 ".query_lens [B]");
  }
  if (st.query_start_loc) {
    expect_shape(*st.query_start_loc, {batch + 1}, s, Part::kQueryStartLoc, "B + 1");
    const auto& q = st.query_start_loc->values;
    if (q[0] != 0) {
      throw spec::InvalidInput(field_of(s, Part::kQueryStartLoc), 0, std::to_string(q[0]),
                               "expected 0");
    }
    for (std::int64_t b = 0; b < batch; ++b) {
      const auto i = static_cast<std::size_t>(b);
      if (q[i + 1] <= q[i]) {
        throw spec::InvalidInput(field_of(s, Part::kQueryStartLoc), b + 1, std::to_string(q[i + 1]),
                                 "expected > the previous entry " + std::to_string(q[i]) +
                                     " (every request writes at least one token)");
      }
    }
  } else {
    expect_shape(*st.query_lens, {batch}, s, Part::kQueryLens, "one per block_table row");
  }
  if (st.request_ids) {
    expect_shape(*st.request_ids, {batch}, s, Part::kRequestIds, "one per block_table row");
    std::unordered_set<std::int64_t> seen;
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t id = st.request_ids->values[static_cast<std::size_t>(b)];
      if (id < 0) {
        throw spec::InvalidInput(field_of(s, Part::kRequestIds), b, std::to_string(id),
                                 "expected a non-negative request id");
      }
      if (!seen.insert(id).second) {
        throw spec::InvalidInput(field_of(s, Part::kRequestIds), b, std::to_string(id),
                                 "request id repeats within the step");
      }
    }
  }
  if (st.topk_ids) {
    expect_rank(*st.topk_ids, 2, s, Part::kTopkIds);
    if (st.topk_ids->dim(0) != tokens) {
      throw spec::InvalidInput(field_of(s, Part::kTopkIds) + " shape", -1,
                               shape_text(st.topk_ids->shape),
                               "expected [" + std::to_string(tokens) + ", k] (one row per token)");
    }
  }
  // Per request: q_len in [1, seq_len], seq_len within the row's blocks, tokens within T.
  std::int64_t end = 0;
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto i = static_cast<std::size_t>(b);
    const std::int64_t q_len =
        st.query_lens ? st.query_lens->values[i]
                      : st.query_start_loc->values[i + 1] - st.query_start_loc->values[i];
    if (q_len < 1) {
      throw spec::InvalidInput(field_of(s, Part::kQueryLens), b, std::to_string(q_len),
                               "expected >= 1 (every request writes at least one token)");
    }
    const std::int64_t seq = st.seq_lens.values[i];
    if (seq < q_len || seq > kMaxSeqLen) {
      throw spec::InvalidInput(field_of(s, Part::kSeqLens), b, std::to_string(seq),
                               "expected in [query length " + std::to_string(q_len) + ", 2^40]");
    }
    const std::int64_t bs = c.geometry.block_size;
    const std::int64_t blocks = seq / bs + (seq % bs != 0 ? 1 : 0);
    if (blocks > max_blocks) {
      throw spec::InvalidInput(field_of(s, Part::kSeqLens), b, std::to_string(seq),
                               "needs " + std::to_string(blocks) + " blocks of " +
                                   std::to_string(bs) + " but step." + std::to_string(s) +
                                   ".block_table has " + std::to_string(max_blocks) + " columns");
    }
    if (q_len > tokens - end) {
      throw spec::InvalidInput(
          field_of(s, st.query_lens ? Part::kQueryLens : Part::kQueryStartLoc), b,
          std::to_string(q_len),
          "the step's tokens run past the slot mapping's " + std::to_string(tokens) + " entries");
    }
    end += q_len;
  }
}

}  // namespace

std::vector<std::int64_t> TraceStep::starts() const {
  if (query_start_loc) return query_start_loc->values;
  std::vector<std::int64_t> out{0};
  for (std::int64_t q : query_lens->values) out.push_back(out.back() + q);
  return out;
}

std::map<std::string, std::string> trace_metadata(const Trace& t) {
  std::map<std::string, std::string> m = t.extra;
  m["format"] = std::string(kTraceFormat);
  m["engine"] = t.engine;
  m["engine_version"] = t.engine_version;
  m["num_steps"] = std::to_string(t.steps.size());
  spec::write_config(t.config, m);
  m["k_scale"] = spec::floats_text(t.k_scale);
  m["v_scale"] = spec::floats_text(t.v_scale);
  const spec::IndexerParams ip = indexer_params(t);
  const spec::AttentionParams ap = attention_params(t);
  m["num_index_heads"] = std::to_string(ip.num_index_heads);
  m["num_q_heads"] = std::to_string(ap.num_q_heads);
  m["sparse_block"] = std::to_string(ip.sparse_block);
  m["topk"] = std::to_string(ip.topk);
  m["init_blocks"] = std::to_string(ip.init_blocks);
  m["local_blocks"] = std::to_string(ip.local_blocks);
  m["sm_scale"] = spec::floats_text(std::vector<float>{ap.sm_scale});
  m["out_dtype"] = spec::name_of(ap.out_dtype);
  // Written only when set, so that traces without a fused dense insert keep their bytes.
  if (t.read.dense_rotary_dim != 0) m["dense_rotary_dim"] = std::to_string(t.read.dense_rotary_dim);
  const TraceReadParams defaults;
  for_each_read_mode([&](const char* key, auto member) {
    if (t.read.*member != defaults.*member) m[key] = spec::name_of(t.read.*member);
  });
  return m;
}

spec::IndexerParams indexer_params(const Trace& t) {
  const std::int64_t nkv = t.config.geometry.num_kv_heads;
  spec::IndexerParams p;
  p.num_index_heads = default_heads(t.read.num_index_heads, p.num_index_heads, nkv);
  p.sparse_block = t.read.sparse_block;
  p.topk = t.read.topk;
  p.init_blocks = t.read.init_blocks;
  p.local_blocks = t.read.local_blocks;
  p.index_nan = t.read.index_nan;
  p.score_scale = t.read.index_score_scale;
  p.index_group = t.read.index_group;
  p.neg_inf = t.read.index_neg_inf;
  p.index_q_type = t.read.index_q;
  return p;
}

spec::AttentionParams attention_params(const Trace& t) {
  spec::AttentionParams p;
  p.num_q_heads = default_heads(t.read.num_q_heads, p.num_q_heads, t.config.geometry.num_kv_heads);
  p.sparse_block = t.read.sparse_block;
  p.sm_scale = t.read.sm_scale;
  p.out_dtype = t.read.out_dtype;
  return p;
}

bool Trace::operator==(const Trace& o) const {
  return trace_metadata(*this) == trace_metadata(o) && steps == o.steps;
}

Trace parse_trace(std::span<const std::uint8_t> bytes) {
  const StFile file = parse_safetensors(bytes);
  spec::MetadataReader m(file.metadata);
  Trace t;
  const std::string& format = m.text("format");
  if (format != kTraceFormat) {
    throw spec::InvalidInput("__metadata__ 'format'", -1, "\"" + format + "\"",
                             "expected \"" + std::string(kTraceFormat) + "\"");
  }
  t.engine = m.text("engine");
  t.engine_version = m.text("engine_version");
  t.config = spec::read_config(m);
  const spec::ModelConfig& c = t.config;
  t.k_scale = m.floats("k_scale");
  t.v_scale = m.floats("v_scale");
  spec::validate_scales(c, t.k_scale, "__metadata__ 'k_scale'");
  spec::validate_scales(c, t.v_scale, "__metadata__ 'v_scale'");
  t.read = parse_read_params(m);
  try {
    spec::validate_indexer(c, indexer_params(t));
    spec::validate_attention(c, attention_params(t));
  } catch (const spec::InvalidInput& e) {
    throw spec::InvalidInput("__metadata__ '" + e.field() + "'", -1, e.value(),
                             "inconsistent read-side parameter (" + std::string(e.what()) + ")");
  }
  const std::int64_t num_steps = m.count("num_steps");
  // Keys of no part of the format are kept verbatim (e.g. a synthetic trace's generator).
  for (const std::string& k : m.unread()) t.extra.emplace(k, file.metadata.at(k));

  // Every tensor is step.<s>.<part> (s < num_steps, no leading zeros) or an x.* extension.
  std::map<std::int64_t, std::array<const StTensor*, 8>> parts;
  for (const StTensor& st : file.tensors) {
    const std::string& name = st.name;
    if (name.rfind("x.", 0) == 0) continue;
    const std::size_t dot = name.find('.', 5);
    const auto step = name.rfind("step.", 0) == 0 && dot != std::string::npos
                          ? spec::parse_count(std::string_view(name).substr(5, dot - 5))
                          : std::nullopt;
    if (!step) {
      throw spec::InvalidInput("tensor '" + name + "'", -1, "name",
                               "expected step.<s>.<part> (s a decimal step index) or an x.* "
                               "extension");
    }
    const std::string_view part = std::string_view(name).substr(dot + 1);
    const auto pi = std::find(kPartNames.begin(), kPartNames.end(), part);
    if (pi == kPartNames.end()) {
      throw spec::InvalidInput("tensor '" + name + "'", -1, "name",
                               "unknown part; expected one of slot_mapping, index_slot_mapping, "
                               "block_table, seq_lens, query_start_loc, query_lens, request_ids, "
                               "topk_ids");
    }
    if (*step >= num_steps) {
      throw spec::InvalidInput("tensor '" + name + "'", -1, "step " + std::to_string(*step),
                               "past __metadata__ 'num_steps' = " + std::to_string(num_steps));
    }
    if (st.dtype != StDType::kI32 && st.dtype != StDType::kI64) {
      throw spec::InvalidInput("tensor '" + name + "' dtype", -1,
                               std::string(st_dtype_name(st.dtype)), "expected I32 or I64");
    }
    parts[*step][static_cast<std::size_t>(pi - kPartNames.begin())] = &st;
  }
  for (std::int64_t s = 0; s < num_steps; ++s) {
    const auto it = parts.find(s);
    const auto required = [&](Part p) -> const StTensor& {
      const StTensor* st = it == parts.end() ? nullptr : it->second[static_cast<std::size_t>(p)];
      if (!st) {
        throw spec::InvalidInput(
            field_of(s, p), -1, "missing",
            "every step of __metadata__ 'num_steps' = " + std::to_string(num_steps) +
                " needs slot_mapping, "
                "block_table, seq_lens and query_start_loc or query_lens");
      }
      return *st;
    };
    const auto optional = [&](Part p) -> std::optional<IntTensor> {
      const StTensor* st = it == parts.end() ? nullptr : it->second[static_cast<std::size_t>(p)];
      if (!st) return std::nullopt;
      return decode_int(*st);
    };
    TraceStep step;
    step.slot_mapping = decode_int(required(Part::kSlotMapping));
    step.block_table = decode_int(required(Part::kBlockTable));
    step.seq_lens = decode_int(required(Part::kSeqLens));
    step.index_slot_mapping = optional(Part::kIndexSlotMapping);
    step.query_start_loc = optional(Part::kQueryStartLoc);
    step.query_lens = optional(Part::kQueryLens);
    step.request_ids = optional(Part::kRequestIds);
    step.topk_ids = optional(Part::kTopkIds);
    check_step(c, s, step);
    t.steps.push_back(std::move(step));
  }
  return t;
}

std::vector<std::uint8_t> serialize_trace(const Trace& t) {
  std::vector<StTensorOut> out;
  for (std::size_t i = 0; i < t.steps.size(); ++i) {
    const auto s = static_cast<std::int64_t>(i);
    const TraceStep& st = t.steps[i];
    out.push_back(encode_int(tensor_name(s, Part::kSlotMapping), st.slot_mapping));
    if (st.index_slot_mapping) {
      out.push_back(encode_int(tensor_name(s, Part::kIndexSlotMapping), *st.index_slot_mapping));
    }
    out.push_back(encode_int(tensor_name(s, Part::kBlockTable), st.block_table));
    out.push_back(encode_int(tensor_name(s, Part::kSeqLens), st.seq_lens));
    if (st.query_start_loc) {
      out.push_back(encode_int(tensor_name(s, Part::kQueryStartLoc), *st.query_start_loc));
    }
    if (st.query_lens) out.push_back(encode_int(tensor_name(s, Part::kQueryLens), *st.query_lens));
    if (st.request_ids) {
      out.push_back(encode_int(tensor_name(s, Part::kRequestIds), *st.request_ids));
    }
    if (st.topk_ids) out.push_back(encode_int(tensor_name(s, Part::kTopkIds), *st.topk_ids));
  }
  for (const auto& o : out) {
    std::int64_t n = 1;
    for (std::int64_t d : o.shape) n *= d;
    if (static_cast<std::size_t>(n) * st_dtype_bytes(o.dtype) != o.bytes.size()) {
      throw spec::InvalidInput("tensor '" + o.name + "' shape", -1, shape_text(o.shape),
                               "disagrees with its " +
                                   std::to_string(o.bytes.size() / st_dtype_bytes(o.dtype)) +
                                   " values");
    }
  }
  std::vector<std::uint8_t> bytes = build_safetensors(trace_metadata(t), out);
  // The writer's output goes through the strict reader: a trace this program writes always loads.
  (void)parse_trace(bytes);
  return bytes;
}

Trace load_trace(const std::filesystem::path& path) {
  return parse_trace(read_file_bytes(path, "trace"));
}

void save_trace(const Trace& trace, const std::filesystem::path& path) {
  write_file_atomically(serialize_trace(trace), path);
}

}  // namespace kvo::traces
