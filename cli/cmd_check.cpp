// kvoracle check: the property campaign on every subject available (CPU always, GPU when present).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "commands.hpp"
#include "kvo/gpu/device.hpp"
#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/detect.hpp"
#include "kvo/oracle/mutants.hpp"
#include "kvo/oracle/read_judge.hpp"
#include "kvo/oracle/report_files.hpp"
#include "kvo/oracle/shrink.hpp"
#include "options.hpp"
#include "shard_processes.hpp"

namespace kvo::cli {
namespace {

struct CheckFlags {
  std::string seed = "0x6B766F72";
  std::string case_seed;
  std::vector<std::string> subjects;
  std::vector<std::string> ops;
  std::optional<std::int64_t> total_shards, shard_index;
  std::string junit, json;
  bool no_shrink = false;
  bool list_ops = false, list_subjects = false;
  bool detect_modes = false;
  bool coverage = false;
  std::string tier = "cpu";
  std::string gpus;                       // --gpus: all or a count (shard processes)
  std::optional<std::int64_t> processes;  // --processes
  oracle::CheckOptions options;
};

/// "a,b" and repeated flags, flattened.
std::vector<std::string> split_list(const std::vector<std::string>& lists) {
  std::vector<std::string> out;
  for (const std::string& list : lists) {
    std::stringstream ss(list);
    for (std::string name; std::getline(ss, name, ',');) {
      if (!name.empty()) out.push_back(name);
    }
  }
  return out;
}

/// --list-ops: the op registry, one line per op with the subjects of this build that implement it.
int list_ops(const oracle::SubjectList& subjects) {
  for (const oracle::OpDriver* d : oracle::op_registry()) {
    std::string names;
    for (const auto& s : subjects) {
      if (s->implements(d->op())) names += (names.empty() ? "" : " ") + s->name();
    }
    std::printf("%-10s %s\n", std::string(spec::name_of(d->op())).c_str(), names.c_str());
  }
  return spec::kExitPass;
}

/// --list-subjects: every subject of this build (mutants with `kvoracle mutants --list`), its
/// ops, its ordering and whether it can run here.
int list_subjects(const oracle::SubjectList& subjects) {
  for (const auto& s : subjects) {
    const std::string why = s->unavailable_reason();
    std::printf("%-24s %-22s %-10s %s\n", s->name().c_str(), oracle::implemented_ops(*s).c_str(),
                std::string(spec::name_of(s->ordering())).c_str(),
                why.empty() ? "available" : ("unavailable: " + why).c_str());
  }
  return spec::kExitPass;
}

/// --detect-modes: which modes each named subject implements (SPEC 7), one report per op.
int detect_modes(const CheckFlags& f, oracle::SubjectList& subjects) {
  const oracle::CheckOptions& o = f.options;
  if (o.subjects.empty()) {
    throw spec::InvalidInput("detect-modes", -1, "no --subject",
                             "name the subject(s) whose modes to detect");
  }
  std::printf("kvoracle check --detect-modes: seed 0x%016llX, %s\n",
              static_cast<unsigned long long>(o.seed),
              o.case_seed ? "1 case (--case-seed)" : (std::to_string(o.cases) + " cases").c_str());
  spec::Outcome worst = spec::Outcome::kPass;
  for (const std::string& name : o.subjects) {
    for (const oracle::DetectResult& r : oracle::detect_modes(o, subjects, name)) {
      std::cout << r.report() << std::flush;
      worst = spec::worst(worst, r.outcome());
    }
  }
  return spec::exit_status(worst);
}

/// --gpus / --processes: the campaign as shard processes of this binary (shard_processes.hpp).
int run_as_shard_processes(const CheckFlags& f, int gpus, const std::string& why_no_gpu) {
  const char* flag = f.gpus.empty() ? "processes" : "gpus";
  if (!f.gpus.empty() && f.processes) {
    throw spec::InvalidInput("processes", -1, std::to_string(*f.processes),
                             "--gpus and --processes both split the campaign: give one");
  }
  if (f.options.case_seed || f.options.total_shards > 1) {
    throw spec::InvalidInput(
        flag, -1, f.gpus.empty() ? std::to_string(*f.processes) : f.gpus,
        f.options.case_seed ? "splits a campaign, not one case (--case-seed)"
                            : "splits the campaign itself: not within a shard (--total-shards, "
                              "GTEST_TOTAL_SHARDS or a scheduler's shard index)");
  }
  ShardProcessPlan plan;
  if (f.gpus.empty()) {
    if (*f.processes < 1 || *f.processes > 1024) {
      throw spec::InvalidInput("processes", -1, std::to_string(*f.processes),
                               "must be in [1, 1024]");
    }
    plan.count = static_cast<int>(*f.processes);
  } else {
    plan = gpu_shard_plan(f.gpus, gpus, why_no_gpu);
  }
  return run_shard_processes(plan, command_line_without_split_flags(), f.junit, f.json, f.coverage);
}

int run_check_verb(CheckFlags& f) {
  oracle::CheckOptions& o = f.options;
  auto subjects = oracle::make_subjects();
  if (f.list_ops) return list_ops(subjects);
  if (f.list_subjects) return list_subjects(subjects);
  o.seed = parse_u64(f.seed, "seed");
  if (!f.case_seed.empty()) o.case_seed = parse_u64(f.case_seed, "case-seed");
  o.subjects = split_list(f.subjects);
  if (!f.ops.empty()) o.ops = oracle::parse_ops(split_list(f.ops));
  oracle::add_named_mutants(o.subjects, subjects);
  oracle::require_named_subjects_run(subjects, o.subjects, o.ops);
  // --profile judges foreign attention under another bound: on a canonical subject it is bad input.
  if (const auto profile = o.overrides.read.profile) {
    for (const oracle::SubjectOp& so : oracle::select_subject_ops(subjects, o.subjects, o.ops)) {
      const std::string problem = oracle::profile_override_problem(*so.subject, profile);
      if (so.op == spec::Op::kAttention && so.skipped.empty() && !problem.empty())
        throw spec::InvalidInput("profile", -1, std::string(spec::name_of(*profile)), problem);
    }
  }
  if (f.detect_modes) return detect_modes(f, subjects);
  oracle::apply_shard_environment(o, f.total_shards, f.shard_index);
  std::string why_no_gpu;
  const int gpus = gpu::device_count(&why_no_gpu);
  if (!f.gpus.empty() || f.processes) return run_as_shard_processes(f, gpus, why_no_gpu);
  o.tier = oracle::parse_tier(f.tier, gpus > 0);
  // A shard says so (the scheduler's variables may have set it without a flag).
  const std::string shard = o.total_shards > 1 ? ", shard " + std::to_string(o.shard_index) +
                                                     " of " + std::to_string(o.total_shards)
                                               : "";
  std::printf("kvoracle check: seed 0x%016llX, %s%s, %lld jobs, %s tier, GPU: %s\n",
              static_cast<unsigned long long>(o.seed),
              o.case_seed ? "1 case (--case-seed)" : (std::to_string(o.cases) + " cases").c_str(),
              shard.c_str(), static_cast<long long>(oracle::campaign_jobs(o.jobs)),
              std::string(spec::name_of(o.tier)).c_str(),
              gpus > 0 ? gpu::device_description().c_str() : ("none (" + why_no_gpu + ")").c_str());
  std::fflush(stdout);
  const bool tty = isatty(fileno(stderr)) != 0;
  const auto progress = [tty](std::int64_t done, std::int64_t total) {
    if (!tty) {
      // Plain lines for logs: one at every tenth of the campaign.
      if (total >= 10 && done % (total / 10) == 0) {
        std::fprintf(stderr, "kvoracle check: %lld/%lld cases\n", static_cast<long long>(done),
                     static_cast<long long>(total));
      }
      return;
    }
    const int width = 40;
    const int filled = static_cast<int>(width * done / std::max<std::int64_t>(total, 1));
    std::fprintf(stderr, "\r[%.*s%*s] %lld/%lld", filled,
                 "########################################", width - filled, "",
                 static_cast<long long>(done), static_cast<long long>(total));
    if (done == total) std::fprintf(stderr, "\n");
  };
  const oracle::CheckReport report = oracle::run_check(o, subjects, progress);
  if (tty) std::fprintf(stderr, "\n");
  std::cout << report.summary() << std::endl;
  if (f.coverage) std::cout << report.coverage_table() << std::flush;
  // Every failing subject's case, shrunk to a small one that still fails, with its command.
  for (const auto& sum : report.subjects) {
    if (f.no_shrink || !sum.failing_seed || sum.count(spec::Outcome::kMismatch) == 0) continue;
    const auto shrunk = oracle::shrink_failure(o, *sum.failing_seed, sum.name, sum.op, subjects);
    if (!shrunk) continue;
    std::cout << "\nshrunk failure of " << sum.name << " (" << spec::name_of(sum.op) << ", "
              << shrunk->steps << " reductions kept, " << shrunk->attempts << " cases run):\n"
              << shrunk->first_failure << std::endl;
  }
  if (!f.junit.empty()) oracle::write_file_atomically(f.junit, oracle::junit_xml(report));
  if (!f.json.empty()) oracle::write_file_atomically(f.json, oracle::report_json(report));
  return spec::exit_status(report.worst);
}

}  // namespace

void add_check(CLI::App& app, int& status) {
  auto flags = std::make_shared<CheckFlags>();
  CLI::App* cmd = app.add_subcommand(
      "check", "diff every available subject against the reference on random cases");
  cmd->add_option("--cases", flags->options.cases, "random cases to run")->capture_default_str();
  cmd->add_option("--seed", flags->seed, "campaign seed (decimal or 0x-hex)")
      ->capture_default_str();
  cmd->add_option("--case-seed", flags->case_seed,
                  "run exactly the case of this seed (from a failure report)");
  cmd->add_option("--time-budget", flags->options.time_budget_s,
                  "stop drawing cases after this many seconds");
  cmd->add_option("--subject", flags->subjects,
                  "subjects to run (repeatable or comma-separated; default all)");
  cmd->add_option(
      "--ops", flags->ops,
      "ops to check: " + spec::enum_choices<spec::Op>() + ", comma-separated (default all)");
  cmd->add_option_function<std::int64_t>(
      "--total-shards", [f = flags.get()](const std::int64_t& v) { f->total_shards = v; },
      "split the campaign over this many shards (also GTEST_TOTAL_SHARDS)");
  cmd->add_option_function<std::int64_t>(
      "--shard-index", [f = flags.get()](const std::int64_t& v) { f->shard_index = v; },
      "run this shard, 0-based (also GTEST_SHARD_INDEX)");
  cmd->add_flag("--fail-fast", flags->options.fail_fast,
                "stop at the first case that does not pass");
  cmd->add_option("--jobs,-j", flags->options.jobs,
                  "cases worked on at once on the CPU (0: one per hardware thread); the report is "
                  "the same for any number");
  add_tier_flags(*cmd, flags->tier, flags->options.tier_sample_first,
                 flags->options.tier_sample_every, "cases",
                 "the canonical CUDA kernels answer the write, dense and read cases");
  cmd->add_flag(
      "--staged", [f = flags.get()](std::int64_t) { f->options.tier_resident = false; },
      "the GPU tier stages every case through the host (default: an op whose subjects "
      "all write on the device, as the tier's answerer does, is generated, written and "
      "compared on the device)");
  cmd->add_option("--device-lanes", flags->options.device_lanes,
                  "host threads judging the GPU tier's resident cases at once, each on its own "
                  "stream (1-16; where every device subject launches statelessly); the report is "
                  "the same for any number")
      ->capture_default_str();
  cmd->add_option("--heavy-lanes", flags->options.heavy_lanes,
                  "device lanes judging the cases of gigabytes: 1 (the first lane) or 2 (the "
                  "second taking those of at most a quarter of the device's memory)")
      ->capture_default_str();
  const std::map<std::string, gpu::HostWait> waits{{"auto", gpu::HostWait::kAuto},
                                                   {"spin", gpu::HostWait::kSpin},
                                                   {"yield", gpu::HostWait::kYield},
                                                   {"block", gpu::HostWait::kBlock}};
  cmd->add_option("--host-wait", flags->options.host_wait,
                  "how host threads wait for the device while the GPU tier's lanes judge: auto "
                  "(CUDA's choice: spin), spin, yield (spin, giving the core to ready threads) or "
                  "block")
      ->transform(CLI::CheckedTransformer(waits));
  cmd->add_option("--gpus", flags->gpus,
                  "all or N: the campaign as one shard process per GPU (CUDA_VISIBLE_DEVICES), "
                  "their reports merged into one verdict");
  cmd->add_option_function<std::int64_t>(
      "--processes", [f = flags.get()](const std::int64_t& v) { f->processes = v; },
      "the campaign as N shard processes of this binary, their reports merged into one verdict");
  cmd->add_option("--junit", flags->junit,
                  "write a JUnit XML report (one testcase per subject and op)");
  cmd->add_option("--json", flags->json, "write the report as JSON");
  // A shard process's own flags come last on its command line (shard_processes.cpp) and win.
  for (const char* name : {"--junit", "--json", "--jobs", "--total-shards", "--shard-index"})
    cmd->get_option(name)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_flag("--no-shrink", flags->no_shrink, "do not shrink failing cases");
  cmd->add_flag("--coverage", flags->coverage,
                "print how often the cases reached each op's rare conditions (also in --json)");
  cmd->add_flag("--list-ops", flags->list_ops,
                "print the op registry (each op and the subjects that implement it) and exit");
  cmd->add_flag("--list-subjects", flags->list_subjects,
                "print every subject of this build with its ops and ordering, and exit");
  cmd->add_flag("--detect-modes", flags->detect_modes,
                "with --subject: run the subject against every combination of the contract's "
                "modes and print those it matches on every case (SPEC 7)");
  add_case_flags(*cmd, flags->options.overrides);
  cmd->callback([flags, &status] { status = run_check_verb(*flags); });
}

}  // namespace kvo::cli
