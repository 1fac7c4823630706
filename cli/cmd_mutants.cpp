// kvoracle mutants: the mutation score. Each catalogued planted bug runs against the campaign until
// the oracle kills it; one line per mutant, then killed K/N. Exit 0 when every mutant is killed, 1
// when one survives (a bug the oracle would miss).
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "kvo/oracle/mutants.hpp"
#include "options.hpp"

namespace kvo::cli {
namespace {

struct MutantFlags {
  std::int64_t cases = 200;
  std::string seed = "0x6D757461";
  std::vector<std::string> names;
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
  std::printf("kvoracle mutants: seed 0x%016llX, up to %lld cases each\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(f.cases));
  std::printf("%-28s %-10s %-9s %6s  %s\n", "mutant", "op", "result", "cases", "models");
  std::fflush(stdout);
  const auto results = oracle::run_mutants(seed, f.cases, f.names);
  int killed = 0, ran = 0;
  for (const auto& r : results) {
    const std::string op(spec::name_of(r.op));
    if (!r.skipped.empty()) {
      std::printf("%-28s %-10s %-9s %6s  %s\n", r.name.c_str(), op.c_str(), "skipped", "-",
                  r.skipped.c_str());
      continue;
    }
    ++ran;
    killed += r.killed;
    std::printf("%-28s %-10s %-9s %6lld  %s\n", r.name.c_str(), op.c_str(),
                r.killed ? "killed" : "SURVIVED", static_cast<long long>(r.cases),
                r.models.c_str());
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
  cmd->add_flag("--list", f->list, "list the catalogue and the bug each models");
  cmd->callback([f, &status] { status = run_mutants_verb(*f); });
}

}  // namespace kvo::cli
