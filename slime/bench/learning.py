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
- the off-policy token share (the trained model tokens with version lag > 0, the driver's
  ``lag_histogram``: after the ``--max-staleness`` mask, before ``--mask-offpolicy-in-partial-rollout``,
  which the trainer applies, so april-mask shows the share it masks) and the version-lag
  distribution of those tokens (shares per lag, p50 / p90 / max), the share of tokens masked as
  over-stale, and the length bias of what trained against what was drawn (``bias/*`` of the step
  records, ``slime.loop.offpolicy.length_bias``: length ratio, longest-quartile share trained / drawn,
  mean age in versions of the trained tokens of long / short samples), and each mode's mean response
  length and reward per trained sample beside sync's (``len/rew vs sync``: the one bias measure against an
  unbiased draw; on the H200's long tail APRIL's first steps trained 20-token answers while its window
  ratio read 1.00, since the completed draws of that window were as short).

Modes ``april-4x``, ``april-drop``, ``april-tis`` and ``async-eta4`` are issue 30's candidates (32 groups in
flight, the bench's APRIL before 2x became the default; partial groups expiring after ``--max-staleness``
versions; the over-stale prefix trained with TIS instead of masked; async at η = 4, its default before 1).

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
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from slime.bench.learning_curves import fmt, format_table, plot, run_curve, summarize
from slime.bench.learning_modes import OWN_FLAGS, TRAIN_FLAGS, VARIANTS, train_argv
from slime.obs import strict_json
from slime.types import JsonObject

TrainFn = Callable[[list[str]], list[JsonObject]]
"""Runs ``slime train ARGV`` and returns its ``metrics.jsonl`` records (``slime.cli``'s in-process run)."""

__all__ = [
    "VARIANTS",
    "OWN_FLAGS",
    "TRAIN_FLAGS",
    "TrainFn",
    "train_argv",
    "run_curve",
    "summarize",
    "format_table",
    "plot",
    "run_bench",
    "write_results",
    "merge_results",
    "build_parser",
    "main",
]


def _results(
    curves: dict[str, list[JsonObject]],
    argvs: dict[str, list[list[str]]],
    *,
    task: str,
    num_rollout: int,
    eval_interval: int,
    target: float,
    seeds: list[int],
    extra: list[str],
    bench_wall_s: float,
) -> JsonObject:
    summary = summarize(curves)
    return {
        "target_accuracy": target,
        "task": task,
        "num_rollout": num_rollout,
        "eval_interval": eval_interval,
        "seeds": seeds,
        "extra_flags": list(extra),
        "summary": summary,
        "curves": curves,
        "argv": argvs,
        "table": format_table(summary, target),
        "meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv, "bench_wall_s": bench_wall_s},
    }


def write_results(results: JsonObject, out: str | Path) -> None:
    """Write ``OUT/learning.json``, ``learning.txt`` (the table) and ``learning.png``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "learning.json").write_text(strict_json.dumps(results, indent=1) + "\n")
    (out / "learning.txt").write_text(results["table"] + "\n")
    plot(results["curves"], out / "learning.png", results["target_accuracy"])


def run_bench(
    modes: list[str],
    seeds: list[int],
    out: str | Path,
    *,
    task: str,
    num_rollout: int,
    eval_interval: int,
    target: float,
    train: TrainFn,
    extra: Sequence[str] = (),
    log: Callable[[str], None] = print,
) -> JsonObject:
    """Run every (mode, seed) with ``train``, write ``OUT/learning.{json,txt,png}``; return the results dict
    (``curves``: mode -> per-seed ``run_curve``; ``summary``: ``summarize``; ``table``; ``argv`` per run; ``meta``).

    The outputs are rewritten after every run, so a bench cut short (a time limit, a failed run) keeps
    every run it finished; modes with no finished run are left out of them.

    Raises:
        SlimeError: a run failed (its run directory keeps what it wrote).
    """
    out = Path(out)
    curves: dict[str, list[JsonObject]] = {m: [] for m in modes}
    argvs: dict[str, list[list[str]]] = {m: [] for m in modes}
    t_bench = time.monotonic()
    results: JsonObject = {}
    for seed in seeds:  # seeds outermost: a cut-short bench still has every mode of the first seeds
        for mode in modes:
            argv = train_argv(
                mode,
                seed,
                out / "runs" / f"{mode}-s{seed}",
                task=task,
                num_rollout=num_rollout,
                eval_interval=eval_interval,
                extra=list(extra),
            )
            curves[mode].append(
                {"seed": seed, **_run_one(f"[{mode} seed {seed}]", argv, train=train, target=target, log=log)}
            )
            argvs[mode].append(argv)
            done = [m for m in modes if curves[m]]
            results = _results(
                {m: curves[m] for m in done},
                {m: argvs[m] for m in done},
                task=task,
                num_rollout=num_rollout,
                eval_interval=eval_interval,
                target=target,
                seeds=seeds,
                extra=list(extra),
                bench_wall_s=time.monotonic() - t_bench,
            )
            write_results(results, out)
    return results


def _run_one(tag: str, argv: list[str], *, train: TrainFn, target: float, log: Callable[[str], None]) -> JsonObject:
    """``slime train ARGV`` through ``train``, logged before and after (``tag`` starts each line); its ``run_curve``."""
    log(f"{tag} slime train {' '.join(argv)}")
    t = time.monotonic()
    curve = run_curve(train(argv), target)
    log(
        f"{tag} {time.monotonic() - t:.1f} s: accuracy {fmt(curve['initial_accuracy'], '.3f')} -> "
        f"{fmt(curve['final_accuracy'], '.3f')}, to {target:.2f} in {fmt(curve['time_to_target_s'])} s "
        f"({fmt(curve['time_to_target_ex_eval_s'])} s without evals), off-policy share {fmt(curve['off_policy_token_share'], '.3f')}"
    )
    return curve


def merge_results(paths: list[str | Path], *, retarget: float | None = None) -> JsonObject:
    """Merge ``learning.json`` files of separate benches (e.g. one process per mode) into one results dict.

    The runs must share task, target, steps and eval interval; a (mode, seed) in two files is refused.
    ``retarget``: re-read every run's ``metrics.jsonl`` (its ``--save`` directory) and time this target
    instead (the benches' own targets may then differ), e.g. one set from sync's final accuracy.

    Raises:
        ValueError: a file that is missing or not a bench's output, benches that do not compare, or
            (``retarget``) a run directory without its metrics.
    """
    parts = []
    for path in paths:
        try:
            parts.append((path, json.loads(Path(path).read_text())))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable learning.json ({exc})") from None
    if not parts:
        raise ValueError("nothing to merge")
    keys = (
        "task",
        *(("target_accuracy",) if retarget is None else ()),
        "num_rollout",
        "eval_interval",
        "extra_flags",
    )  # extra: the runs' slime train flags
    first_path, first = parts[0]
    curves: dict[str, list[JsonObject]] = {}
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
    if retarget is not None:
        curves = {m: [_retimed(r, a, retarget) for r, a in zip(runs, argvs.get(m, []))] for m, runs in curves.items()}
    order = [m for m in VARIANTS if m in curves] + [m for m in curves if m not in VARIANTS]
    seeds = sorted({r["seed"] for runs in curves.values() for r in runs})
    return _results(
        {m: curves[m] for m in order},
        {m: argvs.get(m, []) for m in order},
        task=first["task"],
        num_rollout=first["num_rollout"],
        eval_interval=first["eval_interval"],
        target=first["target_accuracy"] if retarget is None else retarget,
        seeds=seeds,
        extra=first.get("extra_flags", []),
        bench_wall_s=sum(p.get("meta", {}).get("bench_wall_s", 0.0) for _, p in parts),
    )


def _retimed(run: JsonObject, argv: list[str], target: float) -> JsonObject:
    """``run`` (one seed's curve) timed against ``target``, from the ``metrics.jsonl`` in its ``--save`` directory."""
    path = Path(argv[argv.index("--save") + 1]) / "metrics.jsonl" if "--save" in argv else None
    if path is None or not path.is_file():
        raise ValueError(f"--retarget: no metrics.jsonl for seed {run['seed']} ({path})")
    return {
        "seed": run["seed"],
        **run_curve([json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()], target),
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slime bench learning",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
        epilog="extra slime train flags go after --, e.g. -- --rollout-batch-size 8 --hf-checkpoint DIR",
    )
    p.add_argument("--modes", default="sync,april,async", help=f"comma-separated subset of {','.join(VARIANTS)}")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds (each mode runs once per seed)")
    p.add_argument("--builtin-task", default="chain", choices=["arith", "chain"], help="the task (slime.data.TASK)")
    p.add_argument("--num-rollout", type=int, default=40, help="train steps per run")
    p.add_argument(
        "--eval-interval", type=int, default=4, help="held-out eval every N steps (each eval is timed and excluded too)"
    )
    p.add_argument(
        "--target-accuracy",
        type=float,
        default=0.9,
        help="held-out accuracy whose first crossing is timed (chain's warm start: 0.855)",
    )
    p.add_argument("--out", default="runs/bench-learning", help="run directories and learning.{json,txt,png}")
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="LEARNING_JSON",
        help="run nothing: merge these benches' learning.json (e.g. one process per mode) into --out",
    )
    p.add_argument(
        "--retarget",
        type=float,
        default=None,
        metavar="T",
        help="with --merge: time target T instead, from each run's metrics.jsonl (e.g. set from sync's final)",
    )
    return p


def main(argv: list[str] | None = None, *, train: TrainFn) -> int:
    """``slime bench learning [flags] [-- slime train flags]``; ``train`` runs one ``slime train`` (``slime.cli``
    passes its own, so the bench never imports the CLI). Returns 0; 2 on a bad flag or a failed run."""
    from slime.errors import SlimeError, first_slime_error

    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.merge:
        return _merge(ns.merge, ns.out, retarget=ns.retarget)
    modes, seeds = _checked_flags(parser, ns, extra)
    try:
        results = run_bench(
            modes,
            seeds,
            ns.out,
            task=ns.builtin_task,
            num_rollout=ns.num_rollout,
            eval_interval=ns.eval_interval,
            target=ns.target_accuracy,
            train=train,
            extra=extra,
            log=lambda line: print(line, flush=True),
        )
    except SlimeError as exc:
        print(f"slime bench learning: error: {exc}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:  # raised inside the driver's task group: its own error, plainly
        leaf = first_slime_error(group)
        if leaf is None:
            raise
        print(f"slime bench learning: error: {leaf}", file=sys.stderr)
        return 2
    print(results["table"], flush=True)
    print(f"wrote {Path(ns.out) / 'learning.json'}, learning.txt, learning.png", flush=True)
    return 0


def _merge(paths: list[str], out: str, *, retarget: float | None = None) -> int:
    """``--merge``: the benches' ``learning.json`` files as one bench's outputs in ``out``; 2 if they do not merge."""
    try:
        results = merge_results(list(paths), retarget=retarget)
    except ValueError as exc:
        print(f"slime bench learning: error: {exc}", file=sys.stderr)
        return 2
    write_results(results, out)
    print(results["table"], flush=True)
    print(f"wrote {Path(out) / 'learning.json'}, learning.txt, learning.png", flush=True)
    return 0


def _checked_flags(
    parser: argparse.ArgumentParser, ns: argparse.Namespace, extra: list[str]
) -> tuple[list[str], list[int]]:
    """The modes and seeds to run; ``parser.error`` (exit 2) on a bad flag or a bench flag after ``--``."""
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
        parser.error(f"after --: {', '.join(own)}: set by the bench (per mode / seed, or by its own flags)")
    return modes, seeds
