#!/usr/bin/env bash
# Create .venv and install slime with its test extras. Idempotent: re-runs only when pyproject.toml changes.
# torch is pinned to the CPU build first, so pip never pulls a multi-GB CUDA build on a CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${SLIME_TORCH_SPEC:-torch==2.13.0}
stamp=.venv/.slime-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $TORCH_SPEC"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "$TORCH_SPEC"
.venv/bin/python -m pip install -q -e '.[test,megatron]'
echo "$want" > "$stamp"
echo "slime installed in .venv"
