"""Pick the learning rate of a sweep of learning-bench runs (``bench_learning_longtail.sh`` with ``LRS``).

Each ``DIR/lrLR/MODE/learning.json`` is one ``slime bench learning`` run at that ``--lr``. The pick is the rate
whose run has the highest mean held-out accuracy over its evaluations after step 0 (the area under the curve:
one eval of 200 problems is noisy to +-3.5 points, a final eval alone would pick by that noise); ties go to the
smaller rate. Prints one line per rate (its curve, mean and gain over step 0) and writes the pick to
``DIR/best_lr``. Exit 1 when no run has a curve.

    python3 scripts/gpu/pick_lr.py DIR [--mode sync]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def curve(path: Path, mode: str) -> list[tuple[int, float]]:
    """(step, accuracy) of the first run of ``mode`` in one learning.json, evals without an accuracy left out."""
    runs = json.loads(path.read_text())["curves"].get(mode) or []
    if not runs:
        return []
    return [(int(p["step"]), float(p["accuracy"])) for p in runs[0]["points"] if p.get("accuracy") is not None]


def score(points: list[tuple[int, float]]) -> float | None:
    """Mean accuracy of the evals after step 0; None without one."""
    later = [acc for step, acc in points if step > 0]
    return sum(later) / len(later) if later else None


def pick(sweep: Path, mode: str = "sync") -> tuple[str | None, list[str]]:
    """(the best rate as written in the folder name, or None; one report line per rate)."""
    scored: list[tuple[float, float, str]] = []
    lines: list[str] = []
    for path in sorted(sweep.glob(f"lr*/{mode}/learning.json")):
        lr = path.parent.parent.name[2:]
        points = curve(path, mode)
        s = score(points)
        shown = " ".join(f"{step}:{acc:.3f}" for step, acc in points)
        if s is None:
            lines.append(f"lr {lr}: no eval after step 0 ({shown or 'no curve'})")
            continue
        gain = s - points[0][1] if points and points[0][0] == 0 else float("nan")
        lines.append(f"lr {lr}: mean after step 0 {s:.3f} (gain {gain:+.3f}); {shown}")
        scored.append((-s, float(lr), lr))
    if not scored:
        return None, lines
    return min(scored)[2], lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--mode", default="sync")
    ns = parser.parse_args(argv)
    best, lines = pick(ns.sweep, ns.mode)
    for line in lines:
        print(line)
    if best is None:
        print(f"pick_lr: no {ns.mode} run with a curve under {ns.sweep}", file=sys.stderr)
        return 1
    (ns.sweep / "best_lr").write_text(best + "\n")
    print(f"best lr {best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
