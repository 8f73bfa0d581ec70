"""``slime train --ray`` end to end on a local two-node Ray cluster (issue 28, item 5).

Its own cluster (``ray.cluster_utils.Cluster``: a head without GPUs and two nodes of ONE fake GPU each, so
the run's two bundles, trainer then engine, must land on different nodes): the built-in chain task, one
embedded engine standing in for SGLang on one node, the torch trainer on the other, the driver a
subprocess as a user runs it. Three cases: the run learns while its engine is killed mid-run (replaced
on its bundle, no sample lost or trained twice); a trainer rank killed ends the run with one line after
its last checkpoint and ``--load`` resumes it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from slime.bench.learning_modes import TRAIN_FLAGS  # noqa: E402
from slime.loop.record import load_rollout_record  # noqa: E402

pytestmark = pytest.mark.timeout(300)

RUN = ["--builtin-task", "chain", *TRAIN_FLAGS, "--no-progress", "--health-check-interval-s", "1"]
"""The bench's CPU recipe for the chain task (slime bench learning), with fast engine health checks."""
GROUPS = int(TRAIN_FLAGS[TRAIN_FLAGS.index("--rollout-batch-size") + 1])
SAMPLES = int(TRAIN_FLAGS[TRAIN_FLAGS.index("--n-samples-per-prompt") + 1])


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[str]:
    """The address of a head (no GPU) and two nodes of one fake GPU each; not connected here."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    yield cluster.address
    cluster.shutdown()


def _start(address: str, run_dir: Path, *flags: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "slime.cli", "train", "--ray", "--ray-address", address, *RUN, *flags]
    return subprocess.Popen(
        [*argv, "--save", str(run_dir)],
        cwd=run_dir.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _placement(run_dir: Path, proc: subprocess.Popen[str], timeout_s: float = 60) -> dict[str, dict[str, object]]:
    """Process name -> its row in ``RUN_DIR.placement.json`` (written by the driver once all started)."""
    path = Path(f"{run_dir}.placement.json")
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        assert proc.poll() is None, _finish(proc)[-3000:]
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.2)
    return {row["name"]: row for row in json.loads(path.read_text())["processes"]}


def _wait_steps(run_dir: Path, n: int, proc: subprocess.Popen[str], timeout_s: float = 120) -> None:
    """Until ``metrics.jsonl`` holds ``n`` train steps (the run still going)."""
    deadline = time.monotonic() + timeout_s
    while _steps(run_dir) < n:
        assert proc.poll() is None, "the run ended early"
        assert time.monotonic() < deadline, f"no step {n} within {timeout_s}s"
        time.sleep(0.2)


def _steps(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return 0
    return sum(json.loads(line).get("kind") == "step" for line in metrics.read_text().splitlines() if line.strip())


def _finish(proc: subprocess.Popen[str], timeout_s: float = 180) -> str:
    out, _ = proc.communicate(timeout=timeout_s)
    return out


def test_run_on_two_nodes_learns_and_survives_a_killed_engine(two_nodes: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    record = str(tmp_path / "groups" / "step_{rollout_id}.bin")
    proc = _start(
        two_nodes, run_dir, "--num-rollout", "14", "--eval-interval", "14", "--save-debug-rollout-data", record
    )
    where = _placement(run_dir, proc)
    # each on its own node: the trainer's bundle first in slime's order, the engine's after it
    assert where["trainer-0"]["node"] == 0 and where["engine-0"]["node"] == 1
    assert where["trainer-0"]["node_id"] != where["engine-0"]["node_id"]
    _wait_steps(run_dir, 4, proc)
    os.kill(int(where["engine-0"]["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    out = _finish(proc)
    assert proc.returncode == 0, out[-3000:]
    assert "engine-0 restarted on its bundle" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
    assert after > before, (before, after)
    # every step trained its full batch, and no group (hence no sample) twice or with a sample missing
    ids = []
    for step in range(1, 15):
        groups = load_rollout_record(record, step).groups
        assert len(groups) == GROUPS and all(len(g.samples) == SAMPLES for g in groups), step
        ids += [g.group_id for g in groups]
        assert all(sorted(s.index for s in g.samples) == list(range(SAMPLES)) for g in groups)
    assert len(ids) == len(set(ids))
    assert re.search(r"^done: eval accuracy", out, re.M)


def test_killed_trainer_ends_the_run_with_one_line_and_load_resumes(two_nodes: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    flags = ("--num-rollout", "6", "--eval-interval", "6", "--save-interval", "2")
    proc = _start(two_nodes, run_dir, *flags)
    where = _placement(run_dir, proc)
    _wait_steps(run_dir, 3, proc)  # a checkpoint at step 2
    os.kill(int(where["trainer-0"]["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    out = _finish(proc)
    assert proc.returncode == 2, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("slime train: error:")]
    assert len(errors) == 1, out[-3000:]
    line = errors[0]
    assert "trainer rank 0 (actor trainer-0" in line and "on node 0" in line and "exit status -9" in line
    assert f"resume with `slime train --ray --load {run_dir}" in line
    resumed = _start(two_nodes, run_dir, *flags, "--load", str(run_dir))
    out = _finish(resumed)
    assert resumed.returncode == 0, out[-3000:]
    assert _steps(run_dir) >= 6
    assert json.loads((run_dir / "summary.json").read_text())["final_policy_version"] == 6
