// libFuzzer target: the trace reader (traces/trace.hpp). Any input is either rejected with
// spec::InvalidInput, or it is a trace whose every per-token quantity is in bounds: it serialises,
// parses back to an equal trace, and info and validate run over it without fault. Nothing else may
// happen (no other exception, no crash, no unbounded allocation or time).
#include <cstdint>
#include <cstdlib>
#include <span>

#include "kvo/spec/outcome.hpp"
#include "kvo/traces/analysis.hpp"
#include "kvo/traces/trace.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kvo::traces::Trace trace;
  try {
    trace = kvo::traces::parse_trace(std::span<const std::uint8_t>(data, size));
  } catch (const kvo::spec::InvalidInput& e) {
    if (e.field().empty()) std::abort();
    return 0;
  }
  const auto bytes = kvo::traces::serialize_trace(trace);
  if (!(kvo::traces::parse_trace(bytes) == trace)) std::abort();
  const auto validation = kvo::traces::validate_trace(trace, 4);
  if (validation.problems.size() > 4 || (validation.count > 0) != !validation.problems.empty()) {
    std::abort();
  }
  const auto info = kvo::traces::trace_info(trace);
  if (info.padding > info.slot_entries || info.tokens > info.slot_entries) std::abort();
  (void)info.report(trace.config);
  return 0;
}
