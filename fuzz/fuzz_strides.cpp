// libFuzzer target: the strided-view parsers (`--kv-strides`, `--index-strides`, the case-file keys
// kv_strides and index_strides). Any input either parses into strides whose text parses back to the
// same strides, or is rejected with InvalidInput naming the field; nothing else may happen.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "kvo/spec/config.hpp"
#include "kvo/spec/outcome.hpp"

namespace {

/// Parses `text` with `parse`, then its own spelling (`text_of`) back: the same strides, or the
/// named field's InvalidInput.
template <class Parse, class TextOf>
void round_trip(std::string_view text, const std::string& field, Parse parse, TextOf text_of) {
  try {
    const auto strides = parse(text, field);
    if (parse(text_of(strides), field) != strides) std::abort();
  } catch (const kvo::spec::InvalidInput& e) {
    if (e.field() != field) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  round_trip(text, "--kv-strides", kvo::spec::parse_kv_strides, kvo::spec::kv_strides_text);
  round_trip(text, "--index-strides", kvo::spec::parse_index_strides,
             kvo::spec::index_strides_text);
  return 0;
}
