#!/usr/bin/env bash
# Create .venv and install slime with its test extras. Idempotent: re-runs only when pyproject.toml changes.
# torch is installed first, pinned: on a machine without an NVIDIA GPU (no working nvidia-smi) its CPU build, from
# PyTorch's CPU index (PyPI's Linux wheel is the multi-GB CUDA build), so pip never pulls CUDA onto a CPU machine;
# with a GPU, PyPI's (CUDA) build. SLIME_TORCH_INDEX=URL names the extra index to take it from ("" for none).
# The test extra includes slime[ray] (Ray's wheel, ~79 MB; tests/cluster), so this installs Ray too.
set -euo pipefail
cd "$(dirname "$0")/.."
# The code sandbox (slime/rollout/tools/isolation.py) needs bubblewrap, libseccomp (its seccomp filter) and
# util-linux's setpriv (as root: the code runs as nobody); without them, code execution refuses to run and
# its tests are skipped. Installed only as root with apt; skipped quietly otherwise.
sandbox_pkgs=""
command -v bwrap >/dev/null || sandbox_pkgs=" bubblewrap"
ldconfig -p 2>/dev/null | grep 'libseccomp\.so\.2' >/dev/null || sandbox_pkgs="$sandbox_pkgs libseccomp2"
command -v setpriv >/dev/null || sandbox_pkgs="$sandbox_pkgs util-linux"
if [ -n "$sandbox_pkgs" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  # shellcheck disable=SC2086  # a list of package names
  apt-get install -y -qq $sandbox_pkgs >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $sandbox_pkgs >/dev/null 2>&1; } \
    || echo "setup.sh: could not install$sandbox_pkgs; the code sandbox's tests will be skipped" >&2
fi
PY=${PYTHON:-python3}
TORCH_SPEC=${SLIME_TORCH_SPEC:-torch==2.13.0}
if [ -z "${SLIME_TORCH_INDEX+set}" ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    SLIME_TORCH_INDEX=""
  else
    SLIME_TORCH_INDEX=https://download.pytorch.org/whl/cpu
  fi
fi
# an extra index, the user's own index kept: torch==X matches X+cpu there, which sorts above PyPI's X (PEP 440)
torch_index=()
[ -z "$SLIME_TORCH_INDEX" ] || torch_index=(--extra-index-url "$SLIME_TORCH_INDEX")
stamp=.venv/.slime-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $TORCH_SPEC $SLIME_TORCH_INDEX"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q ${torch_index[@]+"${torch_index[@]}"} "$TORCH_SPEC"
.venv/bin/python -m pip install -q -e '.[test,megatron]'
echo "$want" > "$stamp"
echo "slime installed in .venv"
