#!/usr/bin/env bash
# The GPU campaign in one call: GPU tests (8 shards in parallel), compute-sanitizer memcheck and
# racecheck over a reduced test run, the CLI campaign, replay and mutants, the Python package on the
# GPU, the real-kernel modes, the benchmarks, and a short table printed last.
#
#   gpu/run_on_device.sh --stage   (here, on a machine with nvcc and the Debian test/bench
#                                   packages) builds build-gpu/ and copies the binaries, plus
#                                   libbenchmark and fallback C++ runtimes, into .device/bin
#   gpu/run_on_device.sh           (on the device, with .device carried) runs everything; if no
#                                   staged binaries are present it tries to build them there.
#
# Environment: OUT (default ./device-out) receives summary.txt, bench.json and logs.tar.gz;
# KVO_GPU_CASES random cases per RandomCases shard (default 400; 8 shards); SAN_CASES (default
# 40) for the sanitizer runs; KVO_DEADLINE_S (default 550) the whole run's wall-clock budget;
# KVO_STAGES (default all) the stages to run, comma-separated: tests, campaign (10,000 random read
# cases, KVO_READ_CAMPAIGN_CASES per shard, each round of four shards at most
# KVO_CAMPAIGN_ROUND_S seconds), sanitizers, bench, profile (ncu on both indexer paths, the fused
# write and the sparse decode kernels, with their instruction mixes), cli
# (check and replay), scaling (the
# campaign over jobs, and over GPUs: check --gpus all), tier (the GPU reference tier against the CPU's), mutants, peer (kvoracle's
# fused write against the Triton peer, bench/bench_write_peer.py), python (KVO_PYTHON_PARTS of
# "tests bench engines"; engines: `kvoracle engines`,
# KVO_ENGINE_CASES cases a configuration, over the engines' code if .engines/site or
# .device/engines.tar.xz is carried), example, modes.
# KVO_TEST_FILTER and KVO_SAN_FILTER narrow the tests and sanitizer stages (gtest filters);
# KVO_SAN_TOOLS (default "memcheck racecheck") and KVO_SAN_LIMIT_S (default 150 s a tool) the
# sanitizer stage's tools and each one's limit (racecheck to its end: racecheck alone, 540 s);
# KVO_TIER_PARTS the tier stage's parts (writes, write-campaign, replay, prod, reads; default all);
# --stage with KVO_STAGE_BENCH=1 stages only what the bench, profile and peer stages use;
# --stage with KVO_STAGE_LEAN=1 leaves out the example stage's binaries and puts what only the
# python and peer stages use into .device/py.tar.xz, to be carried alone (KVO_STAGES=python,peer).
# Everything takes about 1500 s, past one device call (600 s): run it as three calls,
# KVO_STAGES=tests,sanitizers (about 420 s), then KVO_STAGES=campaign,bench,cli,peer, then
# KVO_STAGES=scaling,tier,mutants,python,example,modes.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/.device/bin

if [[ "${1:-}" == "--stage" ]]; then
  set -e
  # The build scripts/build.sh makes (build/: position-independent, the Python extension on), so
  # that staging after the test suite rebuilds nothing.
  B=${KVO_STAGE_BUILD:-$ROOT/build}
  bash "$ROOT/scripts/venv.sh"
  cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVO_BUILD_PYTHON=ON \
    -DPython_EXECUTABLE="$ROOT/.venv/bin/python" >/dev/null
  ninja -C "$B" test_gpu_write test_traces bench_write_gpu bench_read_gpu bench_alias_gpu kvoracle _core \
    kvo_bench_write
  mkdir -p "$BIN/fallback" "$BIN/pylibs"
  cp "$B/tests/gpu/test_gpu_write" "$B/tests/traces/test_traces" "$B/bench/bench_write_gpu" \
     "$B/bench/bench_read_gpu" "$B/bench/bench_alias_gpu" "$B/cli/kvoracle" \
     "$B/bench/libkvo_bench_write.so" "$BIN/"
  # The Python extension is built on the device for its Python (python/prebuilt) against these.
  # The libraries of the build itself: not the copies installed or kept by the package tests
  # (tests/package/example_run/prefix), which may be older and would overwrite them here.
  find "$B" -name 'libkvo_*.a' -not -path '*/install/*' -not -path '*/example/*' \
    -not -path "$B/tests/*" -exec cp {} "$BIN/pylibs/" \;
  strip -g "$BIN"/pylibs/*.a
  # The user's-kernel example (examples/cpp) built as a user builds it: against the installed
  # package, with find_package(kvoracle); its CUDA twin runs on the device (section 3e).
  cmake --install "$B" --prefix "$B/install" >/dev/null
  cmake -S "$ROOT/examples/cpp" -B "$B/example" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$B/install" \
    "-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc" >/dev/null
  ninja -C "$B/example"
  cp "$B/example/test_my_cuda_kernels" "$B/example/test_my_kernels" "$BIN/"
  cp -L /lib/x86_64-linux-gnu/libbenchmark.so.1debian "$BIN/"
  cp -L /lib/x86_64-linux-gnu/libstdc++.so.6 /lib/x86_64-linux-gnu/libgcc_s.so.1 "$BIN/fallback/"
  ls -la "$BIN" "$BIN/pylibs"
  # The device tool carries at most 64 MiB: the stripped binaries travel as one xz archive.
  strip "$BIN"/kvoracle "$BIN"/test_gpu_write "$BIN"/test_traces "$BIN"/bench_write_gpu \
    "$BIN"/bench_read_gpu "$BIN"/bench_alias_gpu "$BIN"/test_my_cuda_kernels "$BIN"/test_my_kernels
  strip --strip-unneeded "$BIN"/libkvo_bench_write.so
  # KVO_STAGE_LEAN=1: without what only the python, peer and example stages use (the device tool
  # carries 64 MiB with the tree; the whole set is past it). The python and peer stages' part goes
  # to .device/py.tar.xz instead (the static libraries the extension is built from, the benchmark
  # library): carry it alone for KVO_STAGES=python,peer.
  rm -f "$ROOT/.device/py.tar.xz"
  if [[ ${KVO_STAGE_BENCH:-0} == 1 ]]; then
    # KVO_STAGE_BENCH=1: what the bench, profile and peer stages use, in one archive under the
    # device tool's limit, so that kvoracle, the Triton peer, copy and an empty launch are timed in
    # one call (KVO_STAGES=bench,peer,profile).
    rm -f "$BIN"/kvoracle "$BIN"/test_gpu_write "$BIN"/test_traces "$BIN"/test_my_cuda_kernels \
      "$BIN"/test_my_kernels
  elif [[ ${KVO_STAGE_LEAN:-0} == 1 ]]; then
    mkdir -p "$ROOT/.device/py/bin"
    mv "$BIN/pylibs" "$ROOT/.device/py/bin/"
    cp "$BIN/libkvo_bench_write.so" "$BIN/libbenchmark.so.1debian" "$ROOT/.device/py/bin/"
    tar -C "$ROOT/.device/py" -cf - bin | xz -T2 -6 >"$ROOT/.device/py.tar.xz"
    rm -rf "$ROOT/.device/py" "$BIN/test_my_cuda_kernels" "$BIN/test_my_kernels"
  fi
  tar -C "$ROOT/.device" -cf - bin | xz -T2 -9e >"$ROOT/.device/bin.tar.xz"
  rm -rf "$BIN"
  ls -la "$ROOT/.device"
  exit 0
fi
# The carried archives, unpacked on every run (a warm machine keeps the last call's .device/bin).
if [[ -f "$ROOT/.device/bin.tar.xz" ]]; then
  rm -rf "$BIN" && tar -C "$ROOT/.device" -xJf "$ROOT/.device/bin.tar.xz"
fi
if [[ -f "$ROOT/.device/py.tar.xz" ]]; then
  rm -rf "$BIN/pylibs" && tar -C "$ROOT/.device" -xJf "$ROOT/.device/py.tar.xz"
fi

OUT=${OUT:-$ROOT/device-out}
LOGS=$(mktemp -d /tmp/kvo-logs.XXXX)
mkdir -p "$OUT"
# Random write cases per test shard: one in eight is a huge cache (8-9 GB on the device), so 400
# keeps the whole run inside its deadline.
CASES=${KVO_GPU_CASES:-400}
SAN_CASES=${SAN_CASES:-40}
export RC_PARAMS=${RC_PARAMS:-"seed=20261129 max_success=300 verbose_progress=0"}
START=$(date +%s)
STAGES=${KVO_STAGES:-all}
want() { [[ ",$STAGES," == *",all,"* || ",$STAGES," == *",$1,"* ]]; }
T_TESTS=-; T_CAMP=-; T_SAN=-; T_BENCH=-; T_CLI=-; T_SCALE=-; T_TIER=-; T_MUT=-; T_PEER=-; T_PY=-; T_MODES=-
# Every stage's limit is cut to what is left before the deadline (the device tool's calls end at
# 600 s), so that the table below is always written; a stage cut short shows exit 124 in its log.
DEADLINE=$((START + ${KVO_DEADLINE_S:-550}))
budget() {
  local left=$((DEADLINE - $(date +%s)))
  ((left < 1)) && left=1
  echo $(($1 < left ? $1 : left))
}

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  nvcc --version | tail -1
} >"$LOGS/machine.txt" 2>&1

# 0. Binaries: staged ones, else build here (not for the python and peer stages alone, which use
# the extension's libraries: .device/py.tar.xz).
python_side_only() {
  [[ ",$STAGES," == *",all,"* ]] && return 1
  local st
  for st in ${STAGES//,/ }; do [[ $st == python || $st == peer ]] || return 1; done
}
# A staged archive's binaries are used as they are (a bench-only one has no test binaries).
if [[ ! -x "$BIN/test_gpu_write" && ! -x "$BIN/bench_write_gpu" ]] && ! python_side_only; then
  echo "no staged binaries: building on the device" | tee "$LOGS/build.txt"
  cmake -S "$ROOT" -B "$ROOT/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release >>"$LOGS/build.txt" 2>&1 &&
    ninja -C "$ROOT/build-gpu" test_gpu_write bench_write_gpu bench_read_gpu >>"$LOGS/build.txt" 2>&1 &&
    mkdir -p "$BIN" && cp "$ROOT/build-gpu/tests/gpu/test_gpu_write" "$ROOT/build-gpu/bench/bench_write_gpu" \
      "$ROOT/build-gpu/bench/bench_read_gpu" "$BIN/"
fi
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ! "$BIN/bench_write_gpu" --benchmark_list_tests >/dev/null 2>&1; then
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$BIN/fallback"
  echo "using the carried libstdc++ (fallback)" >>"$LOGS/machine.txt"
fi
if [[ -x "$BIN/test_gpu_write" ]]; then
  "$BIN/test_gpu_write" --gtest_list_tests >"$LOGS/test_list.txt" 2>&1 || echo "test binary does not start" | tee -a "$LOGS/machine.txt"
fi

# 0b. The Python extension for this machine's Python (torch's), built in the background while the
# GPU tests run: the module source against the staged static libraries (python/prebuilt).
PY=${KVO_DEVICE_PYTHON:-python3}
PYBUILD=/tmp/kvo-py
(cmake -S "$ROOT/python/prebuilt" -B "$PYBUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
   -DKVO_LIB_DIR="$BIN/pylibs" -DPython_EXECUTABLE="$(command -v "$PY")" &&
   ninja -C "$PYBUILD"; echo "exit $?") >"$LOGS/python_build.txt" 2>&1 &

# 1. GPU tests, 8 shards in parallel.
passed=0; failed=0; skipped=0; cases=0; OOM_FAILED=-; MEM_SKIPPED=-
if want tests; then
for i in 0 1 2 3 4 5 6 7; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i KVO_GPU_CASES=$CASES \
    timeout $(budget 240) "$BIN/test_gpu_write" --gtest_filter="${KVO_TEST_FILTER:-*}" \
    >"$LOGS/tests_$i.log" 2>&1 &
done
# The GPU tests of the trace replay (its GPU reference tier) against the committed traces here.
KVO_TRACE_DATA_DIR=$ROOT/traces/data timeout $(budget 120) "$BIN/test_traces" \
  --gtest_filter='TraceReplayTier.*:TraceReplayResident.*' >"$LOGS/tests_traces.log" 2>&1 &
wait
# Eight processes share the device: an allocation that does not fit waits for the others to free
# memory, then skips its case ("needs N GiB"), so no test fails for want of memory and none is
# rerun (issue 54). The table counts both, and the device's memory.
OOM_FAILED=$(grep -l 'out of memory' "$LOGS"/tests_[0-7].log 2>/dev/null | xargs -r grep -h '^\[  FAILED  \] .*(' | sort -u | wc -l)
MEM_SKIPPED=$(grep -ho 'skipped: needs [0-9.]* GiB' "$LOGS"/tests_[0-7].log 2>/dev/null | wc -l)
T_TESTS=$(($(date +%s) - START))
for i in 0 1 2 3 4 5 6 7; do
  f=$LOGS/tests_$i.log
  passed=$((passed + $(grep -c '^\[       OK \]' "$f")))
  failed=$((failed + $(grep -c '^\[  FAILED  \].*(' "$f")))
  skipped=$((skipped + $(grep -c '^\[  SKIPPED \].*(' "$f")))
  c=$(grep -o 'random cases diffed: [0-9]*' "$f" | tail -1 | awk '{print $4}')
  cases=$((cases + ${c:-0}))
done
fi

# 1b. The read campaign: 8 shards of KVO_READ_CAMPAIGN_CASES (default 1250) random read cases each,
# 10,000 in all (canonical indexer, sparse and dense attention bit-exact; the fast family in foreign
# mode), four processes at a time: eight at once ran out of device memory (session 15).
CAMP_SHARDS=0; CAMP_CASES=0
if want campaign; then
for round in 0 4; do
  for k in 0 1 2 3; do
    i=$((round + k))
    GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i KVO_GPU_READ_CASES=${KVO_READ_CAMPAIGN_CASES:-1250} \
      KVO_GPU_READ_LONG=0 timeout $(budget ${KVO_CAMPAIGN_ROUND_S:-150}) "$BIN/test_gpu_write" --gtest_filter='Shards/GpuRead.*' \
      >"$LOGS/campaign_$i.log" 2>&1 &
  done
  wait
done
for i in 0 1 2 3 4 5 6 7; do
  f=$LOGS/campaign_$i.log
  CAMP_SHARDS=$((CAMP_SHARDS + $(grep -c '^\[       OK \]' "$f")))
  c=$(grep -o 'read cases diffed: [0-9]*' "$f" | tail -1 | awk '{print $4}')
  CAMP_CASES=$((CAMP_CASES + ${c:-0}))
done
T_CAMP=$(($(date +%s) - START))
fi

# 2. compute-sanitizer over a reduced run (fused and unfused kernels, planted bugs, bad input, the
# specialised attention kernel's instantiations, the flash family's decode kernels);
# memcheck also over the specialised write kernel's instantiations (it uses no shared memory, so
# racecheck has nothing to look at there) and the GPU tier's read campaign (its host threads
# launch the read kernels side by side; racecheck, of shared memory within a kernel, runs past the
# budget there and looks at nothing the other tests do not). racecheck leaves out the planted write
# faults' campaign (77 s under it, and write kernels without shared memory), which kept it from
# reaching the indexer's and attention's tests in its budget.
SAN_FILTER=${KVO_SAN_FILTER:-'Shards/RandomCases.GpuMatchesReference/0:PlantedBug.*:BadInput.*:LegacyWrap.*:DenseInsert.*:Shards/GpuRead.*/0:GpuReadBadInput.*:SpecialisedAttention.*:FusedIndexer.*:GpuBlockTopk.TheOneLaunch*:GpuFlash.Decode*'}
san_errors() { [[ -f $1 ]] && grep -oE '(ERROR SUMMARY: [0-9]+ error|\([0-9]+ errors)' "$1" | tail -1 | grep -oE '[0-9]+'; }
if want sanitizers; then
for tool in ${KVO_SAN_TOOLS:-memcheck racecheck}; do
  filter=$SAN_FILTER
  [[ $tool == memcheck ]] && filter="$SAN_FILTER:SpecialisedWrite.*:ReferenceTierReads.TheGpu*:ReferenceTierReads.TheResident*"
  [[ $tool == racecheck && -z ${KVO_SAN_FILTER:-} ]] && filter="$SAN_FILTER-PlantedBug.CampaignCatchesEachWriteFault"
  KVO_GPU_CASES=$SAN_CASES KVO_SPECIALISED_MAX_TOKENS=40 KVO_DENSE_CASES=10 KVO_GPU_READ_CASES=4 KVO_GPU_READ_LONG=0 KVO_TIER_READ_CASES=12 KVO_GPU_FLASH_DECODE_SPARSE_BLOCKS=1 timeout $(budget ${KVO_SAN_LIMIT_S:-150}) compute-sanitizer --tool $tool --print-limit 20 \
    "$BIN/test_gpu_write" --gtest_filter="$filter" >"$LOGS/sanitizer_$tool.log" 2>&1
  echo "exit $?" >>"$LOGS/sanitizer_$tool.log"
done
MEMCHECK=$(san_errors "$LOGS/sanitizer_memcheck.log"); RACECHECK=$(san_errors "$LOGS/sanitizer_racecheck.log")
MEMCHECK_TESTS=$(grep -sc '^\[       OK \]' "$LOGS/sanitizer_memcheck.log")
RACECHECK_TESTS=$(grep -sc '^\[       OK \]' "$LOGS/sanitizer_racecheck.log")
T_SAN=$(($(date +%s) - START))
fi

# 3. Benchmarks (about 10 s).
# KVO_BENCH_BINARIES (default "write read alias"): which of the three benchmark binaries run.
bench_wanted() { [[ " ${KVO_BENCH_BINARIES:-write read alias} " == *" $1 "* ]]; }
if want bench; then
bench_wanted write && timeout $(budget 150) "$BIN/bench_write_gpu" --benchmark_out="$OUT/bench.json" --benchmark_out_format=json \
  >"$LOGS/bench.txt" 2>&1
echo "exit $?" >>"$LOGS/bench.txt"
bench_wanted read && timeout $(budget 200) "$BIN/bench_read_gpu" --benchmark_out="$OUT/bench_read.json" --benchmark_out_format=json \
  >"$LOGS/bench_read.txt" 2>&1
echo "exit $?" >>"$LOGS/bench_read.txt"
bench_wanted alias && timeout $(budget 120) "$BIN/bench_alias_gpu" --benchmark_out="$OUT/bench_alias.json" \
  --benchmark_out_format=json >"$LOGS/bench_alias.txt" 2>&1
echo "exit $?" >>"$LOGS/bench_alias.txt"
T_BENCH=$(($(date +%s) - START))
fi

# 3a. ncu (--clock-control none: the clocks as the benchmarks see them) on the kernels of issue
# 16's targets: duration, instruction mix (--print-details all prints the sections' tables, the
# executed instruction mix among them), occupancy, warp stalls. The indexer at three contexts (the
# two-launch path's score and top-k kernels, then the fused kernel), then one launch of each of
# the fused write (divide, at 1 and 65,536 tokens) and the sparse decode kernels at batch 64.
if want profile; then
NCU_SECTIONS=(--section SpeedOfLight --section Occupancy --section LaunchStats
  --section InstructionStats --section WarpStateStats --section ComputeWorkloadAnalysis)
for shape in batch:1/context:131072 batch:16/context:16384 batch:1/context:1024; do
  for k in 'index_score|topk_kernel' indexer_fused; do
    timeout $(budget 90) ncu --clock-control none -k "regex:$k" --launch-count 2 \
      "${NCU_SECTIONS[@]}" --print-details all --print-metric-instances details "$BIN/bench_read_gpu" \
      --benchmark_filter="BM_IndexerTopk/$shape/" >>"$LOGS/ncu_${shape//[:\/]/_}.txt" 2>&1
    echo "exit $?" >>"$LOGS/ncu_${shape//[:\/]/_}.txt"
  done
done
# label, binary, benchmark filter, kernel regex, launches skipped (the write's 3D57S model: the
# fourth launch is the first sparse layer's)
while read -r label bin filter kernel skip; do
  timeout $(budget 90) ncu --clock-control none -k "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
    "${NCU_SECTIONS[@]}" --print-details all --print-metric-instances details "$BIN/$bin" --benchmark_filter="$filter" \
    >"$LOGS/ncu_$label.txt" 2>&1
  echo "exit $?" >>"$LOGS/ncu_$label.txt"
done <<'KERNELS'
write_divide_1 bench_write_gpu BM_LayerWrite/flavour:1/tokens:1/ fused_write_decode_kernel 3
write_divide_65536 bench_write_gpu BM_LayerWrite/flavour:1/tokens:65536/ fused_write_decode_kernel 3
decode_canonical_fp8_b64 bench_read_gpu BM_SparseDecode/fp8:1/batch:64/ attention_decode_chunk_kernel 0
decode_flash_bf16_b64 bench_read_gpu BM_SparseDecode/fp8:0/batch:64/ flash_decode_kernel 0
decode_flash_fp8_b64 bench_read_gpu BM_SparseDecode/fp8:1/batch:64/ flash_decode_kernel 0
KERNELS
fi
# 3b. The CLI campaign with every subject (CPU and CUDA), as `kvoracle check` runs it.
if want cli; then
timeout $(budget 90) "$BIN/kvoracle" check --cases 300 >"$LOGS/kvoracle_check.txt" 2>&1
echo "exit $?" >>"$LOGS/kvoracle_check.txt"
# 3b'. The committed traces replayed on every subject (CPU and CUDA), writes, indexer and attention.
for t in "$ROOT"/traces/data/*.st; do
  case "$t" in *planted*) continue ;; esac
  ops=write,indexer,attention
  case "$t" in *dense_insert*) ops=write,dense,indexer,attention ;; esac  # fused dense layers
  timeout $(budget 120) "$BIN/kvoracle" replay "$t" --ops "$ops" >>"$LOGS/kvoracle_replay.txt" 2>&1
  echo "exit $? $(basename "$t")" >>"$LOGS/kvoracle_replay.txt"
done
T_CLI=$(($(date +%s) - START))
fi
# 3b''. The campaign over jobs (issue 15): the CPU subjects alone, then every subject (the CUDA
# ones judged on the main thread), each report identical to one job's.
if want scaling; then
cpu_subjects=$("$BIN/kvoracle" check --list-subjects | awk '$1 ~ /^cpu-/ {print $1}' | paste -sd,)
KVO_BIN="$BIN/kvoracle" timeout $(budget 150) bash "$ROOT/scripts/campaign_scaling.sh" 300 \
  --subject "$cpu_subjects" >"$LOGS/campaign_scaling.txt" 2>&1
echo "exit $? (CPU subjects)" >>"$LOGS/campaign_scaling.txt"
KVO_BIN="$BIN/kvoracle" timeout $(budget 150) bash "$ROOT/scripts/campaign_scaling.sh" 300 \
  >>"$LOGS/campaign_scaling.txt" 2>&1
echo "exit $? (every subject)" >>"$LOGS/campaign_scaling.txt"
KVO_BIN="$BIN/kvoracle" timeout $(budget 150) bash "$ROOT/scripts/replay_speed.sh" 60 \
  >"$LOGS/replay_speed.txt" 2>&1
echo "exit $?" >>"$LOGS/replay_speed.txt"
# One shard process per GPU (check --gpus all, issue 15): the same seed, the same merged report
# (counts and first failures; timing aside) as one process, and the time of each.
for mode in one all; do
  gpus_flag=(); [[ $mode == all ]] && gpus_flag=(--gpus all)
  t0=$(date +%s%N)
  timeout $(budget 100) "$BIN/kvoracle" check --cases 2000 --seed 0xC1 --no-shrink "${gpus_flag[@]}" \
    --json "$LOGS/gpus_$mode.json" >"$LOGS/gpus_$mode.txt" 2>&1
  echo "exit $? in $((($(date +%s%N) - t0) / 1000000)) ms" >>"$LOGS/gpus_$mode.txt"
done
python3 - "$LOGS/gpus_one.json" "$LOGS/gpus_all.json" >"$LOGS/gpus_compare.txt" 2>&1 <<'PY'
import json, sys
def rows(path):
    return [(s["name"], s["op"], s["cases"], s["pass"], s["mismatch"], s["first_failure"])
            for s in json.load(open(path))["subjects"]]
print("same merged report as one process:", rows(sys.argv[1]) == rows(sys.argv[2]))
PY
T_SCALE=$(($(date +%s) - START))
fi
# 3b'''. The GPU reference tier (issue 15): the write and dense cases answered by the canonical
# CUDA kernels, checked against the CPU reference on a sample; the same campaign on the CPU tier.
# KVO_TIER_PARTS: which of the stage's parts run (default all: writes, write-campaign, replay,
# prod, reads).
TIER_PARTS=${KVO_TIER_PARTS:-writes write-campaign replay prod reads}
TIER_PARTS=${TIER_PARTS//,/ }  # comma- or space-separated, as KVO_STAGES
tier_part() { [[ " $TIER_PARTS " == *" $1 "* ]]; }
if want tier; then
if tier_part writes; then
for tier in cpu gpu; do
  timeout $(budget 150) "$BIN/kvoracle" check --cases 2000 --ops write,dense --no-shrink \
    --subject cpu-fused,cpu-dense --tier $tier >"$LOGS/tier_$tier.txt" 2>&1
  echo "exit $?" >>"$LOGS/tier_$tier.txt"
done
fi
# The read campaign at 16k-token contexts (issue 15 item 4: target 500 cases/s): the CPU tier,
# then the GPU tier (cuda-canonical-generic answers each case's selection with its scores and its
# exact output), with a canonical subject (cuda-canonical: judged bit for bit) and a foreign one
# (cuda-fast: judged against the float64 truth, which the CPU computes in every tier).
if tier_part reads; then
# Then each op alone on the GPU tier (where the time goes).
# cuda-canonical on the GPU tier is judged resident on the device (the case's layer generated and
# written there); -staged: through the host as before (--staged). cuda-fast (foreign: its truth
# reads host caches) is staged. -odd: the odd cases (theme slot = case index % 8; the huge-cache
# theme, slot 6, moves two copies of 4-12 GB on the device a case).
# -1lane: the resident cases on one device lane (the main thread); -yield: the lanes' waits
# yielding their cores (--host-wait yield; the sampled cases' CPU reference competes for them).
for run in cpu-canonical:200 gpu-canonical-staged:1000 gpu-canonical:5000 gpu-canonical-odd:5000 \
  gpu-canonical-1lane:5000 gpu-canonical-yield:5000 \
  cpu-fast:200 gpu-fast:1000 gpu-canonical-indexer:5000 gpu-canonical-attention:5000; do
  name=${run%%:*}; cases=${run##*:}
  tier=${name%%-*}; subject=${name#*-}; subject=cuda-${subject%%-*}
  ops=indexer,attention; flags=
  [[ $name == *-indexer ]] && ops=indexer
  [[ $name == *-attention ]] && ops=attention
  [[ $name == *-staged ]] && flags=--staged
  [[ $name == *-odd ]] && flags="--total-shards 2 --shard-index 1"
  [[ $name == *-1lane ]] && flags="--device-lanes 1"
  [[ $name == *-yield ]] && flags="--host-wait yield"
  timeout $(budget 150) "$BIN/kvoracle" check --cases $cases --ops $ops --no-shrink $flags \
    --seq-len 16384 --subject $subject --tier $tier >"$LOGS/read_tier_$name.txt" 2>&1
  echo "exit $?" >>"$LOGS/read_tier_$name.txt"
done
fi
# The write campaign with one CUDA subject (issue 15 item 4: target 5,000 cases/s): the CPU tier,
# the GPU tier staged through the host, the GPU tier resident (cases generated, written and
# compared on the device), over the default distribution, over its odd cases (no huge-cache
# theme: theme slot = case index % 8, huge is slot 6), and over the odd cases with one right answer
# byte for byte (no div_approx, strict slots: no case judged by admissible sets). The default
# distribution also on one device lane, with two heavy lanes, and with the lanes' waits yielding.
for run in $(tier_part write-campaign && echo cpu:2000 staged:2000 resident:10000 resident-1lane:10000 \
  resident-heavy2:10000 resident-yield:10000 resident-odd:10000 resident-exact:10000); do
  name=${run%%:*}; cases=${run##*:}
  case $name in
    cpu) flags="--tier cpu" ;;
    staged) flags="--tier gpu --staged" ;;
    resident) flags="--tier gpu" ;;
    resident-1lane) flags="--tier gpu --device-lanes 1" ;;
    resident-heavy2) flags="--tier gpu --heavy-lanes 2" ;;
    resident-yield) flags="--tier gpu --host-wait yield" ;;
    resident-odd) flags="--tier gpu --total-shards 2 --shard-index 1" ;;
    resident-exact) flags="--tier gpu --total-shards 2 --shard-index 1 --scale-mode mul_recip --slot-mode strict" ;;
  esac
  timeout $(budget 150) "$BIN/kvoracle" check --cases $cases --ops write --no-shrink \
    --subject cuda-unfused $flags >"$LOGS/write_tier_$name.txt" 2>&1
  echo "exit $?" >>"$LOGS/write_tier_$name.txt"
done
# Replay's tier (issue 15 item 2): the 60-layer batch-64 trace of scripts/replay_speed.sh, the
# reference caches written by the CPU, then by the CUDA answerers (sampled against the CPU), with
# a CUDA subject judged (cuda-unfused: the answerer, cuda-fused, is never judged by itself) and 2
# jobs; the time of each.
# The GPU tier twice: staged through the host per layer (--resident off), and resident on the
# device (issue 15 item 3: values generated there, copies compared there).
"$BIN/kvoracle" trace gen --steps 120 --max-batch 64 --layers 3D57S -o /tmp/kvo-tier.st >/dev/null 2>&1
for tier in $(tier_part replay && echo cpu gpu-staged gpu-resident gpu-resident-fused gpu-resident-fused-alljobs); do
  subject=cuda-unfused
  jobs="--jobs 2"
  case $tier in
    cpu) flags="--tier cpu" ;;
    gpu-staged) flags="--tier gpu --resident off" ;;
    gpu-resident) flags="--tier gpu --resident on" ;;
    gpu-resident-fused) flags="--tier gpu --resident on"; subject=cuda-fused-generic ;;
    gpu-resident-fused-alljobs) flags="--tier gpu --resident on"; subject=cuda-fused-generic; jobs= ;;
  esac
  t0=$(date +%s%N)
  timeout $(budget 120) "$BIN/kvoracle" replay /tmp/kvo-tier.st --subject $subject $jobs \
    $flags >"$LOGS/replay_tier_$tier.txt" 2>&1
  echo "exit $? in $((($(date +%s%N) - t0) / 1000000)) ms" >>"$LOGS/replay_tier_$tier.txt"
done
# Resident at a production geometry (issue 15 item 5): 4096 blocks of 64 tokens, fp8 K/V,
# blockscale index-K, 60 layers, two judged CUDA subjects; 2,000 steps timed against 200.
"$BIN/kvoracle" trace gen --steps 2000 --max-batch 64 --layers 3D57S --num-blocks 4096 \
  --block-size 64 --num-kv-heads 4 --head-dim 128 --index-dim 128 --kv-dtype fp8_e4m3 \
  --index-layout blockscale -o /tmp/kvo-prod.st >/dev/null 2>&1
for steps in $(tier_part prod && echo 200 2000); do
  t0=$(date +%s%N)
  timeout $(budget 150) "$BIN/kvoracle" replay /tmp/kvo-prod.st --steps 0:$steps \
    --subject cuda-unfused,cuda-fused-generic --tier gpu --resident on \
    >"$LOGS/replay_prod_$steps.txt" 2>&1
  echo "exit $? in $((($(date +%s%N) - t0) / 1000000)) ms" >>"$LOGS/replay_prod_$steps.txt"
done
T_TIER=$(($(date +%s) - START))
fi
# 3c. The mutation score with the CUDA mutants (bugs planted in the fused kernel) included.
if want mutants; then
timeout $(budget 100) "$BIN/kvoracle" mutants --cases 200 --seeds 1 >"$LOGS/kvoracle_mutants.txt" 2>&1
echo "exit $?" >>"$LOGS/kvoracle_mutants.txt"
T_MUT=$(($(date +%s) - START))
fi
# 3f. The Python package on the GPU (issue 13): the NumPy tests, torch ops and Triton kernels
# judged through the adapters (one [py-gpu] line per subject), examples/python, then what the
# Python path costs against the C++ campaign.
wait  # the extension's build (section 0b), if still running
# 3g. kvoracle's fused write against the Triton peer (issue 16), in one process: the peer judged by
# kvoracle in each flavour, then both timed in one graph of 60 layers per token count.
if want peer; then
PYTHONPATH=$PYBUILD timeout $(budget 240) "$PY" "$ROOT/bench/bench_write_peer.py" \
  --lib "$BIN/libkvo_bench_write.so" --json "$OUT/bench_peer.json" >"$LOGS/bench_peer.txt" 2>&1
echo "exit $?" >>"$LOGS/bench_peer.txt"
T_PEER=$(($(date +%s) - START))
fi
# KVO_PYTHON_PARTS (default "tests bench engines"): which parts of the python stage run.
python_wanted() { [[ " ${KVO_PYTHON_PARTS:-tests bench engines} " == *" $1 "* ]]; }
if want python; then
if python_wanted tests; then
PYTHONPATH=$PYBUILD timeout $(budget 420) "$PY" -m pytest -q -s -p no:cacheprovider -rs \
  "$ROOT/python/tests" "$ROOT/examples/python" >"$LOGS/python_tests.txt" 2>&1
echo "exit $?" >>"$LOGS/python_tests.txt"
fi
if python_wanted bench; then
PYTHONPATH=$PYBUILD timeout $(budget 120) "$PY" "$ROOT/python/bench/bench_python_path.py" \
  >"$LOGS/python_bench.txt" 2>&1
echo "exit $?" >>"$LOGS/python_bench.txt"
fi
# The engines' own code (scripts/fetch_engines.sh: carried as .engines/site or packed as
# .device/engines.tar.xz) judged through its real signatures: `kvoracle engines` on the GPU.
ENGINES_SITE=$ROOT/.engines/site
if [[ -f "$ROOT/.device/engines.tar.xz" ]]; then
  mkdir -p /tmp/kvo-engines && tar -C /tmp/kvo-engines -xJf "$ROOT/.device/engines.tar.xz"
  ENGINES_SITE=/tmp/kvo-engines/site
fi
if [[ -d $ENGINES_SITE ]] && python_wanted engines; then
  PYTHONPATH=$PYBUILD:$ENGINES_SITE timeout $(budget 240) "$PY" -m kvoracle.engines \
    --cases "${KVO_ENGINE_CASES:-200}" --json "$OUT/engines.json" >"$LOGS/engines.txt" 2>&1
  echo "exit $?" >>"$LOGS/engines.txt"
fi
T_PY=$(($(date +%s) - START))
fi
# 3e. The user's-kernel example (examples/cpp): its CUDA twin judged in device memory through the
# device subjects (each kernel passes, each planted bug fails), then under compute-sanitizer.
if want example; then
timeout $(budget 200) "$BIN/test_my_cuda_kernels" >"$LOGS/example_cuda.txt" 2>&1
echo "exit $?" >>"$LOGS/example_cuda.txt"
KVO_CASES=20 timeout $(budget 150) compute-sanitizer --tool memcheck --print-limit 20 "$BIN/test_my_cuda_kernels" \
  >"$LOGS/example_cuda_memcheck.txt" 2>&1
echo "exit $?" >>"$LOGS/example_cuda_memcheck.txt"
EXAMPLE_MEMCHECK=$(san_errors "$LOGS/example_cuda_memcheck.txt")
fi
# 3d. The real-kernel modes (SPEC 2, 7): div_approx (div.full.f32) judged by admissible sets; mode
# detection of the CUDA subjects told a mode; the flash attention under its profile and under fp32.
modes() {  # label, then the kvoracle arguments
  local label=$1
  shift
  timeout $(budget 90) "$BIN/kvoracle" "$@" --no-shrink >>"$LOGS/kvoracle_modes.txt" 2>&1
  echo "exit $? $label" >>"$LOGS/kvoracle_modes.txt"
}
if want modes; then
modes div_approx check --subject cuda-fused,cuda-unfused --ops write --scale-mode div_approx --cases 300
modes detect_told_mul_recip check --subject cuda-fused --detect-modes --ops write --cases 100 \
  --scale-mode mul_recip --kv-dtype bf16
modes detect_told_div_approx check --subject cuda-fused,cuda-unfused --detect-modes --ops write \
  --cases 100 --scale-mode div_approx --kv-dtype bf16
modes detect_dense_div_approx check --subject cuda-dense-qknorm-rope --detect-modes --ops dense \
  --cases 60 --scale-mode div_approx --kv-dtype bf16
modes flash_bf16_p check --subject cuda-flash-bf16 --ops attention --cases 300
modes flash_under_fp32 check --subject cuda-flash-bf16 --ops attention --cases 300 --profile fp32
modes detect_profiles check --subject cuda-flash-bf16,cuda-fast,cuda-canonical --detect-modes \
  --ops attention --cases 100
fi

T_MODES=$(($(date +%s) - START))
# 6. Short table, last.
{
  cat "$LOGS/machine.txt"
  echo "stages: $STAGES"
  echo
  if want tests; then
    echo "GPU tests: $passed passed, $failed failed, $skipped skipped; random cases diffed: $cases (t=${T_TESTS}s)"
    grep -h 'dense insert cases diffed' "$LOGS"/tests_*.log
    grep -h '^\[gpu-fast\] ' "$LOGS"/tests_*.log
    echo "read cases diffed (canonical: indexer + sparse + dense attention, bit-exact; fast: top-k + sparse attention, foreign mode): $(grep -ho 'read cases diffed: [0-9]*' "$LOGS"/tests_*.log | awk '{s += $4} END {print s}')"
    grep -h '^\[  FAILED  \].*(' "$LOGS"/tests_*.log | head -5
    echo "8 test processes on $(nvidia-smi --query-gpu=memory.total --format=csv,noheader | head -1): $OOM_FAILED tests failed out of device memory (none rerun); $MEM_SKIPPED case reports skipped for memory"
    echo "trace replay's GPU tier tests: $(grep -c '^\[       OK \]' "$LOGS/tests_traces.log") passed, $(grep -c '^\[  FAILED  \].*(' "$LOGS/tests_traces.log") failed, $(grep -c '^\[  SKIPPED \].*(' "$LOGS/tests_traces.log") skipped"
    grep -h '^\[gpu-device-subject\]' "$LOGS"/tests_*.log
  fi
  if want campaign; then
    echo "read campaign (Shards/GpuRead, 8 shards x ${KVO_READ_CAMPAIGN_CASES:-1250}): $CAMP_SHARDS of 8 shards passed, $CAMP_CASES read cases diffed (t=${T_CAMP}s)"
    grep -h -A3 '^unknown file: Failure\|Failure$' "$LOGS"/campaign_*.log | head -8
  fi
  want sanitizers && echo "compute-sanitizer: memcheck ${MEMCHECK:-?} errors ($MEMCHECK_TESTS tests ok), racecheck ${RACECHECK:-?} errors ($RACECHECK_TESTS tests ok) (t=${T_SAN}s)"
  if want cli; then
    echo "kvoracle check --cases 300:"
    grep -E '^(cpu|cuda)-|^result|exit' "$LOGS/kvoracle_check.txt"
    echo "kvoracle replay of the committed traces:"
    grep -E '^exit|result' "$LOGS/kvoracle_replay.txt"
  fi
  if want scaling; then
    echo "kvoracle check over jobs (300 cases; CPU subjects, then every subject):"
    cat "$LOGS/campaign_scaling.txt"
    echo "kvoracle replay over jobs (60 steps, 60 layers, reference + cpu-fused):"
    cat "$LOGS/replay_speed.txt"
    echo "kvoracle check --cases 2000, one process | --gpus all: $(tail -1 "$LOGS/gpus_one.txt") | $(grep -E '^kvoracle check: [0-9]+ shard' "$LOGS/gpus_all.txt") $(tail -1 "$LOGS/gpus_all.txt"); $(cat "$LOGS/gpus_compare.txt")"
  fi
  if want mutants; then
    echo "kvoracle mutants --cases 200 --seeds 1 (the median over 20 seeds: the CPU run):"
    grep -E '^cuda-|^killed|exit' "$LOGS/kvoracle_mutants.txt"
  fi
  want example && echo "examples/cpp CUDA twin (device subjects): $(grep -c '^\[       OK \]' "$LOGS/example_cuda.txt") passed, $(grep -c '^\[  FAILED  \].*(' "$LOGS/example_cuda.txt") failed, $(grep -c '^\[  SKIPPED \].*(' "$LOGS/example_cuda.txt") skipped; memcheck ${EXAMPLE_MEMCHECK:-?} errors; $(tail -1 "$LOGS/example_cuda.txt")"
  want python && echo "Python package ($PY, extension build: $(tail -1 "$LOGS/python_build.txt")): $(grep -E '(passed|failed|error)' "$LOGS/python_tests.txt" | tail -1)"
  if want python; then
    grep -h '^\[py-gpu\]' "$LOGS/python_tests.txt"
    grep -h '^FAILED\|^ERROR' "$LOGS/python_tests.txt" | head -5
    cat "$LOGS/python_bench.txt"
    [[ -f $LOGS/engines.txt ]] && { echo "the engines' kernels (kvoracle engines):"; cat "$LOGS/engines.txt"; }
  fi
  if want modes; then
    echo "real-kernel modes (div_approx, mode detection, flash profiles):"
    grep -E '^cuda-[a-z0-9-]+ +(write|dense|attention) |^mode detection|^  per mode|^  no combination|^exit' \
      "$LOGS/kvoracle_modes.txt"
  fi
  if want peer; then
    echo "kvoracle's fused write vs the Triton peer (bench/bench_write_peer.py):"
    grep -vE '^\s*$' "$LOGS/bench_peer.txt" | tail -45
  fi
  want bench && python3 - "$OUT/bench_alias.json" <<'PY'
import json, sys
try:
    runs = json.load(open(sys.argv[1]))["benchmarks"]
except Exception as e:
    print("bench_alias: no results (%s)" % e); sys.exit(0)
print("judging every byte of a huge subject allocation a case (bench_alias_gpu; ms a case, medians; aliased: touched granules remapped to their own, the rest one shared poisoned granule):")
print("%4s %7s %6s %9s %8s %9s %9s %9s %8s %8s %7s %8s %s" % ("GiB", "touched", "granMB", "plain_ms", "plainTB", "alias_ms", "remap_ms", "judge_ms", "remaps", "setup_ms", "x_plain", "strays", "partial/offset maps"))
for r in runs:
    if r.get("error_occurred"):
        print("bench_alias error:", r["name"], r.get("error_message")); continue
    arg = lambda k: r["name"].split(k + ":")[1].split("/")[0]
    print("%4s %7s %6.0f %9.2f %8.2f %9.3f %9.3f %9.3f %8.0f %8.1f %7.3f %5d/%-2d %d/%d" % (arg("GiB"), arg("touched"), r["granule_MiB"], r["plain_ms"], r["plain_TBps"], r["aliased_ms"], r["remap_ms"], r["judge_ms"], r["remaps_per_case"], r["setup_ms"], r["x_plain"], r["strays_seen"], r["strays_planted"], r["partial_map_ok"], r["offset_map_ok"]))
PY
  want bench && python3 - "$OUT/bench_read.json" <<'PY'
import json, sys
try:
    runs = json.load(open(sys.argv[1]))["benchmarks"]
except Exception as e:
    print("bench_read: no results (%s)" % e); sys.exit(0)
ok = lambda b: "ok" if b else "MISS"
print("%-5s %5s %10s %10s %10s %9s %9s %8s %8s %9s %9s %9s %9s  %s" % ("cache", "batch", "canon_us", "generic_us", "fast_us", "flash_us", "flash1_us", "MB", "copyGBs", "bwFrac", "bwF_fast", "bwF_flash", "bwF_read1", "targets canonical>=0.60, flash>=0.80 at batch>=64"))
for r in runs:
    if r.get("error_occurred"):
        print("bench_read error:", r["name"], r.get("error_message")); continue
    n = r["name"]
    if n.startswith("BM_SparseDecode"):
        b = int(n.split("batch:")[1].split("/")[0])
        print("%-5s %5d %10.2f %10.2f %10.2f %9.2f %9.2f %8.1f %8.0f %9.3f %9.3f %9.3f %9.3f  %s" % ("fp8" if "fp8:1" in n else "bf16", b, r["canonical_us"], r.get("generic_us", float("nan")), r["fast_us"], r.get("flash_us", float("nan")), r.get("flash_generic_us", float("nan")), r["MB"], r["copy_GBps"], r["bw_frac"], r["bw_frac_fast"], r.get("bw_frac_flash", float("nan")), r.get("bw_frac_read_once", float("nan")), (ok(r["bw_frac"] >= 0.6) + " " + ok(r.get("bw_frac_flash", 0) >= 0.8)) if b >= 64 else "-"))
print("%5s %8s %10s %10s %10s %10s %8s %8s %9s %6s  %s" % ("batch", "context", "canon_us", "fast_us", "2launch_us", "read1_us", "MB", "x_read", "x_r_fast", "fused", "target x_read<=2"))
for r in runs:
    n = r["name"]
    if n.startswith("BM_IndexerTopk") and not r.get("error_occurred"):
        b = int(n.split("batch:")[1].split("/")[0]); L = int(n.split("context:")[1].split("/")[0])
        print("%5d %8d %10.2f %10.2f %10.2f %10.2f %8.1f %8.2f %9.2f %6d  %s" % (b, L, r["canonical_us"], r["fast_us"], r["two_launch_us"], r["read_once_us"], r["MB"], r["x_read"], r["x_read_fast"], r["fused"], ok(r["x_read"] <= 2)))
PY
  want bench && python3 - "$OUT/bench.json" <<'PY'
import json, sys
try:
    runs = json.load(open(sys.argv[1]))["benchmarks"]
except Exception as e:
    print("bench: no results (%s)" % e); sys.exit(0)
row = {}
for r in runs:
    if r.get("error_occurred"):
        print("bench error:", r["name"], r.get("error_message")); continue
    row[r["name"]] = r
def first(key):
    return next((r[key] for r in runs if key in r), float("nan"))
print("bench: empty launch %.3f us (PDL twin %.3f us), 60 in a graph; D2D copy %.0f GB/s read+write (memcpy %.0f, copy kernel %.0f)" % (
    first("empty_us"), first("empty_pdl_us"), first("copy_GBps"), first("memcpy_GBps"), first("copy_kernel_GBps")))
print("bench: a slot-mapped store alone (a warp's 32 slot loads, one store each; gpu_bench.cuh) %.3f us = %.2fx an empty launch (PDL %.3f us = %.2fx), the floor under the 2x target" % (
    first("slot_store_us"), first("slot_store_us") / first("empty_us"), first("slot_store_pdl_us"), first("slot_store_pdl_us") / first("empty_us")))
print("%-13s %6s %8s %8s %8s %8s %7s %7s %7s %7s %7s %7s %8s  %s" % ("flavour", "tokens", "fused", "fusedPDL", "generic", "unfused", "xEmpty", "xE_PDL", "speedup", "spd_PDL", "bwFrac", "bwF_PDL", "hot/PDL", "targets (plain | PDL)"))
for name, r in row.items():
    if not name.startswith("BM_LayerWrite"): continue
    kind = r.get("label", "?").split()[0]
    t = int(name.split("tokens:")[1].split("/")[0])
    ok = lambda b: "ok" if b else "MISS"
    notes = []
    if t <= 256:
        notes.append("xEmpty<=2 %s|%s" % (ok(r["x_empty"] <= 2), ok(r["x_empty_pdl"] <= 2)))
        notes.append("speedup>=15 %s|%s" % (ok(r["speedup"] >= 15), ok(r["speedup_pdl"] >= 15)))
    if t >= 65536:
        floor = 0.8 if "divide" in kind else 0.9  # issue 16: 0.80 of copy for exact division
        notes.append("bw>=%.2f %s|%s" % (floor, ok(r["bw_frac"] >= floor), ok(r["bw_frac_pdl"] >= floor)))
    hot = "%.2f/%.2f" % (r["fused_hot_us"], r["fused_hot_pdl_us"]) if "fused_hot_us" in r else "-"
    print("%-13s %6d %8.3f %8.3f %8.3f %8.3f %7.2f %7.2f %7.1f %7.1f %7.3f %7.3f %8s  %s" % (
        kind, t, r["fused_us"], r["fused_pdl_us"], r["generic_us"], r["unfused_us"], r["x_empty"],
        r["x_empty_pdl"], r["speedup"], r["speedup_pdl"], r["bw_frac"], r["bw_frac_pdl"], hot, ", ".join(notes)))
print("(times in us per layer; fused: as shipped (the specialised kernel where it applies), generic: the fused write's generic kernel; xEmpty = fused / plain empty launch; bwFrac = (bytes read + written) / time / copy bandwidth; fp8 K/V scale 0.37, _s1: 1.0; bench/write_bench_setup.hpp)")
PY
  if want profile; then
    for f in "$LOGS"/ncu_*.txt; do
      echo "ncu $(basename "$f" .txt):"
      python3 "$ROOT/gpu/ncu_summary.py" "$f" | sed "s#^$LOGS/##"
      grep '^exit' "$f" | tr '\n' ' '; echo
    done
  fi
  if want tier; then
    echo "reference tiers, 2000 write+dense cases (cpu-fused, cpu-dense):"
    for tier in cpu gpu; do
      [ -f "$LOGS/tier_$tier.txt" ] || continue
      echo "  --tier $tier: $(grep -m1 -E '^kvoracle check: seed .* cases in' "$LOGS/tier_$tier.txt"); $(grep -m1 '^reference:' "$LOGS/tier_$tier.txt"); $(tail -2 "$LOGS/tier_$tier.txt" | tr '\n' ' ')"
    done
    echo "read campaign, 16k-token contexts (indexer + attention), one CUDA subject:"
    for name in cpu-canonical gpu-canonical-staged gpu-canonical gpu-canonical-odd gpu-canonical-1lane gpu-canonical-yield cpu-fast gpu-fast gpu-canonical-indexer gpu-canonical-attention; do
      [ -f "$LOGS/read_tier_$name.txt" ] || continue
      echo "  $name: $(grep -m1 -E '^kvoracle check: seed .* cases in' "$LOGS/read_tier_$name.txt"); $(grep -m1 '^reference:' "$LOGS/read_tier_$name.txt" | cut -c1-200); $(grep -m1 '^resident:' "$LOGS/read_tier_$name.txt" | cut -c1-200); $(grep -m1 '^time:' "$LOGS/read_tier_$name.txt"); $(tail -2 "$LOGS/read_tier_$name.txt" | tr '\n' ' ')"
    done
    echo "write campaign, one CUDA subject (cuda-unfused):"
    for name in cpu staged resident resident-1lane resident-heavy2 resident-yield resident-odd resident-exact; do
      [ -f "$LOGS/write_tier_$name.txt" ] || continue
      echo "  $name: $(grep -m1 -E '^kvoracle check: seed .* cases in' "$LOGS/write_tier_$name.txt"); $(grep -m1 '^reference:' "$LOGS/write_tier_$name.txt" | cut -c1-160); $(grep '^resident:' "$LOGS/write_tier_$name.txt" | tr '\n' ' '); $(tail -2 "$LOGS/write_tier_$name.txt" | tr '\n' ' ')"
    done
    echo "replay of a 120-step 60-layer batch-64 trace, subject cuda-unfused (fused: cuda-fused-generic), --jobs 2 (alljobs: one per hardware thread):"
    for tier in cpu gpu-staged gpu-resident gpu-resident-fused gpu-resident-fused-alljobs; do
      [ -f "$LOGS/replay_tier_$tier.txt" ] || continue
      echo "  $tier: $(grep -E '^(reference|caches|resident|tier disagreement|result|  cuda-)' "$LOGS/replay_tier_$tier.txt" | tr '\n' ' ') $(tail -1 "$LOGS/replay_tier_$tier.txt")"
    done
    echo "resident replay at a production geometry (4096 blocks x 64, fp8, blockscale), cuda-unfused + cuda-fused-generic:"
    for steps in 200 2000; do
      [ -f "$LOGS/replay_prod_$steps.txt" ] || continue
      echo "  $steps steps: $(grep -E '^(reference|caches|resident|tier disagreement|result|  cuda-)' "$LOGS/replay_prod_$steps.txt" | tr '\n' ' ') $(tail -1 "$LOGS/replay_prod_$steps.txt")"
    done
  fi
  echo "stage ends (s from start): tests ${T_TESTS}, campaign ${T_CAMP}, sanitizers ${T_SAN}, benchmarks ${T_BENCH}, check+replay ${T_CLI}, scaling ${T_SCALE}, tier ${T_TIER}, mutants ${T_MUT}, peer ${T_PEER}, python ${T_PY}, modes+example ${T_MODES}"
  echo "whole run $(($(date +%s) - START))s of a ${KVO_DEADLINE_S:-550}s budget (a stage cut short by it shows exit 124)"
} >"$OUT/summary.txt" 2>&1
tar czf "$OUT/logs.tar.gz" -C "$LOGS" . 2>/dev/null
cat "$OUT/summary.txt"
[[ $failed -eq 0 ]]
