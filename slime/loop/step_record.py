"""The step records of ``RUN_DIR/metrics.jsonl``: one typed struct per kind of run.

``StepRecord`` (an RL step, ``slime.loop.step.run_step``) and ``SFTStepRecord`` (an SFT step) are
what the loop builds and reads; ``to_dict()`` is the JSON object written for them, with the keys
runs have always had (``kind: "step"``; the trainer's metrics flattened as ``train/<name>``, the
weight sync's as ``weight_sync/<name>``, on-policy distillation's as ``opd/<name>``; fields that a
run does not have, e.g. ``train_time_s`` of a rollout-only step, left out). Readers of the file
(``slime.obs.report``, ``slime.bench.learning``) read the JSON, old runs' included.
Units: ``*_s`` seconds, ``*_tokens`` tokens, versions are policy versions.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

__all__ = ["StepRecord", "SFTStepRecord"]


class StepRecord(msgspec.Struct, kw_only=True):
    """One RL step. The order of the fields is the order of the keys written."""

    kind: str = "step"
    policy_version: int
    """The engines' version after the step's weight sync (= the trainer's)."""
    opd_reverse_kl: float | None = None
    """``opd/reverse_kl`` (``--use-opd``; ``slime.loop.step.batch_stats``)."""
    opd_teacher_logprob_mean: float | None = None
    # the batch (slime.loop.step.batch_stats): over the samples that count (not FAILED)
    reward_mean: float
    accuracy: float
    response_len_mean: float
    response_tokens: int
    num_samples: int
    truncated_samples: int
    failed_samples_in_batch: int
    trained_tokens: int
    # the scheduler and buffer since the last step (slime.loop.counters.StepStats)
    aborted_samples: int
    resumed_samples: int
    started_groups: int
    generated_tokens: int
    failed_samples: int
    filtered_groups: int
    dropped_stale_groups: int
    offline_groups: int
    buffer_evicted_groups: int
    buffer_expired_groups: int
    tokens_per_s: float
    step_time_s: float
    partial_groups_queued: int
    ready_groups_left: int
    rollout_wait_s: float
    train_time_s: float | None = None
    """None (left out): a rollout-only step."""
    weight_sync_s: float | None = None
    weight_sync_in_place: int | None = None
    # off-policy accounting (slime.loop.offpolicy.apply_staleness)
    lag_histogram: dict[int, int]
    off_policy_token_fraction: float
    max_version_lag: int
    masked_stale_tokens: int
    max_versions_in_a_sample: int
    multi_version_samples: int
    offline_tokens: int
    train: dict[str, float] = {}
    """The trainer's metrics, written as ``train/<name>``."""
    weight_sync: dict[str, float] = {}
    """The weight sync's ``stats``, written as ``weight_sync/<name>``."""
    step: int = 0
    """1-based step number (set by the driver)."""
    time_s: float = 0.0
    """Seconds since the run started, at the end of the step (set by the driver)."""

    _RENAMED: ClassVar[dict[str, str]] = {"opd_reverse_kl": "opd/reverse_kl", "opd_teacher_logprob_mean": "opd/teacher_logprob_mean"}
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {"opd_reverse_kl", "opd_teacher_logprob_mean", "train_time_s", "weight_sync_s", "weight_sync_in_place"}
    )

    def to_dict(self) -> dict[str, Any]:
        """The ``metrics.jsonl`` object (see the module doc)."""
        out: dict[str, Any] = {}
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if name in ("train", "weight_sync"):
                out.update({f"{name}/{k}": v for k, v in value.items()})
            elif not (value is None and name in self._OPTIONAL):
                out[self._RENAMED.get(name, name)] = value
        return out


class SFTStepRecord(msgspec.Struct, kw_only=True):
    """One SFT step (``slime.loop.sft``)."""

    kind: str = "step"
    step: int
    policy_version: int
    """The trainer's version after the step."""
    epoch: int
    num_rows: int
    num_tokens: int
    """Prompt and response tokens of the step's rows."""
    trained_tokens: int
    """Tokens under the loss mask."""
    tokens_per_s: float
    step_time_s: float
    train: dict[str, float] = {}
    """The trainer's metrics, written as ``train/<name>``."""

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__struct_fields__ if name != "train"}
        out.update({f"train/{k}": v for k, v in self.train.items()})
        return out
