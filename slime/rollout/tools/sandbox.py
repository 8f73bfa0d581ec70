"""Run untrusted Python (model-written code) in an OS-level sandbox, with limits for the whole sandbox.

What a run does (``Sandbox.run(code, stdin=...)``):

1. The code is written to ``main.py`` in a fresh host temporary directory (deleted afterwards), and a
   fresh cgroup is made for the run (``cgroup.py``): ``pids.max`` (``max_processes`` tasks, threads
   included, for all its processes together) and a memory limit (``memory_bytes`` for all of them).
2. bubblewrap (``bwrap.py``) starts ``python -I -S`` (isolated mode, no ``site``: the standard library
   only) inside that cgroup, as an unprivileged host user (when we are root a uid of the run's own,
   ``run_uid.py``, so concurrent sandboxes share nothing the kernel keeps per user; else ourselves, in a user
   namespace of its own; never the host's root), in its own PID, mount, network, IPC, UTS and cgroup namespaces, with no
   capabilities, under a seccomp filter (``seccomp.py``: no ``ptrace``, keyrings, mounts, namespaces,
   modules, clock setting, ...), a cleared environment, a read-only view of only what the interpreter
   needs, a fresh ``/proc`` (no host process visible; ``/proc/sys`` read-only) and a size-bounded tmpfs
   ``/sandbox`` as its working directory and only writable place. ``main.py`` is bound read-only into it.
3. A bootstrap (``_LIMITS``) sets ``resource`` limits per process (soft = hard): CPU seconds, address
   space (so one hog gets ``MemoryError`` before the cgroup's OOM killer acts), file size, open files,
   core size 0, then runs the code as ``__main__``.
4. The parent keeps at most ``max_output_bytes`` of stdout and of stderr (the rest is drained and
   counted). When bwrap exits, or at the wall-clock limit (bwrap killed), every process left in the
   run's cgroup is killed and the cgroup removed before ``run`` returns: nothing outlives a run, and
   concurrent runs share no limit.

``isolation.probe()`` (cached parts) says what this machine gives; where any part is missing
(``sandbox_unavailable_reason()``, one line naming it and the fix), constructing a ``Sandbox`` raises
``SandboxUnavailable`` unless ``allow_unsafe=True`` (``--allow-unsafe-code-execution``). Then it uses
what there is: bwrap without the missing part (``RLIMIT_NPROC`` bounds processes when there is no cgroup,
per host user: per run as root, shared by concurrent runs otherwise), or with no bwrap a plain child process guarded only by an
in-process audit hook (``audit_hook.py``), which model-written code can get past.

What the sandbox does not do: CPU time is bounded per process (``RLIMIT_CPU``) and by the wall clock, not
per sandbox; the kernel's whole remaining syscall surface is reachable. Only the standard library is
importable (``-S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import sys
import tempfile
import time

from slime.errors import ConfigError
from slime.rollout.reward_clock import queued
from slime.rollout.tools import bwrap, isolation, run_uid, seccomp
from slime.rollout.tools.audit_hook import HOOK, NETWORK_MARK
from slime.rollout.tools.cgroup import RunCgroup
from slime.rollout.tools.pipes import CappedReader, OutputOverflow, feed, kill_group
from slime.rollout.tools.registry import Tool

__all__ = [
    "Sandbox",
    "SandboxResult",
    "SandboxUnavailable",
    "python_tool",
    "format_result",
    "sandbox_unavailable_reason",
    "process_limit_enforced",
]

logger = logging.getLogger(__name__)

BWRAP_TASKS = 2
"""Tasks of bwrap's own in a run's cgroup (bwrap and the sandbox's init), on top of ``max_processes``."""


class SandboxUnavailable(ConfigError):
    """No complete OS-level sandbox here and unsafe execution was not allowed; the message names the fix."""


def sandbox_unavailable_reason() -> str | None:
    """What the OS sandbox lacks on this machine (one line: the first missing part and its fix), or None."""
    missing = isolation.probe().missing
    return missing[0] if missing else None


def process_limit_enforced() -> bool:
    """Whether a process limit binds for a sandbox here: its cgroup's ``pids.max``, or else
    ``RLIMIT_NPROC`` (not for the host's root, which the kernel exempts)."""
    found = isolation.probe()
    if found.launcher is None:
        return False
    return found.cgroups is not None or found.launcher.host_uid != 0


_LIMITS = r"""
import os, resource, sys
cpu_s, as_bytes, fsize_bytes, nofile, nproc, netns = (int(x) for x in sys.argv[1:7])
work = os.path.realpath(os.getcwd())
for lim, val in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, as_bytes), (resource.RLIMIT_FSIZE, fsize_bytes),
                 (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(lim, (val, val))
"""
# nproc 0: the run's cgroup bounds processes (RLIMIT_NPROC would count every sandbox of the host user).
_RUN = r"""
if nproc:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
with open("main.py", "rb") as f:
    _src = f.read()
_g = {"__name__": "__main__", "__file__": os.path.join(work, "main.py"), "__builtins__": __builtins__}
exec(compile(_src, "main.py", "exec"), _g)
"""
_REAP_TIMEOUT_S = 2.0
"""After a kill, how long to wait for the pipes to close (something outside the group may hold them)."""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """The outcome of one run.

    Attributes:
        stdout / stderr: decoded (UTF-8, replacement), each at most ``max_output_bytes`` long.
        returncode: the child's exit status (negative: killed by that signal); None if never started.
        timed_out: the wall-clock limit killed it.
        elapsed_s: wall seconds from spawn to exit.
        truncated: some output was dropped past ``max_output_bytes``.
        network: ``"netns"`` (own network namespace: always with bwrap) or ``"audit-hook"`` (unsafe mode, hook only).
        oom_killed: the memory limit of the whole sandbox was reached and the kernel killed processes of it.
    """

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    elapsed_s: float
    truncated: bool = False
    network: str = "unknown"
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        """Exit status 0, within the time limit, nothing killed for memory."""
        return self.returncode == 0 and not self.timed_out and not self.oom_killed

    @property
    def memory_exceeded(self) -> bool:
        """A process hit its address-space limit (``MemoryError``) or the sandbox its memory limit."""
        return self.oom_killed or "MemoryError" in self.stderr


class Sandbox:
    """Runs code in bubblewrap with limits; concurrent runs are bounded by ``max_concurrency``.

    Args:
        timeout_s: wall-clock seconds per run; the whole sandbox is killed past it.
        cpu_time_s: ``RLIMIT_CPU`` seconds per process (default: ``ceil(timeout_s)``).
        memory_bytes: memory of the whole sandbox (its cgroup: resident memory, tmpfs files included)
            and ``RLIMIT_AS`` of each process (virtual memory), default 1 GiB.
        max_file_bytes: ``RLIMIT_FSIZE``, default 16 MiB.
        max_disk_bytes: size of the writable tmpfs ``/sandbox`` (all files together), default 64 MiB.
        max_open_files: ``RLIMIT_NOFILE``.
        max_processes: processes and threads the code may have at once, all together, itself included.
        max_output_bytes: kept per stream.
        max_concurrency: sandboxes at once (default: the CPU count).
        network_namespace: unsafe mode only: try ``unshare(CLONE_NEWNET)``; False leaves network
            denial to the audit hook.
        allow_unsafe: where the OS sandbox is incomplete (``sandbox_unavailable_reason()``), run the
            code with what there is (module docstring) instead of refusing (``--allow-unsafe-code-execution``).

    Attributes:
        isolation: ``"bwrap"`` (OS sandbox) or ``"unsafe"`` (audit hook only).
        missing: what this sandbox lacks (one line each; empty for a complete sandbox).

    Raises:
        SandboxUnavailable: the OS sandbox is incomplete here and ``allow_unsafe`` is False.
        ValueError: a non-positive limit.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        cpu_time_s: int | None = None,
        memory_bytes: int = 1 << 30,
        max_file_bytes: int = 16 << 20,
        max_disk_bytes: int = 64 << 20,
        max_open_files: int = 64,
        max_processes: int = 8,
        max_output_bytes: int = 64 << 10,
        max_concurrency: int | None = None,
        network_namespace: bool = True,
        allow_unsafe: bool = False,
    ):
        if min(timeout_s, memory_bytes, max_output_bytes, max_disk_bytes, max_processes) <= 0:
            raise ValueError(
                f"Sandbox: timeout_s={timeout_s}, memory_bytes={memory_bytes}, max_output_bytes={max_output_bytes}, "
                f"max_disk_bytes={max_disk_bytes}, max_processes={max_processes} must be > 0"
            )
        self.timeout_s = timeout_s
        self.cpu_time_s = cpu_time_s if cpu_time_s is not None else max(1, int(-(-timeout_s // 1)))
        self.memory_bytes, self.max_file_bytes, self.max_disk_bytes = memory_bytes, max_file_bytes, max_disk_bytes
        self.max_open_files, self.max_processes = max_open_files, max_processes
        self.max_output_bytes = max_output_bytes
        self.network_namespace = network_namespace
        self._iso = isolation.probe()
        self.missing = self._iso.missing
        if self.missing and not allow_unsafe:
            raise SandboxUnavailable(
                f"code execution refused: model-written code runs only in a complete OS sandbox and {self.missing[0]}; "
                "or pass --allow-unsafe-code-execution to run it with less isolation"
            )
        for what in self.missing:
            logger.warning("running model-written code with less isolation (--allow-unsafe-code-execution): %s", what)
        self._launcher = self._iso.launcher
        self.isolation = "bwrap" if self._launcher is not None else "unsafe"
        self._slots = asyncio.Semaphore(max_concurrency or os.cpu_count() or 1)

    async def run(self, code: str, *, stdin: str = "", timeout_s: float | None = None) -> SandboxResult:
        """Run ``code`` (Python source) with ``stdin``; never raises for what the code does.

        Raises:
            OSError: the run's cgroup or temporary directory could not be made (the host, not the code).
        """
        limit_s = timeout_s if timeout_s is not None else self.timeout_s
        own_uid = self._launcher is not None and self._launcher.sets_uid
        async with queued():  # the wait for a slot is other runs' time: the reward's deadline stands still
            await self._slots.acquire()
        try:
            return await self._run_in_slot(code, stdin, limit_s, own_uid)
        finally:
            self._slots.release()

    async def _run_in_slot(self, code: str, stdin: str, limit_s: float, own_uid: bool) -> SandboxResult:
        """``run``'s body once it holds a slot: a fresh uid and work directory for the code, removed after it."""
        async with contextlib.AsyncExitStack() as held:
            uid = held.enter_context(run_uid.held_uid()) if own_uid else bwrap.NOBODY  # one per run (run_uid.py)
            workdir = tempfile.mkdtemp(prefix="slime-sandbox-")
            try:
                main_py = os.path.join(workdir, "main.py")
                with open(main_py, "w", encoding="utf-8") as f:
                    f.write(code)
                os.chmod(workdir, 0o755)  # the sandbox runs unprivileged; the code never writes here
                os.chmod(main_py, 0o644)
                return await self._contained(workdir, stdin.encode("utf-8"), limit_s, uid)
            finally:
                await asyncio.to_thread(shutil.rmtree, workdir, True)

    async def _contained(self, workdir: str, stdin: bytes, limit_s: float, uid: int) -> SandboxResult:
        """One run (as host ``uid`` in ``"setpriv"`` mode) inside its own cgroup (where there are cgroups), which is
        emptied and removed after it."""
        cgroups = self._iso.cgroups if self._launcher is not None else None
        if cgroups is None:
            return await self._spawn(workdir, stdin, limit_s, None, uid)
        run_cgroup = cgroups.create(max_tasks=self.max_processes + BWRAP_TASKS, memory_bytes=self.memory_bytes)
        try:
            result = await self._spawn(workdir, stdin, limit_s, run_cgroup, uid)
            return dataclasses.replace(result, oom_killed=run_cgroup.oom_kills() > 0)
        finally:
            run_cgroup.kill()
            run_cgroup.remove()

    def _command(
        self, workdir: str, run_cgroup: RunCgroup | None, seccomp_fd: int | None, uid: int
    ) -> tuple[list[str], dict]:
        """argv and extra spawn arguments of one run."""
        limits = [str(self.cpu_time_s), str(self.memory_bytes), str(self.max_file_bytes), str(self.max_open_files)]
        if self._launcher is not None:
            # Without a cgroup, RLIMIT_NPROC (bwrap's init counts against it too) is the only process bound.
            nproc = 0 if run_cgroup is not None else self.max_processes + 1
            args = ["-I", "-S", "-c", _LIMITS + _RUN, *limits, str(nproc), "0"]
            argv = self._launcher.argv(
                os.path.join(workdir, "main.py"),
                args,
                tmpfs_bytes=self.max_disk_bytes,
                seccomp_fd=seccomp_fd,
                cgroup_procs=run_cgroup.procs_files if run_cgroup is not None else (),
                uid=uid,
            )
            return argv, {"cwd": "/", "pass_fds": () if seccomp_fd is None else (seccomp_fd,)}
        netns = str(int(self.network_namespace))
        argv = [sys.executable, "-I", "-S", "-c", _LIMITS + HOOK + _RUN, *limits, str(self.max_processes), netns]
        return argv, {"cwd": workdir}

    async def _spawn(
        self, workdir: str, stdin: bytes, limit_s: float, run_cgroup: RunCgroup | None, uid: int
    ) -> SandboxResult:
        bpf = self._iso.seccomp_bpf if self._launcher is not None else None
        seccomp_fd = seccomp.program_fd(bpf) if bpf is not None else None
        argv, kwargs = self._command(workdir, run_cgroup, seccomp_fd, uid)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        t0 = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                start_new_session=True,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                **kwargs,
            )
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)  # bwrap has its own copy
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None  # all three are PIPE
        out, err = CappedReader(self.max_output_bytes), CappedReader(self.max_output_bytes)
        timed_out = False
        try:
            # stdout past the cap ends the run: it is the answer (or the harness's channel), unusable once cut, and
            # reading a flood to the time limit cost this process 4 of 5 CPU seconds; stderr is evidence (the
            # assert harness sends the solution's prints there): past the cap it is discarded, the run goes on.
            # A task group, not gather: the overflow ends the other readers too (gather would leave them running)
            async with asyncio.timeout(limit_s), asyncio.TaskGroup() as tg:
                for step in (feed(proc.stdin, stdin), out.drain(proc.stdout, stop=True), err.drain(proc.stderr)):
                    tg.create_task(step)
                tg.create_task(proc.wait())
        except BaseException as exc:  # timeout, output past the cap, or our caller cancelled: never leave it running
            timed_out = isinstance(exc, TimeoutError)
            overflow = isinstance(exc, BaseExceptionGroup) and exc.subgroup(OutputOverflow) is not None
            kill_group(proc.pid)
            if run_cgroup is not None:
                run_cgroup.kill()
            # On 3.11 ``wait()`` also waits for the pipes to reach EOF, so drain them (discarding) first.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_REAP_TIMEOUT_S):
                    await asyncio.gather(out.drain(proc.stdout), err.drain(proc.stderr), proc.wait())
            if not (timed_out or overflow):
                raise
        stderr_bytes, network = _split_network_mark(bytes(err.data))
        return SandboxResult(
            stdout=bytes(out.data).decode("utf-8", "replace"),
            stderr=stderr_bytes.decode("utf-8", "replace"),
            returncode=proc.returncode,
            timed_out=timed_out,
            elapsed_s=time.monotonic() - t0,
            truncated=out.dropped > 0 or err.dropped > 0,
            network="netns" if self._launcher is not None else network,
        )


def _split_network_mark(stderr: bytes) -> tuple[bytes, str]:
    start = stderr.find(NETWORK_MARK)
    if start < 0:
        return stderr, "unknown"
    end = stderr.find(b"\n", start)
    end = len(stderr) if end < 0 else end
    network = stderr[start + len(NETWORK_MARK) : end].decode("ascii", "replace")
    return stderr[:start] + stderr[end + 1 :], network


def python_tool(sandbox: Sandbox) -> Tool:
    """The ``python`` tool: run the model's code in ``sandbox``; the model sees stdout (and errors)."""

    async def run_python(arguments: dict) -> str:
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ValueError("'code' must be a string of Python source")
        result = await sandbox.run(code)
        return format_result(result)

    return Tool(
        name="python",
        description="Run Python 3 code (standard library only, no network) and return what it prints.",
        parameters={
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source; print() the results"}},
            "required": ["code"],
        },
        fn=run_python,
    )


def format_result(result: SandboxResult) -> str:
    """What the model sees: stdout, then the last lines of stderr and why the run failed, if it did."""
    parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
    if result.timed_out:
        parts.append(f"[killed: wall-clock limit of {result.elapsed_s:.1f}s reached]")
    elif result.oom_killed:
        parts.append(f"[killed: the sandbox's memory limit was reached (exit status {result.returncode})]")
    elif result.returncode != 0:
        tail = "\n".join(result.stderr.rstrip().splitlines()[-8:])
        parts.append(f"[exit status {result.returncode}]" + (f"\n{tail}" if tail else ""))
    if result.truncated:
        parts.append("[output truncated]")
    return "\n".join(parts) if parts else "[no output]"
