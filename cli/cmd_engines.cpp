// kvoracle engines: judges the serving engines installed in a Python environment (vLLM, SGLang,
// TensorRT-LLM, FlashInfer) through the Python package's adapters. The engines are Python
// packages, so the work is kvoracle.engines's: this verb runs `python -m kvoracle.engines` with
// the arguments as given (the interpreter: $KVO_PYTHON, else python3 on PATH) and returns its exit
// status (0 every judged kernel passed, 1 one did not, 2 usage, 3 nothing could be judged here).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::cli {

void add_engines(CLI::App& app, int& status) {
  CLI::App* cmd = app.add_subcommand(
      "engines",
      "judge the engine kernels installed in Python (python -m kvoracle.engines; its options: "
      "--cases, --seed, --device, --engine, --json, --junit; $KVO_PYTHON picks the interpreter)");
  cmd->prefix_command();  // everything after the verb is kvoracle.engines's
  cmd->set_help_flag();   // --help is kvoracle.engines's too
  cmd->callback([cmd, &status] {
    const char* env = std::getenv("KVO_PYTHON");
    const std::string python = env != nullptr && *env != '\0' ? env : "python3";
    std::vector<std::string> words = {python, "-m", "kvoracle.engines"};
    for (const std::string& a : cmd->remaining()) words.push_back(a);
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    std::fflush(stdout);
    execvp(argv[0], argv.data());
    // Only reached when the interpreter could not be started.
    std::fprintf(stderr,
                 "kvoracle engines: cannot run %s: %s (set KVO_PYTHON to a Python with "
                 "kvoracle installed)\n",
                 python.c_str(), std::strerror(errno));
    status = spec::kExitFailedToRun;
  });
}

}  // namespace kvo::cli
