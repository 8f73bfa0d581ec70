"""End-of-run PNGs, drawn from the records of ``RUN_DIR/metrics.jsonl``.

============================  ==================================================================
``reward_curve.png``          train reward and eval accuracy over steps (the README's plot)
``reward.png``                train reward, batch accuracy, eval accuracy
``response_length.png``       mean response length, share of truncated samples, eval length
``staleness.png``             trained tokens by version lag per step (stacked), off-policy share
``engine_busy.png``           generated tokens/s, and each step's time: rollout wait, train, sync
============================  ==================================================================

Records may come from an older or crashed run: a key that is missing leaves its curve out. Figures
are ``matplotlib.figure.Figure`` objects (no pyplot state), so drawing is safe off the main thread.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from slime.step_record import MetricsRow

__all__ = [
    "PLOTS",
    "plot_reward_curve",
    "plot_reward",
    "plot_response_length",
    "plot_staleness",
    "plot_engine_busy",
    "write_plots",
]

Records = list[MetricsRow]


def _figure(num_rows: int = 1, height: float = 4.0):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, height * num_rows if num_rows > 1 else height))
    axes = fig.subplots(num_rows, 1, squeeze=False)[:, 0]
    return fig, axes


def _save(fig: Any, path: str | Path) -> None:  # a matplotlib Figure (untyped third-party)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _steps(records: Records) -> Records:
    return [r for r in records if r.get("kind") == "step" and isinstance(r.get("step"), (int, float))]


def _evals(records: Records) -> Records:
    return [r for r in records if r.get("kind") == "eval" and isinstance(r.get("step"), (int, float))]


def _series(records: Records, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the records that hold a number under ``key``."""
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def _finish(ax: Any, ylabel: str, *, legend: bool = True) -> None:  # a matplotlib Axes (untyped third-party)
    ax.set_xlabel("rollout step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def plot_reward_curve(records: Records, path: str | Path) -> None:
    """Train reward (mean) and greedy eval accuracy over steps, on [0, 1]."""
    fig, (ax,) = _figure()
    x, y = _series(_steps(records), "reward_mean")
    if x:
        ax.plot(x, y, label="train reward (mean)")
    x, y = _series(_evals(records), "accuracy")
    if x:
        ax.plot(x, y, "o-", label="eval accuracy (greedy)")
    ax.set_ylim(0, 1)
    _finish(ax, "reward / accuracy")
    _save(fig, path)


def plot_reward(records: Records, path: str | Path) -> None:
    """Train reward, the batch's share of samples with reward >= 1, and eval accuracy (auto-scaled)."""
    fig, (ax,) = _figure()
    steps = _steps(records)
    for key, label in (("reward_mean", "train reward (mean)"), ("accuracy", "train accuracy (reward >= 1)")):
        x, y = _series(steps, key)
        if x:
            ax.plot(x, y, label=label)
    x, y = _series(_evals(records), "accuracy")
    if x:
        ax.plot(x, y, "o-", label="eval accuracy (greedy)")
    ax.set_title("reward")
    _finish(ax, "reward / accuracy")
    _save(fig, path)


def plot_response_length(records: Records, path: str | Path) -> None:
    """Mean response length per step (tokens), the share of truncated samples, eval length."""
    fig, (ax,) = _figure()
    steps = _steps(records)
    x, y = _series(steps, "response_len_mean")
    if x:
        ax.plot(x, y, label="train response length (mean)")
    x, y = _series(_evals(records), "mean_response_len")
    if x:
        ax.plot(x, y, "o-", label="eval response length (mean)")
    trunc = [
        (r["step"], r["truncated_samples"] / r["num_samples"])
        for r in steps
        if isinstance(r.get("truncated_samples"), (int, float)) and r.get("num_samples")
    ]
    if trunc:
        ax2 = ax.twinx()
        ax2.plot([p[0] for p in trunc], [p[1] for p in trunc], ":", color="tab:red", label="truncated share")
        ax2.set_ylim(0, 1)
        ax2.set_ylabel("truncated share")
        ax2.legend(loc="lower right", fontsize="small")
    ax.set_title("response length")
    _finish(ax, "tokens")
    _save(fig, path)


def _lag_histogram(record: MetricsRow) -> dict[int, float]:
    """``lag_histogram`` with int keys (JSON turned them into strings)."""
    hist = record.get("lag_histogram")
    if not isinstance(hist, dict):
        return {}
    return {int(k): float(v) for k, v in hist.items() if str(k).lstrip("-").isdigit() and isinstance(v, (int, float))}


def plot_staleness(records: Records, path: str | Path, *, max_lag_shown: int = 4) -> None:
    """Top: each step's trained tokens by version lag (shares, stacked; lags past ``max_lag_shown``
    pooled). Bottom: off-policy token share and the share of samples spanning several versions."""
    fig, (top, bottom) = _figure(2, height=3.2)
    steps = [r for r in _steps(records) if _lag_histogram(r)]
    if steps:
        xs = [r["step"] for r in steps]
        hists = [_lag_histogram(r) for r in steps]
        totals = [sum(h.values()) or 1.0 for h in hists]
        base = [0.0] * len(steps)
        for lag in range(max_lag_shown + 1):
            last = lag == max_lag_shown
            share = [
                sum(n for k, n in h.items() if (k >= lag if last else k == lag)) / t for h, t in zip(hists, totals)
            ]
            if any(share):
                top.bar(xs, share, bottom=base, label=f"lag {lag}{'+' if last else ''}")
                base = [b + s for b, s in zip(base, share)]
        top.set_ylim(0, 1)
    top.set_title("staleness: trained tokens by version lag")
    _finish(top, "share of tokens")
    all_steps = _steps(records)
    x, y = _series(all_steps, "off_policy_token_fraction")
    if x:
        bottom.plot(x, y, label="off-policy token share (lag > 0)")
    multi = [
        (r["step"], r["multi_version_samples"] / r["num_samples"])
        for r in all_steps
        if isinstance(r.get("multi_version_samples"), (int, float)) and r.get("num_samples")
    ]
    if multi:
        bottom.plot([p[0] for p in multi], [p[1] for p in multi], label="samples spanning >= 2 versions")
    bottom.set_ylim(0, 1)
    _finish(bottom, "share")
    _save(fig, path)


def plot_engine_busy(records: Records, path: str | Path) -> None:
    """Top: generated tokens/s per step. Bottom: each step's wall time split into rollout wait,
    train and weight sync (what is left is bookkeeping)."""
    fig, (top, bottom) = _figure(2, height=3.2)
    steps = _steps(records)
    x, y = _series(steps, "tokens_per_s")
    if x:
        top.plot(x, y, label="generated tokens/s")
    top.set_title("engine throughput")
    _finish(top, "tokens/s")
    base = [0.0] * len(steps)
    xs = [r["step"] for r in steps]
    for key, label in (
        ("rollout_wait_s", "waiting for rollouts"),
        ("train_time_s", "train step"),
        ("weight_sync_s", "weight sync"),
    ):
        values = [float(r[key]) if isinstance(r.get(key), (int, float)) else 0.0 for r in steps]
        if any(values):
            bottom.bar(xs, values, bottom=base, label=label)
            base = [b + v for b, v in zip(base, values)]
    bottom.set_title("step time")
    _finish(bottom, "seconds")
    _save(fig, path)


PLOTS: dict[str, Callable[[Records, str | Path], None]] = {
    "reward_curve.png": plot_reward_curve,
    "reward.png": plot_reward,
    "response_length.png": plot_response_length,
    "staleness.png": plot_staleness,
    "engine_busy.png": plot_engine_busy,
}
"""File name in RUN_DIR -> the function that draws it."""


def write_plots(records: Records, run_dir: str | Path, *, only_missing: bool = False) -> list[Path]:
    """Draw every PNG of ``PLOTS`` into ``run_dir``; returns the paths written.

    ``only_missing``: keep files that exist (``slime report`` regenerates only what is missing).
    """
    run_dir = Path(run_dir)
    written = []
    for name, draw in PLOTS.items():
        path = run_dir / name
        if only_missing and path.exists():
            continue
        draw(records, path)
        written.append(path)
    return written
