#!/usr/bin/env bash
# Development build of the extension into build/dev-NAME (default: dev). Use it with
#   PYTHONPATH=build/dev-NAME python -m pytest tests/native
# (an installed package, `pip install .`, needs none of this).
set -euo pipefail
cd "$(dirname "$0")/.."
name="${1:-dev}"
dir="build/dev-$name"
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release \
  -Dpybind11_DIR="$(python -m pybind11 --cmakedir)" -DPython_EXECUTABLE="$(command -v python)" \
  >"$dir.configure.log" 2>&1 || { mkdir -p "$dir"; cat "$dir.configure.log"; exit 1; }
cmake --build "$dir" -j2 2>&1 | grep -E "error|warning|Error" || true
test -n "$(ls "$dir"/_opdispatch_native*.so 2>/dev/null)" || { echo "build failed" >&2; exit 1; }
echo "$dir"
