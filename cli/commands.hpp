#pragma once
/// \file commands.hpp
/// The verbs of `kvoracle`. Each add_<verb> registers a CLI11 subcommand whose callback runs the
/// verb and stores its exit status (spec::kExit*) in `status`. Verbs stay thin: the work is done by
/// the libraries the tests also use.

#include <CLI/CLI.hpp>

namespace kvo::cli {

void add_check(CLI::App& app, int& status);
void add_quant(CLI::App& app, int& status);
void add_layout(CLI::App& app, int& status);
void add_trace(CLI::App& app, int& status);
void add_replay(CLI::App& app, int& status);
void add_mutants(CLI::App& app, int& status);
void add_explain(CLI::App& app, int& status);
void add_case(CLI::App& app, int& status);
void add_judge(CLI::App& app, int& status);
void add_report(CLI::App& app, int& status);
void add_engines(CLI::App& app, int& status);

}  // namespace kvo::cli
