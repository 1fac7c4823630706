#pragma once
/// \file options.hpp
/// Flag helpers shared by the verbs: enum options spelled through the spec's name tables, the model
/// configuration flags, and 64-bit seeds in decimal or hex.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "case_flags.hpp"
#include "kvo/oracle/op_driver.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/spec/types.hpp"

namespace kvo::cli {

/// An option taking one of E's names; anything else is a usage error (exit 2).
template <class E>
CLI::Option* add_enum_option(CLI::App& app, const std::string& flag, std::optional<E>& target,
                             const std::string& help) {
  std::vector<std::string> names;
  for (const auto& entry : spec::EnumInfo<E>::kNames) names.emplace_back(entry.name);
  return app
      .add_option_function<std::string>(
          flag, [&target](const std::string& v) { target = spec::parse_enum<E>(v); },
          help + " (" + spec::enum_choices<E>() + ")")
      ->check(CLI::IsMember(names));
}

/// The configuration flags (--layers, --block-size, --kv-dtype, --layout, ...) that fix a dimension
/// of the model instead of drawing it.
void add_model_flags(CLI::App& app, oracle::CaseOverrides& overrides);

/// The read-side flags (--sparse-block, --topk, --group-size, --max-seq-len, --read-requests,
/// --index-heads-per-kv, --adversarial, --tied-scores, --profile) of `check` and `explain`.
void add_read_flags(CLI::App& app, oracle::ReadOverrides& overrides);

/// Every flag that fixes a dimension of some op's cases: the model and read flags above, and the
/// dense insert's (--rotary-dim). `check` and `explain` take them all.
void add_case_flags(CLI::App& app, oracle::Overrides& overrides);

/// The reference tier's flags of `check` and `replay`: --tier (cpu, gpu or auto: read by
/// oracle::parse_tier), --tier-sample-first and --tier-sample-every; `units` names what the
/// sample counts ("cases", "replayed steps") and `answers` what the GPU tier answers.
void add_tier_flags(CLI::App& app, std::string& tier, std::int64_t& sample_first,
                    std::int64_t& sample_every, const std::string& units,
                    const std::string& answers);

/// A 64-bit value in decimal or 0x-hex; throws spec::InvalidInput naming `field` otherwise.
std::uint64_t parse_u64(const std::string& text, const char* field);

}  // namespace kvo::cli
