// kvoracle explain: the whole story of one case for one subject (typically pasted from a failure's
// "reproduce:" line, with check replaced by explain).
#include <cstdio>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "kvo/oracle/explain.hpp"
#include "kvo/oracle/mutants.hpp"
#include "options.hpp"

namespace kvo::cli {
namespace {

struct ExplainFlags {
  std::string case_seed;
  std::string subject;
  std::string op = "write";
  oracle::CheckOptions options;
};

int run_explain(ExplainFlags& f) {
  const std::uint64_t seed = parse_u64(f.case_seed, "case-seed");
  const std::vector<spec::Op> ops = oracle::parse_ops({f.op});
  auto subjects = oracle::make_subjects();
  oracle::add_named_mutants({f.subject}, subjects);
  const oracle::Explanation ex =
      oracle::explain_case(f.options, seed, f.subject, ops.front(), subjects);
  std::cout << ex.text << "result: " << spec::name_of(ex.outcome) << std::endl;
  return spec::exit_status(ex.outcome);
}

}  // namespace

void add_explain(CLI::App& app, int& status) {
  auto f = std::make_shared<ExplainFlags>();
  CLI::App* cmd =
      app.add_subcommand("explain", "explain one case: full report, page picture, tokens, values");
  cmd->add_option("--case-seed", f->case_seed, "the case (from a failure report)")->required();
  cmd->add_option("--subject", f->subject, "subject or mutant name")->required();
  cmd->add_option("--ops", f->op, "one op: " + spec::enum_choices<spec::Op>())
      ->capture_default_str();
  add_case_flags(*cmd, f->options.overrides);
  cmd->callback([f, &status] { status = run_explain(*f); });
}

}  // namespace kvo::cli
