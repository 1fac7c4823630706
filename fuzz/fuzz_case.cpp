// libFuzzer target: the case-file and result-file readers (traces/case_file.hpp). Any input is
// either rejected with spec::InvalidInput, or it is a case whose reference answer matched the one
// it stores: it serialises and parses back to a case of the same op, seed and sizes. The same
// bytes are also judged as a result file against one small case of each op: rejected with
// InvalidInput or judged to an outcome. Nothing else may happen (no other exception, no crash, no
// unbounded allocation or time).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

#include "kvo/oracle/op_driver.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/traces/case_file.hpp"

namespace {

/// The overrides of fuzz/corpus/case/valid_<op>.st (its result_<op>.st seeds answer these cases).
kvo::oracle::Overrides small_overrides(kvo::spec::Op op) {
  kvo::oracle::Overrides o;
  kvo::oracle::CaseOverrides& w = o.write;
  w.block_size = 2;
  w.num_kv_heads = 1;
  if (op == kvo::spec::Op::kDense) {
    w.tokens = 2;
    w.head_dim = 32;
    w.num_blocks = 2;
    o.dense.rotary_dim = 2;
    o.dense.group_size = 1;
    return o;
  }
  w.head_dim = 8;
  w.index_dim = 8;
  if (op == kvo::spec::Op::kWrite) {
    w.layers = "DS";
    w.tokens = 3;
    w.num_blocks = 4;
    w.separate_index_slots = true;
    return o;
  }
  w.index_layout = kvo::spec::IndexLayout::kFlat;
  o.read.max_seq_len = 6;
  o.read.sparse_block = 2;
  o.read.topk = 2;
  o.read.group_size = 1;
  o.read.index_heads_per_kv = 1;
  o.read.requests = 1;
  return o;
}

/// One small case per op (seed 0x5EED), drawn once.
std::vector<kvo::traces::CaseFile>& small_cases() {
  static std::vector<kvo::traces::CaseFile> cases = [] {
    std::vector<kvo::traces::CaseFile> out;
    for (kvo::spec::Op op : kvo::oracle::all_ops()) {
      auto prepared = kvo::oracle::driver_of(op).prepare(0x5EED, small_overrides(op));
      out.push_back(kvo::traces::parse_case(kvo::traces::serialize_case(op, *prepared, "")));
    }
    return out;
  }();
  return cases;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  try {
    kvo::traces::CaseFile c = kvo::traces::parse_case(bytes);
    const auto again = kvo::traces::serialize_case(c.op, *c.prepared, c.flags);
    const kvo::traces::CaseFile back = kvo::traces::parse_case(again);
    if (back.op != c.op || back.seed != c.seed ||
        back.prepared->describe() != c.prepared->describe())
      std::abort();
  } catch (const kvo::spec::InvalidInput& e) {
    if (e.field().empty()) std::abort();
  }
  for (kvo::traces::CaseFile& c : small_cases()) {
    try {
      const kvo::traces::Judgement j = kvo::traces::judge_result(c, bytes, {});
      if (j.report.empty()) std::abort();
    } catch (const kvo::spec::InvalidInput& e) {
      if (e.field().empty()) std::abort();
    }
  }
  return 0;
}
