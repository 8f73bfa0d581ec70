"""``slime bench learning``: what asynchrony buys in learning: held-out accuracy against wall time, side by side.

``slime bench rollout`` measures delivered tokens/s with constant rewards; this bench trains. Each
mode of ``--modes`` (``VARIANTS``: sync, april, april with ``--mask-offpolicy-in-partial-rollout``,
async plain and with TIS, MIS or decoupled PPO) runs once per seed of ``--seeds`` through the real
driver (``slime.loop.driver.run_training``, the embedded engine unless the extra flags say
otherwise), one run after another in this process, each into ``OUT/runs/MODE-sSEED``, on the same
task (``--builtin-task``, default ``chain``: long-tailed response lengths), warm start, eval set and
hyper-parameters. From each run's ``metrics.jsonl`` (``run_curve``) it reads:

- the accuracy curve: held-out eval accuracy (every ``--eval-interval`` steps) against wall time
  since training started (the end of the eval before RL: engine start-up and that eval are the same
  for every mode), against the same wall time less the mid-run evals' own time (evals pause
  generation, so they are not part of any mode's cost), and against trained (loss-bearing) tokens;
  the wall time at an eval is when it began, i.e. what the model had reached by then;
- time (both clocks) and tokens to reach ``--target-accuracy``: the first eval at or above it;
- final accuracy (the driver's eval after the last step);
- the off-policy token share (the batches' model tokens with version lag > 0, the driver's
  ``lag_histogram``: after the ``--max-staleness`` mask, before ``--mask-offpolicy-in-partial-rollout``,
  which the trainer applies, so april-mask shows the share it masks) and the version-lag
  distribution of those tokens (shares per lag, p50 / p90 / max).

Per mode (``summarize``): seeds that reached the target, mean / min / max time to target, final
accuracy mean and spread (sample standard deviation, min, max), and the speed-up of time to target
against sync (ratio of the means, over the seeds that reached it). Outputs: ``OUT/learning.json``,
``OUT/learning.txt`` (the table, also printed) and ``OUT/learning.png`` (accuracy vs wall time and
vs trained tokens; one line per mode, the mean over seeds on a common grid, seeds as a min-max band).

On the CPU (defaults: ``TRAIN_FLAGS``, 8 groups x 8 samples a step, 200 eval prompts every 4 steps,
40 steps, target 0.9 from the chain warm start's 0.855), a run takes about a minute on a quiet core.
The GPU-sized version (item 3 of issue 15; documented, not run yet): the GPU-sized chain data
(``slime.data.chain`` docstring) on a real SGLang, e.g. ``slime bench learning --modes
sync,april,april-mask,async,async-tis,async-mis,async-decoupled --seeds 0 --num-rollout 200
--eval-interval 10 --target-accuracy T -- --hf-checkpoint Qwen/Qwen2.5-0.5B-Instruct --prompt-data
D/train.jsonl --eval-prompt-data D/eval.jsonl --num-eval-prompts 200 --rollout-max-response-len 1024
--rollout-batch-size 32 --n-samples-per-prompt 8 --global-batch-size 256 --rollout-num-gpus 1
--train-backend megatron`` (the chain reward is the built-in task's; T a few points under sync's
final accuracy, set after a first sync run).

Extra ``slime train`` flags go after ``--`` and apply to every run (e.g. ``-- --rollout-batch-size 8
--hf-checkpoint DIR``); a flag that a mode sets itself (``--rollout-mode``, ``--seed``, ``--save``, ...)
is refused there.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from slime.obs import strict_json

__all__ = ["VARIANTS", "OWN_FLAGS", "TRAIN_FLAGS", "train_argv", "run_curve", "summarize", "format_table", "plot", "run_bench",
           "write_results", "merge_results", "build_parser", "main"]

VARIANTS: dict[str, list[str]] = {
    "sync": ["--rollout-mode", "sync"],
    "april": ["--rollout-mode", "april"],
    "april-mask": ["--rollout-mode", "april", "--mask-offpolicy-in-partial-rollout"],
    "async": ["--rollout-mode", "async"],
    "async-tis": ["--rollout-mode", "async", "--use-tis"],
    "async-mis": ["--rollout-mode", "async", "--mis-level", "token"],
    "async-decoupled": ["--rollout-mode", "async", "--use-decoupled-ppo"],
}
"""Each mode's own ``slime train`` flags."""

OWN_FLAGS = ("--rollout-mode", "--partial-rollout", "--mask-offpolicy-in-partial-rollout", "--use-tis", "--mis-level",
             "--use-decoupled-ppo", "--seed", "--save", "--load", "--num-rollout", "--eval-interval", "--builtin-task")
"""Flags the bench sets on every run; refused among the extra flags."""


TRAIN_FLAGS = ["--rollout-batch-size", "8", "--n-samples-per-prompt", "8", "--global-batch-size", "64", "--num-eval-prompts", "200",
               "--rollout-max-response-len", "96"]
"""The bench's default ``slime train`` flags (sized for the CPU and ``chain``); extra flags after ``--`` override them."""


def train_argv(mode: str, seed: int, run_dir: str | Path, *, task: str, num_rollout: int, eval_interval: int,
               extra: list[str] = ()) -> list[str]:
    """The ``slime train`` arguments of one run: the bench's, then ``extra`` (the last of a repeated flag wins), then the mode's."""
    return ["--builtin-task", task, "--num-rollout", str(num_rollout), "--eval-interval", str(eval_interval), "--seed", str(seed),
            "--save", str(run_dir), *TRAIN_FLAGS, *extra, *VARIANTS[mode]]


def _quantile(hist: dict[int, float], q: float) -> int | None:
    total = sum(hist.values())
    if total <= 0:
        return None
    acc = 0.0
    for lag in sorted(hist):
        acc += hist[lag]
        if acc >= q * total - 1e-9:
            return lag
    return max(hist)


def run_curve(records: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """One run's curve and figures from its ``metrics.jsonl`` records (see the module doc).

    Returns a dict: ``points`` (per eval: ``step``, ``accuracy``, ``wall_s``, ``wall_ex_eval_s``,
    ``trained_tokens``), ``time_to_target_s`` / ``time_to_target_ex_eval_s`` / ``tokens_to_target`` /
    ``step_to_target`` (None when never reached), ``final_accuracy``, ``initial_accuracy``,
    ``train_wall_s`` (first step to the last, without the final eval), ``eval_time_s`` (mid-run evals),
    ``trained_tokens``, ``off_policy_token_share``, ``lag_share`` (lag -> share of trained tokens),
    ``lag_p50`` / ``lag_p90`` / ``lag_max``.

    Raises:
        ValueError: records without the eval before RL or without ``time_s`` (a run of an older slime).
    """
    evals = [r for r in records if r.get("kind") == "eval"]
    steps = [r for r in records if r.get("kind") == "step"]
    if not evals or evals[0].get("step") != 0 or "time_s" not in evals[0]:
        raise ValueError("metrics.jsonl has no timed eval before RL (step 0 with time_s); it was written by an older slime")
    t0 = evals[0]["time_s"]
    points, eval_so_far = [], 0.0
    tokens_by_step: dict[int, float] = {}
    total = 0.0
    for r in steps:
        total += float(r.get("trained_tokens") or 0)
        tokens_by_step[int(r["step"])] = total
    for r in evals:
        started = r["time_s"] - r.get("eval_time_s", 0.0) - t0
        wall = max(0.0, started)
        acc = r.get("accuracy")
        points.append({"step": int(r["step"]), "accuracy": None if acc is None else float(acc), "wall_s": wall,
                       "wall_ex_eval_s": max(0.0, wall - eval_so_far),
                       "trained_tokens": max((v for k, v in tokens_by_step.items() if k <= r["step"]), default=0.0)})
        if r is not evals[0] and r is not evals[-1]:
            eval_so_far += float(r.get("eval_time_s", 0.0))
    reached = next((p for p in points if p["accuracy"] is not None and p["accuracy"] >= target), None)
    hist: dict[int, float] = {}
    for r in steps:
        for lag, n in (r.get("lag_histogram") or {}).items():
            hist[int(lag)] = hist.get(int(lag), 0.0) + float(n)
    hist_total = sum(hist.values())
    off = sum(n for lag, n in hist.items() if lag > 0)
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
        "off_policy_token_share": off / hist_total if hist_total else None,
        "lag_share": {str(lag): n / hist_total for lag, n in sorted(hist.items())} if hist_total else {},
        "lag_p50": _quantile(hist, 0.5),
        "lag_p90": _quantile(hist, 0.9),
        "lag_max": max(hist) if hist else None,
    }


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None}
    return {"n": len(values), "mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def summarize(curves: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per mode, over its seeds' ``run_curve`` results: ``seeds``, ``reached`` (seeds at target),
    ``time_to_target_s`` / ``time_to_target_ex_eval_s`` / ``tokens_to_target`` / ``final_accuracy`` /
    ``off_policy_token_share`` / ``train_wall_s`` / ``eval_time_s`` as ``{n, mean, std, min, max}``, and
    ``speedup_vs_sync`` (sync's mean time to target over this mode's, both clocks; None when either
    never reached it)."""
    out: dict[str, dict[str, Any]] = {}
    for mode, runs in curves.items():
        m: dict[str, Any] = {"seeds": len(runs), "reached": sum(r["time_to_target_s"] is not None for r in runs)}
        for key in ("time_to_target_s", "time_to_target_ex_eval_s", "tokens_to_target", "final_accuracy", "initial_accuracy",
                    "off_policy_token_share", "train_wall_s", "train_wall_ex_eval_s", "eval_time_s", "trained_tokens"):
            m[key] = _stats([float(r[key]) for r in runs if r[key] is not None])
        m["lag_p90_max"] = max((r["lag_p90"] for r in runs if r["lag_p90"] is not None), default=None)
        m["lag_max"] = max((r["lag_max"] for r in runs if r["lag_max"] is not None), default=None)
        out[mode] = m
    sync = out.get("sync")
    for m in out.values():
        for key, name in (("time_to_target_s", "speedup_vs_sync"), ("time_to_target_ex_eval_s", "speedup_vs_sync_ex_eval")):
            a, b = (sync or {}).get(key, {}).get("mean"), m[key]["mean"]
            m[name] = a / b if a is not None and b else None
        a, b = (sync or {}).get("final_accuracy", {}).get("mean"), m["final_accuracy"]["mean"]
        m["final_accuracy_vs_sync_points"] = 100 * (b - a) if a is not None and b is not None else None
    return out


def _fmt(x: Any, spec: str = ".1f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_table(summary: dict[str, dict[str, Any]], target: float) -> str:
    """The per-mode table (one row a mode; time as mean [min-max] over the seeds that reached the target)."""
    head = (f"{'mode':<16} {'reached':>7} {'t->' + format(target, '.2f') + ' s':>20} {'ex-eval s':>9} {'x sync':>6} "
            f"{'tokens->target':>14} {'final acc':>15} {'vs sync':>7} {'off-pol':>7} {'lag p90/max':>11} {'wall s':>7} {'eval s':>6}")
    lines = [head, "-" * len(head)]
    for mode, m in summary.items():
        t, te, tok, fa = m["time_to_target_s"], m["time_to_target_ex_eval_s"], m["tokens_to_target"], m["final_accuracy"]
        span = f"{_fmt(t['mean'])} [{_fmt(t['min'])}-{_fmt(t['max'])}]" if t["n"] else "-"
        acc = f"{_fmt(fa['mean'], '.3f')} ±{_fmt(fa['std'], '.3f')}" if fa["n"] else "-"
        lines.append(
            f"{mode:<16} {m['reached']:>3}/{m['seeds']:<3} {span:>20} {_fmt(te['mean']):>9} {_fmt(m['speedup_vs_sync'], '.2f'):>6} "
            f"{_fmt(tok['mean'], '.0f'):>14} {acc:>15} {_fmt(m['final_accuracy_vs_sync_points'], '+.1f'):>7} "
            f"{_fmt(m['off_policy_token_share']['mean'], '.3f'):>7} {_fmt(m['lag_p90_max'], 'd'):>5}/{_fmt(m['lag_max'], 'd'):<5} "
            f"{_fmt(m['train_wall_s']['mean']):>7} {_fmt(m['eval_time_s']['mean']):>6}")
    return "\n".join(lines)


def _band(runs: list[dict[str, Any]], x_key: str):
    """Mean, min and max accuracy of the runs on a common grid of ``x_key`` (linear interpolation, no extrapolation)."""
    import numpy as np

    series = [([p[x_key] for p in r["points"] if p["accuracy"] is not None], [p["accuracy"] for p in r["points"] if p["accuracy"] is not None])
              for r in runs]
    series = [(x, y) for x, y in series if x]
    if not series:
        return None
    grid = np.linspace(0.0, min(max(x) for x, _ in series), 100)
    ys = np.array([np.interp(grid, x, y) for x, y in series])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def plot(curves: dict[str, list[dict[str, Any]]], path: str | Path, target: float) -> None:
    """``path``: accuracy vs wall time (left) and vs trained tokens (right); per mode the mean over seeds, band = min-max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, x_key, label in ((axes[0], "wall_s", "wall time since training started, s"), (axes[1], "trained_tokens", "trained tokens")):
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


def _one_run(argv: list[str]) -> list[dict[str, Any]]:
    """Run ``slime train ARGV`` in this process; return its metrics records.

    Raises:
        SlimeError: a bad flag or a failed run (the driver's own errors).
    """
    import msgspec
    from transformers.utils import logging as hf_logging

    from slime import cli_args
    from slime.cli import DEFAULT_CHECKPOINTS, _check_run_dir, _run, preflight
    from slime.errors import ConfigError
    from slime.loop.driver import run_training

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar at every weight sync (as slime train)
    argv, sglang_args, router_args = cli_args.split_passthrough(argv)
    parser = cli_args.build_parser(argparse.ArgumentParser(prog="slime bench learning (a run)", allow_abbrev=False))
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ConfigError(f"unrecognized slime train arguments: {' '.join(unknown)}")
    config = cli_args.config_from_args(ns, sglang_args=sglang_args, router_args=router_args)
    if not config.engine.hf_checkpoint:
        config = msgspec.structs.replace(config, engine=msgspec.structs.replace(config.engine, hf_checkpoint=DEFAULT_CHECKPOINTS[config.data.builtin_task]))
    preflight(config)
    _check_run_dir(config)
    _run(run_training(config, progress=False))
    path = Path(config.run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _results(curves: dict[str, list[dict[str, Any]]], argvs: dict[str, list[list[str]]], *, task: str, num_rollout: int,
             eval_interval: int, target: float, seeds: list[int], extra: list[str], bench_wall_s: float) -> dict[str, Any]:
    summary = summarize(curves)
    return {"target_accuracy": target, "task": task, "num_rollout": num_rollout, "eval_interval": eval_interval, "seeds": seeds,
            "extra_flags": list(extra), "summary": summary, "curves": curves, "argv": argvs, "table": format_table(summary, target),
            "meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv, "bench_wall_s": bench_wall_s}}


def write_results(results: dict[str, Any], out: str | Path) -> None:
    """Write ``OUT/learning.json``, ``learning.txt`` (the table) and ``learning.png``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "learning.json").write_text(strict_json.dumps(results, indent=1) + "\n")
    (out / "learning.txt").write_text(results["table"] + "\n")
    plot(results["curves"], out / "learning.png", results["target_accuracy"])


def run_bench(modes: list[str], seeds: list[int], out: str | Path, *, task: str, num_rollout: int, eval_interval: int, target: float,
              extra: list[str] = (), log=print) -> dict[str, Any]:
    """Run every (mode, seed), write ``OUT/learning.{json,txt,png}``; return the results dict
    (``curves``: mode -> per-seed ``run_curve``; ``summary``: ``summarize``; ``table``; ``argv`` per run; ``meta``).

    The outputs are rewritten after every run, so a bench cut short (a time limit, a failed run) keeps
    every run it finished; modes with no finished run are left out of them.

    Raises:
        SlimeError: a run failed (its run directory keeps what it wrote).
    """
    out = Path(out)
    curves: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    argvs: dict[str, list[list[str]]] = {m: [] for m in modes}
    t_bench = time.monotonic()
    results: dict[str, Any] = {}
    for seed in seeds:  # seeds outermost: a cut-short bench still has every mode of the first seeds
        for mode in modes:
            argv = train_argv(mode, seed, out / "runs" / f"{mode}-s{seed}", task=task, num_rollout=num_rollout,
                              eval_interval=eval_interval, extra=list(extra))
            log(f"[{mode} seed {seed}] slime train {' '.join(argv)}")
            t = time.monotonic()
            curve = run_curve(_one_run(argv), target)
            curves[mode].append({"seed": seed, **curve})
            argvs[mode].append(argv)
            log(f"[{mode} seed {seed}] {time.monotonic() - t:.1f} s: accuracy {_fmt(curve['initial_accuracy'], '.3f')} -> "
                f"{_fmt(curve['final_accuracy'], '.3f')}, to {target:.2f} in {_fmt(curve['time_to_target_s'])} s "
                f"({_fmt(curve['time_to_target_ex_eval_s'])} s without evals), off-policy share {_fmt(curve['off_policy_token_share'], '.3f')}")
            done = [m for m in modes if curves[m]]
            results = _results({m: curves[m] for m in done}, {m: argvs[m] for m in done}, task=task, num_rollout=num_rollout,
                               eval_interval=eval_interval, target=target, seeds=seeds, extra=list(extra),
                               bench_wall_s=time.monotonic() - t_bench)
            write_results(results, out)
    return results


def merge_results(paths: list[str | Path]) -> dict[str, Any]:
    """Merge ``learning.json`` files of separate benches (e.g. one process per mode) into one results dict.

    The runs must share task, target, steps and eval interval; a (mode, seed) in two files is refused.

    Raises:
        ValueError: a file that is missing or not a bench's output, or benches that do not compare.
    """
    parts = []
    for path in paths:
        try:
            parts.append((path, json.loads(Path(path).read_text())))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable learning.json ({exc})") from None
    if not parts:
        raise ValueError("nothing to merge")
    keys = ("task", "target_accuracy", "num_rollout", "eval_interval")
    first_path, first = parts[0]
    curves: dict[str, list[dict[str, Any]]] = {}
    argvs: dict[str, list[list[str]]] = {}
    for path, part in parts:
        if "curves" not in part:
            raise ValueError(f"{path}: no curves (not a slime bench learning output)")
        differ = [k for k in keys if part.get(k) != first.get(k)]
        if differ:
            raise ValueError(f"{path} and {first_path} differ in {', '.join(differ)}: their runs do not compare")
        for mode, runs in part["curves"].items():
            have = {r["seed"] for r in curves.get(mode, [])}
            twice = sorted(have & {r["seed"] for r in runs})
            if twice:
                raise ValueError(f"{path}: mode {mode} seed {twice[0]} is in another file too")
            curves.setdefault(mode, []).extend(runs)
            argvs.setdefault(mode, []).extend(part.get("argv", {}).get(mode, []))
    order = [m for m in VARIANTS if m in curves] + [m for m in curves if m not in VARIANTS]
    seeds = sorted({r["seed"] for runs in curves.values() for r in runs})
    return _results({m: curves[m] for m in order}, {m: argvs.get(m, []) for m in order}, task=first["task"],
                    num_rollout=first["num_rollout"], eval_interval=first["eval_interval"], target=first["target_accuracy"],
                    seeds=seeds, extra=first.get("extra_flags", []),
                    bench_wall_s=sum(p.get("meta", {}).get("bench_wall_s", 0.0) for _, p in parts))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slime bench learning", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False,
                                epilog="extra slime train flags go after --, e.g. -- --rollout-batch-size 8 --hf-checkpoint DIR")
    p.add_argument("--modes", default="sync,april,async", help=f"comma-separated subset of {','.join(VARIANTS)}")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds (each mode runs once per seed)")
    p.add_argument("--builtin-task", default="chain", choices=["arith", "chain"], help="the task (slime.data.TASK)")
    p.add_argument("--num-rollout", type=int, default=40, help="train steps per run")
    p.add_argument("--eval-interval", type=int, default=4, help="held-out eval every N steps (each eval is timed and excluded too)")
    p.add_argument("--target-accuracy", type=float, default=0.9,
                   help="held-out accuracy whose first crossing is timed (chain's warm start: 0.855)")
    p.add_argument("--out", default="runs/bench-learning", help="run directories and learning.{json,txt,png}")
    p.add_argument("--merge", nargs="+", metavar="LEARNING_JSON",
                   help="run nothing: merge these benches' learning.json (e.g. one process per mode) into --out")
    return p


def main(argv: list[str] | None = None) -> int:
    """``slime bench learning [flags] [-- slime train flags]``. Returns 0; 2 on a bad flag or a failed run."""
    from slime.errors import SlimeError

    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.merge:
        try:
            results = merge_results(ns.merge)
        except ValueError as exc:
            print(f"slime bench learning: error: {exc}", file=sys.stderr)
            return 2
        write_results(results, ns.out)
        print(results["table"], flush=True)
        print(f"wrote {Path(ns.out) / 'learning.json'}, learning.txt, learning.png", flush=True)
        return 0
    modes = [m.strip() for m in ns.modes.split(",") if m.strip()]
    if not modes or any(m not in VARIANTS for m in modes) or len(set(modes)) != len(modes):
        parser.error(f"--modes={ns.modes!r}: expected distinct names from {','.join(VARIANTS)}")
    try:
        seeds = [int(s) for s in ns.seeds.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or len(set(seeds)) != len(seeds):
        parser.error(f"--seeds={ns.seeds!r}: expected distinct integers, e.g. 0,1,2")
    if not 0.0 < ns.target_accuracy <= 1.0:
        parser.error(f"--target-accuracy={ns.target_accuracy}: expected a value in (0, 1]")
    if ns.num_rollout < 1 or not 1 <= ns.eval_interval:
        parser.error("--num-rollout and --eval-interval must be >= 1")
    own = sorted({a.split("=")[0] for a in extra} & set(OWN_FLAGS))
    if own:
        parser.error(f"after --: {', '.join(own)} are set by the bench (per mode / seed, or by its own flags)")
    try:
        results = run_bench(modes, seeds, ns.out, task=ns.builtin_task, num_rollout=ns.num_rollout, eval_interval=ns.eval_interval,
                            target=ns.target_accuracy, extra=extra, log=lambda line: print(line, flush=True))
    except SlimeError as exc:
        print(f"slime bench learning: error: {exc}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:  # raised inside the driver's task group: its own error, plainly
        from slime.cli import _first_slime_error

        leaf = _first_slime_error(group)
        if leaf is None:
            raise
        print(f"slime bench learning: error: {leaf}", file=sys.stderr)
        return 2
    print(results["table"], flush=True)
    print(f"wrote {Path(ns.out) / 'learning.json'}, learning.txt, learning.png", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
