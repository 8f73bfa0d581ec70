"""What a run starts on a cluster, laid onto GPU slots in THUDM/slime's order: the placement table.

THUDM/slime (``slime/ray/placement_group.py``) reserves ONE Ray placement group of ``{GPU: 1}`` bundles,
probes each bundle's node IP and GPU id, sorts them by node then GPU, and hands the sorted list out in
order: the trainer's ``--actor-num-nodes x --actor-num-gpus-per-node`` ranks first, then the rollout's
``--rollout-num-gpus`` (``--colocate``: the rollout starts again at slot 0, sharing the trainer's GPUs,
and the group has ``max(trainer, rollout)`` bundles instead of their sum). Engines take
``--rollout-num-gpus-per-engine`` consecutive slots; an engine wider than a node spans whole nodes, one
process per node (SGLang's ``--nnodes/--node-rank/--dist-init-addr``). The router is one CPU process.

This module is the pure part: ``RunShape`` (what to start), ``Slot`` (one GPU bundle, in sorted order),
``layout`` (the shape onto slots: every ``Process`` with its slots) and ``plan_placement`` (the table for
a cluster given as numbers, nodes x GPUs per node, for ``--dry-run``; ports are the planned ones).
``slime.cluster.placement`` builds the slots from a real placement group and calls the same ``layout``.

Example: ``plan_placement(RunShape(1, 8, None, 2, colocate=True), ClusterShape(1, 8))`` (THUDM/slime's
Qwen3-4B script) -> 8 bundles on node 0; trainer ranks 0-7 on GPUs 0-7; engines 0-3 on GPUs 0-1, 2-3,
4-5, 6-7 (ports 15000-15003); the router on node 0 (port 15004).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
from collections.abc import Sequence
from typing import Literal

from slime.errors import ConfigError

__all__ = [
    "RunShape",
    "ClusterShape",
    "Slot",
    "Process",
    "PlacementTable",
    "layout",
    "plan_placement",
    "BASE_PORT",
    "RENDEZVOUS_PORT",
]

BASE_PORT = 15000
"""First planned port of a node's engines and router (slime's ``--base-port`` default)."""
RENDEZVOUS_PORT = 29500
"""Planned port of trainer rank 0's rendezvous (torchrun's ``MASTER_PORT`` default)."""

Role = Literal["trainer", "engine", "router"]


@dataclasses.dataclass(frozen=True)
class RunShape:
    """What to start: THUDM/slime's placement flags, nothing else.

    ``rollout_gpus`` None means: the trainer's GPU count with ``colocate``, an error without it.
    """

    trainer_nodes: int = 1
    """``--actor-num-nodes``"""
    trainer_gpus_per_node: int = 8
    """``--actor-num-gpus-per-node``"""
    rollout_gpus: int | None = None
    """``--rollout-num-gpus``"""
    gpus_per_engine: int = 1
    """``--rollout-num-gpus-per-engine``"""
    colocate: bool = False
    """``--colocate``: engines share the trainer's bundles"""
    router: bool = True
    """one CPU router process in front of the engines"""

    @classmethod
    def from_flags(cls, argv: Sequence[str]) -> RunShape:
        """The shape of a THUDM/slime command line (other flags ignored), with THUDM/slime's defaults.

        Example: ``["--actor-num-nodes", "8", "--colocate", "--rollout-num-gpus-per-engine", "32"]``
        -> ``RunShape(8, 8, None, 32, colocate=True)``.
        """
        p = argparse.ArgumentParser(add_help=False)
        p.add_argument("--actor-num-nodes", type=int, default=1)
        p.add_argument("--actor-num-gpus-per-node", type=int, default=8)
        p.add_argument("--rollout-num-gpus", type=int, default=None)
        p.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
        p.add_argument("--colocate", action="store_true")
        a, _ = p.parse_known_args(list(argv))
        return cls(
            a.actor_num_nodes, a.actor_num_gpus_per_node, a.rollout_num_gpus, a.rollout_num_gpus_per_engine, a.colocate
        )

    @property
    def trainer_ranks(self) -> int:
        return self.trainer_nodes * self.trainer_gpus_per_node

    def rollout_total(self) -> int:
        """GPUs of the engines; raises ``ConfigError`` when unset without ``colocate``."""
        if self.rollout_gpus is not None:
            return self.rollout_gpus
        if self.colocate:
            return self.trainer_ranks
        raise ConfigError("--rollout-num-gpus is needed without --colocate (the engines' GPUs after the trainer's)")

    def bundles(self) -> int:
        """GPU bundles of the placement group (THUDM/slime's ``_get_placement_group_layout``)."""
        if self.colocate:
            return max(self.trainer_ranks, self.rollout_total())
        return self.trainer_ranks + self.rollout_total()

    def check(self) -> None:
        """Raise ``ConfigError`` (one line) for counts that cannot be laid out on any cluster."""
        for name, value in (
            ("--actor-num-nodes", self.trainer_nodes),
            ("--actor-num-gpus-per-node", self.trainer_gpus_per_node),
            ("--rollout-num-gpus-per-engine", self.gpus_per_engine),
        ):
            if value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}")
        rollout = self.rollout_total()
        if rollout % self.gpus_per_engine:
            raise ConfigError(
                f"--rollout-num-gpus {rollout} is not a multiple of --rollout-num-gpus-per-engine {self.gpus_per_engine}"
            )


@dataclasses.dataclass(frozen=True)
class ClusterShape:
    """A cluster given as numbers (``--dry-run``): ``nodes`` alike nodes of ``gpus_per_node`` GPUs."""

    nodes: int
    gpus_per_node: int


@dataclasses.dataclass(frozen=True)
class Slot:
    """One GPU bundle of the placement group, at its place in slime's order (sorted by node, then GPU)."""

    index: int
    """Position in slime's order (the trainer's rank r takes slot r)."""
    bundle: int
    """The bundle's index in the Ray placement group (what an actor is scheduled on)."""
    node: int
    """Node rank: 0 for the first node in sorted order, then 1, ..."""
    node_id: str
    """Ray's node id (hex); ``node-<rank>`` in a dry-run plan."""
    ip: str
    """The node's IP; ``node-<rank>`` in a dry-run plan."""
    gpu: int
    """The GPU's id on its node (what ``CUDA_VISIBLE_DEVICES`` names)."""


@dataclasses.dataclass(frozen=True)
class Process:
    """One process of the run and the slots it runs on (its actor is scheduled on ``slots[0]``'s bundle)."""

    role: Role
    name: str
    """``trainer-<rank>``, ``engine-<i>`` (``engine-<i>-node-<k>`` for node k > 0 of a wide engine), ``router``"""
    rank: int
    """Trainer rank or engine index (0 for the router)."""
    slots: tuple[int, ...]
    """Slot indices (``Slot.index``); empty for the router (CPU only)."""
    node: int
    """Node rank the process runs on."""
    node_rank: int = 0
    """The engine's ``--node-rank`` (0 unless the engine spans nodes)."""
    nnodes: int = 1
    """The engine's ``--nnodes``."""
    port: int | None = None
    """Planned port: HTTP for engines (node rank 0) and the router, the rendezvous for trainer rank 0."""
    dist_port: int | None = None
    """A wide engine's ``--dist-init-addr`` port (on its node rank 0)."""


@dataclasses.dataclass(frozen=True)
class PlacementTable:
    """Slots in slime's order and every process on them (``layout``)."""

    shape: RunShape
    slots: tuple[Slot, ...]
    processes: tuple[Process, ...]

    def gpus(self, process: Process) -> tuple[int, ...]:
        """The GPU ids of ``process`` on its node (its ``CUDA_VISIBLE_DEVICES``)."""
        return tuple(self.slots[i].gpu for i in process.slots)

    def of_role(self, role: Role) -> tuple[Process, ...]:
        return tuple(p for p in self.processes if p.role == role)

    def node_ip(self, node: int) -> str:
        return next(s.ip for s in self.slots if s.node == node)

    def format(self, bundles: bool = True) -> str:
        """The table as text (``--dry-run``): a header, one line per bundle (unless not ``bundles``), one per process."""
        return "\n".join([*self._header(), *(self._bundle_lines() if bundles else []), *self._process_lines()])

    def _header(self) -> list[str]:
        s, nodes = self.shape, len({slot.node for slot in self.slots})
        engines = len({p.rank for p in self.of_role("engine")})
        return [
            f"# slime on Ray: {len(self.slots)} GPU bundle(s) on {nodes} node(s); trainer {s.trainer_nodes} node(s) x "
            f"{s.trainer_gpus_per_node} GPU(s); {engines} engine(s) of {s.gpus_per_engine} GPU(s), "
            f"{'sharing the trainer bundles (--colocate)' if s.colocate else 'on the bundles after the trainer'}",
        ]

    def _bundle_lines(self) -> list[str]:
        roles: dict[int, list[str]] = {s.index: [] for s in self.slots}
        for p in self.processes:
            for i in p.slots:
                roles[i].append(p.name)
        head = f"{'bundle':>6} {'node':>4} {'ip':<16} {'gpu':>3}  roles"
        return [
            head,
            *(
                f"{s.bundle:>6} {s.node:>4} {s.ip:<16} {s.gpu:>3}  {', '.join(roles[s.index]) or '(idle)'}"
                for s in self.slots
            ),
        ]

    def _process_lines(self) -> list[str]:
        """One line per engine process and the router; trainer ranks one line per node (``trainer-0..7``)."""
        lines = [f"{'process':<18} {'node':>4} {'ip':<16} {'gpus':<24} ports"]
        trainers = self.of_role("trainer")
        for node in sorted({t.node for t in trainers}):
            ranks = [t for t in trainers if t.node == node]
            name = f"trainer-{ranks[0].rank}..{ranks[-1].rank}" if len(ranks) > 1 else ranks[0].name
            gpus = _ranges([self.slots[t.slots[0]].gpu for t in ranks])
            lines.append(f"{name:<18} {node:>4} {self.node_ip(node):<16} {gpus:<24} {_ports(self, ranks[0])}")
        for p in self.processes:
            if p.role != "trainer":
                gpus = _ranges(list(self.gpus(p))) or "- (CPU)"
                lines.append(f"{p.name:<18} {p.node:>4} {self.node_ip(p.node):<16} {gpus:<24} {_ports(self, p)}")
        return lines


def _ranges(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _ports(table: PlacementTable, p: Process) -> str:
    if p.role == "trainer":
        return (
            f"rendezvous :{p.port} (rank 0)" if p.port is not None else f"rendezvous at trainer-0 ({table.node_ip(0)})"
        )
    parts = [f"http :{p.port}"] if p.port is not None else []
    if p.nnodes > 1:
        head = next(q for q in table.processes if q.role == "engine" and q.rank == p.rank and q.node_rank == 0)
        parts.append(
            f"--nnodes {p.nnodes} --node-rank {p.node_rank} --dist-init-addr {table.node_ip(head.node)}:{head.dist_port}"
        )
    return " ".join(parts) or "-"


def layout(shape: RunShape, slots: Sequence[Slot]) -> PlacementTable:
    """Every process of ``shape`` on ``slots`` (slime's order), with planned ports (``BASE_PORT`` per node).

    Raises ``ConfigError`` (one line) when ``slots`` are fewer than ``shape.bundles()``, or an engine would
    straddle nodes: an engine of at most a node's GPUs must fit on one node, a wider one must take whole
    nodes, the same GPU count on each.
    """
    shape.check()
    if len(slots) < shape.bundles():
        raise ConfigError(f"the run needs {shape.bundles()} GPU bundle(s), the placement has {len(slots)}")
    trainers = [
        Process("trainer", f"trainer-{r}", r, (r,), slots[r].node, port=RENDEZVOUS_PORT if r == 0 else None)
        for r in range(shape.trainer_ranks)
    ]
    engines = _engines(shape, slots)
    router = [Process("router", "router", 0, (), slots[0].node)] if shape.router and engines else []
    return PlacementTable(shape, tuple(slots), tuple(_planned_ports([*trainers, *engines, *router])))


def _engines(shape: RunShape, slots: Sequence[Slot]) -> list[Process]:
    offset, k = (0 if shape.colocate else shape.trainer_ranks), shape.gpus_per_engine
    on_node = collections.Counter(s.node for s in slots)
    out: list[Process] = []
    for e in range(shape.rollout_total() // k):
        mine = slots[offset + e * k : offset + (e + 1) * k]
        nodes = sorted({s.node for s in mine})
        per_node = [tuple(s.index for s in mine if s.node == n) for n in nodes]
        # SGLang's multi-node engine runs the same GPU count on each node: a part-node share cannot work
        if len(nodes) > 1 and any(len(g) != on_node[n] or len(g) != len(per_node[0]) for n, g in zip(nodes, per_node)):
            raise ConfigError(
                f"engine {e} ({k} GPUs) would straddle nodes {nodes} ({[len(g) for g in per_node]} GPUs each): an engine "
                f"must fit one node or take whole nodes alike (--rollout-num-gpus-per-engine, --actor-num-gpus-per-node)"
            )
        for rank, (node, group) in enumerate(zip(nodes, per_node)):
            name = f"engine-{e}" if rank == 0 else f"engine-{e}-node-{rank}"
            out.append(Process("engine", name, e, group, node, node_rank=rank, nnodes=len(nodes)))
    return out


def _planned_ports(processes: list[Process]) -> list[Process]:
    """Ports from ``BASE_PORT`` on each node, in process order (a real run asks each node for free ones)."""
    nxt: dict[int, int] = {}

    def take(node: int) -> int:
        nxt[node] = nxt.get(node, BASE_PORT) + 1
        return nxt[node] - 1

    out = []
    for p in processes:
        if p.role == "router" or (p.role == "engine" and p.node_rank == 0):
            p = dataclasses.replace(p, port=take(p.node))
            if p.nnodes > 1:
                p = dataclasses.replace(p, dist_port=take(p.node))
        out.append(p)
    return out


def plan_placement(shape: RunShape, cluster: ClusterShape) -> PlacementTable:
    """The table a run of ``shape`` gets on ``cluster`` (no Ray, no cluster): PACK fills node 0's GPUs, then
    node 1's, ...; bundle i is slot i. Raises ``ConfigError`` (one line) when it does not fit.

    Example: 2 engines of 32 GPUs on 1 x 8 GPUs -> ``ConfigError("the run needs 64 GPU bundle(s), the
    cluster has 8 (1 node(s) x 8 GPU(s))")``.
    """
    shape.check()
    have = cluster.nodes * cluster.gpus_per_node
    if shape.bundles() > have:
        raise ConfigError(
            f"the run needs {shape.bundles()} GPU bundle(s), the cluster has {have} ({cluster.nodes} node(s) x {cluster.gpus_per_node} GPU(s))"
        )
    g = cluster.gpus_per_node
    slots = [Slot(i, i, i // g, f"node-{i // g}", f"node-{i // g}", i % g) for i in range(shape.bundles())]
    return layout(shape, slots)
