"""The OS-level sandbox of ``sandbox.py``: bubblewrap (``bwrap``, Debian package ``bubblewrap``).

A command started through ``BwrapLauncher.argv`` runs in new PID, mount, network, IPC, UTS and cgroup
namespaces, with no capabilities, in a new session, killed when the launching process dies, under the
seccomp filter of ``seccomp.py`` and inside the per-run cgroup of ``cgroup.py`` (a two-line ``sh``
wrapper writes its own pid into the cgroup before it executes bwrap, so every process of the sandbox
starts inside). Its file system is a read-only view of ``/usr``, the ``/lib*`` and ``/bin`` links,
``/etc/ld.so.cache`` and the interpreter's prefix, a fresh ``/proc`` of its own PID namespace (no host
process, so no ``/proc/<pid>/environ`` of ours) with ``/proc/sys`` read-only, a minimal ``/dev``, and
one writable size-bounded tmpfs at ``/sandbox`` (its working directory and ``HOME``); the environment
is cleared to ``PATH``, ``LANG``, ``HOME`` and ``TMPDIR``; the network namespace has only a loopback.

The sandbox's processes never run as the host's root (``mode``):

* ``"setpriv"`` (we are root): bwrap runs privileged, with no user namespace, so it can bind the
  interpreter wherever it lives (``/root`` is 0700 on most machines); its command is util-linux's
  ``setpriv``, which makes itself the run's own host uid (``run_uid.held_uid``: a uid no other sandbox
  holds, so concurrent sandboxes share no per-user limit, keyring or signal reach; ``nobody``, 65534,
  when the caller names none), with no groups, no capabilities, no new privileges, and then executes
  Python. The sandbox's init (bwrap, PID 1 inside) stays root, which an unprivileged process cannot
  trace or signal.
* ``"userns"`` (we are not root): bwrap in a user namespace of our own, as ``nobody`` inside and our
  own uid outside, with ``--disable-userns``.
* ``"root-userns"``: as root in a user namespace, ``nobody`` inside mapped to the host's root
  outside. Only where ``"setpriv"`` cannot start (``problem`` says why); the sandbox refuses it
  unless unsafe execution is allowed.

``probe()`` finds which works, once per process.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from slime.rollout.tools.seccomp import program_fd

__all__ = ["BwrapLauncher", "probe", "SANDBOX_DIR", "NOBODY"]

NOBODY = 65534
"""The sandbox's uid/gid inside, and on the host in ``"setpriv"`` mode (Debian's ``nobody``/``nogroup``)."""
SANDBOX_DIR = "/sandbox"
"""The sandbox's working directory and its only writable place (a tmpfs)."""
_PROBE_TIMEOUT_S = 20.0
_OPTIONAL_FLAGS = ("--size", "--disable-userns", "--perms", "--seccomp")
# Run as ``sh -c _ENTER_CGROUPS sh PROCS... -- COMMAND...``: the shell enters each cgroup, then becomes COMMAND.
_ENTER_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


@dataclasses.dataclass(frozen=True)
class BwrapLauncher:
    """How to start ``python`` inside bwrap on this machine.

    Attributes:
        bwrap: path of the bwrap binary.
        python: the interpreter run inside (the running one's base executable).
        mode: ``"setpriv"``, ``"userns"`` or ``"root-userns"`` (module docstring).
        known_flags: optional bwrap flags this version has (``--size``, ``--disable-userns``, ...).
        setpriv: path of util-linux's ``setpriv`` (``"setpriv"`` mode).
        problem: why the sandbox runs as the host's root (``"root-userns"``), else ``""``.
    """

    bwrap: str
    python: str
    mode: str
    known_flags: frozenset[str]
    setpriv: str = ""
    problem: str = ""

    @property
    def host_uid(self) -> int:
        """The host uid of the sandbox's code (in ``"setpriv"`` mode: when ``argv`` is given no ``uid``)."""
        return {"setpriv": NOBODY, "userns": os.geteuid()}.get(self.mode, 0)

    @property
    def sets_uid(self) -> bool:
        """Whether ``argv`` takes the host ``uid`` the code runs as (``"setpriv"`` mode)."""
        return self.mode == "setpriv"

    def argv(
        self,
        main_py: str,
        python_args: list[str],
        *,
        tmpfs_bytes: int,
        seccomp_fd: int | None = None,
        cgroup_procs: Sequence[str] = (),
        uid: int = NOBODY,
    ) -> list[str]:
        """The command line running ``python <python_args>`` in ``SANDBOX_DIR``.

        Args:
            main_py: host path of the program, bound read-only at ``SANDBOX_DIR/main.py``.
            python_args: the interpreter's arguments.
            tmpfs_bytes: size of the writable tmpfs (where bwrap supports ``--size``).
            seccomp_fd: an inherited descriptor holding the BPF filter (``seccomp.program_fd``), or None.
            cgroup_procs: ``cgroup.procs`` files to enter before bwrap starts (``RunCgroup.procs_files``).
            uid: ``"setpriv"`` mode: the host uid and gid the code runs as (``run_uid.held_uid``); else unused.
        """
        args = [self.bwrap, *self._namespaces(), "--hostname", "sandbox", "--die-with-parent", "--new-session"]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        args += _read_only_binds(self.python, "--perms" in self.known_flags)
        args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"]
        if "--size" in self.known_flags:
            args += ["--size", str(tmpfs_bytes)]
        if "--perms" in self.known_flags:
            args += ["--perms", "1777"]  # in "setpriv" mode bwrap (root) makes it; the code (its own uid) writes there
        args += ["--tmpfs", SANDBOX_DIR, "--ro-bind", main_py, f"{SANDBOX_DIR}/main.py"]
        args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", SANDBOX_DIR, "--clearenv"]
        for key, value in (
            ("PATH", "/usr/bin:/bin"),
            ("LANG", "C.UTF-8"),
            ("HOME", SANDBOX_DIR),
            ("TMPDIR", SANDBOX_DIR),
        ):
            args += ["--setenv", key, value]
        args += ["--", *self._drop(uid), self.python, *python_args]
        if cgroup_procs:
            return ["/bin/sh", "-c", _ENTER_CGROUPS, "sh", *cgroup_procs, "--", *args]
        return args

    def _namespaces(self) -> list[str]:
        if self.mode == "setpriv":
            # Capabilities of the command: only what setpriv needs to become nobody (it drops them with the uid).
            caps = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try", *caps]
        args = ["--unshare-all", "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--cap-drop", "ALL"]
        return args + (["--disable-userns"] if "--disable-userns" in self.known_flags else [])

    def _drop(self, uid: int) -> list[str]:
        if self.mode != "setpriv":
            return []
        ids = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        return [self.setpriv, *ids, "--inh-caps=-all", "--no-new-privs", "--"]


def _read_only_binds(python: str, set_perms: bool) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += [
        "--ro-bind-try",
        "/etc/ld.so.cache",
        "/etc/ld.so.cache",
        "--ro-bind-try",
        "/etc/localtime",
        "/etc/localtime",
    ]
    prefixes = {os.path.dirname(os.path.dirname(python))}  # <prefix>/bin/python3.X
    if python == _base_python():
        prefixes |= {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    prefixes = {p for p in prefixes if p != "/usr" and not p.startswith("/usr/")}
    made: set[str] = set()
    for prefix in sorted(prefixes):
        # The prefix's parents are made 0755 inside (bwrap would copy e.g. /root's 0700, shutting nobody out).
        for parent in _parents(prefix) if set_perms else []:
            if parent not in made and parent not in prefixes:
                args += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        args += ["--ro-bind", prefix, prefix]
    return args


def _parents(path: str) -> list[str]:
    """``/a/b/c`` -> ``["/a", "/a/b"]``."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def probe(seccomp_bpf: bytes | None = None) -> BwrapLauncher | str:
    """The launcher that works here, or why none does (one line). Cached per bwrap path, interpreter, uid, filter.

    Args:
        seccomp_bpf: the filter the sandbox will load, tried with the probe's run (None: none).
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bwrap (bubblewrap) is not found on PATH"
    return _probe(bwrap, _base_python(), os.geteuid(), seccomp_bpf)


def _base_python() -> str:
    """The running interpreter's real executable (outside any virtual environment)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.cache
def _probe(bwrap: str, python: str, euid: int, seccomp_bpf: bytes | None) -> BwrapLauncher | str:
    try:
        help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{bwrap} does not run: {exc}"
    known = frozenset(f for f in _OPTIONAL_FLAGS if f in help_text)
    if "--seccomp" not in known:
        seccomp_bpf = None  # the caller reports it (``isolation.py``)
    if euid != 0:
        launcher = BwrapLauncher(bwrap=bwrap, python=python, mode="userns", known_flags=known)
        reason = _try(launcher, seccomp_bpf)
        return launcher if reason is None else f"{bwrap} cannot start a sandbox here ({reason})"
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin")
    problem = "util-linux's setpriv is not found in /usr/bin or /bin"
    if setpriv is not None:
        launcher = BwrapLauncher(bwrap=bwrap, python=python, mode="setpriv", known_flags=known, setpriv=setpriv)
        if (problem := _try(launcher, seccomp_bpf) or "") == "":
            return launcher
    fallback = BwrapLauncher(bwrap=bwrap, python=python, mode="root-userns", known_flags=known, problem=problem)
    reason = _try(fallback, seccomp_bpf)
    return fallback if reason is None else f"{bwrap} cannot start a sandbox here ({reason})"


def _try(launcher: BwrapLauncher, seccomp_bpf: bytes | None) -> str | None:
    """Run a program that prints its uid through ``launcher``; None if it worked, else the last line it wrote."""
    workdir = tempfile.mkdtemp(prefix="slime-sandbox-probe-")
    fds: tuple[int, ...] = ()
    try:
        main_py = os.path.join(workdir, "main.py")
        with open(main_py, "w") as f:
            f.write("import os\nprint('ok', os.getuid())\n")
        os.chmod(workdir, 0o755)
        os.chmod(main_py, 0o644)
        if seccomp_bpf is not None:
            fds = (program_fd(seccomp_bpf),)
        argv = launcher.argv(main_py, ["-I", "-S", "main.py"], tmpfs_bytes=1 << 20, seccomp_fd=fds[0] if fds else None)
        proc = subprocess.run(
            argv,
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            pass_fds=fds,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    finally:
        for fd in fds:
            os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)
    if proc.returncode == 0 and proc.stdout == f"ok {NOBODY}\n":
        return None
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}, printed {proc.stdout.strip()[:80]!r}"
