// libFuzzer target: 64-bit seeds on the command line (`--seed`, `--case-seed`), decimal or 0x-hex.
// Accepted text must print back to the same value; everything else is InvalidInput naming the
// field.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../cli/options.hpp"
#include "kvo/spec/outcome.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const std::uint64_t v = kvo::cli::parse_u64(text, "seed");
    const bool hex = text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
    const std::uint64_t back = std::strtoull(text.c_str() + (hex ? 2 : 0), nullptr, hex ? 16 : 10);
    if (back != v || text.find('\0') != std::string::npos) std::abort();
  } catch (const kvo::spec::InvalidInput& e) {
    if (e.field() != "seed") std::abort();
  }
  return 0;
}
