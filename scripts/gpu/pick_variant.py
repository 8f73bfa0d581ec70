"""Pick the recipe of a sweep of learning-bench runs (``bench_learning_longtail.sh`` with ``VARIANTS`` or ``LRS``).

Each ``DIR/NAME/MODE/learning.json`` is one ``slime bench learning`` run of the variant NAME (``DIR/NAME/flags``
holds its extra ``slime train`` flags; an ``LRS`` sweep names its variants ``lr<rate>``). The pick is the variant
whose run has the highest mean held-out accuracy over its evaluations after step 0 (the area under the curve:
one eval of 200 problems is noisy to +-3.5 points, a final eval alone would pick by that noise); ties go to the
smaller rate between ``lr`` variants, then to the first name. Prints one line per variant (its curve, mean and
gain over step 0) and one of its training signals from the run's ``metrics.jsonl`` (the sampled reward and the
policy entropy of its first and last three steps, the mean grad norm: a curve that falls with entropy rising is
an update that hurts, a flat one with a flat reward an update too small to matter), then writes the pick to
``DIR/best_variant`` (and, for an ``lr`` variant, its rate to ``DIR/best_lr``), with a warning line when even
the best fell below step 0 (nothing learned: the pick is the run that moved least). Exit 1 when no run has a
curve.

    python3 scripts/gpu/pick_variant.py DIR [--mode sync]
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


def lr_of(name: str) -> float | None:
    """The rate of an ``lr<rate>`` variant, None for any other name."""
    try:
        return float(name[2:]) if name.startswith("lr") else None
    except ValueError:
        return None


def _label(name: str) -> str:
    """How a variant is named in the report: ``lr 3e-5`` for ``lr3e-5``, else its folder name."""
    return f"lr {name[2:]}" if lr_of(name) is not None else name


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def signals(variant: Path, mode: str) -> str:
    """Reward and entropy over the first and last three train steps, mean grad norm; '' without metrics."""
    steps: list[dict] = []
    for path in sorted(variant.glob(f"{mode}/runs/*/metrics.jsonl"))[:1]:
        for line in path.read_text().splitlines():
            record = json.loads(line) if line.strip() else {}
            if "train/reward_mean" in record:
                steps.append(record)
    if not steps:
        return ""

    def ends(key: str) -> str:
        values = [s[key] for s in steps if isinstance(s.get(key), (int, float))]
        return f"{_mean(values[:3]):.3f} -> {_mean(values[-3:]):.3f}"

    grad = _mean([s["train/grad_norm"] for s in steps if isinstance(s.get("train/grad_norm"), (int, float))])
    return (
        f"    {len(steps)} steps: reward {ends('train/reward_mean')}, entropy {ends('train/entropy')}, "
        f"grad norm {grad:.2f}"
    )


def pick(sweep: Path, mode: str = "sync") -> tuple[str | None, list[str], float]:
    """(the best variant's folder name, or None; the report lines; the best's gain over step 0, NaN without one)."""
    scored: list[tuple[float, float, int, str, float]] = []
    lines: list[str] = []
    for order, path in enumerate(sorted(sweep.glob(f"*/{mode}/learning.json"))):
        name = path.parent.parent.name
        points = curve(path, mode)
        s = score(points)
        shown = " ".join(f"{step}:{acc:.3f}" for step, acc in points)
        label = _label(name)
        if s is None:
            lines.append(f"{label}: no eval after step 0 ({shown or 'no curve'})")
            continue
        gain = s - points[0][1] if points and points[0][0] == 0 else float("nan")
        lines.append(f"{label}: mean after step 0 {s:.3f} (gain {gain:+.3f}); {shown}")
        if extra := signals(path.parent.parent, mode):
            lines.append(extra)
        rate = lr_of(name)
        scored.append((-s, rate if rate is not None else float("inf"), order, name, gain))
    if not scored:
        return None, lines, float("nan")
    best = min(scored)
    return best[3], lines, best[4]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--mode", default="sync")
    ns = parser.parse_args(argv)
    best, lines, gain = pick(ns.sweep, ns.mode)
    for line in lines:
        print(line)
    if best is None:
        print(f"pick_variant: no {ns.mode} run with a curve under {ns.sweep}", file=sys.stderr)
        return 1
    if not gain > 0:
        # the best of runs that all fell is still a pick (e.g. a control run); say so rather than let it pass
        print(f"pick_variant: no variant raised held-out accuracy over step 0; {best} fell least")
    (ns.sweep / "best_variant").write_text(best + "\n")
    if lr_of(best) is not None:
        (ns.sweep / "best_lr").write_text(best[2:] + "\n")
    print(f"best {best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
