"""Run outputs: metrics JSONL, the one-line step summary, ``summary.json`` and the reward-curve PNG.

Run directory layout::

    RUN_DIR/config.json        the resolved typed config
    RUN_DIR/metrics.jsonl      one JSON object per rollout step (and one per eval)
    RUN_DIR/summary.json       eval_accuracy_before/after, aborted/resumed samples, version stats
    RUN_DIR/reward_curve.png   reward and eval accuracy over steps
    RUN_DIR/weights/vN/        the HF checkpoint pushed to the engines at version N (last few kept)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["MetricsWriter", "format_step_line", "write_json_atomic", "plot_reward_curve"]


def write_json_atomic(path: str | Path, obj: Any) -> None:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


class MetricsWriter:
    """Appends one JSON line per record to ``RUN_DIR/metrics.jsonl`` (flushed each time)."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / "metrics.jsonl"
        self._f = self.path.open("a", encoding="utf-8")
        self.records: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self._f.write(json.dumps(record, default=str) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def format_step_line(r: dict[str, Any]) -> str:
    """One summary line per step: reward, accuracy, length, tokens/s, aborts, resumes, lag."""
    return (
        f"step {r['step']:>3} v{r['policy_version']:<3} reward {r['reward_mean']:.3f} acc {r['accuracy']:.3f} "
        f"len {r['response_len_mean']:5.1f} tok/s {r['tokens_per_s']:7.0f} aborted {r['aborted_samples']:>3} "
        f"resumed {r['resumed_samples']:>3} lag max {r['max_version_lag']} multi-ver {r['multi_version_samples']:>3} "
        f"| loss {r.get('train/loss', float('nan')):+.4f} step {r['step_time_s']:.1f}s"
    )


def plot_reward_curve(records: list[dict[str, Any]], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r for r in records if r.get("kind") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig, ax = plt.subplots(figsize=(7, 4))
    if steps:
        ax.plot([r["step"] for r in steps], [r["reward_mean"] for r in steps], label="train reward (mean)")
    if evals:
        ax.plot([r["step"] for r in evals], [r["accuracy"] for r in evals], "o-", label="eval accuracy (greedy)")
    ax.set_xlabel("rollout step")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
