"""One pass over a JSONL or Parquet file of rows, each parsed by the caller's function: bad rows raised as
``DataError`` with their place (``path:line``, ``path row i``) or skipped and counted (``on_bad_data``).

The format comes from the file extension, as ``slime.data.dataset`` says: ``.parquet`` is read with pyarrow,
one record batch at a time; anything else is JSONL (``slime.data.jsonl``: lines by byte offset, a UTF-8
byte-order mark ignored). ``read_rows`` reads the whole file; ``RowScan`` yields the rows one at a time with
their byte offset (``slime.data.prompt_index`` streams a file that way).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import msgspec

from slime.data.jsonl import decode_line, jsonl_lines
from slime.errors import ConfigError, DataError
from slime.stop import raise_if_stopped

__all__ = ["read_rows", "RowScan"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def read_rows(
    path: str | Path,
    parse: Callable[[Any, int], T],
    *,
    on_bad_data: Literal["skip", "fail"] = "fail",
    flag: str = "--prompt-data",
) -> tuple[list[T], int]:
    """Parse every row of a JSONL or Parquet file with ``parse(obj, index_among_good_rows)``.

    ``parse`` raises ValueError for a bad row; the message gets the row's place prepended. A
    ``ConfigError`` (a problem of the run's setup, such as its chat template) propagates as is.

    Returns:
        (items, num_bad).

    Raises:
        DataError: as ``slime.data.dataset.load_prompt_file``.
    """
    scan = RowScan(path, parse, on_bad_data=on_bad_data, flag=flag)
    return [item for item, _ in scan], scan.num_bad


class RowScan(Generic[T]):
    """One pass over a JSONL or Parquet file: iterating it yields ``(parse(obj, index), offset)`` per good row, where
    ``offset`` is the byte offset of its JSONL line (None for Parquet), one row at a time; bad rows are raised or
    skipped and counted in ``num_bad`` as ``read_rows`` says. A stop request (SIGTERM, ``slime.stop``) ends it.

    Raises (while iterating):
        DataError: as ``slime.data.dataset.load_prompt_file``, the empty file included once the pass ends.
        Stopped: the run was asked to stop.
    """

    def __init__(
        self, path: str | Path, parse: Callable[[Any, int], T], *, on_bad_data: Literal["skip", "fail"], flag: str
    ):
        self.path, self.parse, self.on_bad_data, self.flag = Path(path), parse, on_bad_data, flag
        self.num_bad = 0

    def __iter__(self) -> Iterator[tuple[T, int | None]]:
        path, flag = self.path, self.flag
        if path.is_dir():
            raise DataError(f"{path}: is a directory, expected a JSONL or Parquet file ({flag})")
        if not path.is_file():
            raise DataError(f"{path}: prompt file not found ({flag})")
        parquet = path.suffix.lower() == ".parquet"
        num_good = 0
        for where, obj, offset in _parquet_records(path, flag) if parquet else _jsonl_records(path):
            if num_good % 1024 == 0:
                raise_if_stopped(f"reading {path}")
            try:
                if isinstance(obj, ValueError):
                    raise obj
                item = self.parse(obj, num_good)
            except ConfigError:  # the run's setup (e.g. its chat template) is at fault, not this row
                raise
            except ValueError as exc:
                msg = f"{where}: {exc}"
                if self.on_bad_data == "fail":
                    raise DataError(
                        msg + f" (use --on-bad-data skip to skip bad {'rows' if parquet else 'lines'})"
                    ) from None
                log.warning("skipping bad row %s", msg)
                self.num_bad += 1
                continue
            num_good += 1
            yield item, offset
        if not num_good:
            bad = self.num_bad
            what = (
                f"all {bad} {'rows' if parquet else 'non-blank lines'} are bad" if bad else "the file is empty or blank"
            )
            raise DataError(f"{path}: no usable prompt rows: {what} ({flag})")


def _jsonl_records(path: Path) -> Iterator[tuple[str, Any, int]]:
    """(``path:line``, decoded object or the ValueError saying why it is not a row, byte offset) per non-blank line."""
    decoder = msgspec.json.Decoder()
    for lineno, offset, raw in jsonl_lines(path):
        yield f"{path}:{lineno}", decode_line(decoder, raw), offset


def _parquet_records(path: Path, flag: str) -> Iterator[tuple[str, Any, None]]:
    """(``path row i``, the row as a dict, None) per row, 0-based, read one record batch at a time."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs the pyarrow package (pip install pyarrow) ({flag})") from None
    try:
        file = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for a file that is not Parquet
        raise DataError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc}) ({flag})") from None
    i = 0
    for batch in file.iter_batches(batch_size=4096):
        for obj in batch.to_pylist():
            yield f"{path} row {i}", obj, None
            i += 1
