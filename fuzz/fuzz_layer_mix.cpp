// libFuzzer target: the layer-mix pattern parser (`--layers`). Any input either parses into a mix
// whose run-length spelling parses back to the same mix, or is rejected with InvalidInput naming
// the field; nothing else may happen (no other exception, no crash, no unbounded allocation).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kvo/spec/config.hpp"
#include "kvo/spec/outcome.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto mix = kvo::spec::parse_layer_mix(text);
    if (mix.empty() || mix.size() > 100000) std::abort();
    if (kvo::spec::parse_layer_mix(kvo::spec::format_layer_mix(mix)) != mix) std::abort();
  } catch (const kvo::spec::InvalidInput& e) {
    if (e.field() != "layers") std::abort();
  }
  return 0;
}
