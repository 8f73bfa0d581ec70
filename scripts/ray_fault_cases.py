"""The fault cases of ``slime train --ray`` on a local two-node Ray cluster (docs/benchmarks.md, issue 28).

A head without GPUs and two nodes of one fake GPU each (``ray.cluster_utils.Cluster``), so the trainer's bundle
and the engine's land on different nodes; the built-in chain task with the learning bench's CPU recipe.

    python scripts/ray_fault_cases.py learn 14    # engine-0 killed (SIGKILL) after step 4; the run goes on
    python scripts/ray_fault_cases.py trainer     # trainer-0 killed after step 3 (checkpoint at 2); --load resumes

Run folders (``learn``, ``kt``) go to the current directory; prints the driver's lines that matter.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ray.cluster_utils import Cluster

from slime.bench.learning_modes import TRAIN_FLAGS

RUN = ["--builtin-task", "chain", *TRAIN_FLAGS, "--no-progress", "--health-check-interval-s", "1"]
"""The learning bench's CPU recipe for the chain task, with fast engine health checks."""


def start(address: str, run: str, *flags: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "slime.cli", "train", "--ray", "--ray-address", address, *RUN, *flags, "--save", run]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def steps(run: str) -> int:
    metrics = Path(run) / "metrics.jsonl"
    if not metrics.is_file():
        return 0
    return sum(json.loads(line).get("kind") == "step" for line in metrics.read_text().splitlines())


def wait_steps(run: str, n: int) -> None:
    while steps(run) < n:
        time.sleep(0.2)


def placed(run: str) -> dict[str, dict]:
    path = Path(run + ".placement.json")
    while not path.is_file():
        time.sleep(0.2)
    return {row["name"]: row for row in json.loads(path.read_text())["processes"]}


def kill_engine(address: str, num_rollout: str, extra: list[str]) -> subprocess.Popen[str]:
    proc = start(address, "learn", "--num-rollout", num_rollout, "--eval-interval", num_rollout, *extra)
    pid = placed("learn")["engine-0"]["pid"]
    wait_steps("learn", 4)
    os.kill(pid, signal.SIGKILL)
    print("killed engine-0 at step", steps("learn"))
    return proc


def kill_trainer(address: str) -> subprocess.Popen[str]:
    flags = ("--num-rollout", "6", "--eval-interval", "6", "--save-interval", "2")
    proc = start(address, "kt", *flags)
    pid = placed("kt")["trainer-0"]["pid"]
    wait_steps("kt", 3)
    os.kill(pid, signal.SIGKILL)
    print("killed trainer-0 at step", steps("kt"))
    out = proc.communicate()[0]
    print("rc", proc.returncode, [line for line in out.splitlines() if "error" in line])
    return start(address, "kt", "--load", "kt", *flags)


def main(argv: list[str]) -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    t0 = time.time()
    try:
        if argv[0] == "learn":
            proc = kill_engine(cluster.address, argv[1] if len(argv) > 1 else "14", argv[2:])
        else:
            proc = kill_trainer(cluster.address)
        out = proc.communicate()[0]
        Path("driver.log").write_text(out)  # the driver's whole output (the lines below are picked from it)
        print("rc", proc.returncode, "wall", round(time.time() - t0, 1))
        keep = ("restart", "done:", "error:", "resuming", "back in rotation")
        print("\n".join(line for line in out.splitlines() if any(k in line for k in keep))[-3000:])
        return proc.returncode
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["learn"]))
