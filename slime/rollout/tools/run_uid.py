"""A host user id of its own for each sandbox run as root (``bwrap.py``'s ``"setpriv"`` mode).

Sandboxes that share one host uid (``nobody``) share what the kernel keeps per user: ``RLIMIT_NPROC``'s count
(the process bound where there is no cgroup), the user keyring, and the processes ``kill`` and ``ptrace`` may
reach. Each run as root therefore takes a uid (and the gid of the same number) of its own from
``UID_BASE`` .. ``UID_BASE + NUM_UIDS - 1``, none of them a user of ``/etc/passwd``, held for the whole run by
an ``flock`` on ``LOCK_DIR/<uid>`` (or, where that is not writable, the temporary directory's), removed at the
end of the run: concurrent runs, of this process or of any other on the host, never hold the same one, and a
lock dies with its process (a killed run leaves an empty file, which the next run on that uid takes). Without root (``"userns"``) each sandbox is its own user namespace
already: its uid inside is ``nobody`` and outside ours, and nothing here is needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import random
import tempfile
from collections.abc import Iterator

__all__ = ["held_uid", "UID_BASE", "NUM_UIDS", "LOCK_DIR"]

UID_BASE = 2_000_000_000
"""The first uid of the range (well above login users, systemd's dynamic users and the usual subuid ranges)."""
NUM_UIDS = 1 << 20
LOCK_DIR = "/run/lock/slime-sandbox-uids"
_TRIES = 256


def _lock_dir() -> str:
    for path in (LOCK_DIR, os.path.join(tempfile.gettempdir(), "slime-sandbox-uids")):
        with contextlib.suppress(OSError):
            os.makedirs(path, mode=0o700, exist_ok=True)
            if os.access(path, os.W_OK):
                return path
    raise OSError(f"no writable directory for the sandbox uid locks ({LOCK_DIR}, or the temporary directory's)")


def _is_user(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _locked(path: str) -> int | None:
    """A descriptor of ``path`` holding its exclusive lock, or None when another run holds it (or held it and
    removed the file between our open and our lock: the lock is then on a file no one else will open)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino == os.stat(path).st_ino:
            return fd
    except (BlockingIOError, FileNotFoundError):
        pass
    os.close(fd)
    return None


@contextlib.contextmanager
def held_uid() -> Iterator[int]:
    """A uid no other sandbox run on this host holds, held until the block ends.

    Raises:
        OSError: no lock directory is writable, or ``_TRIES`` uids in a row were held (a host with that many
            sandboxes at once).
    """
    where = _lock_dir()
    start = random.randrange(NUM_UIDS)  # spread the runs over the range: few collisions to step over
    for i in range(_TRIES):
        uid = UID_BASE + (start + i) % NUM_UIDS
        if _is_user(uid):
            continue
        path = os.path.join(where, str(uid))
        fd = _locked(path)
        if fd is None:  # another run holds it
            continue
        try:
            yield uid
        finally:
            os.unlink(path)  # while still locked: a run that opened it before sees it gone (_locked) and moves on
            os.close(fd)
        return
    raise OSError(f"{_TRIES} sandbox uids in a row are held in {where}")
