#!/usr/bin/env bash
# Formats every project source with clang-format (repo .clang-format); --check only reports.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cf=${CLANG_FORMAT:-clang-format}
mode=(-i)
[[ "${1:-}" == "--check" ]] && mode=(--dry-run --Werror)
cd "$root"
git ls-files -co --exclude-standard -- '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs -r "$cf" "${mode[@]}"
