#pragma once
/// \file metadata.hpp
/// The one codec between a model configuration and the string -> string metadata of a file (the
/// `__metadata__` of a trace or of a case file): each key's spelling, the strict reader of each
/// kind of value (decimal counts, true/false, enum names from types.hpp, float32 lists) and the
/// error that names a missing or malformed key. Plain text: the container (safetensors) is
/// traces/'s.

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvo/spec/config.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/spec/types.hpp"

namespace kvo::spec {

/// A file's metadata: key -> value, both strings.
using Metadata = std::map<std::string, std::string>;

/// How errors name a metadata key: "__metadata__ 'block_size'".
std::string metadata_field(std::string_view key);

/// Strict readers of one file's metadata. Every key read is remembered, so that a format that
/// allows no other keys can reject the first unread one (require_all_read) and one that keeps them
/// can list them (unread). Each reader throws InvalidInput naming the key and its value.
class MetadataReader {
 public:
  explicit MetadataReader(const Metadata& metadata) : m_(metadata) {}

  bool has(std::string_view key) const { return m_.count(std::string(key)) != 0; }
  /// The value of a required key.
  const std::string& text(std::string_view key);
  /// A non-negative decimal integer: digits only, no sign, no leading zero, fits int64.
  std::int64_t count(std::string_view key);
  /// `true` or `false`.
  bool flag(std::string_view key);
  /// Comma-separated float32 values (at most 4097 read), each parsed whole.
  std::vector<float> floats(std::string_view key);
  /// One of the enum's names (types.hpp tables).
  template <class E>
  E choice(std::string_view key) {
    const std::string& v = text(key);
    const auto e = parse_enum<E>(v);
    if (!e) {
      throw InvalidInput(metadata_field(key), -1, "\"" + v + "\"",
                         "expected one of " + enum_choices<E>());
    }
    return *e;
  }
  /// An optional key read with one of the readers above (e.g. &MetadataReader::flag), or
  /// `fallback` when absent.
  template <class T, class Read>
  T optional(std::string_view key, T fallback, Read read) {
    return has(key) ? (this->*read)(key) : fallback;
  }
  template <class E>
  E optional_choice(std::string_view key, E fallback) {
    return has(key) ? choice<E>(key) : fallback;
  }

  /// The keys never read, in key order.
  std::vector<std::string> unread() const;
  /// Throws InvalidInput naming the first key never read (a format that allows no other keys).
  void require_all_read() const;

 private:
  const Metadata& m_;
  std::set<std::string, std::less<>> read_;
};

/// Strict decimal count (MetadataReader::count's rule), or nothing.
std::optional<std::int64_t> parse_count(std::string_view text);

/// Float32 values as metadata writes them: "%.9g" each, comma-separated (they read back exactly).
std::string floats_text(std::span<const float> values);

/// The configuration keys of `c` (SPEC 2-3): layers, num_blocks, block_size, num_kv_heads,
/// head_dim, index_dim, act_dtype, kv_dtype, saturation, scale_mode, per_head_scale,
/// via_model_dtype, layout, index_layout, index_dtype, ue8m0, slot_mode, slot_type,
/// separate_index_slots; and kOptionalConfigKeys only when not their default, so that files
/// written before those modes keep their bytes.
void write_config(const ModelConfig& c, Metadata& m);
/// The configuration back from those keys (the optional ones default when absent), validated
/// (spec::validate).
ModelConfig read_config(MetadataReader& r);

/// The optional configuration keys (later write modes, SPEC 2): scale_in_model_dtype (default
/// false), blockscale_scale (default divide).
inline constexpr std::array<std::string_view, 2> kOptionalConfigKeys{"scale_in_model_dtype",
                                                                     "blockscale_scale"};

}  // namespace kvo::spec
