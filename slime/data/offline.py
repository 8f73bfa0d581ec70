"""Offline (pre-generated) samples, mixed into training batches (``--offline-data``, ``--offline-ratio``).

The file is JSONL (or Parquet, by extension), one sample per row, with the prompt keys of
``--prompt-data`` (``--input-key``, ``--label-key``, ``--metadata-key``, ``--tool-key``; messages with
``--apply-chat-template``) plus::

    {"prompt": "2+3=", "label": "5", "response": "5<eos>", "reward": 1.0, "logprobs": [-0.1, -0.02]}

- ``response``: the text generated for the prompt, tokenised with ``encode`` (no special tokens
  added: write the EOS text, as above, if the model should learn to stop there).
- ``reward`` (optional): the sample's reward; absent or null = scored by the run's reward function
  when the group is mixed into a batch.
- ``logprobs`` (optional): one natural-log float per response token, from the model that generated
  it. Absent: the sample carries 0.0 placeholders and ``metadata["offline_logprobs"] = False``, and
  the driver computes them with the trainer's weights right before the train step, so the behaviour
  policy is taken to be the current one (TIS / MIS / decoupled-PPO weight 1 for those tokens).

Rows with the same prompt form one group (GRPO needs them together), in order of first appearance;
each group must hold exactly ``--n-samples-per-prompt`` rows. Each sample is built through
``Sample.append`` with ``OFFLINE_VERSION`` (-1) as every token's version, loss mask 1 and status
COMPLETED; ``metadata["offline"] = True``. Version -1 marks the tokens as off-policy by construction:
the staleness mask, the staleness drop and the trainer's staleness check exempt them
(``slime.types.OFFLINE_VERSION``).

Not covered: multi-turn offline samples (tool tokens with loss mask 0); a response is one segment.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import msgspec

from slime.data.dataset import PromptRow, PromptSource, parse_prompt_row, read_rows, row_metadata, tokenize_row
from slime.errors import DataError
from slime.types import OFFLINE_VERSION, Group, JsonObject, Sample, Status

__all__ = ["OfflineSample", "OfflineGroup", "load_offline_data", "OfflineSource"]

log = logging.getLogger(__name__)


class OfflineSample(msgspec.Struct, frozen=True):
    response: str
    response_ids: list[int]
    """[num_tokens] int, ``encode(response)``."""
    logprobs: list[float] | None = None
    """[num_tokens] float, natural log, from the file; None = computed before the train step."""
    reward: float | None = None


class OfflineGroup(msgspec.Struct, frozen=True):
    """The rows of one prompt, tokenised. ``index`` is the group's position in the file."""

    index: int
    row: PromptRow
    prompt_ids: list[int]
    samples: list[OfflineSample]


def load_offline_data(
    path: str | Path,
    *,
    tokenize: Callable[..., list[int]],
    encode: Callable[[str], list[int]],
    group_size: int,
    input_key: str = "prompt",
    label_key: str | None = "label",
    metadata_key: str | None = None,
    tool_key: str | None = None,
    apply_chat_template: bool = False,
    on_bad_data: Literal["skip", "fail"] = "fail",
) -> list[OfflineGroup]:
    """Read and tokenise an offline-data file (module docstring).

    Args:
        tokenize: the run's prompt tokenizer (``slime.data.dataset.tokenize_row`` calls it).
        encode: response text -> ids, without special tokens.
        group_size: rows per prompt (``--n-samples-per-prompt``).

    Returns:
        The groups in order of first appearance.

    Raises:
        DataError: a bad row (``path:line`` / ``path row i``, with ``on_bad_data="fail"``), or a
            prompt whose row count is not ``group_size``.
    """

    def parse(obj: Any, index: int) -> tuple[PromptRow, OfflineSample]:
        row = parse_prompt_row(
            obj,
            index,
            input_key=input_key,
            label_key=label_key,
            metadata_key=metadata_key,
            tool_key=tool_key,
            apply_chat_template=apply_chat_template,
        )
        return row, _offline_sample(obj, encode)

    items, _ = read_rows(path, parse, on_bad_data=on_bad_data, flag="--offline-data")
    return _groups_of(items, path=path, group_size=group_size, tokenize=tokenize, on_bad_data=on_bad_data)


def _offline_sample(obj: JsonObject, encode: Callable[[str], list[int]]) -> OfflineSample:
    """A row's ``response`` (encoded), ``logprobs`` (one per response token) and ``reward``; ValueError saying
    which key is wrong."""
    response = obj.get("response")
    if not isinstance(response, str) or not response:
        raise ValueError(f"key 'response' must be a non-empty string, got {type(response).__name__} {response!r:.60}")
    ids = list(encode(response))
    if not ids:
        raise ValueError(f"'response' {response!r:.60} encodes to no tokens")
    logprobs = obj.get("logprobs")
    if logprobs is not None:
        if not isinstance(logprobs, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in logprobs
        ):
            raise ValueError(
                f"key 'logprobs' must be a list of numbers, got {type(logprobs).__name__} {logprobs!r:.60}"
            )
        if len(logprobs) != len(ids):
            raise ValueError(f"key 'logprobs' has {len(logprobs)} values for the {len(ids)} tokens of 'response'")
        logprobs = [float(x) for x in logprobs]
    reward = obj.get("reward")
    if reward is not None:
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise ValueError(f"key 'reward' must be a number or null, got {type(reward).__name__} {reward!r:.60}")
        reward = float(reward)
    return OfflineSample(response=response, response_ids=ids, logprobs=logprobs, reward=reward)


def _groups_of(
    items: list[tuple[PromptRow, OfflineSample]],
    *,
    path: str | Path,
    group_size: int,
    tokenize: Callable[..., list[int]],
    on_bad_data: Literal["skip", "fail"],
) -> list[OfflineGroup]:
    """The rows grouped by prompt (messages or text, and tools) in order of first appearance; a group of other
    than ``group_size`` rows is a DataError (skipped and logged with ``on_bad_data="skip"``)."""
    by_prompt: dict[bytes, list[tuple[PromptRow, OfflineSample]]] = {}
    for row, sample in items:
        key = msgspec.json.encode([row.messages if row.messages is not None else row.prompt, row.tools])
        by_prompt.setdefault(key, []).append((row, sample))
    groups: list[OfflineGroup] = []
    for members in by_prompt.values():
        row = members[0][0]
        if len(members) != group_size:
            msg = (
                f"{path}: prompt {row.prompt!r:.60} has {len(members)} rows, expected --n-samples-per-prompt={group_size} "
                "(the rows of one prompt form one group) (--offline-data)"
            )
            if on_bad_data == "fail":
                raise DataError(msg + " (use --on-bad-data skip to skip such groups)")
            log.warning("skipping offline group: %s", msg)
            continue
        groups.append(
            OfflineGroup(
                index=len(groups), row=row, prompt_ids=tokenize_row(tokenize, row), samples=[s for _, s in members]
            )
        )
    if not groups:
        raise DataError(f"{path}: no usable offline groups (--offline-data)")
    return groups


class OfflineSource:
    """Hands out offline groups as fresh ``Group``s, epoch after epoch; its position is resumable."""

    def __init__(self, groups: list[OfflineGroup], *, shuffle: bool = False, seed: int = 0):
        self._source = PromptSource(groups, shuffle=shuffle, seed=seed)

    def __len__(self) -> int:
        return len(self._source.rows)

    def next_group(self, *, group_id: int, rollout_id: int) -> Group:
        """The next offline group as a new ``Group`` (new ``Sample`` objects) with id ``group_id``."""
        og: OfflineGroup = self._source.next()
        samples = []
        for i, s in enumerate(og.samples):
            metadata = {**row_metadata(og.row), "offline": True, "offline_logprobs": s.logprobs is not None}
            sample = Sample(
                prompt_ids=list(og.prompt_ids),
                group_id=group_id,
                index=i,
                label=og.row.label,
                prompt=og.row.prompt,
                response=s.response,
                metadata=metadata,
                reward=s.reward,
            )
            sample.append(
                s.response_ids,
                s.logprobs if s.logprobs is not None else [0.0] * len(s.response_ids),
                OFFLINE_VERSION,
                trainable=True,
            )
            sample.status = Status.COMPLETED
            samples.append(sample)
        return Group(group_id=group_id, samples=samples, rollout_id=rollout_id, data_index=og.index)

    def state_dict(self) -> dict[str, int]:
        return self._source.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._source.load_state_dict(state)
