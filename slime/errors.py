"""slime's exception tree. Errors are translated once, at the boundary where they arise.

    SlimeError
    ├── ConfigError (ValueError)        a flag or config value is invalid; names the flag
    ├── DataError (ValueError)          a malformed dataset row; names file:line
    ├── RunError                        a run ended with nothing to show (it trained nothing); its files are written
    ├── CheckpointError (ValueError)    a model directory's or run checkpoint's file is missing, corrupt or truncated; names the file
    ├── DiskFullError                   a write found no space (ENOSPC / EDQUOT); names the file, the disk and the space needed
    ├── EngineError                     anything from an inference engine (SGLang or embedded)
    │   ├── EngineUnavailable           cannot connect / connection dropped / 5xx: retry elsewhere
    │   │   └── EnginesGone             no engine of a pool is left in rotation: the run cannot go on
    │   ├── EngineTimeout (TimeoutError) the call ran past its ``*_timeout_s``
    │   ├── EngineRequestError          the engine refused the request (4xx); carries its message
    │   └── ProtocolError               the engine sent something we do not understand
    └── PluginError                     a user plugin (reward, generate, tool) broke its contract

Every ``EngineError`` carries ``url`` (engine base URL), ``endpoint``, ``status`` (HTTP status or
None) and ``engine_message`` (the engine's own words, from whichever error-body shape it used).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

__all__ = [
    "first_slime_error",
    "SlimeError",
    "ConfigError",
    "DataError",
    "RunError",
    "CheckpointError",
    "DiskFullError",
    "disk_full_error",
    "EngineError",
    "EngineUnavailable",
    "EnginesGone",
    "EngineTimeout",
    "EngineRequestError",
    "ProtocolError",
    "PluginError",
]


class SlimeError(Exception):
    """Base of every error slime raises on purpose."""


class ConfigError(SlimeError, ValueError):
    """An invalid configuration value; the message names the CLI flag."""


class DataError(SlimeError, ValueError):
    """A malformed dataset row; the message names ``path:line``."""


class RunError(SlimeError):
    """A run that finished its steps without a usable result (e.g. every sample FAILED, so nothing
    trained). Raised after the run's records, summary and report are written."""


class CheckpointError(SlimeError, ValueError):
    """A model directory (``--hf-checkpoint`` and the like) with a missing, corrupt or truncated file;
    the message names the file (``slime.hf_checkpoint.check_hf_dir``)."""


class DiskFullError(SlimeError):
    """A write that found no space left on its disk (``ENOSPC``, or ``EDQUOT``: over quota); one line naming
    what was written, the file, the disk (mount point, file system, free space) and the space needed
    (``disk_full_error``)."""


_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# the text of a writer that drops the errno: safetensors' Rust writer ("os error 28"), or the C library's message
_DISK_FULL_TEXT = re.compile(r"No space left on device|Disk quota exceeded|os error (?:28|122)\b")


def disk_full_error(
    exc: BaseException, *, what: str, path: str | os.PathLike[str], needed_bytes: int | None = None
) -> DiskFullError | None:
    """``exc`` as a ``DiskFullError`` when it, or an exception it chains, is a write that found no space; else None.

    Args:
        exc: the error a write raised (an ``OSError``, or a library's error around one: torch's writer
            chains the ``OSError`` of a Python file object, safetensors' names ``os error 28``).
        what: what was being written, starting the line (``checkpoint step 3``).
        path: the file or folder being written (the ``OSError``'s own file name wins when it has one).
        needed_bytes: the space the write needs, when known.
    """
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in _DISK_FULL_ERRNOS:
            return DiskFullError(_disk_full_line(what, cause.filename or path, needed_bytes, cause.errno))
        if not isinstance(cause, OSError) and (m := _DISK_FULL_TEXT.search(str(cause))):
            over_quota = "quota" in m.group(0) or "122" in m.group(0)
            return DiskFullError(
                _disk_full_line(what, path, needed_bytes, errno.EDQUOT if over_quota else errno.ENOSPC)
            )
        cause = cause.__cause__ or cause.__context__
    return None


def _disk_full_line(what: str, path: str | os.PathLike[str], needed_bytes: int | None, code: int) -> str:
    needed = f"; it needs about {_size(needed_bytes)}" if needed_bytes else ""
    reason = f"{os.strerror(code).lower()} ({errno.errorcode[code]})"
    return f"{what}: {reason} writing {path}: {_describe_disk(Path(path))}{needed}"


def _describe_disk(path: Path) -> str:
    """``the disk mounted at /data (ext4): 12.0 KiB free of 1.0 GiB`` for the disk holding ``path``."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    mount = existing.resolve()
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    usage = shutil.disk_usage(existing)
    return f"the disk mounted at {mount}{_fs_type(mount)}: {_size(usage.free)} free of {_size(usage.total)}"


def _fs_type(mount: Path) -> str:
    try:
        with open("/proc/self/mounts") as f:
            types = [
                fields[2] for fields in (line.split() for line in f) if len(fields) > 2 and fields[1] == str(mount)
            ]
    except OSError:  # not Linux
        return ""
    return f" ({types[-1]})" if types else ""


def _size(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"


class EngineError(SlimeError):
    """An error talking to an inference engine.

    Attributes:
        url: engine base URL (``http://host:port``).
        endpoint: the path called (``/generate``).
        status: HTTP status, or None when no response arrived.
        engine_message: the engine's own error text (or the transport error's text).
    """

    def __init__(
        self, message: str, *, url: str = "", endpoint: str = "", status: int | None = None, engine_message: str = ""
    ):
        self.url = url
        self.endpoint = endpoint
        self.status = status
        self.engine_message = engine_message
        where = f"{url}{endpoint}" if url or endpoint else "engine"
        status_s = f" (HTTP {status})" if status is not None else ""
        super().__init__(f"{where}{status_s}: {message}")


class EngineUnavailable(EngineError):
    """The engine cannot be reached, dropped the connection, or answered 5xx. Retry elsewhere."""


class EnginesGone(EngineUnavailable):
    """Every engine of a pool is out of rotation and none came back within the pool's bound.

    The message is one line naming each engine and why (``reasons``, ``{url: why}``), e.g.
    ``no engine left ...: engine http://h:1: no answer for 31s (...); engine http://h:2: dead (connection refused ...)``.
    Unlike a plain ``EngineUnavailable`` it ends the run: no sample can be served any more.
    """

    def __init__(self, message: str, *, reasons: dict[str, str], endpoint: str = ""):
        super().__init__(message, endpoint=endpoint)
        self.reasons = dict(reasons)
        self.args = (message,)  # the message is already one whole line: no "url/endpoint:" prefix


class EngineTimeout(EngineError, TimeoutError):
    """An engine call ran past its timeout."""


class EngineRequestError(EngineError):
    """The engine refused the request (4xx or ``success: false``)."""


class ProtocolError(EngineError):
    """The engine answered with a body we do not understand."""


class PluginError(SlimeError):
    """A user plugin broke its contract (wrong return type, misaligned lists)."""


def first_slime_error(group: BaseExceptionGroup) -> SlimeError | None:
    """The first ``SlimeError`` in a (nested) exception group (raised inside a task group), or None."""
    for exc in group.exceptions:
        if isinstance(exc, SlimeError):
            return exc
        if isinstance(exc, BaseExceptionGroup) and (found := first_slime_error(exc)) is not None:
            return found
    return None
