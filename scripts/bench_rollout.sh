#!/usr/bin/env bash
# Reproduce docs/benchmarks.md "Rollout scheduling: sync vs APRIL vs async (issue 3)": sync, APRIL and
# fully async on the standard long-tail workload of the simulated engine (~20 min on 2 CPU cores),
# plus the scheduler and HTTP-client overhead. Extra arguments go to the benchmark (e.g. --steps 3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p docs/img
exec .venv/bin/python -m slime.bench.rollout \
  --json docs/bench_rollout.json --png docs/img/bench_rollout.png \
  "$@"
