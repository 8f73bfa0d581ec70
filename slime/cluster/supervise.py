"""``ClusterRun``: every process of a placement table started on its bundle, watched, and released.

- start: one ``ProcessActor`` per process, on its first slot's bundle (a small GPU share, so colocated
  trainer ranks and engines share a bundle; the router on its node, no GPU); ports asked of the actors
  (trainer rank 0's rendezvous, each engine's HTTP and ``--dist-init-addr`` ports, the router's); then each
  command from ``command(process, rendezvous)``, with ``CUDA_VISIBLE_DEVICES`` set to its GPUs and, for a
  trainer rank, torchrun's ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
- ``check()``: a dead engine (its process exited, or its actor died) is started again on the same bundle,
  every process of a wide engine together, at most ``max_restarts`` times per engine; a dead trainer rank
  or router raises ``ProcessDied`` with one line naming the process, its node and the exit status;
- release (``__exit__``, also on ``Stopped``/``KeyboardInterrupt``): every child stopped (SIGTERM, then
  SIGKILL), every actor killed, the placement group removed. SIGTERM is ``slime.stop``'s: unless its
  handler is installed already (``slime train``), ``__enter__`` installs ``sigterm_raises`` for the run's
  life (in place of SIG_DFL, or of the ``sys.exit`` that ``ray.init`` installs), restored at exit.
  A driver killed with SIGKILL leaves nothing either: Ray ends a dead driver's actors and groups, and the
  actors' children die with them (``slime.engines.fleet.lifeline``).

Example::

    with ClusterRun(reserve(shape), lambda p, r: Command(("python", "-m", "http.server", str(r.port)))) as run:
        while training:
            run.check()  # restarts dead engines; raises ProcessDied for a dead trainer rank
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import cast

import ray
from ray import ObjectRef
from ray.actor import ActorHandle
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from slime.cluster.actors import ACTOR_OPTIONS, ProcessActor, ProcessActorRemote, Where
from slime.cluster.placement import Reservation
from slime.cluster.plan import PlacementTable, Process
from slime.errors import RunError
from slime.stop import sigterm_raises

__all__ = ["Command", "Rendezvous", "rendezvous_of", "ProcessDied", "ClusterRun", "RETRYABLE_ROLES"]

log = logging.getLogger(__name__)

RETRYABLE_ROLES = frozenset({"engine"})
"""Roles restarted on their bundle when they die; any other death ends the run."""


@dataclasses.dataclass(frozen=True)
class Command:
    """A command line and the variables added to the actor's environment for it."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Rendezvous:
    """What a process's command needs to know of the run, from the actors (real ports, real IPs)."""

    ip: str
    """The IP of the node the process runs on (its ``--host``)."""
    port: int | None
    """Its own port: HTTP for an engine head and the router, the rendezvous for trainer rank 0."""
    master: tuple[str, int] | None
    """Trainer rank 0's (IP, port), for every trainer rank."""
    dist_init: tuple[str, int] | None
    """A wide engine's node rank 0 (IP, port): SGLang's ``--dist-init-addr``."""
    engines: tuple[str, ...] = ()
    """Every engine's ``http://ip:port`` (the router's workers)."""
    router: tuple[str, int] | None = None
    """The router's (IP, port), when the run has one (what the trainer's pool calls)."""


class ProcessDied(RunError):
    """A process that cannot be restarted died (a trainer rank, the router, an engine out of restarts)."""


@dataclasses.dataclass
class _Live:
    process: Process
    actor: ActorHandle[ProcessActor]
    where: Where
    pid: int | None = None


CommandFn = Callable[[Process, Rendezvous], Command]
AddressFn = Callable[[Process, int], tuple[str, "int | None"]]
"""``(process, which)`` -> its node's IP and its own port (``which`` 0) or dist-init port (1), None if it has none."""


def rendezvous_of(table: PlacementTable, p: Process, address: AddressFn) -> Rendezvous:
    """``p``'s view of the run from ``address``: ``ClusterRun``'s real addresses, or a dry run's planned ones."""

    def known(q: Process | None, which: int) -> tuple[str, int] | None:
        if q is None:
            return None
        ip, port = address(q, which)
        return None if port is None else (ip, port)

    trainer0 = next((q for q in table.processes if q.role == "trainer" and q.rank == 0), None)
    heads = [q for q in table.processes if q.role == "engine" and q.node_rank == 0]
    head = next((q for q in heads if q.rank == p.rank), None)
    router = next((q for q in table.processes if q.role == "router"), None)
    own_ip, own_port = address(p, 0)
    return Rendezvous(
        own_ip,
        own_port,
        known(trainer0, 0) if p.role == "trainer" else None,
        known(head, 1) if p.role == "engine" and p.nnodes > 1 else None,
        tuple(f"http://{ip}:{port}" for ip, port in (address(q, 0) for q in heads)),
        known(router, 0),
    )


def _ports_of(p: Process, free: list[int]) -> tuple[int | None, int | None]:
    """(own port, dist-init port) of ``p`` from the free ports its node gave, in that order."""
    got = iter(free)
    return (next(got) if p.port is not None else None, next(got) if p.dist_port is not None else None)


class ClusterRun:
    """A placement table's processes on Ray, from start to release (module docstring)."""

    def __init__(
        self,
        reservation: Reservation,
        command: CommandFn,
        *,
        max_restarts: int = 3,
        gpu_share: float = 0.01,
        stop_grace_s: float = 5.0,
        cwd: str | None = None,
    ) -> None:
        self.reservation, self.table, self._command = reservation, reservation.table, command
        self._cwd = cwd
        """Every child's working directory (the driver's, on storage every node mounts); None: the actor's."""
        self.max_restarts, self._gpu_share, self._grace = max_restarts, gpu_share, stop_grace_s
        self.restarts: dict[int, int] = {}
        """Engine index -> restarts so far."""
        self._live: dict[str, _Live] = {}
        self._ports: dict[str, tuple[int | None, int | None]] = {}
        self._signals = contextlib.ExitStack()

    def __enter__(self) -> ClusterRun:
        handler = signal.getsignal(signal.SIGTERM)
        # slime's own handler (slime train) already unwinds the run; any other (SIG_DFL, ray.init's
        # sys.exit) is replaced for the run's life, so SIGTERM raises Stopped here as everywhere in slime
        if (
            threading.current_thread() is threading.main_thread()
            and getattr(handler, "__module__", None) != "slime.stop"
        ):
            self._signals.enter_context(sigterm_raises())
        try:
            self.start()
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def start(self) -> None:
        """Actors for every process, their ports, then every command (module docstring); each step asked of
        every actor at once, so a run of many processes starts in the time of its slowest actor."""
        self._spawn(list(self.table.processes))
        self._ports = self._ask_ports(list(self.table.processes))
        self._run(list(self.table.processes))

    def _spawn(self, processes: list[Process]) -> None:
        """An actor for each of ``processes`` on its bundle (the router: on its node), and where each runs."""
        actors = [self._create(p) for p in processes]
        refs: list[ObjectRef[Where]] = [a.where.remote() for a in actors]
        for p, actor, where in zip(processes, actors, ray.get(refs)):
            self._live[p.name] = _Live(p, actor, where)
            self._check_node(p, where)

    def _check_node(self, p: Process, where: Where) -> None:
        """``p``'s actor must run on the node its table row names (a bundle Ray moved, or a wrong bundle
        index, would put a trainer rank beside the wrong GPUs): ``RunError`` naming both nodes."""
        want = next(s.node_id for s in self.table.slots if s.node == p.node)
        if where.node_id != want:
            raise RunError(
                f"{p.name} was placed on node id {where.node_id[:12]} ({where.ip}), the placement table puts it "
                f"on node {p.node} (node id {want[:12]})"
            )

    def records(self) -> list[dict[str, object]]:
        """One row per process as it runs: name, role, node rank, Ray node id, IP, pid, own port."""
        return [
            {
                "name": name,
                "role": live.process.role,
                "node": live.process.node,
                "node_id": live.where.node_id,
                "ip": live.where.ip,
                "pid": live.pid,
                "port": self._ports.get(name, (None, None))[0],
            }
            for name, live in self._live.items()
        ]

    def _create(self, p: Process) -> ActorHandle[ProcessActor]:
        if p.slots:
            bundle = self.table.slots[p.slots[0]].bundle
            strategy: object = PlacementGroupSchedulingStrategy(self.reservation.group, bundle)
            options = {"num_gpus": self._gpu_share, "num_cpus": 0}
        else:  # the router: CPU only, on the node the table names
            node_id = next(s.node_id for s in self.table.slots if s.node == p.node)
            strategy, options = NodeAffinitySchedulingStrategy(node_id, soft=False), {"num_cpus": 0}
        created = ProcessActorRemote.options(scheduling_strategy=strategy, **ACTOR_OPTIONS, **options).remote(p.name)
        return cast("ActorHandle[ProcessActor]", created)  # ray types .options(...).remote() as handle | class

    def _ask_ports(self, processes: list[Process]) -> dict[str, tuple[int | None, int | None]]:
        """Each process's free ports on its node (the planned ones say how many): ONE request per node, to one
        of its actors, so two processes of a node never get the same port; all nodes asked at once."""
        wanted = {p.name: sum(x is not None for x in (p.port, p.dist_port)) for p in processes}
        on_node: dict[int, list[Process]] = {}
        for p in processes:
            on_node.setdefault(p.node, []).append(p)
        refs: dict[int, ObjectRef[list[int]]] = {
            node: self._live[ps[0].name].actor.free_ports.remote(sum(wanted[p.name] for p in ps))
            for node, ps in on_node.items()
        }
        ports: dict[str, tuple[int | None, int | None]] = {}
        for node, ps in on_node.items():
            given: list[int] = ray.get(refs[node])
            free = iter(given)
            for p in ps:
                ports[p.name] = _ports_of(p, [next(free) for _ in range(wanted[p.name])])
        return ports

    def rendezvous(self, p: Process) -> Rendezvous:
        """``p``'s view of the run from the actors: real IPs and the ports each node gave."""
        return rendezvous_of(self.table, p, self._real_address)

    def _real_address(self, q: Process, which: int) -> tuple[str, int | None]:
        return self._live[q.name].where.ip, self._ports[q.name][which]

    def engine_urls(self) -> list[str]:
        """``http://ip:port`` of every engine (its node rank 0), in engine order."""
        heads = (q for q in self.table.processes if q.role == "engine" and q.node_rank == 0)
        return [f"http://{ip}:{port}" for ip, port in (self._real_address(q, 0) for q in heads)]

    def _env(self, p: Process, r: Rendezvous) -> dict[str, str]:
        env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, self.table.gpus(p)))} if p.slots else {}
        if p.role == "trainer" and r.master is not None:
            world = str(self.table.shape.trainer_ranks)
            env |= {
                "MASTER_ADDR": r.master[0],
                "MASTER_PORT": str(r.master[1]),
                "RANK": str(p.rank),
                "WORLD_SIZE": world,
            }
            env["LOCAL_RANK"] = "0"  # one GPU visible per rank: its own, as device 0
        return env

    def _run(self, processes: list[Process]) -> None:
        """Every command of ``processes`` started in its actor (the rendezvous known: ports are asked first)."""
        refs: list[ObjectRef[int]] = []
        for p in processes:
            r = self.rendezvous(p)
            cmd = self._command(p, r)
            refs.append(
                self._live[p.name].actor.start.remote(list(cmd.argv), {**self._env(p, r), **cmd.env}, self._cwd)
            )
        for p, pid in zip(processes, ray.get(refs)):
            live = self._live[p.name]
            live.pid = pid
            log.info("%s: pid %s on node %d (%s)", p.name, pid, p.node, live.where.ip)

    def pids(self) -> dict[str, int | None]:
        """Process name -> its child's pid (None before it started)."""
        return {name: live.pid for name, live in self._live.items()}

    def actor(self, name: str) -> ActorHandle[ProcessActor]:
        return self._live[name].actor

    def where(self, name: str) -> Where:
        return self._live[name].where

    def check(self) -> list[str]:
        """One look at every process: dead engines restarted (their names returned); raises ``ProcessDied``
        for any other death, or an engine past ``max_restarts``."""
        dead = {name: why for name, live in self._live.items() if (why := self._death(live)) is not None}
        restarted: list[str] = []
        for name, why in dead.items():
            p = self._live[name].process
            if p.role not in RETRYABLE_ROLES:
                raise ProcessDied(self._obituary(p, why))
            if name not in restarted:
                restarted += self._restart_engine(p, why)
        return restarted

    def _death(self, live: _Live) -> str | None:
        """Why ``live`` is dead ("exit status -9", "its actor died"), or None while it runs (or, for a
        trainer rank, after it finished with exit status 0: the run ends when its ranks do)."""
        try:
            polled: ObjectRef[int | None] = live.actor.poll.remote()
            status = ray.get(polled, timeout=30)
        except RayActorError as e:
            return f"its actor died ({type(e).__name__})"
        if status is None or (status == 0 and live.process.role == "trainer"):
            return None
        return f"exit status {status}"

    def exit_statuses(self, role: str) -> dict[str, int | None]:
        """Process name -> exit status (None while it runs) of every process of ``role``."""
        refs: dict[str, ObjectRef[int | None]] = {
            name: live.actor.poll.remote() for name, live in self._live.items() if live.process.role == role
        }
        return {name: ray.get(ref, timeout=30) for name, ref in refs.items()}

    def tail(self, name: str) -> list[str]:
        """The last output lines of ``name``'s child (``ProcessActor.tail``); [] when its actor is gone."""
        try:
            lines: ObjectRef[list[str]] = self._live[name].actor.tail.remote()
            return ray.get(lines, timeout=30)
        except RayActorError:
            return []

    def obituary(self, name: str, why: str) -> str:
        """One line naming process ``name``, its actor, pid, node and ``why`` it ended."""
        return self._obituary(self._live[name].process, why)

    def _obituary(self, p: Process, why: str) -> str:
        w = self._live[p.name].where
        what = f"trainer rank {p.rank}" if p.role == "trainer" else p.role if p.role == "router" else f"engine {p.rank}"
        return f"{what} (actor {p.name}, pid {self._live[p.name].pid}) on node {p.node} ({w.ip}, node id {w.node_id[:12]}) died: {why}"

    def _restart_engine(self, p: Process, why: str) -> list[str]:
        """Every process of engine ``p.rank`` killed and started again on the same bundles, same ports."""
        n = self.restarts.get(p.rank, 0) + 1
        if n > self.max_restarts:
            raise ProcessDied(f"{self._obituary(p, why)}; restarted {self.max_restarts} time(s) already, giving up")
        self.restarts[p.rank] = n
        group = [q for q in self.table.processes if q.role == "engine" and q.rank == p.rank]
        log.warning("%s; restart %d of %d on the same bundle(s)", self._obituary(p, why), n, self.max_restarts)
        self._kill([self._live[q.name] for q in group])
        self._spawn(group)
        self._run(group)
        return [q.name for q in group]

    def _kill(self, lives: list[_Live]) -> None:
        """Stop the children of ``lives`` at once (SIGTERM, SIGKILL after the grace), then kill their actors."""
        stops: list[ObjectRef[int | None]] = [live.actor.stop.remote(self._grace) for live in lives]
        for live, stop in zip(lives, stops):
            try:
                ray.get(stop, timeout=self._grace + 30)
            except RayActorError:  # already dead: its child died with it
                pass
            except Exception as e:  # one stuck actor must not keep the others or the group reserved
                log.warning("%s: could not stop it cleanly (%s); killing its actor", live.process.name, e)
        for live in lives:
            ray.kill(live.actor, no_restart=True)

    def release(self) -> None:
        """Stop every child, kill every actor, remove the placement group; idempotent, never raises for a
        process that is already gone."""
        try:
            self._kill(list(self._live.values()))
            self._live.clear()
        finally:
            self.reservation.release()
            self._signals.close()
