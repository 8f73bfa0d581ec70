"""The step records of ``RUN_DIR/metrics.jsonl``: one typed struct per kind of run.

``StepRecord`` (an RL step, ``slime.loop.step.run_step``) and ``SFTStepRecord`` (an SFT step) are
what the loop builds and what the readers of the file decode; ``to_dict()`` is the JSON object
written for them, with the keys runs have always had (``kind: "step"``; the trainer's metrics
flattened as ``train/<name>``, the weight sync's as ``weight_sync/<name>``, the length bias as ``bias/<name>``, on-policy distillation's
as ``opd/<name>``; fields that a run does not have, e.g. ``train_time_s`` of a rollout-only step,
left out). ``from_row`` is its inverse, for old runs' files too: a field missing from the row takes
its default (counts 0, measured floats NaN, so a reader that skips non-finite values skips it), a
null float (strict JSON writes NaN as null) is NaN again (a null ``train/<name>`` is left out of ``train``),
and unknown keys are ignored.
``steps_of(records, StepRecord)`` decodes the step rows of a run's records (``slime.loop.rl_mode``,
``slime.loop.outputs``, ``slime.obs.report``, ``slime.bench.learning_curves``).

A base module (it imports nothing of ours): the loop writes it, ``slime.obs``
and ``slime.bench`` read it. Units: ``*_s`` seconds, ``*_tokens`` tokens, versions are policy versions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, TypeVar

import msgspec

from slime.types import JsonObject

__all__ = [
    "StepRecord", "SFTStepRecord", "steps_of", "summed_lag_histogram", "off_policy_share", "JsonObject", "MetricsRow",
    "RunSummary",
]  # fmt: skip

NAN = math.nan

MetricsRow = JsonObject
"""One ``metrics.jsonl`` object: a step record's ``to_dict()``, an eval record, or either as read back
(untyped JSON: ``Any`` because its values are whatever JSON holds)."""
RunSummary = JsonObject
"""A run's ``summary.json`` (or ``slime report``'s object): untyped JSON."""


class StepRecord(msgspec.Struct, kw_only=True):
    """One RL step. The order of the fields is the order of the keys written."""

    kind: str = "step"
    policy_version: int = 0
    """The engines' version after the step's weight sync (= the trainer's)."""
    opd_reverse_kl: float | None = None
    """``opd/reverse_kl`` (``--use-opd``; ``slime.loop.step.batch_stats``)."""
    opd_teacher_logprob_mean: float | None = None
    # the batch (slime.loop.step.batch_stats): over the samples that count (not FAILED)
    reward_mean: float = NAN
    accuracy: float = NAN
    response_len_mean: float = NAN
    response_tokens: int = 0
    num_samples: int = 0
    truncated_samples: int = 0
    failed_samples_in_batch: int = 0
    trained_tokens: int = 0
    # the scheduler and buffer since the last step (slime.loop.counters.StepStats)
    aborted_samples: int = 0
    resumed_samples: int = 0
    started_groups: int = 0
    generated_tokens: int = 0
    failed_samples: int = 0
    filtered_groups: int = 0
    dropped_stale_groups: int = 0
    offline_groups: int = 0
    buffer_evicted_groups: int = 0
    buffer_expired_groups: int = 0
    tokens_per_s: float = NAN
    step_time_s: float = NAN
    partial_groups_queued: int = 0
    ready_groups_left: int = 0
    rollout_wait_s: float = NAN
    train_time_s: float | None = None
    """None (left out): a rollout-only step."""
    weight_sync_s: float | None = None
    weight_sync_in_place: int | None = None
    # off-policy accounting (slime.loop.offpolicy.apply_staleness)
    lag_histogram: dict[int, int] = {}
    off_policy_token_fraction: float = NAN
    max_version_lag: int = 0
    masked_stale_tokens: int = 0
    max_versions_in_a_sample: int = 0
    multi_version_samples: int = 0
    offline_tokens: int = 0
    masked_token_fraction: float = NAN
    fully_masked_samples: int = 0
    trained_samples: int | None = None
    """Valid samples keeping >= 1 trained token (None: a row of a run before this field)."""
    trained_sample_response_tokens: int = 0
    trained_sample_reward_sum: float = 0.0
    bias: dict[str, float] = {}
    """The batch's length bias (``slime.loop.offpolicy.length_bias``), written as ``bias/<name>``."""
    train: dict[str, float] = {}
    """The trainer's metrics (``TrainMetrics.to_dict``), written as ``train/<name>``."""
    weight_sync: dict[str, float] = {}
    """The weight sync's ``stats``, written as ``weight_sync/<name>``."""
    step: int = 0
    """1-based step number (set by the driver)."""
    time_s: float = 0.0
    """Seconds since the run started, at the end of the step (set by the driver)."""

    _RENAMED: ClassVar[dict[str, str]] = {
        "opd_reverse_kl": "opd/reverse_kl",
        "opd_teacher_logprob_mean": "opd/teacher_logprob_mean",
    }
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {
            "opd_reverse_kl",
            "opd_teacher_logprob_mean",
            "train_time_s",
            "weight_sync_s",
            "weight_sync_in_place",
            "trained_samples",
        }
    )

    def to_dict(self) -> dict[str, Any]:
        """The ``metrics.jsonl`` object (see the module doc)."""
        out: dict[str, Any] = {}
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if name in ("train", "weight_sync", "bias"):
                out.update({f"{name}/{k}": v for k, v in value.items()})
            elif not (value is None and name in self._OPTIONAL):
                out[self._RENAMED.get(name, name)] = value
        return out

    @classmethod
    def from_row(cls, row: Mapping[str, object]) -> StepRecord:
        """The record of a ``metrics.jsonl`` step object (the inverse of ``to_dict``; see the module doc).

        Raises:
            msgspec.ValidationError: a value of the wrong type (e.g. a string where a count goes).
        """
        return _decode(cls, row, cls._RENAMED)


class SFTStepRecord(msgspec.Struct, kw_only=True):
    """One SFT step (``slime.loop.sft``)."""

    kind: str = "step"
    step: int = 0
    policy_version: int = 0
    """The trainer's version after the step."""
    epoch: int = 0
    num_rows: int = 0
    num_tokens: int = 0
    """Prompt and response tokens of the step's rows."""
    trained_tokens: int = 0
    """Tokens under the loss mask."""
    tokens_per_s: float = NAN
    step_time_s: float = NAN
    train: dict[str, float] = {}
    """The trainer's metrics (``TrainMetrics.to_dict``), written as ``train/<name>``."""

    def to_dict(self) -> dict[str, Any]:
        """The ``metrics.jsonl`` object: the fields, then the trainer's metrics as ``train/<name>``."""
        out = {name: getattr(self, name) for name in self.__struct_fields__ if name != "train"}
        out.update({f"train/{k}": v for k, v in self.train.items()})
        return out

    @classmethod
    def from_row(cls, row: Mapping[str, object]) -> SFTStepRecord:
        """The record of a ``metrics.jsonl`` SFT step object (as ``StepRecord.from_row``)."""
        return _decode(cls, row, {})


R = TypeVar("R", StepRecord, SFTStepRecord)


def summed_lag_histogram(steps: Iterable[StepRecord]) -> dict[int, int]:
    """Trained tokens per version lag over ``steps`` ({lag: tokens}, lags ascending)."""
    hist: dict[int, int] = {}
    for st in steps:
        for lag, n in st.lag_histogram.items():
            hist[lag] = hist.get(lag, 0) + n
    return dict(sorted(hist.items()))


def off_policy_share(hist: Mapping[int, int]) -> float | None:
    """Share of the trained tokens in ``hist`` ({lag: tokens}) with lag > 0; None when none trained.
    Example: {0: 3, 2: 1} -> 0.25."""
    total = sum(hist.values())
    return sum(n for lag, n in hist.items() if lag > 0) / total if total else None


def steps_of(records: Iterable[Mapping[str, object]], kind: type[R]) -> list[R]:
    """The ``kind: "step"`` rows of a run's ``metrics.jsonl`` records, decoded as ``kind``'s records."""
    return [kind.from_row(r) for r in records if r.get("kind") == "step"]


@functools.cache
def _float_fields(cls: type[msgspec.Struct]) -> frozenset[str]:
    return frozenset(f.name for f in msgspec.structs.fields(cls) if f.type is float)


def _decode(cls: type[R], row: Mapping[str, object], renamed: Mapping[str, str]) -> R:
    """``row`` regrouped into ``cls``'s fields: ``<group>/<name>`` (``train/loss``) into the dict field
    ``<group>`` (null ones left out), renamed keys back, null floats as NaN; then ``msgspec.convert`` (``strict=False``: the
    file's string keys of ``lag_histogram``)."""
    back = {written: name for name, written in renamed.items()}
    fields, floats = cls.__struct_fields__, _float_fields(cls)
    out: dict[str, object] = {}
    groups: dict[str, dict[str, object]] = {}
    for key, value in row.items():
        name = back.get(key, key)
        group, slash, sub = name.partition("/")
        if slash and group in fields:
            if value is not None:  # a NaN metric, null in the file: left out, as a missing one
                groups.setdefault(group, {})[sub] = value
        elif name in fields:
            out[name] = NAN if value is None and name in floats else value
    return msgspec.convert(out | groups, cls, strict=False)
