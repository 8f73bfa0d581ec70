"""One run per run folder: an OS lock on ``FOLDER/run.lock``, held for the run's whole life.

A run takes the lock of every folder it writes into or resumes from (``--save``, ``--load`` when it
differs, ``weights_dir`` of a disk weight sync outside ``--save``) before it touches a file there,
and holds it to the end; a ``--load`` folder it cannot write (read-only) is only checked. A second run on a held folder, fresh or ``--load``, is refused with one
line naming the holder (pid, host, when it started), read from ``run.lock`` itself::

    FOLDER/run.lock     {"pid": 4242, "host": "node1", "started": "2025-06-01T12:00:00+00:00"}
                        (empty once its run ended cleanly)

The lock is a POSIX record lock (``fcntl.lockf``): the kernel drops it when the holder dies, also on
``kill -9``, and a process the run starts (an engine, a plugin's fork) never inherits it. A run that
finds the lock free but ``run.lock`` still naming a holder (one that died without releasing) takes
it over with a log line naming that holder. Where the file system has no locks (``ENOLCK``), the
holder file alone decides: a holder on this host whose pid is gone is taken over; any other holder
is refused (on another host its liveness cannot be seen: the line says to delete ``run.lock`` if that
run is gone).

POSIX locks are per process: the same process taking a folder twice is caught by a table of this
process's locks (two runs in one process, e.g. tests), and a lock file is never opened twice here,
since closing any descriptor of it would drop the lock. Ranks of a ``torchrun`` job other than 0 take
no lock (rank 0 owns the run folder).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from slime.errors import ConfigError
from slime.types import JsonObject

__all__ = [
    "LOCK_NAME",
    "READ_ONLY_FLAGS",
    "RunFolderInUse",
    "RunLock",
    "acquire_run_lock",
    "check_run_folder_free",
    "hold_run_folders",
]

LOCK_NAME = "run.lock"
READ_ONLY_FLAGS = frozenset({"--load"})
"""Flags of folders a run reads but does not need to write (``hold_run_folders``)."""

_log = logging.getLogger(__name__)
_HELD: dict[str, RunLock] = {}
"""This process's locks, by the folder's real path."""
_GUARD = threading.Lock()
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)
"""``lockf`` errors of a file system without record locks."""


class RunFolderInUse(ConfigError):
    """A run folder held by another live run; the message names the folder's flag and the holder."""


@dataclass
class RunLock:
    """A held run-folder lock (``acquire_run_lock``); ``release`` ends it."""

    folder: Path
    fd: int
    holder: JsonObject

    def release(self) -> None:
        """Empty ``run.lock`` (a clean end: nothing to take over) and drop the lock. Idempotent."""
        with _GUARD:
            if _HELD.get(_key(self.folder)) is not self:
                return
            del _HELD[_key(self.folder)]
            with contextlib.suppress(OSError):  # the folder may be gone (a test's tmp dir)
                os.ftruncate(self.fd, 0)
            os.close(self.fd)  # drops the lock


def acquire_run_lock(folder: str | Path, *, flag: str = "--save") -> RunLock:
    """Take ``folder``'s lock (creating the folder) for this process, or refuse.

    Args:
        folder: the run folder.
        flag: the flag that named it, for the message (``--save``, ``--load``, ``--weights-dir``).

    Raises:
        RunFolderInUse: another live run (or this process) holds it; one line naming the holder.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with _GUARD:
        if (mine := _HELD.get(_key(folder))) is not None:
            raise RunFolderInUse(_in_use(folder, flag, mine.holder))
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            previous = _lock_or_refuse(fd, folder, flag)
            holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": _now()}
            _write_holder(fd, holder)
        except BaseException:
            os.close(fd)
            raise
        if previous:
            _log.warning(
                "%s=%s: taking over its lock from a run that is no longer live (%s)", flag, folder, _describe(previous)
            )
        lock = RunLock(folder, fd, holder)
        _HELD[_key(folder)] = lock
        return lock


def check_run_folder_free(folder: str | Path, *, flag: str = "--save") -> None:
    """Refuse when a live run holds ``folder``; takes nothing (a shared lock for a moment: read-only folders too).

    For ``slime train``'s start-of-run checks, and for a folder a run only reads and cannot write (``--load``).

    Raises:
        RunFolderInUse: as ``acquire_run_lock``.
    """
    folder = Path(folder)
    if not (folder / LOCK_NAME).is_file():
        return
    with _GUARD:
        if (mine := _HELD.get(_key(folder))) is not None:
            raise RunFolderInUse(_in_use(folder, flag, mine.holder))
        fd = os.open(folder / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _lock_or_refuse(fd, folder, flag, mode=fcntl.LOCK_SH)
        finally:
            os.close(fd)  # drops the probe's lock, if it took one


@contextlib.contextmanager
def hold_run_folders(folders: Sequence[tuple[str, str | Path]]) -> Iterator[list[RunLock]]:
    """Hold the lock of every ``(flag, folder)`` for the ``with`` block (each real folder once).

    A folder the run only reads (flag ``--load``) is held when it exists and is writable; one that does
    not exist is skipped (the run starts fresh), and a read-only one is only checked
    (``check_run_folder_free``). A rank of a ``torchrun`` job other than 0 (``RANK``) takes none.

    Raises:
        RunFolderInUse: one of them is held; the ones taken before it are released.
    """
    if int(os.environ.get("RANK", "0")) != 0:
        yield []
        return
    with contextlib.ExitStack() as stack:
        locks: list[RunLock] = []
        seen: set[str] = set()
        for flag, folder in folders:
            if _key(Path(folder)) in seen:
                continue
            seen.add(_key(Path(folder)))
            if flag in READ_ONLY_FLAGS and not os.access(folder, os.W_OK):  # missing, or read-only: nothing to hold
                check_run_folder_free(folder, flag=flag)
                continue
            locks.append(lock := acquire_run_lock(folder, flag=flag))
            stack.callback(lock.release)
        yield locks


def _lock_or_refuse(fd: int, folder: Path, flag: str, *, mode: int = fcntl.LOCK_EX) -> JsonObject | None:
    """Lock ``fd`` (``mode``, without waiting); return the holder ``run.lock`` still names (a dead one), or None.

    Raises:
        RunFolderInUse: the lock is held by a live process.
    """
    try:
        fcntl.lockf(fd, mode | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            raise RunFolderInUse(_in_use(folder, flag, _read_holder(fd))) from None
        if exc.errno not in _NO_LOCKS:
            raise
        return _without_os_locks(fd, folder, flag)
    return _read_holder(fd)


def _without_os_locks(fd: int, folder: Path, flag: str) -> JsonObject | None:
    """The holder file alone decides (a file system without record locks, e.g. some network mounts)."""
    holder = _read_holder(fd)
    if not holder:
        return None
    on_this_host = holder.get("host") == socket.gethostname()
    if on_this_host and not _pid_alive(holder.get("pid")):
        return holder
    gone = "" if on_this_host else f"; if that run is gone, delete {folder / LOCK_NAME}"
    raise RunFolderInUse(_in_use(folder, flag, holder) + f" (this file system has no locks: {LOCK_NAME} decides{gone})")


def _in_use(folder: Path, flag: str, holder: JsonObject | None) -> str:
    other = f"choose another {flag}" if flag != "--load" else "--load a copy of it"
    return f"{flag}={str(folder)!r} is in use by another live run ({_describe(holder)}); wait for that run to end or stop it, or {other}"


def _describe(holder: JsonObject | None) -> str:
    if not holder:
        return "its pid is not written yet: it is just starting"
    me = ", this process" if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname() else ""
    return f"pid {holder.get('pid')} on host {holder.get('host')}{me}, started {holder.get('started')}"


def _read_holder(fd: int) -> JsonObject | None:
    """``run.lock``'s holder, or None (empty: nobody; unreadable: a torn write, treated as nobody's)."""
    raw = os.pread(fd, 4096, 0)
    try:
        holder = json.loads(raw) if raw.strip() else None
    except ValueError:
        return {"pid": "?", "host": "?", "started": f"? (unreadable {LOCK_NAME}: {raw[:40]!r})"}
    return holder if isinstance(holder, dict) else None


def _write_holder(fd: int, holder: JsonObject) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder).encode() + b"\n", 0)
    os.fsync(fd)


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def _key(folder: Path) -> str:
    return os.path.realpath(folder)
