"""A JSONL prompt file streamed: every row parsed and checked once at load, then only each good row's byte offset
kept (8 bytes a row, plus its difficulty with ``--curriculum-key``); a row is read back from the file and parsed
again when the run hands it out (``PromptSource``), an eval cut (``rows[:n]``) reads its ``n`` rows.

Example: a 200 MB file of 412k rows took 372 MiB more than a 3-row file as ``PromptRow`` objects, and 7 MiB
indexed (offsets, and ``PromptSource``'s order as an array), by ``scripts/measure_prompt_memory.py``; a whole
``slime train`` on a 200 MB file of 1.8M rows peaked at 1174 MiB before, 542 MiB after (510 for 3 rows). Bad rows are named ``path:line`` and skipped or refused
at load, exactly as ``load_prompt_file`` does, and row ``i`` is the same ``PromptRow`` either way (same ``index``).
Parquet files are read whole into rows (``load_prompt_file``): a column file has no cheap row-at-a-time access.

The file must stay as it was while the run reads it: a change in size or modification time since the load is a
``DataError`` naming the file when a row is read back.
"""

from __future__ import annotations

import array
import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, overload

import msgspec

from slime.data.dataset import PromptRow, load_prompt_file, parse_prompt_row
from slime.data.jsonl import decode_line, read_line_at
from slime.data.row_scan import RowScan
from slime.errors import DataError

__all__ = ["PromptIndex", "index_prompt_file"]


class PromptIndex(Sequence[PromptRow]):
    """The good rows of a JSONL prompt file by byte offset (module docstring); ``len`` and ``[i]`` as a list.

    Args:
        path: the file.
        offsets: byte offset of each good row's line, in file order.
        parse: ``(decoded object, index) -> PromptRow``, the parse the load checked the rows with.
        difficulties: each row's ``--curriculum-key`` value, or None (``PromptSource`` sorts by it).
    """

    def __init__(
        self, path: Path, offsets: array.array, parse: Callable[[Any, int], PromptRow], difficulties: array.array | None
    ):
        self.path, self.offsets, self.parse, self.difficulties = path, offsets, parse, difficulties
        self._stamp = _stamp(path)
        self._decoder = msgspec.json.Decoder()

    def __len__(self) -> int:
        return len(self.offsets)

    @overload
    def __getitem__(self, i: int) -> PromptRow: ...

    @overload
    def __getitem__(self, i: slice) -> list[PromptRow]: ...

    def __getitem__(self, i: int | slice) -> PromptRow | list[PromptRow]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} of {len(self)}")
        if _stamp(self.path) != self._stamp:
            raise DataError(
                f"{self.path}: changed since the run loaded it (size or modification time); restore it or start again"
            )
        obj = decode_line(self._decoder, read_line_at(self.path, self.offsets[i]))
        if isinstance(obj, ValueError):  # checked at load: only a changed file gets here
            raise DataError(f"{self.path}: row {i} no longer parses ({obj})")
        return self.parse(obj, i)


def _stamp(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def index_prompt_file(
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
) -> tuple[Sequence[PromptRow], int]:
    """``load_prompt_file`` (same arguments, same errors and bad-row count), the rows of a JSONL file as a
    ``PromptIndex``; a Parquet file's as a list.

    Raises:
        DataError: as ``load_prompt_file``.
    """
    if Path(path).suffix.lower() == ".parquet":
        return load_prompt_file(
            path,
            input_key=input_key,
            label_key=label_key,
            metadata_key=metadata_key,
            tool_key=tool_key,
            curriculum_key=curriculum_key,
            apply_chat_template=apply_chat_template,
            require_label=require_label,
            on_bad_data=on_bad_data,
            flag=flag,
            check=check,
        )
    parse = functools.partial(
        parse_prompt_row,
        input_key=input_key,
        label_key=label_key,
        metadata_key=metadata_key,
        tool_key=tool_key,
        curriculum_key=curriculum_key,
        apply_chat_template=apply_chat_template,
        require_label=require_label,
    )

    def parse_and_check(obj: Any, index: int) -> PromptRow:
        row = parse(obj, index)
        if check is not None:
            check(row)
        return row

    scan = RowScan(path, parse_and_check, on_bad_data=on_bad_data, flag=flag)
    offsets, difficulties = array.array("q"), array.array("d") if curriculum_key is not None else None
    for row, offset in scan:
        assert offset is not None  # JSONL lines have offsets
        offsets.append(offset)
        if difficulties is not None:
            assert row.difficulty is not None  # parse_prompt_row sets it with a curriculum key
            difficulties.append(row.difficulty)
    return PromptIndex(Path(path), offsets, parse, difficulties), scan.num_bad
