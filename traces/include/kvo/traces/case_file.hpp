#pragma once
/// \file case_file.hpp
/// Case files: one case of one op as a safetensors file (its inputs, its initial or read caches,
/// the reference's answer, its configuration and modes), so that a result produced anywhere (in
/// another language, on another machine, captured from a running engine) is judged by the same
/// rules as the campaign's (OpDriver::judge: bit for bit, admissible sets, tie-aware top-k,
/// bounded attention). What each op's file holds is its driver's (OpDriver::encode_case); this
/// module adds the container and the keys below and never asks which op a case is. Here, not in
/// oracle/, because the safetensors container is traces/'s and the oracle may not include traces/.
///
/// Case file `__metadata__` (besides the driver's configuration and sizes):
///   format     kvoracle-case/1
///   op         write | dense | indexer | attention
///   case_seed  0x-hex: the campaign's seed of this case (kvoracle check --case-seed)
///   flags      the `kvoracle check` flags the case was drawn with ("" for none)
///
/// Result file: the tensors named as the case's `expected.<name>` ones without `expected.`, with
/// the same dtype and shape (a write: cache.layer.<l>.<buffer> U8 [guard + body + guard] per
/// layer and buffer; dense: cache.<buffer> and q_out; indexer: topk_ids I32 [Tq, nkv, topk];
/// attention: out [Tq, nq, hd] of the case's out_dtype), nothing else; `__metadata__`:
///   format             kvoracle-result/1
///   op, case_seed      the case's (a result of another case is rejected)
///   subject            who produced it (any name)
///   ordering           canonical (judged bit for bit) | foreign (float64 truth, tie-aware top-k)
///   topk_order         the indexer's declared form (spec::TopkForm's text):
///                      <ascending_ids|descending_score|unordered>[,head_major][,keys<N>]
///   attention_profile  fp32 | bf16_p | fp16_p (a foreign attention's bound)
///   run_outcome        optional: failed-to-run | unsupported | invalid-input, with no tensors
///   run_error          optional, with run_outcome: the producer's error message

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvo/oracle/op_driver.hpp"
#include "kvo/oracle/read_diff.hpp"
#include "kvo/oracle/subject.hpp"
#include "kvo/spec/op.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/spec/read.hpp"

namespace kvo::traces {

inline constexpr std::string_view kCaseFormat = "kvoracle-case/1";
inline constexpr std::string_view kResultFormat = "kvoracle-result/1";

/// A case file, decoded: the case rebuilt from its tensors, its answer checked.
struct CaseFile {
  spec::Op op = spec::Op::kWrite;
  std::uint64_t seed = 0;
  std::string flags;  ///< the overrides' flags, for the reproduce line
  std::unique_ptr<oracle::PreparedCase> prepared;
};

/// The case file of a prepared case of `op`.
std::vector<std::uint8_t> serialize_case(spec::Op op, oracle::PreparedCase& c,
                                         const std::string& flags);
/// Parses a case file strictly (spec::InvalidInput naming the byte offset, the key, the tensor or
/// the first element of a stored answer the reference disagrees with).
CaseFile parse_case(std::span<const std::uint8_t> bytes);
CaseFile load_case(const std::filesystem::path& path);

/// Draws case `seed` of `op` under `overrides` and writes its file (temporary file + rename).
void emit_case(spec::Op op, std::uint64_t seed, const oracle::Overrides& overrides,
               const std::filesystem::path& path);
/// The cases of `kvoracle check --seed campaign_seed --cases cases`, one file per op and case:
/// DIR/<op>-<case index, 4 digits>.st (write-0003.st). Returns the paths written, in that order.
/// A case no file can hold (a huge cache, spec::Unsupported) is left out, and a line naming it,
/// its seed and why goes to `skipped` when given.
std::vector<std::filesystem::path> emit_campaign(const std::vector<spec::Op>& ops,
                                                 std::uint64_t campaign_seed, std::int64_t cases,
                                                 const oracle::Overrides& overrides,
                                                 const std::filesystem::path& dir,
                                                 std::vector<std::string>* skipped = nullptr);

/// Runs `subject` on the case and returns its result file. A subject that throws (or cannot run
/// here) gives a result with run_outcome and run_error and no tensors.
std::vector<std::uint8_t> run_case(CaseFile& c, oracle::Subject& subject);

/// Overrides of what a result declares (kvoracle judge --ordering, --profile, --topk-order).
struct Declared {
  std::optional<spec::Ordering> ordering;
  std::optional<spec::AttentionProfile> profile;
  std::optional<spec::TopkForm> topk_form;
};

/// The result file of case `c` holding `tensors` (named as the case's `expected.*` ones without the
/// prefix), produced by `subject` and declared as `declared` says (unset: canonical, ascending ids,
/// fp32): what a producer outside kvoracle (the Python package) hands to judge_result.
std::vector<std::uint8_t> serialize_result(const CaseFile& c,
                                           std::vector<oracle::NamedTensor> tensors,
                                           const std::string& subject, const Declared& declared);

struct Judgement {
  spec::Outcome outcome = spec::Outcome::kPass;
  /// The campaign's report of this case: the case seed and sizes, the subject and how it was
  /// judged, the SPEC 7 diff, the reproduce lines; then "result: <outcome>".
  std::string report;
};

/// Judges a result file against the case through the case's OpDriver::judge. A malformed result
/// (container, keys, another case's, a tensor missing, unknown or of another dtype or shape) is
/// spec::InvalidInput naming it; `judge_command` is the line that reruns this judgement.
Judgement judge_result(CaseFile& c, std::span<const std::uint8_t> result, const Declared& declared,
                       const std::string& judge_command = {});

}  // namespace kvo::traces
