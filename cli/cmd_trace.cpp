// kvoracle trace gen|info|validate: synthetic serving traces and what a trace contains.
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "commands.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/traces/analysis.hpp"
#include "kvo/traces/simulator.hpp"
#include "kvo/traces/trace.hpp"
#include "options.hpp"

namespace kvo::cli {
namespace {

struct GenFlags {
  std::string seed = "1";
  std::string capture_sizes = "1,2,4,8,16,32,64,128,256,512";
  std::string output;
  traces::SimOptions sim;
  oracle::CaseOverrides model;
  traces::TraceReadParams read;
};

/// The read-side flags as trace gen's command line spells them (for the generator note).
std::string read_flags_text(const traces::TraceReadParams& r) {
  return " --num-index-heads " + std::to_string(r.num_index_heads) + " --num-q-heads " +
         std::to_string(r.num_q_heads) + " --sparse-block " + std::to_string(r.sparse_block) +
         " --topk " + std::to_string(r.topk) + " --init-blocks " + std::to_string(r.init_blocks) +
         " --local-blocks " + std::to_string(r.local_blocks) +
         (r.dense_rotary_dim > 0 ? " --dense-rotary-dim " + std::to_string(r.dense_rotary_dim)
                                 : std::string());
}

/// "1,2,4" or "none" (no CUDA-graph padding).
std::vector<std::int64_t> parse_sizes(const std::string& text) {
  std::vector<std::int64_t> out;
  if (text == "none") return out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    const auto v = parse_u64(item, "capture-sizes");
    if (v > (1u << 20)) {
      throw spec::InvalidInput("capture-sizes", static_cast<std::int64_t>(out.size()), item,
                               "expected at most 1048576");
    }
    out.push_back(static_cast<std::int64_t>(v));
  }
  if (out.empty()) throw spec::InvalidInput("capture-sizes", -1, "\"\"", "expected a list or none");
  return out;
}

int run_gen(GenFlags& f) {
  if (f.model.tokens || f.model.requests || f.model.edge_values) {
    throw spec::InvalidInput("trace gen", -1, "--tokens/--requests/--edge-values",
                             "not used by trace gen (the simulator decides tokens and requests; "
                             "values are chosen at replay)");
  }
  f.sim.seed = parse_u64(f.seed, "seed");
  f.sim.capture_sizes = parse_sizes(f.capture_sizes);
  apply_overrides(f.model, f.sim.config);
  const std::int64_t rotary = f.read.dense_rotary_dim;
  if (rotary < 0 || rotary % 2 != 0 || rotary > f.sim.config.geometry.head_dim) {
    throw spec::InvalidInput("dense-rotary-dim", -1, std::to_string(rotary),
                             "must be 0 or even and at most the head dim (" +
                                 std::to_string(f.sim.config.geometry.head_dim) + ")");
  }
  traces::SimStats stats;
  traces::Trace trace = traces::simulate(f.sim, &stats);
  trace.read = f.read;
  trace.extra["generator"] = "kvoracle trace gen --seed " + f.seed + " --steps " +
                             std::to_string(f.sim.steps) + f.model.to_flags() +
                             read_flags_text(f.read);
  traces::save_trace(trace, f.output);
  std::printf(
      "kvoracle trace gen: %s: %lld steps, %lld requests admitted, %lld finished, %lld "
      "preemptions, %lld shared prefix blocks, %lld chunked prefills, %lld padded steps, %lld "
      "rejected drafts, %lld freed blocks reused\n",
      f.output.c_str(), static_cast<long long>(trace.steps.size()),
      static_cast<long long>(stats.requests_admitted),
      static_cast<long long>(stats.requests_finished), static_cast<long long>(stats.preemptions),
      static_cast<long long>(stats.shared_blocks), static_cast<long long>(stats.chunked_prefills),
      static_cast<long long>(stats.padded_steps), static_cast<long long>(stats.rejected_drafts),
      static_cast<long long>(stats.blocks_reused));
  return spec::kExitPass;
}

int run_info(const std::string& path) {
  const traces::Trace trace = traces::load_trace(path);
  std::printf("trace: %s (engine %s %s)\n", path.c_str(), trace.engine.c_str(),
              trace.engine_version.c_str());
  std::cout << traces::trace_info(trace).report(trace.config) << std::flush;
  return spec::kExitPass;
}

int run_validate(const std::string& path, std::size_t limit) {
  const traces::Trace trace = traces::load_trace(path);
  const traces::TraceValidation v = traces::validate_trace(trace, limit);
  for (const auto& p : v.problems) std::printf("%s\n", p.describe().c_str());
  if (!v.ok()) {
    std::printf(
        "trace validate: %s: %lld problems%s\n", path.c_str(), static_cast<long long>(v.count),
        v.count > static_cast<std::int64_t>(v.problems.size()) ? " (first ones shown)" : "");
    return spec::kExitInvalidInput;
  }
  std::printf("trace validate: %s: ok (%zu steps)\n", path.c_str(), trace.steps.size());
  return spec::kExitPass;
}

}  // namespace

void add_trace(CLI::App& app, int& status) {
  CLI::App* cmd = app.add_subcommand("trace", "serving traces: generate, describe, validate");
  cmd->require_subcommand(1);

  auto gen = std::make_shared<GenFlags>();
  CLI::App* g = cmd->add_subcommand("gen", "synthetic trace from the serving-scheduler simulator");
  g->add_option("--seed", gen->seed, "simulator seed (decimal or 0x-hex)")->capture_default_str();
  g->add_option("--steps", gen->sim.steps, "engine steps")->capture_default_str();
  g->add_option("--max-batch", gen->sim.max_batch, "running requests at most")
      ->capture_default_str();
  g->add_option("--token-budget", gen->sim.token_budget, "tokens per step (chunked prefill)")
      ->capture_default_str();
  g->add_option("--prompt-min", gen->sim.prompt_min, "shortest prompt")->capture_default_str();
  g->add_option("--prompt-max", gen->sim.prompt_max, "longest prompt")->capture_default_str();
  g->add_option("--output-min", gen->sim.output_min, "fewest output tokens")->capture_default_str();
  g->add_option("--output-max", gen->sim.output_max, "most output tokens")->capture_default_str();
  g->add_option("--arrival-percent", gen->sim.arrival_percent,
                "chance per step (drawn twice) that a request arrives")
      ->capture_default_str();
  g->add_option("--prefix-share-percent", gen->sim.prefix_share_percent,
                "chance a new request shares a running request's prefix blocks")
      ->capture_default_str();
  g->add_option("--mtp", gen->sim.mtp, "draft tokens per decode (q_len = 1 + mtp)")
      ->capture_default_str();
  g->add_option("--capture-sizes", gen->capture_sizes,
                "CUDA-graph capture sizes the slot mapping is padded to, or none")
      ->capture_default_str();
  g->add_flag("--query-lens", gen->sim.query_lens_form,
              "write query_lens [B] instead of query_start_loc [B+1]");
  g->add_option("--num-index-heads", gen->read.num_index_heads,
                "read replay: indexer heads (0: smallest multiple of the KV heads >= 4)")
      ->capture_default_str();
  g->add_option("--dense-rotary-dim", gen->read.dense_rotary_dim,
                "dense layers written by the fused qknorm + rope + insert rotating this many dims "
                "(even, <= head dim; 0: plain writes)")
      ->capture_default_str();
  g->add_option("--num-q-heads", gen->read.num_q_heads,
                "read replay: query heads (0: smallest multiple of the KV heads >= 16)")
      ->capture_default_str();
  g->add_option("--sparse-block", gen->read.sparse_block,
                "read replay: selection block of the indexer and attention (tokens)")
      ->capture_default_str();
  g->add_option("--topk", gen->read.topk, "read replay: blocks kept per query and KV head")
      ->capture_default_str();
  g->add_option("--init-blocks", gen->read.init_blocks, "read replay: forced leading blocks")
      ->capture_default_str();
  g->add_option("--local-blocks", gen->read.local_blocks, "read replay: forced trailing blocks")
      ->capture_default_str();
  g->add_option("-o,--output", gen->output, "trace file to write")->required();
  add_model_flags(*g, gen->model);
  g->callback([gen, &status] { status = run_gen(*gen); });

  auto info_path = std::make_shared<std::string>();
  CLI::App* i = cmd->add_subcommand("info", "steps, tokens, padding, fragmentation of a trace");
  i->add_option("trace", *info_path, "trace file")->required();
  i->callback([info_path, &status] { status = run_info(*info_path); });

  auto val_path = std::make_shared<std::string>();
  auto limit = std::make_shared<std::size_t>(20);
  CLI::App* v = cmd->add_subcommand(
      "validate", "check every slot and block-table entry; exit 2 naming each problem");
  v->add_option("trace", *val_path, "trace file")->required();
  v->add_option("--max-problems", *limit, "problems listed")->capture_default_str();
  v->callback([val_path, limit, &status] { status = run_validate(*val_path, *limit); });
}

}  // namespace kvo::cli
