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
threads=$(nproc)
jobs=(1)
while ((jobs[-1] * 2 <= threads)); do jobs+=($((jobs[-1] * 2))); done
((jobs[-1] != threads)) && jobs+=("$threads")
printf '%-6s %9s %9s %8s  %s\n' jobs seconds cases/s speedup report
for j in "${jobs[@]}"; do
  t0=$(date +%s.%N)
  set +e
  "$bin" check --cases "$cases" --jobs "$j" --json "$tmp/$j.json" "$@" >"$tmp/$j.txt" 2>&1
  rc=$?
  set -e
  t1=$(date +%s.%N)
  grep -v '"seconds"' "$tmp/$j.json" >"$tmp/$j.untimed" || true
  same="same as 1 job"
  cmp -s "$tmp/1.untimed" "$tmp/$j.untimed" || same="DIFFERS from 1 job"
  s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
  [[ $j == 1 ]] && base=$s
  awk -v j="$j" -v s="$s" -v n="$cases" -v b="$base" -v same="$same" -v rc="$rc" \
    'BEGIN { printf "%-6s %9.2f %9.1f %8.2f  %s (exit %d)\n", j, s, n / s, b / s, same, rc }' 
done
