"""Kill the driver with SIGKILL at random points of a CPU run, resume each time, and check that the
trained groups equal those of an uninterrupted run with the same seed (issue 7's must-show).

    .venv/bin/python scripts/kill_resume_check.py --kills 5 --mode sync
    .venv/bin/python scripts/kill_resume_check.py --kills 5 --mode april   # no loss / no repeat

In ``sync`` mode the run is deterministic, so the check is exact equality of the (step, group id,
data index) sequence. In ``april`` mode which groups finish first depends on timing, so the check
is: no group trained twice, and every started group is trained or still pending (ready/partial)
in the final checkpoint. Each kill lands at a random time in the middle of the run, uniformly over
the uninterrupted run's duration after start-up; the killed driver's engine children are cleaned up
after the kill (the driver itself gets no chance to do anything).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]


def train_cmd(run_dir: Path, args) -> list[str]:
    return [
        str(ROOT / ".venv/bin/slime"),
        "train",
        "--rollout-mode",
        args.mode,
        "--rollout-batch-size",
        "4",
        "--over-sampling-batch-size",
        "8",
        "--n-samples-per-prompt",
        "8",
        "--global-batch-size",
        "32",
        "--micro-batch-size",
        "32",
        "--rollout-max-response-len",
        "48",
        "--num-rollout",
        str(args.num_rollout),
        "--lr",
        "5e-5",
        "--num-eval-prompts",
        "20",
        "--rollout-shuffle",
        "--seed",
        str(args.seed),
        "--save",
        str(run_dir),
        "--load",
        str(run_dir),
        "--save-interval",
        "1",
        "--no-progress",
        "--log-level",
        "WARNING",
    ]


def run(cmd: list[str], *, kill_after_s: float | None = None) -> bool:
    """Run to completion (True) or SIGKILL the driver after ``kill_after_s`` (False)."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        proc.wait(timeout=kill_after_s)
        if proc.returncode != 0:
            raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
        return True
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)  # the driver only: no cleanup, no final checkpoint
        proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # then its orphaned engine children
        except ProcessLookupError:
            pass
        return False


def trained(run_dir: Path) -> list[tuple[int, int, int]]:
    rows = [json.loads(x) for x in (run_dir / "trained_groups.jsonl").read_text().splitlines()]
    return [(r["step"], r["group_id"], r["data_index"]) for r in rows]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--mode", choices=["sync", "april"], default="sync")
    p.add_argument("--num-rollout", type=int, default=10)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default="runs/kill_resume")
    args = p.parse_args()
    out = ROOT / args.out
    ref_dir, kill_dir = out / "uninterrupted", out / "killed"
    for d in (ref_dir, kill_dir):
        subprocess.run(["rm", "-rf", str(d)], check=True)
    t0 = time.monotonic()
    run(train_cmd(ref_dir, args))
    duration = time.monotonic() - t0
    rng = random.Random(args.seed)
    kills = 0
    while kills < args.kills:
        at = rng.uniform(0.25, 1.0) * duration
        if run(train_cmd(kill_dir, args), kill_after_s=at):
            break  # finished before the kill landed; restart the whole schedule
        kills += 1
        latest = kill_dir / "checkpoints" / "latest"
        print(
            f"kill {kills}: SIGKILL after {at:.1f}s; latest checkpoint: {latest.read_text().strip() if latest.exists() else 'none'}",
            flush=True,
        )
    run(train_cmd(kill_dir, args))
    a, b = trained(ref_dir), trained(kill_dir)
    ids = [g for _, g, _ in b]
    assert len(ids) == len(set(ids)), f"a group was trained twice: {sorted(ids)}"
    if args.mode == "sync":
        assert a == b, f"trained groups differ:\nuninterrupted {a}\nkilled+resumed {b}"
    final = msgspec.json.decode(
        (
            kill_dir / "checkpoints" / (kill_dir / "checkpoints" / "latest").read_text().strip() / "loop.json"
        ).read_bytes()
    )
    pending = {g["group_id"] for g in final["ready"] + final["partial"]}
    assert set(ids) | pending == set(range(final["next_group_id"])), "a started group was lost"
    print(
        f"OK: {kills} SIGKILLs, {len(b)} groups trained, identical to the uninterrupted run"
        if args.mode == "sync"
        else f"OK: {kills} SIGKILLs, {len(b)} groups trained once each, {len(pending)} pending, none lost"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
