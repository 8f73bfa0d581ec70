"""Record and replay of rollouts (``--save-debug-rollout-data``, ``--load-debug-rollout-data``).

Recording: right after the scheduler hands a step's groups to the driver (before staleness
masking), they are written whole (every token, logprob, version, loss mask, reward, status and
evidence) to the path template filled with ``rollout_id`` (the 1-based step number), in the format its
suffix names (``FORMATS``):

- ``.jsonl``: one JSON line per group, ``{"rollout_id": 1, "policy_version": 0, "group": {...}}`` (the
  ``Group`` and its ``Sample`` fields as in ``slime.types``); ``jq`` or ``pandas.read_json(lines=True)``
  reads it too. ``slime rollout`` (any ``--debug-rollout-only`` run) without ``--save-debug-rollout-data``
  keeps its groups this way, in ``RUN_DIR/rollouts/rollout_{rollout_id}.jsonl``.
- ``.pt`` (THUDM/slime's suffix): a real ``torch.save`` file of the record as plain dicts and lists, so
  ``torch.load(path, weights_only=True)`` reads it.
- anything else (``.msgpack``): msgpack of ``RolloutRecord``, the smallest and fastest.

Example: ``runs/x/rollout_{rollout_id}.msgpack`` -> ``runs/x/rollout_1.msgpack``. ``load_rollout_record``
reads each format back into the same ``RolloutRecord``. A record is written atomically (temporary file, then
rename).

Replay (a train-only run): ``ReplayScheduler`` stands in for ``Scheduler`` in ``run_step`` and hands
out step k's recorded groups, through a ``DataBuffer`` so that the trained-once check still holds,
and ``NoWeightSync`` stands in for the weight sync: no engine is launched, nothing is generated and
no weights are sent anywhere. With the same start version, each step sees the same groups at the
same trainer version as the recording run, so the staleness mask and the loss match it.

Not covered: the scheduler's own counters (aborts, resumes, generated tokens) are 0 in a replay's
step records; a record written by a run with other batch sizes is trained as recorded.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import msgspec

from slime.config import LoopConfig
from slime.errors import DataError
from slime.loop.buffer import DataBuffer
from slime.loop.counters import SchedulerCounters
from slime.loop.version import PolicyVersion
from slime.types import Group

__all__ = [
    "RolloutRecord",
    "FORMATS",
    "record_path",
    "save_rollout_record",
    "load_rollout_record",
    "ReplayScheduler",
    "NoWeightSync",
]

log = logging.getLogger(__name__)


class RolloutRecord(msgspec.Struct, kw_only=True):
    rollout_id: int
    """The step number (1-based) the groups were trained in."""
    policy_version: int
    """The trainer's version when the groups were taken (the version they were trained at)."""
    groups: list[Group]


def record_path(template: str, rollout_id: int) -> Path:
    return Path(template.format(rollout_id=rollout_id))


FORMATS = {".jsonl": "JSON lines, one group a line", ".pt": "torch.save of plain dicts", "": "msgpack"}
"""The record formats by the template's suffix (the module docstring); any other suffix is msgpack."""


def save_rollout_record(template: str, rollout_id: int, groups: list[Group], *, policy_version: int) -> Path:
    """Write one step's groups in the format of the template's suffix (``FORMATS``); returns the file written."""
    path = record_path(template, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    record = RolloutRecord(rollout_id=rollout_id, policy_version=policy_version, groups=groups)
    if path.suffix == ".jsonl":
        head = {"rollout_id": rollout_id, "policy_version": policy_version}
        tmp.write_bytes(b"".join(msgspec.json.encode({**head, "group": g}) + b"\n" for g in groups))
    elif path.suffix == ".pt":
        import torch

        torch.save(msgspec.to_builtins(record), tmp)
    else:
        tmp.write_bytes(msgspec.msgpack.encode(record))
    os.replace(tmp, path)
    return path


def _decode(path: Path) -> RolloutRecord:
    """The record in ``path``, by its suffix (``FORMATS``). Raises msgspec's errors, ``ValueError``, ``RuntimeError``
    (torch's unpickling) on a file that is not one."""
    if path.suffix == ".jsonl":
        lines = [msgspec.json.decode(line) for line in path.read_bytes().splitlines() if line.strip()]
        heads = {(line["rollout_id"], line["policy_version"]) for line in lines}
        if len(heads) != 1:  # an empty step has no line at all: nothing says which step it was
            raise ValueError(f"{len(heads)} different (rollout_id, policy_version) in one file")
        (rollout_id, policy_version), groups = heads.pop(), [line["group"] for line in lines]
        return msgspec.convert(
            {"rollout_id": rollout_id, "policy_version": policy_version, "groups": groups}, RolloutRecord
        )
    if path.suffix == ".pt":
        import torch

        return msgspec.convert(torch.load(path, weights_only=True), RolloutRecord)
    return msgspec.msgpack.decode(path.read_bytes(), type=RolloutRecord)


def load_rollout_record(template: str, rollout_id: int) -> RolloutRecord:
    """Read one step's record.

    Raises:
        DataError: the file is missing or is not a rollout record (the message names the path).
    """
    path = record_path(template, rollout_id)
    if not path.is_file():
        raise DataError(f"{path}: no rollout record for step {rollout_id} (--load-debug-rollout-data={template})")
    try:
        record = _decode(path)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise DataError(f"{path}: not a rollout record ({exc}) (--load-debug-rollout-data)") from None
    if record.rollout_id != rollout_id:
        raise DataError(f"{path}: holds rollout {record.rollout_id}, expected {rollout_id} (--load-debug-rollout-data)")
    return record


class ReplayScheduler(SchedulerCounters):
    """The part of ``Scheduler`` that ``run_step`` and the driver use, fed from records.

    ``next_batch(n)`` returns the next step's recorded groups (their count, which is ``n`` unless
    the recording run had another batch size).
    """

    def __init__(self, config: LoopConfig, template: str, *, buffer: DataBuffer, version: PolicyVersion | None = None):
        self.config, self.template, self.buffer = config, template, buffer
        super().__init__(version)
        self.pool = None

    async def next_batch(self, n: int) -> list[Group]:
        self.rollout_id += 1
        record = load_rollout_record(self.template, self.rollout_id)
        if len(record.groups) != n:
            log.warning(
                "rollout record %s holds %d groups, the batch size is %d: training on the recorded ones",
                record_path(self.template, self.rollout_id),
                len(record.groups),
                n,
            )
        for g in record.groups:
            self.buffer.push_ready(g)
        groups = self.buffer.take(len(record.groups))
        self.next_group_id = max([self.next_group_id, *(g.group_id + 1 for g in groups)])
        self.num_admitted += len(groups)
        self.stats.finished_groups += len(groups)
        return groups

    @contextlib.asynccontextmanager
    async def paused(self, mode: str = "abort"):
        yield

    quiesced = paused

    async def shutdown(self) -> None:
        pass


class NoWeightSync:
    """The weight sync of a run without engines (train-only) or without training (rollout-only): nothing moves."""

    stats: dict[str, Any] = {}

    async def save(self, version: int) -> None:
        return None

    async def load(self, path: object, version: int, *, abort_all_requests: bool = False) -> None:
        return None

    async def close(self) -> None:
        return None
