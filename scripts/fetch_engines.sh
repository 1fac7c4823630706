#!/usr/bin/env bash
# Brings the engines' pure-Python code from PyPI into .engines/site (git-ignored, never committed)
# for `kvoracle engines` on the GPU machine, which reaches no network: carry .engines/site and put
# it on PYTHONPATH there. Only wheels that are pure Python (py3-none-any) and small enough to carry
# (the device tool carries 64 MiB) are fetched; each is pinned, and what it holds is listed.
#   bash scripts/fetch_engines.sh            # then: PYTHONPATH=.engines/site python -m kvoracle.engines
# sglang 0.5.10.post1: the last py3-none-any release (later ones ship Rust extensions); it still has
# the Triton fused_fp8_set_kv_buffer and MHATokenToKVPool.set_kv_buffer. vLLM 0.19.1: a 433 MB
# wheel whose CUDA library (_C.abi3.so, 190 MB compressed, built for torch 2.10) cannot be carried;
# its Python files alone (5 MB compressed) hold the Triton writer, so only they are kept and the
# CUDA op rows say "unavailable". flashinfer-python (about 100 MB, JIT sources) does not fit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHEELS=(sglang==0.5.10.post1)
PYTHON_ONLY_WHEELS=(vllm==0.19.1)
OUT=$ROOT/.engines
PY=${PYTHON:-python3}
mkdir -p "$OUT/wheels"
rm -rf "$OUT/site"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --platform any --python-version 3.12 \
  -d "$OUT/wheels" "${WHEELS[@]}"
for spec in "${WHEELS[@]}"; do
  "$PY" -m zipfile -e "$OUT/wheels/${spec%%==*}-${spec##*==}"-*.whl "$OUT/site"
done
for spec in "${PYTHON_ONLY_WHEELS[@]}"; do
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_31_x86_64 \
    --python-version 3.12 -d "$OUT/wheels" "$spec"
  "$PY" - "$OUT/wheels/${spec%%==*}-${spec##*==}"-*.whl "$OUT/site" <<'PY'
import sys, zipfile
wheel, site = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    keep = [n for n in z.namelist() if n.endswith(".py") or ".dist-info/" in n]
    z.extractall(site, keep)
print(f"{wheel}: {len(keep)} Python and metadata files kept, its compiled libraries left out")
PY
done
du -sh "$OUT/site"
ls "$OUT/site"
