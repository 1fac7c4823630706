// kvoracle check: the property campaign on every subject available (CPU always, GPU when present).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "commands.hpp"
#include "kvo/gpu/device.hpp"
#include "kvo/oracle/check.hpp"
#include "options.hpp"

namespace kvo::cli {
namespace {

struct CheckFlags {
  std::string seed = "0x6B766F72";
  std::string case_seed;
  std::vector<std::string> subjects;
  std::vector<std::string> ops;
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

int run_check_verb(CheckFlags& f) {
  oracle::CheckOptions& o = f.options;
  o.seed = parse_u64(f.seed, "seed");
  if (!f.case_seed.empty()) o.case_seed = parse_u64(f.case_seed, "case-seed");
  o.subjects = split_list(f.subjects);
  if (!f.ops.empty()) o.ops = split_list(f.ops);
  auto subjects = oracle::make_write_subjects();
  auto read_subjects = oracle::make_read_subjects();
  std::string why_no_gpu;
  const int gpus = gpu::device_count(&why_no_gpu);
  std::printf("kvoracle check: seed 0x%016llX, %s, GPU: %s\n",
              static_cast<unsigned long long>(o.seed),
              o.case_seed ? "1 case (--case-seed)" : (std::to_string(o.cases) + " cases").c_str(),
              gpus > 0 ? gpu::device_description().c_str() : ("none (" + why_no_gpu + ")").c_str());
  std::fflush(stdout);
  const bool tty = isatty(fileno(stderr)) != 0;
  const auto progress = [tty](std::int64_t done, std::int64_t total) {
    if (!tty) return;
    const int width = 40;
    const int filled = static_cast<int>(width * done / std::max<std::int64_t>(total, 1));
    std::fprintf(stderr, "\r[%.*s%*s] %lld/%lld", filled,
                 "########################################", width - filled, "",
                 static_cast<long long>(done), static_cast<long long>(total));
    if (done == total) std::fprintf(stderr, "\n");
  };
  const oracle::CheckReport report = oracle::run_check(o, subjects, read_subjects, progress);
  if (tty) std::fprintf(stderr, "\n");
  std::cout << report.summary() << std::endl;
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
  cmd->add_option("--ops", flags->ops, "ops to check: write,indexer,attention (default all)");
  add_model_flags(*cmd, flags->options.overrides);
  oracle::ReadOverrides& r = flags->options.read_overrides;
  auto add_read = [&](const char* flag, std::optional<std::int64_t>& target, const char* help) {
    cmd->add_option_function<std::int64_t>(
        flag, [&target](const std::int64_t& v) { target = v; }, help);
  };
  add_read("--sparse-block", r.sparse_block, "indexer/attention: selection block (tokens)");
  add_read("--topk", r.topk, "indexer: blocks kept per query and KV head");
  add_read("--group-size", r.group_size, "attention: query heads per KV head (GQA)");
  add_read("--max-seq-len", r.max_seq_len, "indexer/attention: longest sequence drawn");
  cmd->callback([flags, &status] { status = run_check_verb(*flags); });
}

}  // namespace kvo::cli
