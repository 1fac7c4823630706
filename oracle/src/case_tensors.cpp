#include "kvo/oracle/case_tensors.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kvo/reference/paged_cache.hpp"

namespace kvo::oracle {
namespace {

static_assert(std::endian::native == std::endian::little,
              "case tensors are little-endian and read with memcpy");

/// Element size per TensorDType, in enum order.
constexpr std::array<std::size_t, 8> kElementSize{1, 4, 8, 4, 2, 2, 1, 1};

std::string field_of(const std::string& name) { return "tensor '" + name + "'"; }

template <class T>
std::vector<std::uint8_t> raw(const std::vector<T>& values) {
  std::vector<std::uint8_t> out(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

template <class T>
std::vector<T> typed(const std::vector<std::uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

}  // namespace

TensorDType tensor_dtype(spec::DType t) {
  // A case file spells a value format as its row's safetensors name ("F8_E4M3").
  for (const auto& entry : spec::EnumInfo<TensorDType>::kNames)
    if (entry.name == spec::format_of(t).safetensors_name) return entry.value;
  throw std::logic_error("no case tensor dtype for the format " + std::string(spec::name_of(t)));
}
std::size_t element_size(TensorDType t) { return kElementSize[static_cast<std::size_t>(t)]; }

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::int64_t case_count(spec::MetadataReader& m, std::string_view key) {
  const std::int64_t v = m.count(key);
  if (v > kMaxCaseCount) {
    throw spec::InvalidInput(spec::metadata_field(key), -1, std::to_string(v),
                             "expected at most " + std::to_string(kMaxCaseCount));
  }
  return v;
}

void TensorWriter::put(std::string name, TensorDType dtype, std::vector<std::int64_t> shape,
                       std::vector<std::uint8_t> bytes) {
  out_.tensors.push_back({std::move(name), dtype, std::move(shape), std::move(bytes)});
}

void TensorWriter::put_host(std::string name, const spec::HostTensor& t) {
  put(std::move(name), tensor_dtype(t.dtype), t.shape, t.bytes);
}

void TensorWriter::put_i64(std::string name, std::vector<std::int64_t> shape,
                           const std::vector<std::int64_t>& values) {
  put(std::move(name), TensorDType::kI64, std::move(shape), raw(values));
}

void TensorWriter::put_i32(std::string name, std::vector<std::int64_t> shape,
                           const std::vector<std::int32_t>& values) {
  put(std::move(name), TensorDType::kI32, std::move(shape), raw(values));
}

void TensorWriter::put_f32(std::string name, const std::vector<float>& values) {
  put_f32(std::move(name), {static_cast<std::int64_t>(values.size())}, values);
}

void TensorWriter::put_f32(std::string name, std::vector<std::int64_t> shape,
                           const std::vector<float>& values) {
  put(std::move(name), TensorDType::kF32, std::move(shape), raw(values));
}

void TensorWriter::put_slots(std::string name, const spec::SlotMapping& m) {
  const std::vector<std::int64_t> shape{static_cast<std::int64_t>(m.slots.size())};
  if (m.type == spec::SlotType::kI64) return put_i64(std::move(name), shape, m.slots);
  put_i32(std::move(name), shape, std::vector<std::int32_t>(m.slots.begin(), m.slots.end()));
}

std::vector<std::uint8_t> storage_bytes(const spec::CacheBuffer& buffer) {
  if (buffer.storage.is_lazy()) {
    throw spec::Unsupported(
        "a case file holds whole caches and this " + std::string(spec::name_of(buffer.kind)) +
        " buffer is a huge one (" + std::to_string(buffer.storage.size()) +
        " bytes, materialised only where the case touches it); reproduce the case from its seed");
  }
  return std::vector<std::uint8_t>(buffer.storage.data(),
                                   buffer.storage.data() + buffer.storage.size());
}

void TensorWriter::put_caches(const std::string& prefix, const spec::LayerCaches& caches) {
  for (const spec::CacheBuffer& b : caches.buffers) {
    put(prefix + std::string(spec::name_of(b.kind)), TensorDType::kU8, {b.storage.size()},
        storage_bytes(b));
  }
}

TensorReader::TensorReader(const TensorSet& in)
    : in_(in), meta_(in.metadata), taken_(in.tensors.size(), false) {}

bool TensorReader::has(const std::string& name) const {
  for (const NamedTensor& t : in_.tensors)
    if (t.name == name) return true;
  return false;
}

const std::vector<std::uint8_t>& TensorReader::take(const std::string& name, TensorDType dtype,
                                                    const std::vector<std::int64_t>& shape) {
  for (std::size_t i = 0; i < in_.tensors.size(); ++i) {
    const NamedTensor& t = in_.tensors[i];
    if (t.name != name) continue;
    if (t.dtype != dtype) {
      throw spec::InvalidInput(field_of(name) + " dtype", -1, std::string(spec::name_of(t.dtype)),
                               "expected " + std::string(spec::name_of(dtype)));
    }
    if (t.shape != shape) {
      throw spec::InvalidInput(field_of(name) + " shape", -1, shape_text(t.shape),
                               "expected " + shape_text(shape));
    }
    taken_[i] = true;
    return t.bytes;
  }
  throw spec::InvalidInput(
      field_of(name), -1, "missing",
      "expected " + std::string(spec::name_of(dtype)) + " " + shape_text(shape));
}

spec::HostTensor TensorReader::take_host(const std::string& name, spec::DType dtype,
                                         const std::vector<std::int64_t>& shape) {
  return {dtype, shape, take(name, tensor_dtype(dtype), shape)};
}

std::vector<std::int64_t> TensorReader::take_i64(const std::string& name,
                                                 const std::vector<std::int64_t>& shape) {
  return typed<std::int64_t>(take(name, TensorDType::kI64, shape));
}

std::vector<std::int32_t> TensorReader::take_i32(const std::string& name,
                                                 const std::vector<std::int64_t>& shape) {
  return typed<std::int32_t>(take(name, TensorDType::kI32, shape));
}

std::vector<float> TensorReader::take_f32(const std::string& name, std::int64_t n) {
  return take_f32(name, std::vector<std::int64_t>{n});
}

std::vector<float> TensorReader::take_f32(const std::string& name,
                                          const std::vector<std::int64_t>& shape) {
  return typed<float>(take(name, TensorDType::kF32, shape));
}

spec::SlotMapping TensorReader::take_slots(const std::string& name, spec::SlotType type,
                                           std::int64_t n) {
  spec::SlotMapping m;
  m.type = type;
  if (type == spec::SlotType::kI64) {
    m.slots = take_i64(name, {n});
  } else {
    const std::vector<std::int32_t> v = take_i32(name, {n});
    m.slots.assign(v.begin(), v.end());
  }
  return m;
}

spec::LayerCaches TensorReader::take_caches(const std::string& prefix,
                                            const spec::ModelConfig& config, spec::LayerKind kind) {
  // The largest buffer's bytes, in checked arithmetic, before the layout computes any size.
  const spec::CacheGeometry& g = config.geometry;
  std::int64_t bytes = 2 * 4;  // two fp32-sized tensors (packed K and V), or index-K with scales
  for (std::int64_t d : {g.num_blocks, g.block_size, g.num_kv_heads,
                         std::max(g.head_dim, g.index_dim + spec::kScaleGroup)}) {
    if (__builtin_mul_overflow(bytes, d, &bytes) || bytes > kMaxCaseCount) {
      throw spec::InvalidInput("__metadata__ 'num_blocks'", -1, std::to_string(g.num_blocks),
                               "the geometry's caches are larger than a case file holds (" +
                                   std::to_string(kMaxCaseCount) + " bytes)");
    }
  }
  const reference::PagedCacheLayout layout(config);
  spec::LayerCaches caches;
  caches.kind = kind;
  for (spec::BufferKind b : layout.buffers(kind)) {
    spec::CacheBuffer buf;
    buf.kind = b;
    buf.guard_bytes = spec::kGuardBytes;
    buf.storage = spec::ByteStorage(take(prefix + std::string(spec::name_of(b)), TensorDType::kU8,
                                         {layout.buffer_bytes(b) + 2 * spec::kGuardBytes}));
    caches.buffers.push_back(std::move(buf));
  }
  return caches;
}

void TensorReader::require_all_read() const {
  for (std::size_t i = 0; i < in_.tensors.size(); ++i) {
    if (!taken_[i]) {
      throw spec::InvalidInput(field_of(in_.tensors[i].name), -1, "present",
                               "unknown tensor for this op and configuration");
    }
  }
  meta_.require_all_read();
}

void require_reference_answer(const std::string& name, std::size_t element_bytes,
                              const std::vector<std::uint8_t>& stored,
                              const std::vector<std::uint8_t>& computed) {
  if (stored == computed) return;
  std::size_t at = 0;
  while (at < stored.size() && at < computed.size() && stored[at] == computed[at]) ++at;
  const std::size_t element = at / element_bytes;
  const auto hex = [&](const std::vector<std::uint8_t>& v) {
    std::string s = "0x";
    for (std::size_t i = element_bytes; i-- > 0;) {
      const std::size_t k = element * element_bytes + i;
      char b[4];
      std::snprintf(b, sizeof b, "%02X", k < v.size() ? v[k] : 0);
      s += b;
    }
    return s;
  };
  throw spec::InvalidInput(field_of(name), static_cast<std::int64_t>(element), hex(stored),
                           "differs from the reference's answer " + hex(computed) + " (element " +
                               std::to_string(element) +
                               "): the file's expected result was not computed by this contract");
}

}  // namespace kvo::oracle
