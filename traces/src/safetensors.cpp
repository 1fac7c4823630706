#include "kvo/traces/safetensors.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unordered_set>

#include "kvo/spec/outcome.hpp"

namespace kvo::traces {
namespace {

using Json = nlohmann::json;

struct DTypeRow {
  StDType dtype;
  std::string_view name;
  std::size_t bytes;
};
constexpr std::array<DTypeRow, 15> kDTypes{{{StDType::kBool, "BOOL", 1},
                                            {StDType::kU8, "U8", 1},
                                            {StDType::kI8, "I8", 1},
                                            {StDType::kI16, "I16", 2},
                                            {StDType::kU16, "U16", 2},
                                            {StDType::kF16, "F16", 2},
                                            {StDType::kBF16, "BF16", 2},
                                            {StDType::kI32, "I32", 4},
                                            {StDType::kU32, "U32", 4},
                                            {StDType::kF32, "F32", 4},
                                            {StDType::kF64, "F64", 8},
                                            {StDType::kI64, "I64", 8},
                                            {StDType::kU64, "U64", 8},
                                            {StDType::kF8E4M3, "F8_E4M3", 1},
                                            {StDType::kF8E5M2, "F8_E5M2", 1}}};

std::string dtype_choices() {
  std::string s;
  for (const auto& r : kDTypes) {
    if (!s.empty()) s += '|';
    s += r.name;
  }
  return s;
}

/// A JSON value as it appears in a message, cut short: a fuzzer's megabyte string stays readable.
std::string shown(const Json& j) {
  std::string s = j.dump(-1, ' ', true, Json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string name_text(std::string_view name) {
  std::string s = "'";
  for (char ch : name.substr(0, 120)) {
    if (static_cast<unsigned char>(ch) >= 0x20 && ch != 0x7F) {
      s += ch;
    } else {
      s += '?';
    }
  }
  if (name.size() > 120) s += "...";
  return s + "'";
}

[[noreturn]] void bad_header(std::uint64_t offset, const std::string& value,
                             const std::string& why) {
  throw spec::InvalidInput("trace header", -1, value,
                           "at byte offset " + std::to_string(offset) + ": " + why);
}

[[noreturn]] void bad_tensor(const std::string& name, const std::string& key,
                             const std::string& value, const std::string& why) {
  throw spec::InvalidInput("tensor " + name_text(name) + (key.empty() ? "" : " " + key), -1, value,
                           why);
}

/// A non-negative JSON integer (nlohmann parses non-negative integer literals as unsigned).
std::uint64_t as_count(const Json& j, const std::string& name, const std::string& key) {
  if (!j.is_number_unsigned()) {
    bad_tensor(name, key, shown(j), "expected a non-negative integer");
  }
  return j.get<std::uint64_t>();
}

/// SAX handler: nlohmann's DOM builder plus a duplicate-key check at every depth (nlohmann keeps
/// the last of two equal keys, which would let two readers see two different files). Not the
/// callback parser: its end_object rescans the parent object, quadratic in the tensor count.
class DuplicateCheckingSax {
 public:
  explicit DuplicateCheckingSax(Json& root) : dom_(root, true) {}
  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(Json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(Json::number_float_t v, const Json::string_t& s) {
    return dom_.number_float(v, s);
  }
  bool string(Json::string_t& v) { return dom_.string(v); }
  bool binary(Json::binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) {
    keys_.emplace_back();
    return dom_.start_object(n);
  }
  bool key(Json::string_t& k) {
    if (!keys_.back().insert(k).second)
      bad_header(8, shown(Json(k)), "duplicate key in one JSON object");
    return dom_.key(k);
  }
  bool end_object() {
    keys_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return dom_.start_array(n); }
  bool end_array() { return dom_.end_array(); }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& ex) {
    return dom_.parse_error(position, token, ex);  // throws ex
  }

 private:
  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  std::vector<std::unordered_set<std::string>> keys_;
};

Json parse_header_json(const std::uint8_t* begin, const std::uint8_t* end) {
  Json root;
  DuplicateCheckingSax sax(root);
  try {
    Json::sax_parse(begin, end, &sax);
    return root;
  } catch (const Json::parse_error& e) {
    const std::uint64_t at = 8 + (e.byte > 0 ? e.byte - 1 : 0);
    std::string what = e.what();
    if (const auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    bad_header(at, "not JSON", "expected one JSON object (" + what + ")");
  } catch (const Json::exception& e) {
    // out_of_range.406 (a number too large for a double) carries no byte position (found by
    // fuzz/fuzz_trace.cpp; regression input fuzz/corpus/trace/regress_number_overflow.st).
    std::string what = e.what();
    if (const auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    if (what.size() > 120) what = what.substr(0, 117) + "...";
    bad_header(8, "not JSON", "expected one JSON object (" + what + ")");
  }
}

}  // namespace

std::string_view st_dtype_name(StDType t) { return kDTypes[static_cast<std::size_t>(t)].name; }
std::size_t st_dtype_bytes(StDType t) { return kDTypes[static_cast<std::size_t>(t)].bytes; }
std::optional<StDType> st_dtype_named(std::string_view name) {
  for (const DTypeRow& r : kDTypes)
    if (r.name == name) return r.dtype;
  return std::nullopt;
}

StFile parse_safetensors(std::span<const std::uint8_t> bytes) {
  StFile file;
  const std::uint64_t size = bytes.size();
  if (size < 8) {
    throw spec::InvalidInput("trace file size", -1, std::to_string(size),
                             "at byte offset 0: expected at least the 8-byte little-endian "
                             "header length");
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<std::size_t>(i)];
  if (n == 0) {
    throw spec::InvalidInput("trace header length", -1, "0",
                             "at byte offset 0: expected a JSON header of at least 2 bytes");
  }
  if (n > kMaxHeaderBytes) {
    throw spec::InvalidInput(
        "trace header length", -1, std::to_string(n),
        "at byte offset 0: expected at most " + std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (n > size - 8) {
    throw spec::InvalidInput("trace header length", -1, std::to_string(n),
                             "at byte offset 0: the header would end at byte " +
                                 std::to_string(8 + n) + ", past the end of the " +
                                 std::to_string(size) + "-byte file");
  }
  file.header_bytes = n;
  file.data_offset = 8 + n;
  const std::uint8_t* hbegin = bytes.data() + 8;
  if (hbegin[0] != '{') {
    bad_header(
        8,
        "byte 0x" +
            [&] {
              char b[3];
              std::snprintf(b, sizeof b, "%02X", hbegin[0]);
              return std::string(b);
            }(),
        "expected '{' opening the JSON header");
  }
  const Json header = parse_header_json(hbegin, hbegin + n);
  if (!header.is_object()) bad_header(8, shown(header), "expected a JSON object");

  const std::uint64_t data_size = size - file.data_offset;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        throw spec::InvalidInput("__metadata__", -1, shown(entry),
                                 "expected an object of string values");
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          throw spec::InvalidInput("__metadata__ " + name_text(key), -1, shown(value),
                                   "expected a string value");
        }
        file.metadata.emplace(key, value.get<std::string>());
      }
      continue;
    }
    if (name.empty()) bad_tensor(name, "", "\"\"", "expected a non-empty tensor name");
    if (!entry.is_object()) bad_tensor(name, "", shown(entry), "expected an object");
    for (const auto& [key, value] : entry.items()) {
      if (key != "dtype" && key != "shape" && key != "data_offsets") {
        bad_tensor(name, "key " + name_text(key), shown(value),
                   "unexpected key; expected exactly dtype, shape and data_offsets");
      }
    }
    StTensor t;
    t.name = name;
    const auto dt = entry.find("dtype");
    if (dt == entry.end()) bad_tensor(name, "dtype", "missing", "expected a dtype");
    if (!dt->is_string()) bad_tensor(name, "dtype", shown(*dt), "expected a string");
    const auto dtype_name = dt->get<std::string>();
    const auto row = std::find_if(kDTypes.begin(), kDTypes.end(),
                                  [&](const DTypeRow& r) { return r.name == dtype_name; });
    if (row == kDTypes.end()) {
      bad_tensor(name, "dtype", shown(*dt), "unknown dtype; expected one of " + dtype_choices());
    }
    t.dtype = row->dtype;

    const auto sh = entry.find("shape");
    if (sh == entry.end()) bad_tensor(name, "shape", "missing", "expected a shape");
    if (!sh->is_array()) bad_tensor(name, "shape", shown(*sh), "expected an array");
    if (sh->size() > 8) bad_tensor(name, "shape", shown(*sh), "expected at most 8 dimensions");
    // numel * element size, with every step checked against the data section: no overflow.
    std::uint64_t expect = row->bytes;
    bool zero = false;
    bool overflow = false;
    for (const Json& d : *sh) {
      const std::uint64_t dim = as_count(d, name, "shape");
      if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        bad_tensor(name, "shape", shown(*sh), "dimension past int64");
      }
      t.shape.push_back(static_cast<std::int64_t>(dim));
      if (dim == 0) zero = true;
      if (!overflow && dim != 0 && expect > std::numeric_limits<std::uint64_t>::max() / dim) {
        overflow = true;
      }
      if (!overflow) expect *= dim;
    }
    if (zero) {
      expect = 0;
      overflow = false;
    }

    const auto off = entry.find("data_offsets");
    if (off == entry.end()) bad_tensor(name, "data_offsets", "missing", "expected [begin, end]");
    if (!off->is_array() || off->size() != 2) {
      bad_tensor(name, "data_offsets", shown(*off), "expected [begin, end]");
    }
    t.begin = as_count((*off)[0], name, "data_offsets");
    t.end = as_count((*off)[1], name, "data_offsets");
    if (t.begin > t.end) {
      bad_tensor(name, "data_offsets", shown(*off), "reversed: begin is past end");
    }
    if (t.end > data_size) {
      bad_tensor(name, "data_offsets", shown(*off),
                 "past the end of the " + std::to_string(data_size) +
                     "-byte data section (file byte " + std::to_string(file.data_offset + t.end) +
                     " of " + std::to_string(size) + ")");
    }
    if (overflow || t.end - t.begin != expect) {
      bad_tensor(name, "shape", shown(*sh),
                 std::string("shape and byte size disagree: ") + std::string(row->name) + " " +
                     (overflow ? std::string("shape overflows") : std::to_string(expect)) +
                     " bytes, data_offsets hold " + std::to_string(t.end - t.begin));
    }
    t.bytes = bytes.subspan(static_cast<std::size_t>(file.data_offset + t.begin),
                            static_cast<std::size_t>(t.end - t.begin));
    file.tensors.push_back(std::move(t));
  }
  std::sort(file.tensors.begin(), file.tensors.end(), [](const StTensor& a, const StTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The tensors must tile [0, data_size): one reading of every byte, none ignored.
  std::uint64_t at = 0;
  const StTensor* prev = nullptr;
  for (const StTensor& t : file.tensors) {
    if (t.begin < at) {
      bad_tensor(
          t.name, "data_offsets",
          "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]",
          "overlaps tensor " + name_text(prev->name) + " which ends at " + std::to_string(at));
    }
    if (t.begin > at) {
      bad_tensor(t.name, "data_offsets",
                 "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]",
                 "gap of " + std::to_string(t.begin - at) + " bytes before it (data byte " +
                     std::to_string(at) + ", file byte " + std::to_string(file.data_offset + at) +
                     "); expected tensors back to back");
    }
    at = t.end;
    prev = &t;
  }
  if (at != data_size) {
    throw spec::InvalidInput("trace data section", -1, std::to_string(data_size) + " bytes",
                             "at byte offset " + std::to_string(file.data_offset + at) + ": " +
                                 std::to_string(data_size - at) +
                                 " trailing bytes no tensor covers");
  }
  return file;
}

std::vector<std::uint8_t> build_safetensors(const std::map<std::string, std::string>& metadata,
                                            const std::vector<StTensorOut>& tensors) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t at = 0;
  for (const StTensorOut& t : tensors) {
    std::uint64_t numel = 1;
    for (std::int64_t d : t.shape) numel *= static_cast<std::uint64_t>(d);
    if (numel * st_dtype_bytes(t.dtype) != t.bytes.size()) {
      throw std::invalid_argument("build_safetensors: tensor " + t.name +
                                  " bytes disagree with its shape");
    }
    if (header.contains(t.name)) {
      throw std::invalid_argument("build_safetensors: tensor " + t.name + " repeats");
    }
    header[t.name] = {{"dtype", st_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {at, at + t.bytes.size()}}};
    at += t.bytes.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::type_error& e) {
    // Only metadata and names can carry text; JSON strings must be UTF-8.
    throw spec::InvalidInput("trace header", -1, "text",
                             std::string("not valid UTF-8: ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<std::uint8_t> out(8 + text.size() + at);
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::size_t pos = 8 + text.size();
  for (const StTensorOut& t : tensors) {
    if (!t.bytes.empty()) std::memcpy(out.data() + pos, t.bytes.data(), t.bytes.size());
    pos += t.bytes.size();
  }
  return out;
}

std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw spec::InvalidInput(what, -1, path.string(), "cannot open the file for reading");
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
  if (in.bad()) throw spec::InvalidInput(what, -1, path.string(), "read error");
  return bytes;
}

void write_file_atomically(const std::vector<std::uint8_t>& bytes,
                           const std::filesystem::path& path) {
  std::filesystem::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw spec::InvalidInput("output", -1, path.string(), "cannot open for writing");
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw spec::InvalidInput("output", -1, path.string(), "write failed");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw spec::InvalidInput("output", -1, path.string(), "cannot rename the temporary file");
  }
}

}  // namespace kvo::traces
