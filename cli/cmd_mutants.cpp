// kvoracle mutants: the mutation score. Each catalogued planted bug runs against the campaign until
// the oracle kills it; one line per mutant, then killed K/N. Exit 0 when every mutant is killed, 1
// when one survives (a bug the oracle would miss).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvo/oracle/mutants.hpp"
#include "options.hpp"

namespace kvo::cli {
namespace {

struct MutantFlags {
  std::int64_t cases = 200;
  std::string seed = "0x6D757461";
  std::vector<std::string> names;
  std::int64_t seeds = 20;
  std::int64_t jobs = 0;
  bool targeted = false;
  bool list = false;
};

int run_mutants_verb(const MutantFlags& f) {
  if (f.list) {
    for (const auto& m : oracle::mutant_catalogue()) {
      std::printf("%-28s %-10s %s\n", m.name.c_str(), std::string(spec::name_of(m.op)).c_str(),
                  m.models.c_str());
    }
    return spec::kExitPass;
  }
  const std::uint64_t seed = parse_u64(f.seed, "seed");
  if (f.cases < 1) throw spec::InvalidInput("cases", -1, std::to_string(f.cases), "must be >= 1");
  std::printf(
      "kvoracle mutants: seed 0x%016llX, up to %lld cases each, %s; cases-to-kill over %lld "
      "campaign seeds\n",
      static_cast<unsigned long long>(seed), static_cast<long long>(f.cases),
      f.targeted ? "each mutant's own conditions (--targeted)" : "the default case distribution",
      static_cast<long long>(f.seeds));
  std::printf("%-38s %-10s %-9s %6s %7s %6s %7s  %s\n", "mutant", "op", "result", "cases", "median",
              "worst", "seeds", "models");
  std::fflush(stdout);
  oracle::MutantRun run;
  run.seed = seed;
  run.max_cases = f.cases;
  run.names = f.names;
  run.seeds = f.seeds;
  run.jobs = f.jobs;
  run.targeted = f.targeted;
  const auto results = oracle::run_mutants(run);
  std::vector<double> medians;
  int killed = 0, ran = 0;
  for (const auto& r : results) {
    const std::string op(spec::name_of(r.op));
    if (!r.skipped.empty()) {
      std::printf("%-38s %-10s %-9s %6s %7s %6s %7s  %s\n", r.name.c_str(), op.c_str(), "skipped",
                  "-", "-", "-", "-", r.skipped.c_str());
      continue;
    }
    ++ran;
    killed += r.killed;
    medians.push_back(r.median_cases);
    const std::string seeds = std::to_string(r.seeds_killed) + "/" + std::to_string(r.seeds);
    std::printf("%-38s %-10s %-9s %6lld %7.1f %6lld %7s  %s\n", r.name.c_str(), op.c_str(),
                r.killed ? "killed" : "SURVIVED", static_cast<long long>(r.cases), r.median_cases,
                static_cast<long long>(r.worst_cases), seeds.c_str(), r.models.c_str());
  }
  std::sort(medians.begin(), medians.end());
  if (!medians.empty()) {
    std::printf(
        "median cases-to-kill over the mutants (each its median over %lld seeds): %.1f; "
        "largest median %.1f\n",
        static_cast<long long>(f.seeds), medians[medians.size() / 2], medians.back());
  }
  std::printf("killed %d/%d\n", killed, ran);
  return killed == ran ? spec::kExitPass : spec::kExitMismatch;
}

}  // namespace

void add_mutants(CLI::App& app, int& status) {
  auto f = std::make_shared<MutantFlags>();
  CLI::App* cmd =
      app.add_subcommand("mutants", "mutation score: run the campaign against every planted bug");
  cmd->add_option("--cases", f->cases, "cases per mutant before it counts as surviving")
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "campaign seed (decimal or 0x-hex)")->capture_default_str();
  cmd->add_option("--mutant", f->names, "only these mutants (repeatable)");
  cmd->add_option("--seeds", f->seeds,
                  "campaign seeds for each mutant's median cases-to-kill (the first is --seed)")
      ->capture_default_str();
  cmd->add_option(
      "--jobs,-j", f->jobs,
      "mutants run at once on the CPU (0: one per hardware thread); the results are the "
      "same for any number");
  cmd->add_flag("--targeted", f->targeted,
                "run each mutant under its own conditions instead of the default distribution");
  cmd->add_flag("--list", f->list, "list the catalogue and the bug each models");
  cmd->callback([f, &status] { status = run_mutants_verb(*f); });
}

}  // namespace kvo::cli
