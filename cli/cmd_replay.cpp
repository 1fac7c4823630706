// kvoracle replay TRACE: every step of a trace through the write path of every available subject,
// diffed against the reference after each layer; caches persist across steps.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "commands.hpp"
#include "kvo/gpu/device.hpp"
#include "kvo/oracle/mutants.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/traces/replay.hpp"
#include "options.hpp"

namespace kvo::cli {
namespace {

struct ReplayFlags {
  std::string path;
  std::string value_seed = "0x6B766F72";
  std::string steps;
  std::string layers;
  std::vector<std::string> subjects;
  std::string ops;  ///< empty: write, and dense when the trace's dense layers use the fused insert
  std::string tier = "cpu";
  std::optional<traces::Residence> resident;
  traces::ReplayOptions options;
};

std::int64_t parse_index(const std::string& text, const char* field) {
  return static_cast<std::int64_t>(
      std::min<std::uint64_t>(parse_u64(text, field), std::uint64_t{1} << 62));
}

/// "a:b", "a:", ":b" or "a" (one step).
void parse_steps(const std::string& text, traces::ReplayOptions& o) {
  if (text.empty()) return;
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    o.step_begin = parse_index(text, "steps");
    o.step_end = o.step_begin + 1;
    return;
  }
  const std::string a = text.substr(0, colon), b = text.substr(colon + 1);
  if (!a.empty()) o.step_begin = parse_index(a, "steps");
  if (!b.empty()) o.step_end = parse_index(b, "steps");
}

/// "0,3,5-7".
std::vector<std::int64_t> parse_layers(const std::string& text) {
  std::vector<std::int64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    const auto dash = item.find('-');
    if (dash == std::string::npos) {
      out.push_back(parse_index(item, "layers"));
      continue;
    }
    const std::int64_t a = parse_index(item.substr(0, dash), "layers");
    const std::int64_t b = parse_index(item.substr(dash + 1), "layers");
    if (b < a || b - a > 100000) {
      throw spec::InvalidInput("layers", -1, item, "expected a range a-b with a <= b");
    }
    for (std::int64_t l = a; l <= b; ++l) out.push_back(l);
  }
  if (out.empty()) throw spec::InvalidInput("layers", -1, "\"" + text + "\"", "expected 0,3,5-7");
  return out;
}

int run_replay(ReplayFlags& f) {
  traces::ReplayOptions& o = f.options;
  o.value_seed = parse_u64(f.value_seed, "value-seed");
  parse_steps(f.steps, o);
  if (!f.layers.empty()) o.layers = parse_layers(f.layers);
  for (const std::string& list : f.subjects) {
    std::stringstream ss(list);
    for (std::string name; std::getline(ss, name, ',');)
      if (!name.empty()) o.subjects.push_back(name);
  }
  std::vector<std::string> op_names;
  std::stringstream op_list(f.ops);
  for (std::string op; std::getline(op_list, op, ',');)
    if (!op.empty()) op_names.push_back(op);
  const traces::Trace trace = traces::load_trace(f.path);
  if (f.ops.empty()) {
    op_names = {"write"};
    if (trace.read.dense_rotary_dim > 0) op_names.push_back("dense");
  }
  o.ops = oracle::parse_ops(op_names);
  auto subjects = oracle::make_subjects();
  oracle::add_named_mutants(o.subjects, subjects);
  oracle::require_named_subjects_run(subjects, o.subjects, o.ops);
  std::string why_no_gpu;
  const int gpus = gpu::device_count(&why_no_gpu);
  o.tier = oracle::parse_tier(f.tier, gpus > 0);
  if (f.resident) o.residence = *f.resident;
  std::printf(
      "kvoracle replay: %s, %zu steps, %zu layers (%s), value seed 0x%016llX, %lld jobs, %s tier, "
      "GPU: %s\n",
      f.path.c_str(), trace.steps.size(), trace.config.layers.size(),
      spec::format_layer_mix(trace.config.layers).c_str(),
      static_cast<unsigned long long>(o.value_seed),
      static_cast<long long>(oracle::campaign_jobs(o.jobs)),
      std::string(spec::name_of(o.tier)).c_str(),
      gpus > 0 ? gpu::device_description().c_str() : ("none (" + why_no_gpu + ")").c_str());
  std::fflush(stdout);
  const bool tty = isatty(fileno(stderr)) != 0;
  const auto progress = [tty](std::int64_t done, std::int64_t total) {
    if (!tty) return;
    const int width = 40;
    const int filled = static_cast<int>(width * done / std::max<std::int64_t>(total, 1));
    std::fprintf(stderr, "\r[%.*s%*s] step %lld/%lld", filled,
                 "########################################", width - filled, "",
                 static_cast<long long>(done), static_cast<long long>(total));
    if (done == total) std::fprintf(stderr, "\n");
  };
  const traces::ReplayReport report = traces::replay_trace(trace, o, subjects, progress);
  if (tty) std::fprintf(stderr, "\n");
  for (std::size_t i = 0; i < report.mismatches.size(); ++i) {
    std::cout << report.mismatches[i] << "\nreproduce: kvoracle replay " << f.path << " "
              << report.reproduce[i] << "\n";
  }
  std::cout << report.summary() << std::endl;
  return spec::exit_status(report.worst);
}

}  // namespace

void add_replay(CLI::App& app, int& status) {
  auto flags = std::make_shared<ReplayFlags>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "replay a trace's steps through every available write (and read) subject");
  cmd->add_option("trace", flags->path, "trace file")->required();
  cmd->add_option("--subject", flags->subjects,
                  "subjects to run (repeatable or comma-separated; default all available)");
  cmd->add_option(
      "--ops", flags->ops,
      "comma-separated: write, dense, indexer, attention (default write, and dense when "
      "the trace's dense layers use the fused qknorm + rope + insert; the read ops run "
      "the reference's slow read path; indexer on sparse layers, attention sparse or "
      "dense)");
  cmd->add_option("--full-diff-every", flags->options.full_diff_every,
                  "compare whole caches every N steps (between them: the pages each step names, "
                  "and the guards); 1 compares everything every step")
      ->capture_default_str();
  cmd->add_option("--jobs,-j", flags->options.jobs,
                  "layers worked on at once on the CPU (0: one per hardware thread); the report is "
                  "the same for any number")
      ->capture_default_str();
  add_tier_flags(*cmd, flags->tier, flags->options.tier_sample_first,
                 flags->options.tier_sample_every, "replayed steps (every layer of a step)",
                 "the canonical CUDA write and dense insert write the reference caches");
  add_enum_option(
      *cmd, "--resident", flags->resident,
      "the GPU tier's caches on the device across steps: values generated there, "
      "the tier's and the CUDA subjects' writes, the comparisons; the host sees "
      "verdicts and the pages of a report or a sampled check (auto: where the replay "
      "allows it: op write, strict slots, no div_approx, subjects with a device write)");
  cmd->add_option("--steps", flags->steps, "step range a:b (b exclusive; a: or :b)");
  cmd->add_option("--layers", flags->layers, "layer indices, e.g. 0,3,5-7 (default all)");
  cmd->add_flag("--keep-going", flags->options.keep_going,
                "report every mismatching step instead of stopping at the first");
  cmd->add_option("--value-seed", flags->value_seed, "seed of the generated K/V values")
      ->capture_default_str();
  cmd->add_flag("--edge-values", flags->options.edge_values,
                "mix in edge values (zeros, ties, fp8 maxima, inf, NaN)");
  cmd->callback([flags, &status] { status = run_replay(*flags); });
}

}  // namespace kvo::cli
