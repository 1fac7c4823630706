#!/usr/bin/env bash
# Regenerates the committed traces from the simulator (deterministic: same bytes every run) and
# plants one inconsistency into a copy for the rejection tests. Usage: regen.sh path/to/kvoracle
set -euo pipefail
kvoracle=${1:?usage: regen.sh path/to/kvoracle}
here=$(cd "$(dirname "$0")" && pwd)
# Continuous batching, prefix sharing, preemption, chunked prefill, CUDA-graph padding; bf16 nhd.
"$kvoracle" trace gen --seed 1 --steps 120 --layers 1D2S --num-blocks 48 --head-dim 64 \
  -o "$here/serving_bf16_nhd.st"
# MTP (2 drafts), separate index slots, int32 slots, fp8 split_hnd (mul_recip scale), blockscale
# index-K, query_lens.
"$kvoracle" trace gen --seed 2 --steps 120 --layers 2S --num-blocks 40 --block-size 8 \
  --head-dim 32 --mtp 2 --separate-index-slots true --slot-type i32 --layout split_hnd \
  --kv-dtype fp8_e4m3 --scale-mode mul_recip --index-layout blockscale --query-lens \
  -o "$here/mtp_fp8_split_hnd.st"
# One-token pages, no CUDA-graph padding, heavy preemption.
"$kvoracle" trace gen --seed 3 --steps 100 --layers D --block-size 1 --num-blocks 200 \
  --capture-sizes none -o "$here/page1_preempt.st"
# Odd page size, packed layout, fp8 e5m2 divided by per-head scales, big batches.
"$kvoracle" trace gen --seed 4 --steps 80 --layers 1S1D --block-size 17 --num-blocks 64 \
  --num-kv-heads 2 --head-dim 16 --layout packed_hnd --kv-dtype fp8_e5m2 --scale-mode divide \
  --per-head-scale true --max-batch 32 \
  --token-budget 96 --prompt-max 200 --output-max 300 -o "$here/odd_pages_packed.st"
# Dense layers through the fused qknorm + rope + insert (rotary 32 of 64 dims), fp8 e4m3 divided by
# per-head scales, GQA.
"$kvoracle" trace gen --seed 5 --steps 60 --layers 2D1S --num-blocks 40 --block-size 16 \
  --num-kv-heads 2 --head-dim 64 --kv-dtype fp8_e4m3 --scale-mode divide --per-head-scale true \
  --dense-rotary-dim 32 --num-q-heads 8 -o "$here/dense_insert_fp8.st"
# A planted inconsistency: step 3's slot_mapping[2] repeats slot_mapping[0].
python3 - "$here/serving_bf16_nhd.st" "$here/planted_duplicate_slot.st" <<'PY'
import json, struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack_from("<Q", data, 0)[0]
header = json.loads(data[8:8 + n])
t = header["step.3.slot_mapping"]
size = {"I32": 4, "I64": 8}[t["dtype"]]
base = 8 + n + t["data_offsets"][0]
data[base + 2 * size:base + 3 * size] = data[base:base + size]
open(sys.argv[2], "wb").write(data)
PY
ls -l "$here"/*.st
