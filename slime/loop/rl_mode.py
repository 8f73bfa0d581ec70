"""The RL run's part of the run skeleton (``slime.loop.run``): its evals, its step and its summary.

``RLEval`` runs the held-out evals (``k`` samples per prompt at the engines' version) and writes one
``kind: eval`` record each; ``RLMode`` is the ``RunMode`` the skeleton drives, one ``run_step`` per
step plus the eval and checkpoint hooks; ``rl_summary`` derives the run's ``summary.json`` from every
metrics record. ``slime.loop.driver.run_training`` wires the run and hands these to ``run_steps``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from slime.data.dataset import PromptRow
from slime.loop.assemble import RunParts
from slime.loop.buffer import DataBuffer
from slime.loop.checkpoint import LoopState
from slime.loop.evaluate import evaluate_datasets
from slime.loop.interface import RolloutScheduler
from slime.loop.outputs import format_step_line
from slime.loop.plan import RunPlan
from slime.loop.record import save_rollout_record
from slime.loop.run import RunFiles
from slime.loop.step import run_step
from slime.loop.version import PolicyVersion
from slime.obs.observers import Observers
from slime.obs.trace import RunTracer
from slime.step_record import MetricsRow, RunSummary, StepRecord, steps_of
from slime.sync.base import WeightSync
from slime.train_metrics import TrainMetrics
from slime.types import Group, JsonObject

__all__ = ["RLEval", "RLMode", "rl_summary"]

log = logging.getLogger(__name__)


def _clock(t_start: float, t_eval: float) -> dict[str, float]:
    """An eval record's ``time_s`` (seconds since the run started, at its end) and ``eval_time_s`` (its own
    duration, pauses included), so accuracy can be read against wall time with and without evals."""
    now = time.monotonic()
    return {"time_s": round(now - t_start, 4), "eval_time_s": round(now - t_eval, 4)}


class RLEval:
    """The RL run's evals: ``k`` samples per held-out prompt at the engines' version (``slime.loop.evaluate``),
    one ``kind: eval`` record each, with ``time_s`` / ``eval_time_s`` (``_clock``)."""

    def __init__(
        self,
        files: RunFiles,
        obs: Observers,
        eval_sets: dict[str | None, list[PromptRow]],
        version: PolicyVersion,
        eval_kw: dict[str, object],
    ):
        self.files, self.obs, self.eval_sets, self.version, self.eval_kw = files, obs, eval_sets, version, eval_kw
        self.num_prompts = sum(map(len, eval_sets.values()))
        self.before: MetricsRow | None = None

    async def run(self, step: int, *, reuse: MetricsRow | None = None) -> MetricsRow:
        """Evaluate, write the record; returns the eval's numbers."""
        t_eval = time.monotonic()
        with self.obs.tracer.span("eval", "eval", step=step, num_prompts=self.num_prompts):
            result = (
                reuse
                if reuse is not None
                else await evaluate_datasets(self.eval_sets, engine_version=self.version.engines, **self.eval_kw)
            )
        policy_version = 0 if step == 0 else self.version.engines
        self.files.metrics.write(
            rec := {
                "kind": "eval",
                "step": step,
                "policy_version": policy_version,
                **result,
                **_clock(self.files.t_start, t_eval),
            }
        )
        return result | {"_record": rec}

    async def final(self, step: int, *, reuse_before: bool) -> None:
        """The eval after the last step (a rollout-only run's weights never changed: the eval before stands)."""
        out = await self.run(step, reuse=self.before if reuse_before and self.before is not None else None)
        self.obs.record(out["_record"])


class RLMode:
    """The RL run's part of the skeleton (``slime.loop.interface.RunMode``): one ``run_step`` per step."""

    def __init__(
        self,
        sched: RolloutScheduler,
        evaluator: RLEval,
        parts: RunParts,
        plan: RunPlan,
        *,
        train_step: Callable[[list[Group]], TrainMetrics] | None,
        sync: WeightSync,
        tracer: RunTracer,
    ):
        self.sched, self.evaluator, self.trainer, self.train_step, self.sync = (
            sched,
            evaluator,
            parts.trainer,
            train_step,
            sync,
        )
        self.tracer, self.source, self.offline, self.colocate = (
            tracer,
            parts.inputs.source,
            parts.inputs.offline,
            plan.colocate,
        )
        self.record_template, self.rollout_only = plan.record_template, plan.rollout_only
        self.newest_only = plan.newest_only

    async def _save_batch(
        self, template: str, groups: list[Group]
    ) -> None:  # --save-debug-rollout-data: the groups as taken, before masking
        await asyncio.to_thread(
            save_rollout_record, template, self.sched.rollout_id, groups, policy_version=self.sched.version.trainer
        )

    async def step(self, step: int) -> tuple[StepRecord, list[JsonObject]]:
        groups, record = await run_step(
            self.sched,
            train_step=self.train_step,
            sync=self.sync,
            tracer=self.tracer,
            colocate=self.colocate,
            newest_only=self.newest_only,
            on_batch=functools.partial(self._save_batch, self.record_template) if self.record_template else None,
        )
        return record, [{"step": step, "group_id": g.group_id, "data_index": g.data_index} for g in groups]

    def step_line(self, record: StepRecord) -> str:
        return format_step_line(record)

    async def evaluate(self, step: int) -> None:
        ev = self.evaluator
        if step == 0:
            out = await ev.run(0)
            ev.before = {k: v for k, v in out.items() if k != "_record"}
            ev.obs.record(out["_record"])
            if ev.eval_sets:
                log.info("eval before RL: accuracy %.3f%s", out["accuracy"], _per_dataset(out["_record"]))
            else:  # the record is still written (accuracy null): the summary's "before" reads it
                log.info("eval before RL: n/a (no eval set)")
            return
        if not ev.eval_sets or self.rollout_only:
            return
        async with self.sched.paused():
            out = await ev.run(step)
        ev.obs.record(
            out["_record"], f"eval @ step {step}: accuracy {out['accuracy']:.3f}{_per_dataset(out['_record'])}"
        )

    def quiesced(self) -> AbstractAsyncContextManager[None]:
        return self.sched.quiesced()

    def loop_state(self, step: int) -> LoopState:
        buffer = self.sched.buffer
        return LoopState(
            step=step,
            policy_version=self.sched.version.engines,
            source=self.source.state_dict(),
            taken=sorted(buffer.taken),
            ready=list(buffer.ready),
            partial=buffer.partial_groups(),
            num_evicted=buffer.num_evicted,
            num_expired=buffer.num_expired,
            offline_source=self.offline.state_dict() if self.offline else None,
            **self.sched.counters(),
        )


def _per_dataset(record: MetricsRow) -> str:
    """`` (aime 0.200, math 0.800)``: each named eval dataset's accuracy, for the log line; empty without names."""
    named = [
        (key.split("/")[1], value)
        for key, value in record.items()
        if key.startswith("eval/") and key.endswith("/accuracy")
    ]
    return f" ({', '.join(f'{name} {value:.3f}' for name, value in named)})" if named else ""


def rl_summary(
    records: list[MetricsRow],
    *,
    num_eval_prompts: int,
    num_rollout: int,
    mode: str,
    version: int,
    buffer: DataBuffer,
    wall_time_s: float,
    trained: bool = True,
) -> RunSummary:
    """The run's summary, derived from every metrics record (so a resumed run counts its whole history).
    ``trained``: False for a rollout-only run, whose ``max_versions_in_a_trained_sample`` is then None."""
    steps = steps_of(records, StepRecord)
    evals = [r for r in records if r.get("kind") == "eval"]
    first = evals[0] if evals and evals[0].get("step") == 0 else None  # None under --skip-eval-before-train
    opd = [r.opd_reverse_kl for r in steps if r.opd_reverse_kl is not None]
    return {
        **({"opd_reverse_kl_first_step": opd[0], "opd_reverse_kl_last_step": opd[-1]} if opd else {}),
        "eval_accuracy_before": first["accuracy"] if first else None,  # None: no eval set (strict JSON has no NaN)
        "eval_accuracy_after": evals[-1]["accuracy"] if evals else None,
        **(
            {
                f"{key}_{when}": r[key]
                for when, r in (("before", first), ("after", evals[-1]))
                if r
                for key in r
                if key.startswith("eval/") and key.endswith("/accuracy")
            }
            if evals
            else {}
        ),  # eval/<name>/accuracy_before, ..._after
        "num_eval_prompts": num_eval_prompts,
        "num_rollout": num_rollout,
        "final_policy_version": version,
        "wall_time_s": round(wall_time_s, 1),
        "mode": mode,
        "partial_groups_left": buffer.num_partial,
        "ready_groups_left": buffer.num_ready,
        "groups_trained": len(buffer.taken),  # groups handed to the trainer, FAILED samples and all
        "trained_tokens": sum(r.trained_tokens for r in steps),  # loss-bearing tokens: 0 when nothing trained
        "aborted_samples": sum(r.aborted_samples for r in steps),
        "resumed_samples": sum(r.resumed_samples for r in steps),
        "multi_version_samples": sum(r.multi_version_samples for r in steps),
        "max_versions_in_a_trained_sample": max((r.max_versions_in_a_sample for r in steps), default=1)
        if trained
        else None,
        "failed_samples": sum(r.failed_samples for r in steps),
        "offline_groups_trained": sum(r.offline_groups for r in steps),
        "buffer_evicted_groups": buffer.num_evicted,
        "buffer_expired_groups": buffer.num_expired,
    }
