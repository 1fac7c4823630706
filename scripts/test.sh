#!/usr/bin/env bash
# The whole test suite: set-up, build, then every ctest test (GPU tests skip without a GPU; the
# exhaustive fp8/bf16/fp16 sweep against CUDA's host functions runs when the toolkit is installed).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/build.sh"
jobs=$(nproc 2>/dev/null || echo 2)
cd "$root/build"
ctest --output-on-failure -j "$jobs" "$@"
