#!/usr/bin/env bash
# The Python side's virtual environment, .venv/ at the repository root (python/requirements.txt),
# created and filled when missing or when the requirements changed. Prints nothing on success.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv"
requirements="$root/python/requirements.txt"
stamp="$venv/.requirements"
if [[ -x "$venv/bin/python" ]] && cmp -s "$requirements" "$stamp"; then exit 0; fi
python=${KVO_PYTHON:-python3}
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
cp "$requirements" "$stamp"
