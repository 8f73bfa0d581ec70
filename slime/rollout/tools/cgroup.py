"""One cgroup per sandbox run: a task and a memory limit for the whole process tree, and the whole tree killed.

Per-process limits (``RLIMIT_AS``, ``RLIMIT_NPROC``) do not bound a sandbox: four children of 500 MiB
each stay under a 1 GiB address-space limit, and ``RLIMIT_NPROC`` counts every process of the host
user, so concurrent sandboxes (which all run as the same user) would share one count. A cgroup bounds
the tree it contains, whatever the user:

* ``pids.max``: tasks (processes and threads) of the sandbox at once, bwrap's two included;
* ``memory.max`` (v2) / ``memory.limit_in_bytes`` (v1): resident memory of the tree, tmpfs files and
  page cache included; swap is held at zero where the kernel accounts it; past it the kernel's OOM
  killer kills (v2: the whole group, ``memory.oom.group``);
* the end of a run kills every process left in it (v2 ``cgroup.kill``; v1: ``SIGKILL`` to each pid in
  ``cgroup.procs`` until none is left) and removes it, so nothing outlives the run.

Per-run cgroups are children of the cgroup this process is in (so whatever limits the caller has still
apply to its sandboxes) and named ``slime-sbx-<pid>-<n>``; ``probe()`` finds that parent once and removes
empty ones that dead processes left behind. cgroup v2 (unified) is used where it offers both controllers
to this process's cgroup, else the v1 ``pids`` and ``memory`` hierarchies. On v2 a cgroup with processes
in it cannot hand controllers to children; if the caller's cgroup holds only this process and its
descendants, ``probe()`` moves them into a leaf ``slime-main`` and enables ``pids`` and ``memory`` for
the children (the usual way to manage a delegated cgroup). Without write access to the caller's cgroup
(a non-root user outside a delegated one, a read-only ``/sys/fs/cgroup``) there is no per-run cgroup, and
``probe()`` says why.

Cost: entering the cgroups makes the kernel wait out an RCU grace period (the cgroup attach lock): on a
v1 host with 2 cores, 5-8 ms of wall time per run when idle and up to about 12 ms under load, and under
1 ms of CPU (a ``print(1)`` run went from about 15 to 21-23 ms when idle, from 22 to 34 ms mean under load).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import itertools
import logging
import os
import re
import signal
import time

__all__ = ["CgroupRoot", "RunCgroup", "probe"]

logger = logging.getLogger(__name__)

CONTROLLERS = ("pids", "memory")
PREFIX = "slime-sbx-"
_LEAF = "slime-main"
_STALE = re.compile(rf"{PREFIX}(\d+)-\d+$")
_counter = itertools.count()


@dataclasses.dataclass(frozen=True)
class CgroupRoot:
    """Where this process creates per-run cgroups.

    Attributes:
        version: 2 (one unified directory) or 1 (one directory per controller).
        parents: v2 ``(dir,)``; v1 ``(pids dir, memory dir)``.
    """

    version: int
    parents: tuple[str, ...]

    def create(self, *, max_tasks: int, memory_bytes: int) -> RunCgroup:
        """A fresh cgroup for one run, its limits set. Raises OSError where the cgroup file system refuses."""
        name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        run = RunCgroup(self.version, tuple(os.path.join(p, name) for p in self.parents))
        try:
            for d in run.dirs:
                os.mkdir(d)
            run.set_limits(max_tasks, memory_bytes)
        except OSError:
            run.remove(timeout_s=0.5)  # the directories made so far
            raise
        return run


@dataclasses.dataclass(frozen=True)
class RunCgroup:
    """The cgroup of one run (``CgroupRoot.create``).

    Attributes:
        version: as the root's.
        dirs: v2 ``(dir,)``; v1 ``(pids dir, memory dir)``.
    """

    version: int
    dirs: tuple[str, ...]

    @property
    def procs_files(self) -> tuple[str, ...]:
        """The ``cgroup.procs`` files a process writes its pid into to enter this cgroup (all of them)."""
        return tuple(os.path.join(d, "cgroup.procs") for d in self.dirs)

    def set_limits(self, max_tasks: int, memory_bytes: int) -> None:
        """``max_tasks`` tasks and ``memory_bytes`` bytes of memory (no swap) for everything inside."""
        pids_dir, memory_dir = self.dirs[0], self.dirs[-1]
        _write(pids_dir, "pids.max", max_tasks)
        if self.version == 2:
            _write(memory_dir, "memory.max", memory_bytes)
            _write_if_present(memory_dir, "memory.swap.max", 0)
            _write_if_present(memory_dir, "memory.oom.group", 1)
        else:
            _write(memory_dir, "memory.limit_in_bytes", memory_bytes)
            _write_if_present(memory_dir, "memory.memsw.limit_in_bytes", memory_bytes)  # memory + swap

    def pids(self) -> set[int]:
        """Processes in the cgroup now (as this process's PID namespace numbers them)."""
        found: set[int] = set()
        for path in self.procs_files:
            with contextlib.suppress(FileNotFoundError):
                with open(path) as f:
                    found.update(int(line) for line in f if line.strip())
        return found

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer killed in here (0 where the kernel does not count)."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            with open(os.path.join(self.dirs[-1], name)) as f:
                fields = dict(line.split(None, 1) for line in f if line.strip())
        except OSError:
            return 0
        return int(fields.get("oom_kill", "0"))

    def kill(self) -> None:
        """Send every process inside ``SIGKILL`` (returns at once; ``remove`` waits for them to go)."""
        if self.version == 2 and _write_if_present(self.dirs[0], "cgroup.kill", 1):
            return
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, *, timeout_s: float = 5.0) -> bool:
        """Kill what is left, wait until the cgroup is empty and delete it; False (logged) if it would not go."""
        deadline = time.monotonic() + timeout_s
        while self.pids():
            if time.monotonic() > deadline:
                logger.error(
                    "sandbox cgroup %s still has processes %s after %.0fs of SIGKILL",
                    self.dirs[0],
                    sorted(self.pids()),
                    timeout_s,
                )
                return False
            self.kill()  # again: a process forked while the last round was sent
            time.sleep(0.001)
        for d in self.dirs:
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:  # EBUSY: the last exits are still being accounted
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        logger.error("sandbox cgroup %s could not be removed: %s", d, exc)
                        return False
                    time.sleep(0.001)
        return True


def _write(directory: str, name: str, value: int | str) -> None:
    with open(os.path.join(directory, name), "w") as f:
        f.write(str(value))


def _write_if_present(directory: str, name: str, value: int | str) -> bool:
    """Write where the kernel has the file (an option of its configuration); whether it was written."""
    try:
        _write(directory, name, value)
    except FileNotFoundError:
        return False
    return True


def probe() -> CgroupRoot | str:
    """Where per-run cgroups go for this process, or why there is none (one line). Cached per process."""
    return _probe(os.getpid())


@functools.cache
def _probe(pid: int) -> CgroupRoot | str:
    try:
        found = _find_root(_own_cgroups(), _mounts())
    except OSError as exc:
        return f"no cgroup for per-run limits ({exc})"
    if isinstance(found, str):
        return f"no cgroup for per-run limits: {found}"
    problem = _try_create(found)
    return found if problem is None else f"no cgroup for per-run limits: {problem}"


def _own_cgroups() -> dict[str, str]:
    """Controller (``""`` for v2) -> this process's cgroup path, from ``/proc/self/cgroup``."""
    found: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                found[c] = path
    return found


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """Each cgroup mount: (fstype, mount root, mount point, super options), from ``/proc/self/mountinfo``."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            fields, (fstype, _source, options) = head.split(), tail.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                point = re.sub(r"\\(\d{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                found.append((fstype, fields[3], point, set(options.split(","))))
    return found


def _dir(mount_root: str, point: str, path: str) -> str | None:
    rel = os.path.relpath(path, mount_root)
    return None if rel.startswith("..") else os.path.normpath(os.path.join(point, rel))


class _CannotDelegate(Exception):
    """cgroup v2 offers the controllers to this process's cgroup, which cannot hand them to children."""


def _find_root(own: dict[str, str], mounts: list[tuple[str, str, str, set[str]]]) -> CgroupRoot | str:
    """v2 if it offers both controllers to our cgroup, else v1's hierarchies, else why neither."""
    try:
        v2 = _find_v2(own, mounts)
    except _CannotDelegate as exc:  # v2 has the controllers: v1 has none of them
        return str(exc)
    if isinstance(v2, CgroupRoot):
        return v2
    v1 = []
    for c in CONTROLLERS:
        dirs = [_dir(r, p, own[c]) for t, r, p, opts in mounts if t == "cgroup" and c in opts and c in own]
        if not any(dirs):
            return f"{v2} and no cgroup v1 {c} hierarchy (needs {' and '.join(CONTROLLERS)})"
        v1.append(next(d for d in dirs if d))
    return CgroupRoot(1, tuple(v1))


def _find_v2(own: dict[str, str], mounts: list[tuple[str, str, str, set[str]]]) -> CgroupRoot | str:
    """The v2 root, or why v2 has none. Raises _CannotDelegate: it has both controllers but cannot give them to children."""
    note = "no cgroup v2 mount"
    for fstype, root, point, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        d = _dir(root, point, own[""])
        if d is None:
            note = f"the cgroup v2 mount {point} does not show this process's cgroup {own['']}"
            continue
        with open(os.path.join(d, "cgroup.controllers")) as f:
            offered = f.read().split()
        if all(c in offered for c in CONTROLLERS):
            problem = _delegate_v2(d)
            if problem is not None:
                raise _CannotDelegate(problem)
            return CgroupRoot(2, (d,))
        note = f"cgroup v2 {d} offers {' '.join(offered) or 'no controllers'}"
    return note


def _delegate_v2(d: str) -> str | None:
    """Enable ``pids`` and ``memory`` for ``d``'s children; None, or why that cannot be done."""
    with open(os.path.join(d, "cgroup.subtree_control")) as f:
        if all(c in f.read().split() for c in CONTROLLERS):
            return None
    enable = " ".join("+" + c for c in CONTROLLERS)
    try:
        _write(d, "cgroup.subtree_control", enable)
        return None
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            return f"cannot enable {enable} in {d}/cgroup.subtree_control ({exc.strerror})"
    # EBUSY: processes live in ``d``; a cgroup with controllers for its children may hold none.
    with open(os.path.join(d, "cgroup.procs")) as f:
        inside = {int(line) for line in f if line.strip()}
    strangers = inside - _own_tree()
    if strangers:
        return f"{d} also holds {len(strangers)} processes that are not this one's, so it cannot have per-run children"
    leaf = os.path.join(d, _LEAF)
    with contextlib.suppress(FileExistsError):
        os.mkdir(leaf)
    for pid in inside:
        with contextlib.suppress(ProcessLookupError):
            _write(leaf, "cgroup.procs", pid)
    _write(d, "cgroup.subtree_control", enable)
    logger.info("sandbox: moved this process into %s so that per-run cgroups can be made beside it", leaf)
    return None


def _own_tree() -> set[int]:
    """This process and its descendants (from each process's parent in ``/proc/<pid>/stat``)."""
    parent: dict[int, int] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{name}/stat") as f:
                parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
    tree, grew = {os.getpid()}, True
    while grew:
        added = {pid for pid, ppid in parent.items() if ppid in tree} - tree
        tree |= added
        grew = bool(added)
    return tree


def _try_create(root: CgroupRoot) -> str | None:
    """Create, limit and remove one cgroup (and clear stale ones); None, or why it failed."""
    _remove_stale(root)
    try:
        run = root.create(max_tasks=16, memory_bytes=64 << 20)
    except OSError as exc:
        return f"cannot create a cgroup in {root.parents[0]} ({exc.strerror or exc})"
    run.remove(timeout_s=1.0)
    return None


def _remove_stale(root: CgroupRoot) -> None:
    """Empty per-run cgroups whose process is gone (it was killed before it could remove them)."""
    for parent in root.parents:
        with contextlib.suppress(OSError):
            for name in os.listdir(parent):
                m = _STALE.match(name)
                if m and not os.path.exists(f"/proc/{m.group(1)}"):
                    with contextlib.suppress(OSError):
                        os.rmdir(os.path.join(parent, name))
