"""The OS-level sandbox of ``sandbox.py``: bubblewrap (``bwrap``, Debian package ``bubblewrap``).

A command started through ``BwrapLauncher.argv`` runs in new user, PID, mount, network, IPC, UTS
(and, where the kernel has them, cgroup) namespaces, with no capabilities, in a new session,
killed when the launching process dies. Its file system is a read-only view of ``/usr``, the
``/lib*`` and ``/bin`` links, ``/etc/ld.so.cache`` and the interpreter's prefix, a fresh ``/proc``
of its own PID namespace (no host process, so no ``/proc/<pid>/environ`` of ours), a minimal
``/dev``, and one writable size-bounded tmpfs at ``/sandbox`` (its working directory and ``HOME``);
the environment is cleared to ``PATH``, ``LANG``, ``HOME`` and ``TMPDIR``. The network namespace has
only a loopback of its own.

As root the sandbox runs as the host's ``nobody`` (65534) when bwrap can be started that way
(unprivileged user namespaces allowed and the interpreter readable by ``nobody``), else as root
mapped to ``nobody`` inside its user namespace; in that case ``RLIMIT_NPROC`` does not bind (the
kernel exempts the host's root), and only the wall-clock kill, which ends the whole PID namespace,
bounds a fork bomb. ``probe()`` finds which works, once per process.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import subprocess
import sys
import tempfile

__all__ = ["BwrapLauncher", "probe", "SANDBOX_DIR"]

NOBODY = 65534
"""Host uid/gid the sandbox runs as when we are root (Debian's ``nobody``/``nogroup``)."""
SANDBOX_DIR = "/sandbox"
"""The sandbox's working directory and its only writable place (a tmpfs)."""
_PROBE_TIMEOUT_S = 20.0


@dataclasses.dataclass(frozen=True)
class BwrapLauncher:
    """How to start ``python`` inside bwrap on this machine.

    Attributes:
        bwrap: path of the bwrap binary.
        python: the interpreter run inside (the running one's base executable).
        run_as_nobody: start bwrap as host uid 65534 (we are root); else as ourselves.
        known_flags: optional bwrap flags this version has (``--size``, ``--disable-userns``).
    """

    bwrap: str
    python: str
    run_as_nobody: bool
    known_flags: frozenset[str]

    @property
    def process_limit_enforced(self) -> bool:
        """``RLIMIT_NPROC`` binds unless the sandbox's host uid is root."""
        return self.run_as_nobody or os.geteuid() != 0

    def spawn_kwargs(self) -> dict:
        """Extra ``subprocess`` arguments for starting ``argv()`` (the host user to run as)."""
        if self.run_as_nobody:
            return {"user": NOBODY, "group": NOBODY, "extra_groups": []}
        return {}

    def argv(self, main_py: str, python_args: list[str], *, tmpfs_bytes: int) -> list[str]:
        """bwrap's command line running ``python <python_args>`` in ``SANDBOX_DIR``.

        Args:
            main_py: host path of the program, bound read-only at ``SANDBOX_DIR/main.py``.
            python_args: the interpreter's arguments.
            tmpfs_bytes: size of the writable tmpfs (where bwrap supports ``--size``).
        """
        args = [
            self.bwrap,
            "--unshare-all",
            "--unshare-user",
            "--uid",
            str(NOBODY),
            "--gid",
            str(NOBODY),
            "--hostname",
            "sandbox",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
        ]
        if "--disable-userns" in self.known_flags:
            args.append("--disable-userns")
        args += _read_only_binds(self.python)
        args += ["--proc", "/proc", "--dev", "/dev"]
        if "--size" in self.known_flags:
            args += ["--size", str(tmpfs_bytes)]
        args += [
            "--tmpfs",
            SANDBOX_DIR,
            "--ro-bind",
            main_py,
            f"{SANDBOX_DIR}/main.py",
            "--remount-ro",
            "/dev",
            "--remount-ro",
            "/",
            "--chdir",
            SANDBOX_DIR,
            "--clearenv",
        ]
        for key, value in (("PATH", "/usr/bin:/bin"), ("LANG", "C.UTF-8"), ("HOME", SANDBOX_DIR), ("TMPDIR", SANDBOX_DIR)):
            args += ["--setenv", key, value]
        return [*args, "--", self.python, *python_args]


def _read_only_binds(python: str) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache", "--ro-bind-try", "/etc/localtime", "/etc/localtime"]
    prefixes = {os.path.dirname(os.path.dirname(python))}  # <prefix>/bin/python3.X
    if python == _base_python():
        prefixes |= {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    for prefix in sorted(p for p in prefixes if p != "/usr" and not p.startswith("/usr/")):
        args += ["--ro-bind", prefix, prefix]
    return args


def probe() -> BwrapLauncher | str:
    """The launcher that works here, or why none does (one line). Cached per bwrap path, interpreter and uid."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bwrap (bubblewrap) is not found on PATH"
    return _probe(bwrap, _base_python(), os.geteuid())


def _base_python() -> str:
    """The running interpreter's real executable (outside any virtual environment)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.cache
def _probe(bwrap: str, python: str, euid: int) -> BwrapLauncher | str:
    try:
        help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{bwrap} does not run: {exc}"
    known = frozenset(f for f in ("--size", "--disable-userns") if f in help_text)
    reason = ""
    for as_nobody in [True, False] if euid == 0 else [False]:
        launcher = BwrapLauncher(bwrap=bwrap, python=python, run_as_nobody=as_nobody, known_flags=known)
        ok, reason = _try(launcher)
        if ok:
            return launcher
    return f"{bwrap} cannot start a sandbox here ({reason})"


def _try(launcher: BwrapLauncher) -> tuple[bool, str]:
    """Run ``print('ok')`` through ``launcher``; (worked, the last line bwrap or python wrote)."""
    workdir = tempfile.mkdtemp(prefix="slime-sandbox-probe-")
    try:
        main_py = os.path.join(workdir, "main.py")
        with open(main_py, "w") as f:
            f.write("print('ok')\n")
        os.chmod(workdir, 0o755)
        os.chmod(main_py, 0o644)
        proc = subprocess.run(
            launcher.argv(main_py, ["-I", "-S", "main.py"], tmpfs_bytes=1 << 20),
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            **launcher.spawn_kwargs(),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if proc.returncode == 0 and proc.stdout == "ok\n":
        return True, ""
    lines = proc.stderr.strip().splitlines()
    return False, lines[-1] if lines else f"exit status {proc.returncode}"
