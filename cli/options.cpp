#include "options.hpp"

#include <type_traits>

#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/write_dimensions.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::cli {
namespace {

CLI::Option* add_int(CLI::App& app, const std::string& flag, std::optional<std::int64_t>& target,
                     const std::string& help) {
  return app.add_option_function<std::int64_t>(
      flag, [&target](const std::int64_t& v) { target = v; }, help);
}

CLI::Option* add_bool(CLI::App& app, const std::string& flag, std::optional<bool>& target,
                      const std::string& help) {
  return app.add_option_function<bool>(
      flag, [&target](const bool& v) { target = v; }, help + " (true|false)");
}

}  // namespace

void add_model_flags(CLI::App& app, oracle::CaseOverrides& o) {
  // One flag per row of the write dimensions' table, typed by its field.
  oracle::visit_write_dimensions([&](const oracle::DimensionInfo& d, auto member, auto) {
    auto& target = o.*member;
    using T = typename std::remove_reference_t<decltype(target)>::value_type;
    const std::string flag(d.flag), help(d.help);
    if constexpr (std::is_same_v<T, bool>) {
      add_bool(app, flag, target, help);
    } else if constexpr (std::is_same_v<T, std::int64_t>) {
      add_int(app, flag, target, help);
    } else if constexpr (std::is_enum_v<T>) {
      add_enum_option(app, flag, target, help);
    } else if constexpr (std::is_same_v<T, spec::KvStrides>) {
      app.add_option_function<std::string>(
          flag, [&target, flag](const std::string& v) { target = spec::parse_kv_strides(v, flag); },
          help);
    } else if constexpr (std::is_same_v<T, spec::IndexStrides>) {
      app.add_option_function<std::string>(
          flag,
          [&target, flag](const std::string& v) { target = spec::parse_index_strides(v, flag); },
          help);
    } else {
      static_assert(std::is_same_v<T, std::string>, "a write dimension of a type with no flag");
      app.add_option_function<std::string>(
          flag, [&target](const std::string& v) { target = v; }, help);
    }
  });
}

void add_read_flags(CLI::App& app, oracle::ReadOverrides& r) {
  add_int(app, "--sparse-block", r.sparse_block, "indexer/attention: selection block (tokens)");
  add_int(app, "--topk", r.topk, "indexer: blocks kept per query and KV head");
  add_int(app, "--group-size", r.group_size, "attention, dense: query heads per KV head (GQA)");
  add_int(app, "--max-seq-len", r.max_seq_len, "indexer/attention: longest sequence drawn");
  add_int(app, "--seq-len", r.seq_len, "indexer/attention: every request exactly this long");
  add_int(app, "--read-requests", r.requests, "indexer/attention: requests in the batch");
  add_int(app, "--index-heads-per-kv", r.index_heads_per_kv, "indexer: index heads per KV head");
  add_bool(app, "--adversarial", r.adversarial,
           "indexer/attention: large score spreads and offsets");
  add_bool(app, "--tied-scores", r.tied_scores,
           "indexer: zero index-Q, so every unforced block ties");
  add_enum_option(app, "--profile", r.profile,
                  "attention: judge foreign subjects under this arithmetic profile instead of "
                  "their declared one");
  add_enum_option(app, "--index-nan", r.index_nan,
                  "indexer: what a NaN token score does to its block (SPEC 5 index_nan)");
  add_enum_option(app, "--index-score-scale", r.index_score_scale,
                  "indexer: token scores times 1 or fl(index_dim^-0.5) (SPEC 5)");
  add_bool(app, "--nan-index-k", r.nan_index_k,
           "indexer: some index-K rows hold a NaN, so the index_nan rule decides");
  add_enum_option(app, "--index-group", r.index_group,
                  "indexer: a KV head's selection from its index heads, max of their scores or "
                  "union of their top-k (SPEC 5 index_group)");
  add_enum_option(app, "--index-neg-inf", r.index_neg_inf,
                  "indexer: keep a chosen block scoring -inf, or drop it to -1 (SPEC 5 "
                  "drop_neg_inf)");
  add_enum_option(app, "--index-q", r.index_q,
                  "indexer: index-Q in the activation dtype or e4m3 (over an e4m3 index-K cache)");
  add_bool(app, "--neg-inf-block", r.neg_inf_block,
           "indexer: one block scores -inf in every index head (the dot overflows)");
  add_enum_option(app, "--selection-order", r.selection_order,
                  "attention: the order of the selection it is handed (SPEC 6; drawn per case "
                  "otherwise)");
}

void add_case_flags(CLI::App& app, oracle::Overrides& o) {
  add_model_flags(app, o.write);
  add_read_flags(app, o.read);
  add_int(app, "--rotary-dim", o.dense.rotary_dim, "dense: rotated dims (even, <= head_dim)");
  add_enum_option(app, "--dense-fp8-store", o.dense.fp8_store,
                  "dense: K/V stored scaled by the scale mode, or with scale 1 (identity: vLLM's "
                  "fused insert) (SPEC 4)");
}

void add_tier_flags(CLI::App& app, std::string& tier, std::int64_t& sample_first,
                    std::int64_t& sample_every, const std::string& units,
                    const std::string& answers) {
  app.add_option("--tier", tier,
                 "who answers: cpu (the CPU reference), gpu (" + answers +
                     ", checked against the CPU reference on a sample and wherever a subject "
                     "fails) or auto (gpu when a GPU answers)")
      ->capture_default_str();
  app.add_option("--tier-sample-first", sample_first,
                 "the GPU tier is checked against the CPU reference on the first N " + units)
      ->capture_default_str();
  app.add_option("--tier-sample-every", sample_every, "... and then on one in N")
      ->capture_default_str();
}

oracle::Overrides parse_case_flags(const std::vector<std::string>& flags) {
  oracle::Overrides o;
  CLI::App app{"kvoracle case flags"};
  add_case_flags(app, o);
  std::vector<std::string> args(flags.rbegin(), flags.rend());  // CLI11 parses a reversed list
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    throw spec::InvalidInput("overrides", -1, e.get_name(), e.what());
  }
  return o;
}

std::vector<std::string> case_flag_names() {
  oracle::Overrides o;
  CLI::App app{"kvoracle case flags"};
  add_case_flags(app, o);
  std::vector<std::string> names;
  for (const CLI::Option* opt : app.get_options()) {
    for (const std::string& n : opt->get_lnames()) names.push_back("--" + n);
  }
  return names;
}

std::uint64_t parse_u64(const std::string& text, const char* field) {
  return oracle::parse_u64(text, field);  // one rule for seeds: the flags and the test helper's
}

}  // namespace kvo::cli
