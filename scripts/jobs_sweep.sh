# Sourced by campaign_scaling.sh and replay_speed.sh: one kvoracle run per job count (1, 2, 4, ...
# up to this machine's hardware threads), each run's report compared with one job's, the time,
# the rate and the speedup over one job measured in the same sweep.
# jobs_sweep UNIT COUNT RUN: RUN J OUT is called for each job count J and writes the report to
# compare (timing left out) to OUT; UNIT names what COUNT counts ("cases", "steps").
jobs_sweep() {
  local unit=$1 count=$2 run=$3 threads j t0 t1 rc s base same
  local dir
  dir=$(mktemp -d)
  threads=$(nproc)
  local jobs=(1)
  while ((jobs[-1] * 2 <= threads)); do jobs+=($((jobs[-1] * 2))); done
  ((jobs[-1] != threads)) && jobs+=("$threads")
  printf '%-6s %9s %9s %8s  %s\n' jobs seconds "$unit/s" speedup report
  for j in "${jobs[@]}"; do
    t0=$(date +%s.%N)
    set +e
    "$run" "$j" "$dir/$j.report"
    rc=$?
    set -e
    t1=$(date +%s.%N)
    same="same as 1 job"
    cmp -s "$dir/1.report" "$dir/$j.report" || same="DIFFERS from 1 job"
    s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
    [[ $j == 1 ]] && base=$s
    awk -v j="$j" -v s="$s" -v n="$count" -v b="$base" -v same="$same" -v rc="$rc" \
      'BEGIN { printf "%-6s %9.2f %9.1f %8.2f  %s (exit %d)\n", j, s, n / s, b / s, same, rc }'
  done
  rm -rf "$dir"
}
