#!/usr/bin/env bash
# Set up (if needed) and run the CPU test suite. GPU and slow tests are deselected by default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
