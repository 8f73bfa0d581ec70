"""Prompt datasets: JSONL rows -> ``PromptRow``, with errors that name ``path:line``.

A row is a JSON object holding the prompt text under ``input_key`` and, optionally, the reference
answer under ``label_key`` and a metadata dict under ``metadata_key``. A malformed line (bad JSON,
not an object, missing or non-string prompt) raises ``DataError("path:line: ...")`` with
``on_bad_data="fail"``, or is skipped and counted with ``on_bad_data="skip"``.

``PromptSource`` hands out rows in a seeded order, epoch after epoch, and remembers its position
(``state_dict``) so that a resumed run continues where it stopped.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, Literal

import msgspec

from slime.errors import DataError

__all__ = ["PromptRow", "load_jsonl_prompts", "PromptSource"]

log = logging.getLogger(__name__)


class PromptRow(msgspec.Struct, frozen=True):
    """One prompt of the dataset. ``index`` is its position among the good rows of the file."""

    index: int
    prompt: str
    label: str | None = None
    metadata: dict[str, Any] = {}


def load_jsonl_prompts(
    path: str | Path,
    *,
    input_key: str = "prompt",
    label_key: str | None = "label",
    metadata_key: str | None = None,
    on_bad_data: Literal["skip", "fail"] = "fail",
    flag: str = "--prompt-data",
) -> tuple[list[PromptRow], int]:
    """Read a JSONL prompt file (a UTF-8 byte-order mark on the first line is ignored).

    ``flag`` is the option that named the file (``--prompt-data`` or ``--eval-prompt-data``), for messages.

    Returns:
        (rows, num_bad): the good rows in file order, and how many lines were skipped.

    Raises:
        DataError: the file is missing or empty, or (with ``on_bad_data="fail"``) a line is
            malformed; the message names ``path:line`` and what was wrong.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a JSONL file ({flag})")
    if not path.is_file():
        raise DataError(f"{path}: prompt file not found ({flag})")
    rows: list[PromptRow] = []
    num_bad = 0
    decoder = msgspec.json.Decoder()
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                rows.append(_parse_row(decoder, raw, len(rows), input_key, label_key, metadata_key))
            except ValueError as exc:
                msg = f"{path}:{lineno}: {exc}"
                if on_bad_data == "fail":
                    raise DataError(msg + " (use --on-bad-data skip to skip bad lines)") from None
                log.warning("skipping bad line %s", msg)
                num_bad += 1
    if not rows:
        what = f"all {num_bad} non-blank lines are bad" if num_bad else "the file is empty or blank"
        raise DataError(f"{path}: no usable prompt rows: {what} ({flag})")
    return rows, num_bad


def _parse_row(decoder, raw: bytes, index: int, input_key: str, label_key: str | None, metadata_key: str | None) -> PromptRow:
    try:
        obj = decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise ValueError(f"invalid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if input_key not in obj:
        raise ValueError(f"missing key {input_key!r} (--input-key); keys present: {sorted(obj)}")
    prompt = obj[input_key]
    if not isinstance(prompt, str):
        raise ValueError(f"key {input_key!r} (--input-key) must be a non-empty string, got {type(prompt).__name__} {_short(prompt)}")
    if not prompt.strip():
        raise ValueError(f"key {input_key!r} (--input-key) must be a non-empty string, got the blank string {prompt!r}")
    label = None
    if label_key is not None and label_key in obj:
        label = obj[label_key]
        label = None if label is None else str(label)
    metadata: dict[str, Any] = {}
    if metadata_key is not None and obj.get(metadata_key) is not None:
        metadata = obj[metadata_key]
        if not isinstance(metadata, dict):
            raise ValueError(f"key {metadata_key!r} (--metadata-key) must be an object, got {type(metadata).__name__} {_short(metadata)}")
    return PromptRow(index=index, prompt=prompt, label=label, metadata=metadata)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class PromptSource:
    """Hands out prompt rows in a seeded, reshuffled-per-epoch order; its position is resumable.

    Example: 5 rows, shuffle on, seed 1 -> epoch 0 order e.g. [3, 0, 4, 1, 2], epoch 1 another
    permutation; ``next()`` after the 5th row starts epoch 1.
    """

    def __init__(self, rows: list[PromptRow], *, shuffle: bool = True, seed: int = 0):
        if not rows:
            raise DataError("PromptSource needs at least one row")
        self.rows = rows
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._make_order(0)

    def _make_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self) -> PromptRow:
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
