#pragma once
/// \file shard_processes.hpp
/// `kvoracle check --gpus all|N` and `--processes N` (issue 15): the campaign as N shard processes
/// of this binary on this host, GoogleTest-convention shards (--total-shards N --shard-index i),
/// each pinned to one GPU under --gpus (CUDA_VISIBLE_DEVICES), their JSON reports merged into one
/// verdict as `kvoracle report merge` does. The cases and the merged report are those of one
/// process with the same seed.

#include <string>
#include <vector>

namespace kvo::cli {

/// One shard per process: count processes; devices[i] (when not empty) is child i's
/// CUDA_VISIBLE_DEVICES.
struct ShardProcessPlan {
  int count = 1;
  std::vector<std::string> devices;
};

/// The plan of `--gpus value` ("all" or a count): one process per visible device, the i-th of
/// CUDA_VISIBLE_DEVICES where it is set. Throws spec::InvalidInput for a malformed count or one
/// above the visible devices, std::runtime_error (failed to run) where no GPU answers.
ShardProcessPlan gpu_shard_plan(const std::string& value, int visible, const std::string& why_none);

/// The command line of this process (/proc/self/cmdline), less `--gpus X` and `--processes X`.
std::vector<std::string> command_line_without_split_flags();

/// Runs `args` (args[0] the binary) as plan.count shard processes, each with --total-shards,
/// --shard-index, --json <its report> (and, where args have no --jobs, --jobs of the hardware
/// threads over the shards) added, its output in a log file; waits for all; prints each shard's
/// outcome and the merged summary (coverage too when asked); writes the merged JUnit / JSON where
/// asked. Returns the exit status: the merged verdict's, or the worst failure of a shard that left
/// no report.
int run_shard_processes(const ShardProcessPlan& plan, const std::vector<std::string>& args,
                        const std::string& junit, const std::string& json, bool coverage);

}  // namespace kvo::cli
