"""Check a Hugging Face model directory's files before a library loads them.

transformers, safetensors and megatron-core report a corrupt ``config.json`` or a truncated
``model.safetensors`` with a long traceback that often does not name the file (safetensors says
"incomplete metadata, file not fully covered"). ``check_hf_dir`` is called first, everywhere slime
loads a checkpoint (trainer backends, the embedded engine, tokenizers, ``slime convert``, the
preflight of ``slime train``), and raises one ``CheckpointError`` line naming the file::

    --hf-checkpoint: /m/config.json: invalid JSON at line 3, column 5: Expecting ',' delimiter
    /m/model.safetensors: truncated or corrupt safetensors file: 50000 bytes, expected 92848 (8-byte length + 128-byte header + 92712 bytes of tensor data)
    /m/model.safetensors.index.json: names model-00002-of-00002.safetensors, which is missing

What it reads: the JSON files in full, and of each safetensors file only its 8-byte header length
and JSON header (the size the tensor data must have is the largest end offset in the header).
Not covered: tensor bytes that are corrupt but of the right length, and ``pytorch_model.bin``
checkpoints (accepted as they are).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

from slime.errors import CheckpointError

__all__ = ["check_hf_dir", "check_safetensors_file", "load_tokenizer", "CONFIG_JSON_FILES", "TOKENIZER_JSON_FILES"]

CONFIG_JSON_FILES = ("config.json", "generation_config.json")
"""JSON files a model load reads (``config.json`` is required)."""

TOKENIZER_JSON_FILES = (
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
)
"""JSON files a tokenizer load reads, when present."""

INDEX = "model.safetensors.index.json"


TOKENIZER_VOCAB_FILES: tuple[tuple[str, ...], ...] = (
    ("tokenizer.json",),
    ("tokenizer.model",),
    ("vocab.json", "merges.txt"),
    ("vocab.txt",),
    ("tiktoken.model",),
)
"""Sets of files of which a loadable tokenizer has at least one (fast, sentencepiece, BPE, WordPiece, tiktoken)."""


def check_hf_dir(
    path: str | Path,
    *,
    weights: bool = True,
    tokenizer: bool = False,
    flag: str | None = None,
    require_tokenizer: bool = False,
) -> None:
    """Check that ``path`` is an HF model directory whose files a library can load.

    Args:
        path: the directory.
        weights: also check the weights: ``model.safetensors``, or ``model.safetensors.index.json``
            and every shard it names (``pytorch_model.bin`` is accepted unchecked).
        tokenizer: also check the tokenizer's JSON files that are present (``TOKENIZER_JSON_FILES``).
        flag: the CLI flag that named ``path`` (``--hf-checkpoint``); it starts the message.
        require_tokenizer: the directory must hold a tokenizer vocabulary (``TOKENIZER_VOCAB_FILES``).

    Raises:
        CheckpointError: one line: ``[flag: ]file: what is wrong`` (missing directory or file,
            invalid JSON with line and column, a safetensors file whose size disagrees with its
            header, a shard the index names that is missing).
    """
    path = Path(path)
    where = f"{flag}={str(path)!r}" if flag else str(path)

    def fail(message: str) -> CheckpointError:
        return CheckpointError(f"{flag}: {message}" if flag else message)

    if not path.exists():
        raise CheckpointError(f"{where}: no such directory")
    if not path.is_dir():
        raise CheckpointError(f"{where}: is a file, expected a Hugging Face model directory")
    if not (path / "config.json").is_file():
        found = sorted(p.name for p in path.iterdir())[:10]
        raise CheckpointError(
            f"{where}: no config.json in the directory, so it is not a Hugging Face model (found {found})"
        )
    for name in CONFIG_JSON_FILES + (TOKENIZER_JSON_FILES if tokenizer else ()):
        if (path / name).is_file():
            problem = _json_problem(path / name)
            if problem:
                raise fail(f"{path / name}: {problem}")
    if require_tokenizer and not any(all((path / f).is_file() for f in files) for files in TOKENIZER_VOCAB_FILES):
        wanted = " or ".join(" + ".join(files) for files in TOKENIZER_VOCAB_FILES)
        raise fail(f"{path}: no tokenizer vocabulary ({wanted})")
    if not weights:
        return
    for name in _weight_files(path, fail) or ():
        problem = _safetensors_problem(path / name)
        if problem:
            raise fail(f"{path / name}: {problem}")


def _weight_files(path: Path, fail: Callable[[str], CheckpointError]) -> list[str] | None:
    """The safetensors files of the weights (the index's shards, or ``model.safetensors``); None for
    ``pytorch_model.bin`` weights (accepted unchecked); raises ``fail(...)`` for a bad index or no weights."""
    if (path / INDEX).is_file():
        index = path / INDEX
        problem = _json_problem(index)
        if problem:
            raise fail(f"{index}: {problem}")
        weight_map = json.loads(index.read_bytes()).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise fail(f"{index}: no 'weight_map' object of tensor name -> file name")
        files = sorted(set(weight_map.values()))
        for name in files:
            if not (path / name).is_file():
                raise fail(f"{index}: names {name}, which is missing")
        return files
    if (path / "model.safetensors").is_file():
        return ["model.safetensors"]
    if (path / "pytorch_model.bin").is_file() or (path / "pytorch_model.bin.index.json").is_file():
        return None
    raise fail(f"{path}: no weights (no model.safetensors, {INDEX} or pytorch_model.bin)")


def check_safetensors_file(file: str | Path) -> None:
    """Check that ``file`` is a whole safetensors file (its size agrees with its header).

    Raises:
        CheckpointError: ``file: what is wrong`` (see ``check_hf_dir``).
    """
    problem = _safetensors_problem(Path(file))
    if problem:
        raise CheckpointError(f"{file}: {problem}")


def load_tokenizer(path: str | Path, *, flag: str | None = None):
    """``AutoTokenizer.from_pretrained(path)`` after ``check_hf_dir(path, weights=False, tokenizer=True)``.

    Raises:
        CheckpointError: see ``check_hf_dir``.
    """
    from transformers import AutoTokenizer

    check_hf_dir(path, weights=False, tokenizer=True, flag=flag, require_tokenizer=True)
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as exc:  # transformers' own words, last line first
        lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
        where = f"{flag}={str(path)!r}" if flag else str(path)
        raise CheckpointError(
            f"{where}: transformers cannot load its tokenizer: {lines[-1] if lines else type(exc).__name__}"
        ) from exc


def _json_problem(file: Path) -> str | None:
    """What makes ``file`` not a JSON object, or None."""
    data = file.read_bytes()
    if not data.strip():
        return "empty file, expected a JSON object"
    try:
        value = json.loads(data)
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text (byte {exc.start}), expected a JSON object"
    except json.JSONDecodeError as exc:
        return f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
    if not isinstance(value, dict):
        return f"expected a JSON object, got {type(value).__name__}"
    return None


def _safetensors_problem(file: Path) -> str | None:
    """What makes ``file`` not a whole safetensors file, or None.

    The format: an 8-byte little-endian header length N, N bytes of JSON header (tensor name ->
    dtype, shape and ``data_offsets`` [begin, end) into the data), then the data, which ends at
    the largest end offset; safetensors refuses a file with bytes missing or left over.
    """
    size = file.stat().st_size
    bad = "truncated or corrupt safetensors file"
    if size < 8:
        return f"{bad}: {size} bytes, shorter than the 8-byte header length"
    with file.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if 8 + header_len > size:
            return f"{bad}: {size} bytes, but its header alone claims {8 + header_len}"
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return f"{bad}: its {header_len}-byte header is not a safetensors header (JSON of tensor name -> dtype, shape, data_offsets)"
    data_len = max(ends, default=0)
    expected = 8 + header_len + data_len
    if size != expected:
        return (
            f"{bad}: {size} bytes, expected {expected} (8-byte length + {header_len}-byte header + "
            f"{data_len} bytes of tensor data); re-download or re-save it"
        )
    return None
