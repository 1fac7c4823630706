#!/usr/bin/env bash
# kvoracle's main job: a property campaign on every subject available (the CPU emulations always,
# the CUDA kernels when a GPU answers), ending in a one-screen summary. Arguments go to
# `kvoracle check` (default: 2000 cases from the fixed seed); exit status is check's.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/build.sh" >&2
if (($# == 0)); then set -- --cases 2000; fi
exec "$root/build/cli/kvoracle" check "$@"
