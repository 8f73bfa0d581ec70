"""Prompt datasets: JSONL or Parquet rows -> ``PromptRow``, with errors that say where the row is.

The format comes from the file extension: ``.parquet`` is read with pyarrow, one record batch at a
time; anything else is JSONL (a UTF-8 byte-order mark on the first line is ignored). A row is an
object holding:

- the prompt under ``input_key`` (``--input-key``): a non-empty string or, with
  ``--apply-chat-template``, a non-empty list of chat messages (``{"role": ..., "content": ...}``);
- the reference answer under ``label_key`` (``--label-key``): optional, unless the run's reward reads it
  (``needs_label``, e.g. ``--rm-type math`` or the built-in task's reward); a metadata object under ``metadata_key``,
  the row's tools under ``tool_key`` (``--tool-key``; OpenAI function schema, a list of
  ``{"type": "function", "function": {"name": ..., "parameters": ...}}``, or that list as a JSON
  string, as Parquet files often store it) and a numeric difficulty under ``curriculum_key``
  (``--curriculum-key``).

A malformed row raises ``DataError`` naming ``path:line`` (JSONL, 1-based line) or ``path row i``
(Parquet, 0-based row index) and what was wrong with ``on_bad_data="fail"``, or is skipped with a
warning and counted with ``on_bad_data="skip"``.

``PromptSource`` hands out rows epoch after epoch (file order, a seeded per-epoch shuffle, or
curriculum order) and remembers its position (``state_dict``) so that a resumed run continues where
it stopped. Curriculum order: ascending difficulty, the same in every epoch; rows of equal difficulty
keep file order, or the epoch's seeded shuffle order with ``--rollout-shuffle``. Example: difficulties
[3, 1, 2, 1] -> order [1, 3, 2, 0] each epoch (shuffle off).
"""

from __future__ import annotations

import array
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import msgspec

from slime.data.prompt_fields import describe_list, messages_of, short, tools_of
from slime.data.row_scan import read_rows  # re-exported: the file pass every row loader shares (``RowScan``)
from slime.errors import ConfigError, DataError
from slime.types import JsonObject

__all__ = [
    "PromptRow",
    "load_prompt_file",
    "load_jsonl_prompts",
    "read_rows",
    "parse_prompt_row",
    "prompt_input",
    "tokenize_row",
    "row_metadata",
    "prompt_length_check",
    "PromptSource",
]

T = TypeVar("T")


class PromptRow(msgspec.Struct, frozen=True):
    """One prompt of the dataset. ``index`` is its position among the good rows of the file."""

    index: int
    prompt: str
    """The prompt text; for a chat-message input, the content of its last user message (what reward
    functions and logs see; the engine sees the rendered ``messages``)."""
    label: str | None = None
    metadata: dict[str, Any] = {}
    messages: list[dict[str, Any]] | None = None
    """The chat messages, when the input is a list of messages (rendered by the chat template)."""
    tools: list[dict[str, Any]] | None = None
    """The row's tools (``--tool-key``), OpenAI function schema; kept in ``Sample.metadata["tools"]``."""
    difficulty: float | None = None
    """The row's ``--curriculum-key`` value (lower comes first)."""


def load_prompt_file(
    path: str | Path,
    *,
    input_key: str = "prompt",
    label_key: str | None = "label",
    metadata_key: str | None = None,
    tool_key: str | None = None,
    curriculum_key: str | None = None,
    apply_chat_template: bool = False,
    require_label: bool = False,
    on_bad_data: Literal["skip", "fail"] = "fail",
    flag: str = "--prompt-data",
    check: Callable[[PromptRow], None] | None = None,
) -> tuple[list[PromptRow], int]:
    """Read a JSONL or Parquet prompt file (by extension; see the module docstring).

    ``flag`` is the option that named the file (``--prompt-data`` or ``--eval-prompt-data``), for messages.
    ``require_label``: the run's reward reads ``Sample.label`` (``needs_label``); a row whose label is
    missing, null or blank is then a bad row.
    ``check``: raises ValueError for a parsed row that is bad for this run (``prompt_length_check``).

    Returns:
        (rows, num_bad): the good rows in file order, and how many rows were skipped.

    Raises:
        DataError: the file is missing, unreadable or empty, or (with ``on_bad_data="fail"``) a row
            is malformed; the message names ``path:line`` / ``path row i`` and what was wrong.
    """

    def parse(obj: Any, index: int) -> PromptRow:
        row = parse_prompt_row(
            obj,
            index,
            input_key=input_key,
            label_key=label_key,
            metadata_key=metadata_key,
            tool_key=tool_key,
            curriculum_key=curriculum_key,
            apply_chat_template=apply_chat_template,
            require_label=require_label,
        )
        if check is not None:
            check(row)
        return row

    return read_rows(path, parse, on_bad_data=on_bad_data, flag=flag)


load_jsonl_prompts = load_prompt_file
"""The earlier name of ``load_prompt_file`` (it reads Parquet too, by extension)."""


def parse_prompt_row(
    obj: Any,
    index: int,
    *,
    input_key: str = "prompt",
    label_key: str | None = "label",
    metadata_key: str | None = None,
    tool_key: str | None = None,
    curriculum_key: str | None = None,
    apply_chat_template: bool = False,
    require_label: bool = False,
) -> PromptRow:
    """One decoded row -> ``PromptRow``. Raises ValueError saying what is wrong (the caller adds where)."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    prompt, messages = _prompt_of(obj, input_key, apply_chat_template)
    label = _label_of(obj, label_key, require_label)
    metadata = _metadata_of(obj, metadata_key)
    tools = tools_of(obj.get(tool_key), tool_key) if tool_key is not None and obj.get(tool_key) is not None else None
    difficulty = _difficulty_of(obj, curriculum_key)
    return PromptRow(
        index=index,
        prompt=prompt,
        label=label,
        metadata=metadata,
        messages=messages,
        tools=tools,
        difficulty=difficulty,
    )


def _prompt_of(
    obj: dict[str, Any], input_key: str, apply_chat_template: bool
) -> tuple[str, list[dict[str, Any]] | None]:
    """(prompt text, chat messages or None) of a row's ``input_key``; for messages, the text is the content
    of the last user message. Raises ValueError for a missing, blank or non-string prompt, or for chat
    messages without ``--apply-chat-template``."""
    if input_key not in obj:
        raise ValueError(f"missing key {input_key!r} (--input-key); keys present: {sorted(obj)}")
    prompt, messages = obj[input_key], None
    if isinstance(prompt, list) and apply_chat_template:
        messages = messages_of(prompt, input_key)
        prompt = next(
            (m["content"] for m in reversed(messages) if m["role"] == "user" and isinstance(m.get("content"), str)), ""
        )
    elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "role" in m for m in prompt):
        raise ValueError(
            f"key {input_key!r} (--input-key) is a list of chat messages; render it with --apply-chat-template"
        )
    elif isinstance(prompt, list):
        raise ValueError(f"key {input_key!r} (--input-key) must be a non-empty string, got {describe_list(prompt)}")
    elif not isinstance(prompt, str):
        raise ValueError(
            f"key {input_key!r} (--input-key) must be a non-empty string, got {type(prompt).__name__} {short(prompt)}"
        )
    elif not prompt.strip():
        raise ValueError(f"key {input_key!r} (--input-key) must be a non-empty string, got the blank string {prompt!r}")
    return prompt, messages


def _label_of(obj: dict[str, Any], label_key: str | None, require_label: bool) -> str | None:
    """The row's label as a string (None when absent or null). Raises ValueError when ``require_label`` and
    it is missing, null or blank; ConfigError when ``require_label`` with no ``label_key`` (the run's setup)."""
    label = None
    if label_key is not None and label_key in obj:
        label = obj[label_key]
        label = None if label is None else str(label)
    if require_label and label_key is None:  # the run's setup, not this row: ConfigError is not skipped
        raise ConfigError("the reward reads each sample's label (needs_label) but --label-key is unset")
    if require_label and (label is None or not label.strip()):
        state = (
            f"missing (keys present: {sorted(obj)})" if label_key not in obj else "null" if label is None else "blank"
        )
        raise ValueError(f"key {label_key!r} (--label-key) is {state}; the reward needs a reference answer")
    return label


def _metadata_of(obj: dict[str, Any], metadata_key: str | None) -> dict[str, Any]:
    """The row's metadata object ({} when unset or null). Raises ValueError when it is not an object."""
    metadata: dict[str, Any] = {}
    if metadata_key is not None and obj.get(metadata_key) is not None:
        metadata = obj[metadata_key]
        if not isinstance(metadata, dict):
            raise ValueError(
                f"key {metadata_key!r} (--metadata-key) must be an object, got {type(metadata).__name__} {short(metadata)}"
            )
    return metadata


def _difficulty_of(obj: dict[str, Any], curriculum_key: str | None) -> float | None:
    """The row's ``--curriculum-key`` value as a float (None without the key). Raises ValueError when it is
    missing or not a number (a bool is not one)."""
    if curriculum_key is None:
        return None
    difficulty = obj.get(curriculum_key)
    if isinstance(difficulty, bool) or not isinstance(difficulty, (int, float)):
        raise ValueError(
            f"key {curriculum_key!r} (--curriculum-key) must be a number, got {type(difficulty).__name__} {short(difficulty)}"
        )
    return float(difficulty)


def prompt_input(row: PromptRow) -> str | list[JsonObject]:
    """What the tokenizer renders for ``row``: its messages, else its prompt text."""
    return row.messages if row.messages is not None else row.prompt


def tokenize_row(tokenize: Callable[..., list[int]], row: PromptRow) -> list[int]:
    """Prompt ids of ``row``: ``tokenize(text)``, or ``tokenize(text_or_messages, tools=...)`` when
    the row has messages or tools (the driver's tokenize renders those with the chat template)."""
    if row.messages is None and row.tools is None:
        return tokenize(row.prompt)
    return tokenize(prompt_input(row), tools=row.tools)


def prompt_length_check(
    tokenize: Callable[..., list[int]],
    *,
    max_len: int | None,
    max_prompt_len: int | None = None,
    context: str = "the model's context",
    source: str = "max_position_embeddings of --hf-checkpoint",
) -> Callable[[PromptRow], None]:
    """A ``load_prompt_file`` check: a prompt that renders to ``max_len`` tokens or more (the model's
    context, ``slime.data.sft.model_context_len``) leaves no room for a response token; the engine
    would refuse it (HTTP 400), so it is a bad row, caught at load with its ``path:line``. So is one
    over ``max_prompt_len`` tokens (``--rollout-max-prompt-len``, THUDM/slime's: its dataset drops
    them; here they follow ``--on-bad-data``). ``context`` / ``source`` name the bound ``max_len`` is in
    the message (``--rollout-max-context-len`` when that is the smaller one).

    Only prompts that could be that long are tokenized: a text prompt of b UTF-8 bytes renders to at
    most b tokens (each covers a byte or more) plus the template's own (measured once, with margin).
    Rows with messages or tools are always measured.
    """
    overhead = len(tokenize("x")) + 8
    # the shortest token count that is bad: max_len (no room for a response) or max_prompt_len + 1
    limit = min(n for n in (max_len, max_prompt_len + 1 if max_prompt_len is not None else None) if n is not None)

    def check(row: PromptRow) -> None:
        if row.messages is None and row.tools is None and len(row.prompt.encode()) + overhead < limit:
            return
        num_tokens = len(tokenize_row(tokenize, row))
        if max_prompt_len is not None and num_tokens > max_prompt_len:
            raise ValueError(
                f"the prompt renders to {num_tokens} tokens, over --rollout-max-prompt-len {max_prompt_len}"
            )
        if max_len is not None and num_tokens >= max_len:
            raise ValueError(
                f"the prompt renders to {num_tokens} tokens, {context} of {max_len} ({source}) leaves no room for a response; shorten it"
            )

    return check


def row_metadata(row: PromptRow) -> JsonObject:
    """``Sample.metadata`` of a sample of ``row``: its metadata plus ``tools`` and ``messages`` when set
    (where the multi-turn generate function looks for them)."""
    out = dict(row.metadata)
    if row.tools is not None:
        out["tools"] = row.tools
    if row.messages is not None:
        out["messages"] = row.messages
    return out


class PromptSource(Generic[T]):
    """Hands out rows in file, shuffled or curriculum order, epoch after epoch; its position is resumable.

    Example: 5 rows, shuffle on, seed 1 -> epoch 0 order e.g. [3, 0, 4, 1, 2], epoch 1 another
    permutation; ``next()`` after the 5th row starts epoch 1. With ``curriculum=True`` each epoch is
    sorted by ``row.difficulty`` (ascending, stable over the epoch's file or shuffled order).

    ``rows`` may hold anything indexable (the offline data source reuses it for its groups); only
    curriculum order reads ``difficulty``, from ``rows.difficulties`` when the rows have it (a streamed file,
    ``slime.data.prompt_index``: no row is read for the order).
    """

    def __init__(self, rows: Sequence[T], *, shuffle: bool = True, seed: int = 0, curriculum: bool = False):
        if not rows:
            raise DataError("PromptSource needs at least one row")
        difficulties: Sequence[float | None] = ()
        if curriculum:
            difficulties = getattr(rows, "difficulties", None) or [getattr(r, "difficulty", None) for r in rows]
            if any(d is None for d in difficulties):
                raise DataError("curriculum order needs a difficulty on every row (--curriculum-key)")
        self.rows, self.difficulties = rows, difficulties
        self.shuffle = shuffle
        self.curriculum = curriculum
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._make_order(0)

    def _make_order(self, epoch: int) -> array.array:
        # an array of 8-byte ints, not a list of int objects (~36 bytes a row); shuffle draws the same swaps either way
        order = array.array("q", range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        if self.curriculum:
            order = array.array("q", sorted(order, key=lambda i: self.difficulties[i]))  # type: ignore[arg-type, return-value]  # no None
        return order

    def next(self) -> T:
        if self.position >= len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._make_order(self.epoch)
        row = self.rows[self._order[self.position]]
        self.position += 1
        return row

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._make_order(self.epoch)
