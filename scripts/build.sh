#!/usr/bin/env bash
# Installs what is missing (Debian packages; the Python venv .venv/), configures and builds kvoracle
# into build/ (Release), the Python package's extension included (build/python/kvoracle). Extra
# arguments go to CMake's configure step, e.g. scripts/build.sh -DKVO_ENABLE_CUDA=OFF.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/deps.sh"
bash "$root/scripts/venv.sh"
# nvcc is not on every PATH: /usr/local/cuda is where NVIDIA's packages put it.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH=/usr/local/cuda/bin:$PATH; fi
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVO_BUILD_PYTHON=ON \
  -DPython_EXECUTABLE="$root/.venv/bin/python" "$@" >/dev/null
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build "$root/build" -j "$jobs"
