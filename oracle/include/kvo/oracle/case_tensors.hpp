#pragma once
/// \file case_tensors.hpp
/// What a case file or a result file holds, as the op drivers see it (op_driver.hpp): named tensors
/// of raw little-endian elements and string metadata (spec/metadata.hpp). The container that puts
/// them in a file (safetensors, strictly) is traces/case_file.hpp's: the oracle may not include
/// traces/. The element types are the safetensors types a case uses, spelled as that format spells
/// them, so the container maps them by name.
///
/// Naming (every op): `input.*` the inputs, `cache.*` the caches (a write's initial, guarded
/// buffers; a read's written ones), `expected.<name>` the reference's answer, whose result tensor
/// is `<name>` with the same dtype and shape.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvo/spec/metadata.hpp"
#include "kvo/spec/types.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::oracle {

/// Element types of case and result tensors.
enum class TensorDType : std::uint8_t { kU8, kI32, kI64, kF32, kBF16, kF16, kF8E4M3, kF8E5M2 };

}  // namespace kvo::oracle

namespace kvo::spec {
template <>
struct EnumInfo<oracle::TensorDType> {
  static constexpr std::string_view kNoun = "tensor dtype";
  static constexpr std::array<EnumName<oracle::TensorDType>, 8> kNames{
      {{oracle::TensorDType::kU8, "U8"},
       {oracle::TensorDType::kI32, "I32"},
       {oracle::TensorDType::kI64, "I64"},
       {oracle::TensorDType::kF32, "F32"},
       {oracle::TensorDType::kBF16, "BF16"},
       {oracle::TensorDType::kF16, "F16"},
       {oracle::TensorDType::kF8E4M3, "F8_E4M3"},
       {oracle::TensorDType::kF8E5M2, "F8_E5M2"}}};
};
}  // namespace kvo::spec

namespace kvo::oracle {

/// One tensor: [shape...] row-major, raw little-endian elements.
struct NamedTensor {
  std::string name;
  TensorDType dtype = TensorDType::kU8;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;  ///< numel * element size
};

/// A whole file's content: metadata and tensors (in file order).
struct TensorSet {
  spec::Metadata metadata;
  std::vector<NamedTensor> tensors;
};

/// The tensor dtype of a contract dtype (activations, caches, outputs).
TensorDType tensor_dtype(spec::DType t);
/// Bytes per element.
std::size_t element_size(TensorDType t);

/// "[2, 3]".
std::string shape_text(const std::vector<std::int64_t>& shape);

/// A buffer's bytes, guards included, as a case or result file holds them; spec::Unsupported for a
/// huge (lazy) buffer, which no file of whole caches can hold.
std::vector<std::uint8_t> storage_bytes(const spec::CacheBuffer& buffer);

/// Builds a TensorSet from the values the drivers hold.
class TensorWriter {
 public:
  explicit TensorWriter(TensorSet& out) : out_(out) {}
  spec::Metadata& metadata() { return out_.metadata; }
  void put(std::string name, TensorDType dtype, std::vector<std::int64_t> shape,
           std::vector<std::uint8_t> bytes);
  void put_host(std::string name, const spec::HostTensor& t);
  void put_i64(std::string name, std::vector<std::int64_t> shape,
               const std::vector<std::int64_t>& values);
  void put_i32(std::string name, std::vector<std::int64_t> shape,
               const std::vector<std::int32_t>& values);
  void put_f32(std::string name, const std::vector<float>& values);  ///< [n]
  void put_f32(std::string name, std::vector<std::int64_t> shape, const std::vector<float>& values);
  void put_slots(std::string name, const spec::SlotMapping& m);  ///< [T] of its slot type
  /// Each buffer as U8 [storage bytes, guards included], named `prefix` + its buffer name
  /// (spec::BufferKind: k, v, kv, index_k).
  void put_caches(const std::string& prefix, const spec::LayerCaches& caches);

 private:
  TensorSet& out_;
};

/// Reads a TensorSet strictly: each tensor taken must exist with exactly the dtype and shape asked
/// (InvalidInput naming the tensor and what was expected), and require_all_read rejects the first
/// tensor or metadata key never taken ("unknown").
class TensorReader {
 public:
  explicit TensorReader(const TensorSet& in);
  spec::MetadataReader& metadata() { return meta_; }
  bool has(const std::string& name) const;
  const std::vector<std::uint8_t>& take(const std::string& name, TensorDType dtype,
                                        const std::vector<std::int64_t>& shape);
  spec::HostTensor take_host(const std::string& name, spec::DType dtype,
                             const std::vector<std::int64_t>& shape);
  std::vector<std::int64_t> take_i64(const std::string& name,
                                     const std::vector<std::int64_t>& shape);
  std::vector<std::int32_t> take_i32(const std::string& name,
                                     const std::vector<std::int64_t>& shape);
  std::vector<float> take_f32(const std::string& name, std::int64_t n);  ///< [n]
  std::vector<float> take_f32(const std::string& name, const std::vector<std::int64_t>& shape);
  spec::SlotMapping take_slots(const std::string& name, spec::SlotType type, std::int64_t n);
  /// The buffers of a layer of `kind` in `config` (U8 [body + 2 guards] each, as put_caches
  /// names them). The sizes are checked against the configuration before anything is allocated.
  spec::LayerCaches take_caches(const std::string& prefix, const spec::ModelConfig& config,
                                spec::LayerKind kind);
  void require_all_read() const;

 private:
  const TensorSet& in_;
  spec::MetadataReader meta_;
  std::vector<bool> taken_;
};

/// Throws InvalidInput unless the stored `expected.` tensor equals what the reference computes
/// now, naming the tensor, the first differing element and both values' bytes.
void require_reference_answer(const std::string& name, std::size_t element_bytes,
                              const std::vector<std::uint8_t>& stored,
                              const std::vector<std::uint8_t>& computed);

/// Largest count a case file's metadata may give for a dimension or a cache's bytes (1 GiB): far
/// beyond any case, small enough that a hostile file cannot make the reader allocate without bound
/// before the tensors' sizes are compared.
inline constexpr std::int64_t kMaxCaseCount = std::int64_t{1} << 30;
/// MetadataReader::count bounded by kMaxCaseCount.
std::int64_t case_count(spec::MetadataReader& m, std::string_view key);

}  // namespace kvo::oracle
