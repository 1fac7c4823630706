#!/usr/bin/env bash
# The campaign over jobs (issue 15): `kvoracle check` from one seed with --jobs 1, 2, 4, ... up to
# this machine's hardware threads, every report checked identical to one job's (the JSON, timing
# left out), cases/s and the speedup over one job measured in the same run.
# Usage: scripts/campaign_scaling.sh [cases (default 400)] [more `kvoracle check` flags...]
# KVO_BIN: the kvoracle binary (default build/cli/kvoracle).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${KVO_BIN:-$root/build/cli/kvoracle}
cases=${1:-400}
(($# > 0)) && shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=jobs_sweep.sh
source "$root/scripts/jobs_sweep.sh"
run() {  # jobs, report file
  "$bin" check --cases "$cases" --jobs "$1" --json "$tmp/$1.json" "${flags[@]}" >"$tmp/$1.txt" 2>&1
  local rc=$?
  grep -v '"seconds"' "$tmp/$1.json" >"$2" || true
  return $rc
}
flags=("$@")
jobs_sweep cases "$cases" run
