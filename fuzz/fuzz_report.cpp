// libFuzzer target: the campaign report reader (`kvoracle report merge` reads every shard's --json
// file). Any input either reads into a report that the writer spells back into a file reading to
// the same report, and merges as one shard into itself, or is rejected with InvalidInput naming the
// source; nothing else may happen.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvo/oracle/report_files.hpp"
#include "kvo/spec/outcome.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string source = "shard.json";
  kvo::oracle::CheckReport r;
  try {
    r = kvo::oracle::read_report_json(text, source);
  } catch (const kvo::spec::InvalidInput& e) {
    if (e.field().rfind(source, 0) != 0) std::abort();
    return 0;
  }
  const std::string spelled = kvo::oracle::report_json(r);
  if (kvo::oracle::report_json(kvo::oracle::read_report_json(spelled, source)) != spelled)
    std::abort();
  if (r.total_shards == 1) {
    // One shard merges into itself (its failures in case order).
    const kvo::oracle::CheckReport m = kvo::oracle::merge_reports({r}, {source});
    if (m.cases_run != r.cases_run || m.worst != r.worst) std::abort();
  } else {
    try {
      (void)kvo::oracle::merge_reports({r}, {source});
      std::abort();  // a shard of several is not a whole campaign
    } catch (const kvo::spec::InvalidInput&) {
    }
  }
  return 0;
}
