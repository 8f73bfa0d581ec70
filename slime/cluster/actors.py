"""``ProcessActor``: one of our processes (an engine server, a trainer rank, the router) on a Ray node.

The actor is a small Python process that Ray schedules on a bundle of the run's placement group (or, for
the router, on a node); it reports where it is (node id, IP, its pid), finds free ports on its node, and
runs one command line with an environment as its child. The child runs under
``slime.engines.fleet.lifeline``: it gets SIGKILL when the actor dies, ``kill -9`` included, so a dead
actor never leaves an engine holding GPUs. The child's stdout and stderr are the actor's, which Ray
streams to the driver (``(ProcessActor pid=...)`` lines). Its exit status is read with ``poll``.

Example::

    actor = ProcessActorRemote.options(scheduling_strategy=...).remote("engine-0")
    port = ray.get(actor.free_ports.remote(1))[0]
    ray.get(actor.start.remote(["python", "-m", "http.server", str(port)], {"CUDA_VISIBLE_DEVICES": "0,1"}))
    ray.get(actor.poll.remote())  # None while it runs, then its exit status (-9: SIGKILL)
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping, Sequence

import ray

from slime.engines.fleet.lifeline import with_lifeline

__all__ = ["Where", "ProcessActor", "ProcessActorRemote", "ACTOR_OPTIONS", "TAIL_LINES", "PORT_BASE"]

PORT_BASE = 15000
"""First port an actor offers (THUDM/slime's and our ``--base-port`` default)."""
PORT_SPAN = 2000
"""How far above ``PORT_BASE`` an actor looks for free ports."""
TAIL_LINES = 40
"""Output lines of its child an actor keeps (``ProcessActor.tail``): the driver prints a trainer's last lines."""


@dataclasses.dataclass(frozen=True)
class Where:
    """Where an actor runs: Ray's node id (hex), the node's IP, the actor's own pid."""

    node_id: str
    ip: str
    pid: int


class ProcessActor:
    """Runs one command as its child (module docstring); one command per actor, started once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._proc: subprocess.Popen[bytes] | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)

    def where(self) -> Where:
        return Where(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid())

    def free_ports(self, count: int, base: int = PORT_BASE) -> list[int]:
        """``count`` distinct ports free on this node now, the first ones from ``base`` up (bound and released:
        another process may take one before our child binds it; the child then fails to start and is restarted
        like any dead engine). From a fixed base below the kernel's ephemeral range (32768-60999 on Linux), as
        slime's ``--base-port``: a port the kernel hands out for a connection or an NCCL socket (port 0)
        never collides with one held for a server that binds it only after loading its model.

        Raises ``RuntimeError`` when fewer than ``count`` are free in ``base .. base + PORT_SPAN``.
        """
        found: list[int] = []
        for port in range(base, base + PORT_SPAN):
            if len(found) == count:
                break
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("", port))
                except OSError:
                    continue
            found.append(port)
        if len(found) < count:
            raise RuntimeError(f"{self.name}: only {len(found)} of {count} ports free in {base}-{base + PORT_SPAN}")
        return found

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None) -> int:
        """Start ``argv`` with the actor's environment updated by ``env``, in ``cwd`` (default: the actor's);
        returns the child's pid. Its output lines go to the actor's stdout and the last ``TAIL_LINES`` are
        kept (``tail``).

        The child is forked by a thread that lives as long as it does: the parent-death signal follows the
        forking thread, not the process (``slime.engines.fleet.lifeline``). Raises ``RuntimeError`` when a
        command already runs here, ``OSError`` when it cannot start.
        """
        if self._proc is not None:
            raise RuntimeError(f"{self.name}: a command already runs in this actor")
        thread = threading.Thread(
            target=self._keep, args=(list(argv), {**os.environ, **env}, cwd), name=f"{self.name}-child", daemon=True
        )
        thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error
        assert self._proc is not None  # set by _keep before _started
        return self._proc.pid

    def _keep(self, argv: list[str], env: dict[str, str], cwd: str | None) -> None:
        try:
            # a session of its own: stop() signals the child's whole group, never the actor's
            self._proc = subprocess.Popen(
                with_lifeline(argv),
                env={**env, "PYTHONUNBUFFERED": "1"},
                cwd=cwd,
                start_new_session=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        except BaseException as e:
            self._error = e
            self._started.set()
            return
        self._started.set()
        self._copy_output(self._proc)
        self._proc.wait()

    def _copy_output(self, proc: subprocess.Popen[bytes]) -> None:
        """Each line of the child to the actor's stdout (Ray streams it to the driver) and to the tail."""
        assert proc.stdout is not None  # stdout=PIPE
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self._tail.append(line)
            print(line, file=sys.stdout, flush=True)

    def tail(self) -> list[str]:
        """The child's last output lines (at most ``TAIL_LINES``), oldest first."""
        return list(self._tail)

    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def poll(self) -> int | None:
        """The child's exit status (negative: the signal that ended it), or None while it runs or before ``start``."""
        return None if self._proc is None else self._proc.poll()

    def stop(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM to the child's process group, SIGKILL after ``grace_s`` seconds; returns its exit status."""
        p = self._proc
        if p is None or p.poll() is not None:
            return None if p is None else p.returncode
        _signal_group(p.pid, signal.SIGTERM)
        try:
            return p.wait(grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(p.pid, signal.SIGKILL)
            return p.wait()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:  # gone between the poll and the signal
        pass


ProcessActorRemote = ray.remote(ProcessActor)
"""``ProcessActor`` as a Ray actor class; create it with ``.options(**ACTOR_OPTIONS, ...)``."""
ACTOR_OPTIONS = {"max_restarts": 0, "max_concurrency": 4}
"""Ray never restarts the actor (``ClusterRun`` does, on the same bundle); four calls at once, so ``poll``
answers while ``stop`` waits."""
