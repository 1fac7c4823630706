// kvoracle case emit|run and kvoracle judge: case files, a subject's result file, and the judgement
// of a result produced anywhere (traces/case_file.hpp does the work).
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "kvo/oracle/mutants.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/traces/case_file.hpp"
#include "kvo/traces/safetensors.hpp"
#include "options.hpp"

namespace kvo::cli {
namespace {

struct EmitFlags {
  std::string op;
  std::vector<std::string> ops;
  std::string case_seed;
  std::string seed = "0x6B766F72";  // kvoracle check's default campaign seed
  std::int64_t cases = 0;
  std::string output;
  oracle::Overrides overrides;
};

int run_emit(const EmitFlags& f) {
  if (!f.case_seed.empty()) {
    if (f.op.empty() || f.cases != 0) {
      throw spec::InvalidInput("case emit", -1, "--case-seed",
                               "one case needs --op and no --cases; a campaign needs --cases");
    }
    const spec::Op op = oracle::parse_ops({f.op}, "op").front();
    traces::emit_case(op, parse_u64(f.case_seed, "case-seed"), f.overrides, f.output);
    std::cout << "wrote " << f.output << "\n";
    return spec::kExitPass;
  }
  if (f.cases < 1) {
    throw spec::InvalidInput("case emit", -1, "no case asked",
                             "expected --op OP --case-seed S or --cases N");
  }
  const std::vector<spec::Op> ops = f.ops.empty() ? oracle::all_ops() : oracle::parse_ops(f.ops);
  std::vector<std::string> skipped;
  const auto paths = traces::emit_campaign(ops, parse_u64(f.seed, "seed"), f.cases, f.overrides,
                                           f.output, &skipped);
  std::cout << "wrote " << paths.size() << " case files to " << f.output << "\n";
  for (const std::string& s : skipped) std::cout << "not written: " << s << "\n";
  return spec::kExitPass;
}

struct RunFlags {
  std::string case_path, subject, output;
};

int run_run(const RunFlags& f) {
  traces::CaseFile c = traces::load_case(f.case_path);
  auto subjects = oracle::make_subjects();
  oracle::add_named_mutants({f.subject}, subjects);
  oracle::Subject& subject = oracle::find_subject(subjects, f.subject);
  if (!subject.implements(c.op)) {
    throw spec::InvalidInput("subject", -1, f.subject,
                             "implements " + oracle::implemented_ops(subject) + ", not op " +
                                 std::string(spec::name_of(c.op)));
  }
  traces::write_file_atomically(traces::run_case(c, subject), f.output);
  std::cout << "wrote " << f.output << " (" << f.subject << " on " << spec::name_of(c.op)
            << " case 0x" << std::hex << c.seed << std::dec << ")\n";
  return spec::kExitPass;
}

struct JudgeFlags {
  std::string case_path, result_path;
  std::optional<spec::Ordering> ordering;
  std::optional<spec::AttentionProfile> profile;
  std::optional<std::string> topk_form;  ///< spec::TopkForm's text
};

int run_judge(const JudgeFlags& f) {
  traces::CaseFile c = traces::load_case(f.case_path);
  const std::vector<std::uint8_t> result = traces::read_file_bytes(f.result_path, "result file");
  const traces::Judgement j = traces::judge_result(
      c, result,
      {f.ordering, f.profile,
       f.topk_form ? std::optional(spec::parse_topk_form(*f.topk_form, "--topk-order"))
                   : std::nullopt},
      "kvoracle judge " + f.case_path + " " + f.result_path);
  std::cout << j.report << std::endl;
  return spec::exit_status(j.outcome);
}

}  // namespace

void add_case(CLI::App& app, int& status) {
  CLI::App* cmd = app.add_subcommand("case", "case files: emit cases, run a subject on one");
  cmd->require_subcommand(1);

  auto e = std::make_shared<EmitFlags>();
  CLI::App* emit = cmd->add_subcommand(
      "emit", "write one case (--op OP --case-seed S -o FILE) or a campaign's (--cases N -o DIR)");
  emit->add_option("--op", e->op, "the op of one case: " + spec::enum_choices<spec::Op>());
  emit->add_option("--case-seed", e->case_seed, "one case's seed (decimal or 0x-hex)");
  emit->add_option("--cases", e->cases, "a campaign: its first N cases, one file per op and case");
  emit->add_option("--seed", e->seed, "the campaign seed (kvoracle check --seed)")
      ->capture_default_str();
  emit->add_option("--ops", e->ops, "a campaign's ops (default: all)")->delimiter(',');
  emit->add_option("-o,--output", e->output, "the case file, or the campaign's directory")
      ->required();
  add_case_flags(*emit, e->overrides);
  emit->callback([e, &status] { status = run_emit(*e); });

  auto r = std::make_shared<RunFlags>();
  CLI::App* run =
      cmd->add_subcommand("run", "run a built-in subject or mutant on a case; write its result");
  run->add_option("case", r->case_path, "the case file")->required();
  run->add_option("--subject", r->subject, "subject or mutant name")->required();
  run->add_option("-o,--output", r->output, "the result file")->required();
  run->callback([r, &status] { status = run_run(*r); });
}

void add_judge(CLI::App& app, int& status) {
  auto f = std::make_shared<JudgeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "judge", "judge a result file against a case file: the SPEC 7 report; exit 0/1/2/3");
  cmd->add_option("case", f->case_path, "the case file")->required();
  cmd->add_option("result", f->result_path, "the result file")->required();
  add_enum_option(*cmd, "--ordering", f->ordering, "judge as this ordering, not the declared one");
  add_enum_option(*cmd, "--profile", f->profile,
                  "judge a foreign attention under this profile, not the declared one");
  cmd->add_option("--topk-order", f->topk_form,
                  "judge the indexer's rows in this form, not the declared one: "
                  "<order>[,head_major][,keys<N>], order " +
                      spec::enum_choices<spec::TopkOrder>());
  cmd->callback([f, &status] { status = run_judge(*f); });
}

}  // namespace kvo::cli
