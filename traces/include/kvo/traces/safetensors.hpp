#pragma once
/// \file safetensors.hpp
/// The safetensors container, strictly: an 8-byte little-endian header length N, N bytes of JSON
/// (one object: per tensor {"dtype", "shape", "data_offsets": [begin, end)} relative to the data
/// section, plus an optional "__metadata__" string -> string map), then the data section. The
/// reader accepts exactly what the format allows and nothing more: the tensors must tile the data
/// section without gap, overlap or trailing byte (as the reference Rust reader demands), so a file
/// either is one unambiguous set of tensors or is rejected with the byte offset or tensor name.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvo::traces {

/// Element types of the safetensors format. The container accepts all of them; a trace uses
/// kI32 and kI64 only.
enum class StDType : std::uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
  kF8E4M3,
  kF8E5M2,
};

/// The format's spelling of a dtype ("I32") and its element size.
std::string_view st_dtype_name(StDType t);
/// The dtype the format spells `name`, if any.
std::optional<StDType> st_dtype_named(std::string_view name);
std::size_t st_dtype_bytes(StDType t);

/// Largest header accepted (the reference reader's limit), so a hostile length cannot make the
/// reader allocate or scan without bound.
inline constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

/// One tensor of a parsed file: a view into the caller's buffer.
struct StTensor {
  std::string name;
  StDType dtype = StDType::kU8;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  ///< data_offsets, relative to the data section
  std::uint64_t end = 0;
  std::span<const std::uint8_t> bytes;  ///< [end - begin] raw little-endian elements
};

/// A parsed file. `tensors` are in data order (ascending begin).
struct StFile {
  std::map<std::string, std::string> metadata;
  std::vector<StTensor> tensors;
  std::uint64_t header_bytes = 0;  ///< N
  std::uint64_t data_offset = 0;   ///< 8 + N: where the data section starts in the file
};

/// Parses a whole file held in `bytes` (the returned spans point into it). Throws
/// spec::InvalidInput naming the byte offset or the tensor and what was expected: a file shorter
/// than 8 bytes, a header length of 0, over kMaxHeaderBytes or past the end of the file, a header
/// that is not one JSON object (invalid JSON, invalid UTF-8, duplicate keys), an entry without
/// exactly dtype/shape/data_offsets, an unknown dtype, negative or non-integer dimensions, shape
/// and byte size disagreeing, offsets reversed or past the data section, tensors overlapping or
/// leaving a gap or trailing bytes, a non-string metadata value.
StFile parse_safetensors(std::span<const std::uint8_t> bytes);

/// One tensor to write.
struct StTensorOut {
  std::string name;
  StDType dtype = StDType::kU8;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;  ///< raw little-endian elements, numel * dtype size
};

/// Serialises tensors (in the given order) and metadata into a safetensors file. The header is
/// padded with spaces to a multiple of 8 bytes, as safetensors' own writer does, so the data
/// section is aligned. Throws std::invalid_argument when a tensor's bytes disagree with its shape
/// or a name repeats (a programming error, not bad input), spec::InvalidInput when a name or a
/// metadata string is not valid UTF-8.
std::vector<std::uint8_t> build_safetensors(const std::map<std::string, std::string>& metadata,
                                            const std::vector<StTensorOut>& tensors);

/// A whole file's bytes; InvalidInput naming `what` and the path when it cannot be read.
std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path, const char* what);
/// Writes `bytes` to a temporary file next to `path`, then renames it over `path`, so a reader
/// never sees half a file; InvalidInput naming the path when either step fails.
void write_file_atomically(const std::vector<std::uint8_t>& bytes,
                           const std::filesystem::path& path);

}  // namespace kvo::traces
