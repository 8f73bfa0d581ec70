"""The arithmetic of ``slime bench learning`` (``slime.bench.learning``): one run's accuracy curve from its
``metrics.jsonl`` records (``run_curve``), the per-mode summary over seeds (``summarize``), its table
(``format_table``) and the plot (``plot``). Pure functions of records; no run is started here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slime.step_record import StepRecord, off_policy_share, steps_of, summed_lag_histogram
from slime.types import JsonObject

__all__ = ["run_curve", "summarize", "format_table", "plot", "fmt"]


def _quantile(hist: Mapping[int, float], q: float) -> int | None:
    total = sum(hist.values())
    if total <= 0:
        return None
    acc = 0.0
    for lag in sorted(hist):
        acc += hist[lag]
        if acc >= q * total - 1e-9:
            return lag
    return max(hist)


def run_curve(records: list[JsonObject], target: float) -> JsonObject:
    """One run's curve and figures from its ``metrics.jsonl`` records (see the module doc).

    Returns a dict: ``points`` (per eval: ``step``, ``accuracy``, ``wall_s``, ``wall_ex_eval_s``,
    ``trained_tokens``), ``time_to_target_s`` / ``time_to_target_ex_eval_s`` / ``tokens_to_target`` /
    ``step_to_target`` (None when never reached), ``final_accuracy``, ``initial_accuracy``,
    ``train_wall_s`` (first step to the last, without the final eval), ``eval_time_s`` (mid-run evals),
    ``trained_tokens``, ``off_policy_token_share``, ``lag_share`` (lag -> share of trained tokens),
    ``lag_p50`` / ``lag_p90`` / ``lag_max`` (all of trained tokens: after the staleness mask),
    ``masked_token_share`` (masked as over-stale / model tokens before the mask), ``fully_masked_samples``,
    ``bias`` (the steps' mean of each ``bias/<name>``, ``slime.loop.offpolicy.length_bias``),
    ``trained_len_mean`` / ``trained_reward_mean`` (response tokens and reward per trained sample over the
    whole run, FAILED samples left out; ``summarize`` sets them beside sync's: the length bias against an
    unbiased draw, which ``bias/len_ratio`` cannot show when the completed draws of a window are biased too).

    Raises:
        ValueError: records without the eval before RL or without ``time_s`` (a run of an older slime).
    """
    evals = [r for r in records if r.get("kind") == "eval"]
    steps = steps_of(records, StepRecord)
    if not evals or evals[0].get("step") != 0 or "time_s" not in evals[0]:
        raise ValueError(
            "metrics.jsonl has no timed eval before RL (step 0 with time_s); it was written by an older slime"
        )
    tokens_by_step: dict[int, float] = {}
    total = 0.0
    for st in steps:
        total += float(st.trained_tokens)
        tokens_by_step[st.step] = total
    points, eval_so_far = _eval_points(evals, tokens_by_step)
    reached = next((p for p in points if p["accuracy"] is not None and p["accuracy"] >= target), None)
    hist = summed_lag_histogram(steps)
    hist_total = sum(hist.values())
    masked = sum(st.masked_stale_tokens for st in steps)
    trained_len, trained_reward = _per_trained_sample(steps)
    return {
        "points": points,
        "target_accuracy": target,
        "time_to_target_s": None if reached is None else reached["wall_s"],
        "time_to_target_ex_eval_s": None if reached is None else reached["wall_ex_eval_s"],
        "tokens_to_target": None if reached is None else reached["trained_tokens"],
        "step_to_target": None if reached is None else reached["step"],
        "initial_accuracy": points[0]["accuracy"],
        "final_accuracy": points[-1]["accuracy"],
        "train_wall_s": points[-1]["wall_s"],
        "train_wall_ex_eval_s": points[-1]["wall_ex_eval_s"],
        "eval_time_s": eval_so_far,
        "trained_tokens": total,
        "off_policy_token_share": off_policy_share(hist),
        "lag_share": {str(lag): n / hist_total for lag, n in sorted(hist.items())} if hist_total else {},
        "lag_p50": _quantile(hist, 0.5),
        "lag_p90": _quantile(hist, 0.9),
        "lag_max": max(hist) if hist else None,
        "masked_token_share": masked / (hist_total + masked) if hist_total + masked else None,
        "fully_masked_samples": sum(st.fully_masked_samples for st in steps),
        "bias": _bias_means(steps),
        "trained_len_mean": trained_len,
        "trained_reward_mean": trained_reward,
    }


def _per_trained_sample(steps: list[StepRecord]) -> tuple[float | None, float | None]:
    """(response tokens, reward) per trained sample over all steps: samples keeping >= 1 token after the
    staleness mask (``apply_staleness``'s ``trained_samples``; a fully masked sample trains nothing, so its
    length must not count). None where no step trained a sample or a step's row predates the counts."""
    if any(st.trained_samples is None for st in steps):
        return None, None
    trained = sum(st.trained_samples or 0 for st in steps)
    if trained <= 0:
        return None, None
    tokens = sum(st.trained_sample_response_tokens for st in steps)
    return tokens / trained, sum(st.trained_sample_reward_sum for st in steps) / trained


def _bias_means(steps: list[StepRecord]) -> dict[str, float]:
    """Per ``bias/<name>``: its mean over the steps that have a finite value (none: left out)."""
    values: dict[str, list[float]] = {}
    for st in steps:
        for k, v in st.bias.items():
            if math.isfinite(v):
                values.setdefault(k, []).append(v)
    return {k: statistics.fmean(v) for k, v in values.items()}


def _eval_points(evals: list[JsonObject], tokens_by_step: dict[int, float]) -> tuple[list[JsonObject], float]:
    """One point per eval record (step, accuracy, wall seconds since the eval before RL with and without the
    mid-run evals, trained tokens by then), and the seconds the mid-run evals took."""
    t0 = evals[0]["time_s"]
    points: list[JsonObject] = []
    eval_so_far = 0.0
    for r in evals:
        started = r["time_s"] - r.get("eval_time_s", 0.0) - t0
        wall = max(0.0, started)
        acc = r.get("accuracy")
        points.append(
            {
                "step": int(r["step"]),
                "accuracy": None if acc is None else float(acc),
                "wall_s": wall,
                "wall_ex_eval_s": max(0.0, wall - eval_so_far),
                "trained_tokens": max((v for k, v in tokens_by_step.items() if k <= r["step"]), default=0.0),
            }
        )
        if r is not evals[0] and r is not evals[-1]:
            eval_so_far += float(r.get("eval_time_s", 0.0))
    return points, eval_so_far


def _stats(values: list[float]) -> JsonObject:
    if not values:
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None}
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def summarize(curves: dict[str, list[JsonObject]]) -> dict[str, JsonObject]:
    """Per mode, over its seeds' ``run_curve`` results: ``seeds``, ``reached`` (seeds at target),
    ``time_to_target_s`` / ``time_to_target_ex_eval_s`` / ``tokens_to_target`` / ``final_accuracy`` /
    ``off_policy_token_share`` / ``train_wall_s`` / ``eval_time_s`` as ``{n, mean, std, min, max}``, and
    ``speedup_vs_sync`` (sync's mean time to target over this mode's, both clocks; None when either
    never reached it), ``trained_len_vs_sync`` / ``trained_reward_vs_sync`` (this mode's mean response length
    and reward per trained sample over sync's: below 1 on length, a mode that trains the short answers of the
    same task more often than they are drawn; None without sync)."""
    out: dict[str, JsonObject] = {}
    for mode, runs in curves.items():
        m: dict[str, Any] = {"seeds": len(runs), "reached": sum(r["time_to_target_s"] is not None for r in runs)}
        for key in (
            "time_to_target_s",
            "time_to_target_ex_eval_s",
            "tokens_to_target",
            "final_accuracy",
            "initial_accuracy",
            "off_policy_token_share",
            "train_wall_s",
            "train_wall_ex_eval_s",
            "eval_time_s",
            "trained_tokens",
            "masked_token_share",
            "trained_len_mean",
            "trained_reward_mean",
        ):
            m[key] = _stats([float(r[key]) for r in runs if r.get(key) is not None])
        names = sorted({k for r in runs for k in r.get("bias", {})})
        m["bias"] = {k: statistics.fmean(r["bias"][k] for r in runs if k in r.get("bias", {})) for k in names}
        m["lag_p90_max"] = max((r["lag_p90"] for r in runs if r["lag_p90"] is not None), default=None)
        m["lag_max"] = max((r["lag_max"] for r in runs if r["lag_max"] is not None), default=None)
        out[mode] = m
    sync = out.get("sync")
    for m in out.values():
        for key, name in (
            ("time_to_target_s", "speedup_vs_sync"),
            ("time_to_target_ex_eval_s", "speedup_vs_sync_ex_eval"),
        ):
            a, b = (sync or {}).get(key, {}).get("mean"), m[key]["mean"]
            m[name] = a / b if a is not None and b else None
        for key, name in (
            ("trained_len_mean", "trained_len_vs_sync"),
            ("trained_reward_mean", "trained_reward_vs_sync"),
        ):
            a, b = (sync or {}).get(key, {}).get("mean"), m[key]["mean"]
            m[name] = b / a if a and b is not None else None
        a, b = (sync or {}).get("final_accuracy", {}).get("mean"), m["final_accuracy"]["mean"]
        m["final_accuracy_vs_sync_points"] = 100 * (b - a) if a is not None and b is not None else None
    return out


def fmt(x: object, spec: str = ".1f") -> str:
    """``x`` formatted with ``spec``; "-" for None or NaN (a figure a run did not reach)."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_table(summary: dict[str, JsonObject], target: float) -> str:
    """The per-mode table (one row a mode; time as mean [min-max] over the seeds that reached the target;
    the bias columns: ``len_ratio``, ``long_share`` / ``long_share_completed`` and ``age_long`` / ``age_short``
    as means over steps and seeds, the masked share of tokens, and the trained samples' length / reward against
    sync's)."""
    head = (
        f"{'mode':<16} {'reached':>7} {'t->' + format(target, '.2f') + ' s':>20} {'ex-eval s':>9} {'x sync':>6} "
        f"{'tokens->target':>14} {'final acc':>15} {'vs sync':>7} {'off-pol':>7} {'lag p90/max':>11} {'wall s':>7} {'eval s':>6}"
        f" {'masked':>6} {'len ratio':>9} {'long tr/drawn':>13} {'age long/short':>14} {'len/rew vs sync':>15}"
    )
    lines = [head, "-" * len(head)]
    for mode, m in summary.items():
        t, te, tok, fa = (
            m["time_to_target_s"],
            m["time_to_target_ex_eval_s"],
            m["tokens_to_target"],
            m["final_accuracy"],
        )
        span = f"{fmt(t['mean'])} [{fmt(t['min'])}-{fmt(t['max'])}]" if t["n"] else "-"
        acc = f"{fmt(fa['mean'], '.3f')} ±{fmt(fa['std'], '.3f')}" if fa["n"] else "-"
        lines.append(
            f"{mode:<16} {m['reached']:>3}/{m['seeds']:<3} {span:>20} {fmt(te['mean']):>9} {fmt(m['speedup_vs_sync'], '.2f'):>6} "
            f"{fmt(tok['mean'], '.0f'):>14} {acc:>15} {fmt(m['final_accuracy_vs_sync_points'], '+.1f'):>7} "
            f"{fmt(m['off_policy_token_share']['mean'], '.3f'):>7} {fmt(m['lag_p90_max'], 'd'):>5}/{fmt(m['lag_max'], 'd'):<5} "
            f"{fmt(m['train_wall_s']['mean']):>7} {fmt(m['eval_time_s']['mean']):>6} {_bias_cells(m)}"
        )
    return "\n".join(lines)


def _bias_cells(m: JsonObject) -> str:
    """The table's masked-share and length-bias cells of one mode's summary ("-" where a run had none)."""
    b, masked = m.get("bias", {}), m.get("masked_token_share", {}).get("mean")
    long_ = f"{fmt(b.get('long_share'), '.2f')}/{fmt(b.get('long_share_completed'), '.2f')}"
    age = f"{fmt(b.get('age_long'), '.2f')}/{fmt(b.get('age_short'), '.2f')}"
    vs_sync = f"{fmt(m.get('trained_len_vs_sync'), '.2f')}/{fmt(m.get('trained_reward_vs_sync'), '.2f')}"
    return f"{fmt(masked, '.3f'):>6} {fmt(b.get('len_ratio'), '.2f'):>9} {long_:>13} {age:>14} {vs_sync:>15}"


def _band(runs: list[JsonObject], x_key: str):
    """Mean, min and max accuracy of the runs on a common grid of ``x_key`` (linear interpolation, no extrapolation)."""
    import numpy as np

    series = [
        (
            [p[x_key] for p in r["points"] if p["accuracy"] is not None],
            [p["accuracy"] for p in r["points"] if p["accuracy"] is not None],
        )
        for r in runs
    ]
    series = [(x, y) for x, y in series if x]
    if not series:
        return None
    grid = np.linspace(0.0, min(max(x) for x, _ in series), 100)
    ys = np.array([np.interp(grid, x, y) for x, y in series])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def plot(curves: dict[str, list[JsonObject]], path: str | Path, target: float) -> None:
    """``path``: accuracy vs wall time (left) and vs trained tokens (right); per mode the mean over seeds, band = min-max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, x_key, label in (
        (axes[0], "wall_s", "wall time since training started, s"),
        (axes[1], "trained_tokens", "trained tokens"),
    ):
        for mode, runs in curves.items():
            band = _band(runs, x_key)
            if band is None:
                continue
            grid, mean, lo, hi = band
            (line,) = ax.plot(grid, mean, label=f"{mode} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
            if len(runs) > 1:
                ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2)
        ax.axhline(target, color="grey", linestyle=":", linewidth=1, label=f"target {target:.2f}")
        ax.set_xlabel(label)
        ax.set_ylabel("held-out accuracy")
        ax.grid(alpha=0.3)
    axes[0].set_title("accuracy vs wall time (bands: min-max over seeds)")
    axes[1].set_title("accuracy vs trained tokens")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
