#pragma once
// The message of a rejected input, for tests that check what an error names.

#include <string>

#include "kvo/spec/outcome.hpp"

namespace kvo::testing {

/// The message of the spec::InvalidInput that `fn` throws ("" when it throws none).
template <class Fn>
std::string invalid_input(Fn&& fn) {
  try {
    fn();
  } catch (const spec::InvalidInput& e) {
    return e.what();
  }
  return "";
}

}  // namespace kvo::testing
