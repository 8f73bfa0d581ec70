"""``slime train --ray``: one run placed on a Ray cluster, supervised, and released (issue 28; docs/ray.md).

::

    connect(--ray-address) -> launch plan + RunShape (slime.cluster.commands) -> reserve (one placement group)
      -> weight-sync checks on the placed table (tensor: one node; disk: every node sees the weights dir)
      -> ClusterRun: engines, router, trainer ranks (rank 0 drives the run over HTTP to the engines)
      -> every POLL_S: trainer ranks done? dead engine restarted on its bundle; dead trainer rank: one line
      -> exit: every actor stopped, the group removed (also on SIGTERM / Ctrl-C)

The driver carries no tokens: the run's data plane is trainer rank 0's asyncio loop, which calls the placed
engines over HTTP and syncs weights to them itself (``--weight-sync``). What it returns: the exit status
(0 when every trainer rank finished with 0), after printing rank 0's last line (its ``done:`` line).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from slime.cluster.commands import RunCommands, launch_plan_for_ray, run_shape
from slime.cluster.connect import connect, disconnect
from slime.cluster.placement import Reservation, reserve
from slime.cluster.plan import ClusterShape, PlacementTable, Process, plan_placement
from slime.cluster.supervise import ClusterRun, ProcessDied, Rendezvous, rendezvous_of
from slime.config import Config, SyncConfig
from slime.engines.fleet.plan_specs import LaunchPlan
from slime.errors import ConfigError

__all__ = ["run_on_ray", "dry_run_on_ray", "check_tensor_sync", "check_weights_dir_shared", "POLL_S"]

log = logging.getLogger(__name__)

ProbeFn = Callable[[Reservation, Process, Path, "str | None"], bool]
"""``(reservation, process, path, token)``: write ``token`` at ``path`` on the process's node, or (None) read it."""

POLL_S = 2.0
"""Seconds between two looks at every process (a dead engine is restarted within about this)."""


def run_on_ray(config: Config, argv: list[str], *, address: str, prog: str = "slime train --ray") -> int:
    """Run ``config`` (the user's ``argv``) on the Ray cluster at ``address`` (module docstring).

    Raises:
        ConfigError: a run that cannot be placed (shape, sync method, a weights dir not shared).
        RunError: no cluster at ``address``, bundles not placed in time.
        ProcessDied: a trainer rank or the router died, or an engine ran out of restarts (one line).
    """
    plan = _plan(config)
    shape = run_shape(config.train, plan, colocate=config.sync.colocate)
    connection = connect(address)
    try:
        reservation = reserve(shape)
        try:
            check_tensor_sync(config.sync, reservation.table)
            check_weights_dir_shared(config.sync, config.run_dir, reservation)
        except BaseException:
            reservation.release()
            raise
        with ClusterRun(reservation, RunCommands(tuple(argv), plan), cwd=os.getcwd()) as run:
            _write_placement(config.run_dir, run)
            return _drive(run, config.run_dir, prog)
    finally:
        disconnect(connection)


def _plan(config: Config) -> LaunchPlan:
    return launch_plan_for_ray(
        config.engine, seed=config.seed, colocate=config.sync.colocate, in_place_updates=config.updates_in_place()
    )


def _drive(run: ClusterRun, run_dir: str, prog: str) -> int:
    """Watch the run until its trainer ranks finish; 0 and rank 0's last line when they all exit 0."""
    while True:
        statuses = run.exit_statuses("trainer")
        if statuses and all(s == 0 for s in statuses.values()):
            _print_last_line(run)
            return 0
        try:
            for name in run.check():
                log.warning("%s restarted on its bundle; the run's pool resumes its requests elsewhere meanwhile", name)
        except ProcessDied as died:
            raise ProcessDied(f"{died}{_last_words(run)}; {_resume_hint(run_dir, prog)}") from None
        time.sleep(POLL_S)


def _last_words(run: ClusterRun) -> str:
    """The last output line of the first trainer rank that failed (its error), as ``; it said: ...``."""
    for name, status in run.exit_statuses("trainer").items():
        if status is not None and status > 0:  # it exited on its own (an error it printed); < 0: a signal
            said = [line for line in run.tail(name) if line.strip()]
            return f"; it said: {said[-1].strip()}" if said else ""
    return ""


def _print_last_line(run: ClusterRun) -> None:
    """Rank 0's ``done:`` line (its output also streams to this driver, prefixed by Ray)."""
    done = [line for line in run.tail("trainer-0") if line.startswith("done:")]
    if done:
        print(done[-1], flush=True)


def _resume_hint(run_dir: str, prog: str) -> str:
    """Where the run stopped: its last checkpoint and the ``--load`` that resumes it, or that it has none."""
    from slime.loop.resume import latest_checkpoint

    ckpt = latest_checkpoint(Path(run_dir) / "checkpoints") if run_dir else None
    if ckpt is None:
        return f"no checkpoint in {run_dir} (--save-interval N writes them)"
    return f"last checkpoint {ckpt}: resume with `{prog} --load {run_dir} ...`"


def check_tensor_sync(sync: SyncConfig, table: PlacementTable) -> None:
    """``--weight-sync tensor`` hands tensors over on one machine: refused when an engine runs on another
    node than trainer rank 0 (``ConfigError`` naming both and the methods that work across nodes)."""
    if sync.method != "tensor":
        return
    trainer = next((p for p in table.processes if p.role == "trainer" and p.rank == 0), None)
    far = [p for p in table.processes if p.role == "engine" and trainer is not None and p.node != trainer.node]
    if trainer is not None and far:
        raise ConfigError(
            f"--weight-sync tensor passes the weights by handle within one machine, but {far[0].name} runs on node "
            f"{far[0].node} ({table.node_ip(far[0].node)}) and trainer rank 0 on node {trainer.node} "
            f"({table.node_ip(trainer.node)}): use --weight-sync distributed (NCCL from the trainer to the engines) "
            "or disk on storage every node mounts"
        )


def _weights_dir(sync: SyncConfig, run_dir: str) -> Path:
    """The directory a disk sync writes (``--weights-dir``, else ``RUN_DIR/weights``), absolute."""
    return Path(sync.weights_dir or Path(run_dir) / "weights").absolute()


def _existing_ancestor(path: Path) -> Path:
    """``path`` or its nearest parent that exists here (the probe must not create the run directory)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


@ray.remote(num_cpus=0)
def _probe(path: str, token: str | None) -> bool:
    """Write ``token`` to ``path`` (``token`` given) or say whether ``path`` holds it (``token`` None)."""
    p = Path(path)
    if token is not None:
        p.write_text(p.name)
        return True
    return p.is_file() and p.read_text() == p.name


def check_weights_dir_shared(
    sync: SyncConfig, run_dir: str, reservation: Reservation, probe: ProbeFn | None = None
) -> None:
    """``--weight-sync disk``: a file written beside the weights dir on trainer rank 0's node must be seen
    on every engine's node (``ConfigError`` naming the first that does not). ``probe``: how a file is
    written or read on a process's node (default: a Ray task on its bundle)."""
    probe = probe or _run_probe
    table = reservation.table
    trainer = next((p for p in table.processes if p.role == "trainer" and p.rank == 0), None)
    if sync.method != "disk" or trainer is None:
        return
    path = _existing_ancestor(_weights_dir(sync, run_dir)) / f".slime-ray-probe-{uuid.uuid4().hex}"
    try:
        probe(reservation, trainer, path, "w")
        for engine in (p for p in table.processes if p.role == "engine" and p.node != trainer.node):
            if not probe(reservation, engine, path, None):
                raise ConfigError(
                    f"--weight-sync disk: trainer rank 0 (node {trainer.node}) writes the weights under "
                    f"{_weights_dir(sync, run_dir)}, which {engine.name} on node {engine.node} "
                    f"({table.node_ip(engine.node)}) does not see: put --save (or --weights-dir) on storage every "
                    "node mounts, or use --weight-sync distributed"
                )
    finally:
        path.unlink(missing_ok=True)


def _run_probe(reservation: Reservation, p: Process, path: Path, token: str | None) -> bool:
    """``_probe`` on ``p``'s first bundle (its node)."""
    bundle = reservation.table.slots[p.slots[0]].bundle
    strategy = PlacementGroupSchedulingStrategy(reservation.group, bundle)
    return bool(ray.get(_probe.options(scheduling_strategy=strategy).remote(str(path), token)))


def _write_placement(run_dir: str, run: ClusterRun) -> None:
    """The placement (planned table) and every process as it runs (node id, IP, pid, port), logged and kept
    beside the run as ``RUN_DIR.placement.json`` (the trainer owns the run directory, which it creates)."""
    text = run.table.format()
    log.info("placement:\n%s", text)
    if run_dir:
        record = {"table": text.splitlines(), "processes": run.records()}
        Path(f"{Path(run_dir).absolute()}.placement.json").write_text(json.dumps(record, indent=1) + "\n")


def dry_run_on_ray(config: Config, argv: list[str], cluster: ClusterShape) -> str:
    """``slime train --ray --dry-run``: the placement of the run on ``cluster`` and every process's command,
    with planned addresses (``node-<k>``) and ports; no Ray, no cluster, no model files needed.

    Raises ``ConfigError`` when the run does not fit ``cluster`` or cannot be placed (``check_tensor_sync``).
    """
    plan = _plan(config)
    table = plan_placement(run_shape(config.train, plan, colocate=config.sync.colocate), cluster)
    check_tensor_sync(config.sync, table)
    commands = RunCommands(tuple(argv), plan)
    lines = [table.format(), "# commands (addresses and ports as planned; a real run asks each node for free ports)"]
    ranks = len(table.of_role("trainer"))
    for p in table.processes:
        if p.role == "trainer" and p.rank > 0:
            continue  # every rank runs rank 0's command; only RANK and its GPU differ
        cmd = commands(p, _planned_rendezvous(table, p))
        env = " ".join(f"{k}={v}" for k, v in cmd.env.items())
        name = (
            f"trainer-0 (and ranks 1-{ranks - 1}: the same, their RANK and GPU)"
            if p.name == "trainer-0" and ranks > 1
            else p.name
        )
        lines.append(f"{name}: {env + ' ' if env else ''}{' '.join(cmd.argv)}")
    return "\n".join(lines)


def _planned_rendezvous(table: PlacementTable, p: Process) -> Rendezvous:
    """``p``'s view of the run as planned: ``node-<k>`` addresses, the table's planned ports."""
    return rendezvous_of(table, p, lambda q, which: (table.node_ip(q.node), q.port if which == 0 else q.dist_port))
