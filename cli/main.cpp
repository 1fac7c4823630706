// kvoracle: the debugging and CI command line. Exit status: 0 pass, 1 mismatch found, 2 invalid
// input or usage, 3 failed to run.
#include <cstdio>
#include <exception>

#include "commands.hpp"
#include "kvo/spec/outcome.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvoracle: bit-exact reference and correctness oracle for paged KV-cache kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvoracle " KVO_VERSION);  // CMakeLists.txt's project()
  int status = kvo::spec::kExitPass;
  kvo::cli::add_check(app, status);
  kvo::cli::add_quant(app, status);
  kvo::cli::add_layout(app, status);
  kvo::cli::add_trace(app, status);
  kvo::cli::add_replay(app, status);
  kvo::cli::add_mutants(app, status);
  kvo::cli::add_explain(app, status);
  kvo::cli::add_case(app, status);
  kvo::cli::add_judge(app, status);
  kvo::cli::add_report(app, status);
  kvo::cli::add_engines(app, status);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kvo::spec::kExitInvalidInput;
  } catch (const kvo::spec::InvalidInput& e) {
    std::fprintf(stderr, "kvoracle: %s\n", e.what());
    return kvo::spec::kExitInvalidInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvoracle: failed to run: %s\n", e.what());
    return kvo::spec::kExitFailedToRun;
  }
  return status;
}
