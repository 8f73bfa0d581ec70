"""``slime report RUN_DIR``: what a run did, from the files it left, finished or not.

Reads ``config.json``, ``metrics.jsonl`` and ``summary.json``, any of which may be missing (a run
that crashed has no ``summary.json``; one killed mid-write ends ``metrics.jsonl`` with a partial
line, which is skipped and reported). Prints steps, wall time, eval accuracy before and after,
the reward trend (mean of the first and last 5 steps), tokens/s, aborted and resumed samples,
staleness, failures, and what looked wrong; ``--json`` prints the same as one JSON object.
Missing end-of-run PNGs are drawn again (``--no-plots`` to skip). An SFT run (``--loss-type
sft_loss``) reports steps, wall time, the eval loss before and after, the train loss trend, tokens/s
and trained tokens instead of the RL lines, and has no plots.

Exit status: 0 with a report, 2 when RUN_DIR holds none of the three files.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

import msgspec

from slime.obs import strict_json
from slime.step_record import MetricsRow, RunSummary, SFTStepRecord, StepRecord, off_policy_share, summed_lag_histogram
from slime.types import JsonObject

__all__ = ["main", "load_run", "summarize"]

TREND_STEPS = 5
R = TypeVar("R", StepRecord, SFTStepRecord)


def _read_json(path: Path, problems: list[str]) -> JsonObject | None:
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        problems.append(f"{path.name}: unreadable JSON ({exc})")
        return None
    return obj if isinstance(obj, dict) else None


def load_run(run_dir: str | Path) -> tuple[JsonObject | None, list[MetricsRow], RunSummary | None, list[str]]:
    """(config, metrics records, summary, problems) of a run directory; never raises on bad content."""
    run_dir = Path(run_dir)
    problems: list[str] = []
    config = _read_json(run_dir / "config.json", problems)
    summary = _read_json(run_dir / "summary.json", problems)
    records: list[MetricsRow] = []
    path = run_dir / "metrics.jsonl"
    if path.is_file():
        lines = path.read_bytes().split(b"\n")
        last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                what = "truncated last line (the run stopped mid-write)" if i == last else "unreadable line"
                problems.append(f"metrics.jsonl:{i + 1}: {what}, skipped")
                continue
            if isinstance(rec, dict):
                records.append(rec)
            else:
                problems.append(f"metrics.jsonl:{i + 1}: not a JSON object, skipped")
    return config, records, summary, problems


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _finite(values: Iterable[object]) -> list[float]:
    """The finite numbers of ``values`` (a NaN, a record's default for a value its row lacked, is left out)."""
    return [v for v in map(_num, values) if v is not None]


def _decoded_steps(records: list[MetricsRow], kind: type[R], problems: list[str]) -> list[R]:
    """The step rows of ``records`` as ``kind``'s records (``slime.step_record``); a row that does not decode is skipped and reported."""
    steps: list[R] = []
    for n, row in enumerate((r for r in records if r.get("kind") == "step"), start=1):
        try:
            steps.append(kind.from_row(row))
        except msgspec.ValidationError as exc:
            problems.append(f"metrics.jsonl: step record {n}: {exc}, skipped")
    return steps


def summarize(
    config: JsonObject | None, records: list[MetricsRow], summary: RunSummary | None, problems: list[str]
) -> RunSummary:
    """The report as a dict (what ``--json`` prints)."""
    sft = (config or {}).get("train", {}).get("loss_type") == "sft_loss" or (summary or {}).get("mode") == "sft"
    steps: list[StepRecord] | list[SFTStepRecord] = (
        _decoded_steps(records, SFTStepRecord, problems) if sft else _decoded_steps(records, StepRecord, problems)
    )
    evals = [r for r in records if r.get("kind") == "eval"]
    loop = (config or {}).get("loop", {})
    planned = loop.get("num_rollout")
    if summary is None:
        problems.append("no summary.json: the run crashed, was stopped, or is still running")
    if planned is not None and summary is not None and len(steps) != planned:
        problems.append(f"{len(steps)} step records for --num-rollout={planned}")
    wall = _num((summary or {}).get("wall_time_s"))
    head = {
        "status": "finished" if summary is not None else "incomplete",
        "steps": len(steps),
        "num_rollout": planned,
        "last_step": steps[-1].step if steps else None,
        "wall_time_s": wall if wall is not None else round(sum(_finite(r.step_time_s for r in steps)), 1),
        "wall_time_source": "summary.json" if wall is not None else "sum of step times",
    }
    if sft:
        return head | _summarize_sft([r for r in steps if isinstance(r, SFTStepRecord)], evals, summary, problems)
    rl_steps = [r for r in steps if isinstance(r, StepRecord)]
    return {"mode": loop.get("mode") or (summary or {}).get("mode"), **head} | _summarize_rl(
        rl_steps, evals, summary, problems
    )


def _summarize_rl(
    steps: list[StepRecord], evals: list[MetricsRow], summary: RunSummary | None, problems: list[str]
) -> RunSummary:
    """The RL lines of the report: eval accuracy, the reward trend, tokens/s, partial rollouts, staleness, failures."""
    rewards = _finite(r.reward_mean for r in steps)
    first, last = rewards[:TREND_STEPS], rewards[-TREND_STEPS:]
    eval_points = [(r.get("step"), _num(r.get("accuracy"))) for r in evals]
    before = eval_points[0][1] if eval_points and eval_points[0][0] == 0 else None
    after = eval_points[-1][1] if summary is not None and len(eval_points) > 1 else None
    if summary is not None:
        before = _num(summary.get("eval_accuracy_before")) if before is None else before
        after = _num(summary.get("eval_accuracy_after")) if after is None else after
    tps = _finite(r.tokens_per_s for r in steps)
    failed = sum(r.failed_samples for r in steps)
    if failed:
        problems.append(f"{failed} samples FAILED (reward errors or engine refusals; see Sample.evidence)")
    return {
        "final_policy_version": steps[-1].policy_version if steps else None,
        "eval_accuracy_before": before,
        "eval_accuracy_after": after,
        "evals": [{"step": s, "accuracy": a} for s, a in eval_points],
        "reward_first_steps": first,
        "reward_last_steps": last,
        "reward_first_mean": _mean(first),
        "reward_last_mean": _mean(last),
        "tokens_per_s_mean": _mean(tps),
        "tokens_per_s_last": tps[-1] if tps else None,
        "generated_tokens": sum(r.generated_tokens for r in steps),
        "aborted_samples": sum(r.aborted_samples for r in steps),
        "resumed_samples": sum(r.resumed_samples for r in steps),
        "staleness": _staleness(steps),
        "failures": {
            "failed_samples": failed,
            "truncated_samples": sum(r.truncated_samples for r in steps),
            "filtered_groups": sum(r.filtered_groups for r in steps),
            "dropped_stale_groups": sum(r.dropped_stale_groups for r in steps),
        },
        "problems": problems,
    }


def _staleness(steps: list[StepRecord]) -> RunSummary:
    """The staleness line: the largest lag, the mean off-policy share, tokens by lag (summed), masked and multi-version counts."""
    hist = summed_lag_histogram(steps)
    return {
        "max_version_lag": max((r.max_version_lag for r in steps), default=None),
        # of the run's trained tokens (the summed histogram), not a mean over steps: a step that trains few
        # tokens weighs little, and one that trains none has no share at all (as slime bench learning counts)
        "off_policy_token_fraction": off_policy_share(hist),
        "lag_histogram": {str(k): v for k, v in hist.items()},
        "masked_stale_tokens": sum(r.masked_stale_tokens for r in steps),
        "multi_version_samples": sum(r.multi_version_samples for r in steps),
        "max_versions_in_a_sample": max((r.max_versions_in_a_sample for r in steps), default=None),
        "fully_masked_samples": sum(r.fully_masked_samples for r in steps),
        # the length bias (slime.loop.offpolicy.length_bias): each bias/<name> as its mean over the steps
        "bias": {k: _mean(_finite(r.bias.get(k) for r in steps)) for k in sorted({k for r in steps for k in r.bias})},
    }


def _summarize_sft(
    steps: list[SFTStepRecord], evals: list[MetricsRow], summary: RunSummary | None, problems: list[str]
) -> RunSummary:
    """The report of an SFT run (``slime.loop.sft``): eval loss and train-loss trend instead of rewards."""
    eval_points = [(r.get("step"), _num(r.get("eval_loss"))) for r in evals]
    losses = _finite(r.train.get("loss") for r in steps)
    first, last = losses[:TREND_STEPS], losses[-TREND_STEPS:]
    return {
        "mode": "sft",
        "last_epoch": steps[-1].epoch if steps else None,
        "evals": [{"step": s, "eval_loss": v} for s, v in eval_points],
        "eval_loss_before": eval_points[0][1] if eval_points and eval_points[0][0] == 0 else None,
        "eval_loss_after": eval_points[-1][1] if summary is not None and len(eval_points) > 1 else None,
        "train_loss_first_mean": _mean(first),
        "train_loss_last_mean": _mean(last),
        "tokens_per_s_mean": _mean(_finite(r.tokens_per_s for r in steps)),
        "trained_tokens": sum(r.trained_tokens for r in steps),
        "num_tokens": sum(r.num_tokens for r in steps),
        "problems": problems,
    }


def _format_sft(run_dir: Path, rep: RunSummary) -> list[str]:
    planned = f" of {rep['num_rollout']}" if rep["num_rollout"] is not None else ""
    return [
        f"run {run_dir}: {rep['status']}, mode sft",
        f"  steps            {rep['steps']}{planned} (last epoch {_f(rep['last_epoch'], 'd')})",
        f"  wall time        {_f(rep['wall_time_s'], '.1f')} s ({rep['wall_time_source']})",
        f"  eval loss        {_f(rep['eval_loss_before'], '.4f')} -> {_f(rep['eval_loss_after'], '.4f')} (nats per trained token)",
        f"  train loss       first {TREND_STEPS} steps {_f(rep['train_loss_first_mean'], '.4f')} -> last {TREND_STEPS} steps {_f(rep['train_loss_last_mean'], '.4f')}",
        f"  tokens           {rep['trained_tokens']} trained of {rep['num_tokens']}, mean {_f(rep['tokens_per_s_mean'], '.0f')} tokens/s",
    ]


def _f(value: object, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def format_report(run_dir: Path, rep: RunSummary) -> str:
    if rep["mode"] == "sft":
        return "\n".join(_format_sft(run_dir, rep) + [f"  ! {p}" for p in rep["problems"]])
    st, fl = rep["staleness"], rep["failures"]
    planned = f" of {rep['num_rollout']}" if rep["num_rollout"] is not None else ""
    lines = [
        f"run {run_dir}: {rep['status']}, mode {rep['mode'] or '?'}",
        f"  steps            {rep['steps']}{planned} (final policy version {_f(rep['final_policy_version'], 'd')})",
        f"  wall time        {_f(rep['wall_time_s'], '.1f')} s ({rep['wall_time_source']})",
        f"  eval accuracy    {_f(rep['eval_accuracy_before'])} -> {_f(rep['eval_accuracy_after'])}",
        f"  reward           first {len(rep['reward_first_steps'])} steps {_f(rep['reward_first_mean'])}"
        f" -> last {len(rep['reward_last_steps'])} steps {_f(rep['reward_last_mean'])}",
        f"  tokens/s         mean {_f(rep['tokens_per_s_mean'], '.0f')}, last {_f(rep['tokens_per_s_last'], '.0f')}"
        f" ({rep['generated_tokens']} tokens generated)",
        f"  partial rollouts aborted {rep['aborted_samples']}, resumed {rep['resumed_samples']}",
        f"  staleness        max lag {_f(st['max_version_lag'], 'd')}, off-policy token share {_f(st['off_policy_token_fraction'])},"
        f" masked {st['masked_stale_tokens']}, multi-version samples {st['multi_version_samples']},"
        f" tokens by lag {', '.join(f'{k}: {v}' for k, v in st['lag_histogram'].items()) or '-'}",
        f"  length bias      {', '.join(f'{k} {_f(v)}' for k, v in st['bias'].items()) or '-'}"
        f" (trained vs completed draws, step means); fully masked samples {st['fully_masked_samples']}",
        f"  failures         failed samples {fl['failed_samples']}, truncated {fl['truncated_samples']},"
        f" filtered groups {fl['filtered_groups']}, dropped stale groups {fl['dropped_stale_groups']}",
    ]
    lines += [f"  ! {p}" for p in rep["problems"]]
    lines += [f"  plot             {p}" for p in rep.get("plots_written", [])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="slime report", description="Summarize a run directory (finished or crashed)."
    )
    parser.add_argument("run_dir", help="the run's --save directory")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--no-plots", action="store_true", help="do not draw missing PNGs")
    ns = parser.parse_args(argv)
    run_dir = Path(ns.run_dir)
    if not any((run_dir / n).is_file() for n in ("config.json", "metrics.jsonl", "summary.json")):
        print(
            f"slime report: error: {run_dir}: no config.json, metrics.jsonl or summary.json (not a run directory?)",
            file=sys.stderr,
        )
        return 2
    config, records, summary, problems = load_run(run_dir)
    rep = summarize(config, records, summary, problems)
    if not ns.no_plots and records and rep["mode"] != "sft":
        from slime.obs.plots import write_plots

        rep["plots_written"] = [str(p) for p in write_plots(records, run_dir, only_missing=True)]
    if ns.json:
        print(strict_json.dumps(rep, indent=2, sort_keys=True))
    else:
        print(format_report(run_dir, rep))
    return 0
