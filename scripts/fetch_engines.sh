#!/usr/bin/env bash
# Brings the engines' pure-Python code from PyPI into .engines/site (git-ignored, never committed)
# for `kvoracle engines` on the GPU machine, which reaches no network: carry .engines/site and put
# it on PYTHONPATH there. Only wheels that are pure Python (py3-none-any) and small enough to carry
# (the device tool carries 64 MiB) are fetched; each is pinned, and what it holds is listed.
#   bash scripts/fetch_engines.sh            # then: PYTHONPATH=.engines/site python -m kvoracle.engines
# sglang 0.5.10.post1: the last py3-none-any release (later ones ship Rust extensions); it still has
# the Triton fused_fp8_set_kv_buffer and MHATokenToKVPool.set_kv_buffer. vLLM (a CUDA build of
# several hundred MB) and flashinfer-python (about 100 MB, JIT sources) do not fit the carry.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHEELS=(sglang==0.5.10.post1)
OUT=$ROOT/.engines
PY=${PYTHON:-python3}
mkdir -p "$OUT/wheels"
rm -rf "$OUT/site"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --platform any --python-version 3.12 \
  -d "$OUT/wheels" "${WHEELS[@]}"
for w in "$OUT"/wheels/*.whl; do
  "$PY" -m zipfile -e "$w" "$OUT/site"
done
du -sh "$OUT/site"
ls "$OUT/site"
