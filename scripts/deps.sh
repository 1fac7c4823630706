#!/usr/bin/env bash
# Installs the Debian packages kvoracle builds with, if any is missing. Idempotent; needs root (or
# sudo) only when something must be installed. The CUDA toolkit is optional and never installed here:
# the build finds nvcc when it exists (e.g. /usr/local/cuda) and builds without CUDA otherwise.
set -euo pipefail
packages=(cmake ninja-build g++ make pkg-config libgtest-dev libgmock-dev librapidcheck-dev libcli11-dev
          libeigen3-dev libbenchmark-dev nlohmann-json3-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "kvoracle: installing ${missing[*]}" >&2
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
