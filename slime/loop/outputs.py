"""Run outputs: metrics JSONL, the one-line step summary, ``summary.json`` and the reward-curve PNG.

Run directory layout::

    RUN_DIR/config.json        the resolved typed config
    RUN_DIR/metrics.jsonl      one JSON object per rollout step (and one per eval)
    RUN_DIR/summary.json       eval_accuracy_before/after, aborted/resumed samples, version stats
    RUN_DIR/train.log          every line the run logged (``slime.obs.run_log``)
    RUN_DIR/failed_samples.jsonl  one line per sample whose reward failed: ids, prompt, response, traceback
    RUN_DIR/reward_curve.png   reward and eval accuracy over steps (``slime.obs.plots`` draws it
                               and the other end-of-run PNGs: reward, response_length,
                               staleness, engine_busy)
    RUN_DIR/trace.json         Chrome/Perfetto trace (``--enable-trace``)
    RUN_DIR/tb/                TensorBoard events (``--use-tensorboard``)
    RUN_DIR/weights/vN/        the HF checkpoint pushed to the engines at version N (last few kept)
    RUN_DIR/model/             the final trained policy, an HF directory (config, tokenizer, safetensors),
                               whatever --weight-sync; summary.json's ``model_dir`` (``write_final_model``)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from slime.errors import RunError
from slime.obs import strict_json
from slime.step_record import MetricsRow, RunSummary, StepRecord, steps_of
from slime.types import JsonObject

if TYPE_CHECKING:
    from slime.sync.base import WeightSource

__all__ = [
    "JsonlLog",
    "MetricsWriter",
    "format_step_line",
    "format_done_line",
    "write_json_atomic",
    "check_something_trained",
    "write_final_model",
]


def write_json_atomic(path: str | Path, obj: object) -> None:
    """Write ``obj`` as strict JSON (NaN and infinities as null, ``slime.obs.strict_json``), atomically."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(strict_json.dumps(obj, indent=2, sort_keys=True))
    os.replace(tmp, path)


class JsonlLog:
    """Appends one JSON line per record to ``path`` (flushed each time). The file is created by the
    first record: a run that fails to start (an unreachable engine) leaves none, since a
    ``metrics.jsonl`` marks ``--save`` as holding a run."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._f: TextIO | None = None

    def write(self, record: JsonObject) -> str:
        """Append ``record`` as one strict JSON line (NaN/inf as null); returns the line."""
        if self._f is None:
            self._f = self.path.open("a", encoding="utf-8")
        line = strict_json.dumps(record)
        self._f.write(line + "\n")
        self._f.flush()
        return line

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


class MetricsWriter:
    """Appends one strict JSON line per record to ``RUN_DIR/metrics.jsonl`` (a ``JsonlLog``).

    ``records`` holds each record as the file does (NaN as None, int keys as strings), so a fresh
    run and a resumed one, which reads the file back, summarise the same values."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.records: list[MetricsRow] = []
        if self.path.exists():  # a resumed run continues the file (cut back to its checkpoint first)
            self.records = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        self._log = JsonlLog(self.path)

    def write(self, record: MetricsRow) -> None:
        self.records.append(json.loads(self._log.write(record)))

    def close(self) -> None:
        self._log.close()


def format_step_line(r: StepRecord) -> str:
    """One summary line per step: reward, accuracy, length, tokens/s, aborts, resumes, lag (and the
    teacher's reverse KL with ``--use-opd``), then what the train step did and the step's seconds.

    ``failed F/N`` follows the accuracy when F of the batch's N samples FAILED (a reward that raised,
    an engine refusal): reward, accuracy and length are over the others, so an all-failed batch would
    otherwise read as a plain zero reward. A trained step shows ``| grad G trained T tok masked M``: the
    gradient norm, the tokens trained and those the staleness mask left out, which move from step to step
    (GRPO's loss is near 0 by construction, its advantages centred per group: it stays in ``metrics.jsonl``).
    A rollout-only step (no ``train_time_s``): ``| rollout only, step 1.2s``.
    """
    opd = f"rkl {r.opd_reverse_kl:.4f} " if r.opd_reverse_kl is not None else ""
    failed = f"failed {r.failed_samples_in_batch}/{r.num_samples} " if r.failed_samples_in_batch else ""
    train = "rollout only," if r.train_time_s is None else _trained(r)
    return (
        f"step {r.step:>3} v{r.policy_version:<3} reward {r.reward_mean:.3f} acc {r.accuracy:.3f} {failed}{opd}"
        f"len {r.response_len_mean:5.1f} tok/s {r.tokens_per_s:7.0f} aborted {r.aborted_samples:>3} "
        f"resumed {r.resumed_samples:>3} lag max {r.max_version_lag} multi-ver {r.multi_version_samples:>3} "
        f"| {train} step {r.step_time_s:.1f}s"
    )


def _trained(r: StepRecord) -> str:
    """``grad G trained T tok masked M`` of a trained step (``grad n/a`` from a trainer that reports no norm)."""
    norm = r.train.get("grad_norm")
    grad = f"grad {norm:.3g}" if isinstance(norm, (int, float)) else "grad n/a"
    return f"{grad} trained {r.trained_tokens} tok masked {r.masked_stale_tokens}"


def format_done_line(summary: RunSummary, run_dir: str | Path) -> str:
    """The line ``slime train`` / ``slime rollout`` print at the end of an RL run, from its ``rl_summary``.

    Eval accuracy before -> after ("n/a (no eval set)" for a None), aborted and resumed samples, FAILED
    samples when there were any, and the most policy versions in one trained sample; a rollout-only
    run (that value None: nothing trained) says "nothing trained (rollout only)" instead.
    """
    fmt = lambda x: "n/a (no eval set)" if x is None else f"{x:.3f}"  # noqa: E731
    failed = f", failed {summary['failed_samples']}" if summary.get("failed_samples") else ""
    versions = summary.get("max_versions_in_a_trained_sample")
    trained = "nothing trained (rollout only)" if versions is None else f"max versions in a trained sample {versions}"
    return (
        f"done: eval accuracy {fmt(summary['eval_accuracy_before'])} -> {fmt(summary['eval_accuracy_after'])}; "
        f"aborted {summary['aborted_samples']}, resumed {summary['resumed_samples']}{failed}, {trained}; run dir {run_dir}"
    )


def check_something_trained(records: list[MetricsRow], *, trains: bool = True, run_dir: str | Path = "") -> None:
    """Refuse to call a run a success when its steps produced nothing to learn from.

    Args:
        records: the run's metrics records (``kind`` "step" ones are read; a resumed run's whole history).
        trains: False for a rollout-only run (``--debug-rollout-only``): then only "every sample FAILED" is checked.
        run_dir: named in the message.

    Raises:
        RunError: there were steps and every sample of them FAILED (reward errors, engine refusals:
            the log's warnings say which), or (``trains``) no token of any step was trained.
    """
    steps = steps_of(records, StepRecord)
    if not steps:
        return
    num = sum(r.num_samples for r in steps)
    failed = sum(r.failed_samples_in_batch for r in steps)
    where = f"; its records are in {run_dir}" if run_dir else ""
    if num and failed == num:
        raise RunError(
            f"the run trained nothing: every one of the {num} samples of its {len(steps)} steps FAILED (reward errors "
            f"or engine refusals; the warnings in the log say why){where}"
        )
    if trains and sum(r.train.get("num_train_tokens", r.trained_tokens) for r in steps) == 0:
        raise RunError(
            f"the run trained nothing: no token of its {len(steps)} steps was trained ({num - failed} samples "
            f"counted, every token masked, e.g. as over-stale){where}"
        )


def write_final_model(trainer: WeightSource | None, run_dir: str | Path) -> str | None:
    """Write the trained policy to ``RUN_DIR/model`` as an HF directory (config, tokenizer files, safetensors;
    ``save_hf``, atomic) and return its path; None for a run with no trainer (rollout only). Blocking.

    Every run that trains ends with it, whatever ``--weight-sync`` (disk weights are pruned, tensor sync
    writes none) and with or without ``--save-interval`` (checkpoints hold optimizer state too).
    """
    if trainer is None:
        return None
    return trainer.save_hf(str(Path(run_dir) / "model"))
