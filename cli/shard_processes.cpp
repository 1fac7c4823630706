// kvoracle check --gpus / --processes: shard processes of this binary, their reports merged.
#include "shard_processes.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/report_files.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/traces/safetensors.hpp"

extern char** environ;

namespace kvo::cli {
namespace {

namespace fs = std::filesystem;

/// Whether `arg` is `--name` itself or `--name=value`.
bool is_flag(const std::string& arg, const std::string& name) {
  return arg == name || arg.rfind(name + "=", 0) == 0;
}

/// The last `n` lines of a file (a failed shard's log), indented.
std::string log_tail(const fs::path& path, int n) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string out;
  for (std::size_t i = lines.size() > static_cast<std::size_t>(n) ? lines.size() - n : 0;
       i < lines.size(); ++i) {
    out += "    " + lines[i] + "\n";
  }
  return out;
}

/// This environment with CUDA_VISIBLE_DEVICES set to `device` (unchanged when empty).
std::vector<std::string> child_environment(const std::string& device) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!device.empty() && std::strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) == 0) continue;
    env.emplace_back(*e);
  }
  if (!device.empty()) env.push_back("CUDA_VISIBLE_DEVICES=" + device);
  return env;
}

/// NUL-terminated pointer arrays over strings that outlive them.
std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

/// Starts args with stdout and stderr into `log`; its pid.
pid_t spawn(std::vector<std::string> args, std::vector<std::string> env, const fs::path& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);  // nothing to read
  std::vector<char*> argv = c_strings(args), envp = c_strings(env);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    throw std::runtime_error("cannot start a shard process (" + args[0] +
                             "): " + std::strerror(rc));
  }
  return pid;
}

}  // namespace

ShardProcessPlan gpu_shard_plan(const std::string& value, int visible,
                                const std::string& why_none) {
  long asked = 0;  // 0: all
  if (value != "all") {
    char* end = nullptr;
    asked = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || asked < 1 || asked > 1024) {
      throw spec::InvalidInput("gpus", -1, value, "expected all or a count in [1, 1024]");
    }
  }
  if (visible <= 0) {
    throw std::runtime_error("--gpus " + value + ": no GPU answers (" + why_none + ")");
  }
  if (asked > visible) {
    throw spec::InvalidInput("gpus", -1, value,
                             "only " + std::to_string(visible) + " GPU(s) visible");
  }
  const int count = asked == 0 ? visible : static_cast<int>(asked);
  ShardProcessPlan plan;
  plan.count = count;
  // The visible devices' names as the runtime numbers them: CUDA_VISIBLE_DEVICES' entries where it
  // is set (a scheduler's allocation), else 0 .. visible - 1.
  std::vector<std::string> names;
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES"); cvd != nullptr && *cvd != '\0') {
    std::stringstream ss(cvd);
    for (std::string name; std::getline(ss, name, ',');) names.push_back(name);
  }
  for (int i = 0; i < count; ++i) {
    plan.devices.push_back(i < static_cast<int>(names.size()) ? names[i] : std::to_string(i));
  }
  return plan;
}

std::vector<std::string> command_line_without_split_flags() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> all;
  for (std::string arg; std::getline(in, arg, '\0');) all.push_back(arg);
  if (all.empty()) throw std::runtime_error("cannot read this process's command line");
  all[0] = fs::read_symlink("/proc/self/exe").string();  // the binary, wherever it was found
  std::vector<std::string> out;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i] == "--gpus" || all[i] == "--processes") {
      ++i;  // and its value
      continue;
    }
    if (is_flag(all[i], "--gpus") || is_flag(all[i], "--processes")) continue;
    out.push_back(all[i]);
  }
  return out;
}

int run_shard_processes(const ShardProcessPlan& plan, const std::vector<std::string>& args,
                        const std::string& junit, const std::string& json, bool coverage) {
  bool has_jobs = false, has_junit = false;
  for (const std::string& a : args) {
    has_jobs = has_jobs || is_flag(a, "--jobs") || a.rfind("-j", 0) == 0;
    has_junit = has_junit || is_flag(a, "--junit");
  }
  // The hardware threads shared among the shards, where the command line does not say.
  const std::int64_t jobs_each = std::max<std::int64_t>(1, oracle::campaign_jobs(0) / plan.count);
  std::string dir_template = (fs::temp_directory_path() / "kvoracle-shards-XXXXXX").string();
  if (mkdtemp(dir_template.data()) == nullptr) {
    throw std::runtime_error("cannot create a folder for the shards' reports: " +
                             std::string(std::strerror(errno)));
  }
  const fs::path dir = dir_template;
  std::printf("kvoracle check: %d shard processes%s, reports and logs in %s\n", plan.count,
              plan.devices.empty() ? "" : ", one per GPU", dir.c_str());
  std::fflush(stdout);
  std::vector<pid_t> pids;
  std::vector<std::string> reports;
  for (int i = 0; i < plan.count; ++i) {
    const std::string stem = "shard_" + std::to_string(i);
    std::vector<std::string> child = args;
    // These flags come last, so they win (check declares them take-last).
    for (const std::string& a :
         {std::string("--total-shards"), std::to_string(plan.count), std::string("--shard-index"),
          std::to_string(i), std::string("--json"), (dir / (stem + ".json")).string()}) {
      child.push_back(a);
    }
    if (has_junit) child.insert(child.end(), {"--junit", (dir / (stem + ".xml")).string()});
    if (!has_jobs) child.insert(child.end(), {"--jobs", std::to_string(jobs_each)});
    const std::string device = plan.devices.empty() ? "" : plan.devices[i];
    try {
      pids.push_back(spawn(child, child_environment(device), dir / (stem + ".log")));
    } catch (...) {
      for (const pid_t pid : pids) kill(pid, SIGTERM), waitpid(pid, nullptr, 0);  // no orphans
      throw;
    }
    reports.push_back((dir / (stem + ".json")).string());
  }
  // Every shard runs to its end; then their verdicts.
  int worst_exit = spec::kExitPass;
  std::vector<oracle::CheckReport> shards;
  std::string failures;
  for (int i = 0; i < plan.count; ++i) {
    int status = 0;
    while (waitpid(pids[i], &status, 0) < 0 && errno == EINTR) {
    }
    const fs::path log = dir / ("shard_" + std::to_string(i) + ".log");
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    const std::string device = plan.devices.empty() ? "" : ", GPU " + plan.devices[i];
    std::printf("shard %d of %d%s: exit %s, log %s\n", i, plan.count, device.c_str(),
                code >= 0 ? std::to_string(code).c_str()
                          : ("signal " + std::to_string(WTERMSIG(status))).c_str(),
                log.c_str());
    // A report (written atomically into a fresh folder) means the shard's campaign ran to its end,
    // whatever its verdict: a mismatch, or a subject or the tier that failed to run, is in it.
    if (fs::exists(reports[i])) {
      const std::vector<std::uint8_t> bytes = traces::read_file_bytes(reports[i], "report");
      shards.push_back(
          oracle::read_report_json(std::string(bytes.begin(), bytes.end()), reports[i]));
      continue;
    }
    // No report: the shard's own failure (bad input: status 2; anything else: failed to run).
    const int exit =
        code == spec::kExitInvalidInput ? spec::kExitInvalidInput : spec::kExitFailedToRun;
    worst_exit = std::max(worst_exit, exit);
    failures +=
        "shard " + std::to_string(i) + " left no report; the end of its log:\n" + log_tail(log, 8);
  }
  if (!failures.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvoracle: %s", failures.c_str());
    return worst_exit;
  }
  const oracle::CheckReport merged = oracle::merge_reports(shards, reports);
  std::cout << merged.summary() << std::endl;
  if (coverage) std::cout << merged.coverage_table() << std::flush;
  if (!junit.empty()) oracle::write_file_atomically(junit, oracle::junit_xml(merged));
  if (!json.empty()) oracle::write_file_atomically(json, oracle::report_json(merged));
  // The shards' files are kept where a shard did not pass (their logs hold the shrunk failures).
  if (merged.worst == spec::Outcome::kPass) fs::remove_all(dir);
  return spec::exit_status(merged.worst);
}

}  // namespace kvo::cli
