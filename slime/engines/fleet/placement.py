"""Where the trainer's ranks and the SGLang servers run: THUDM/slime's placement flags, over several nodes.

THUDM/slime places actor and rollout in one Ray placement group (``slime/ray/placement_group.py``):
the actor takes the first ``--actor-num-nodes x --actor-num-gpus-per-node`` GPUs, sorted by node then
GPU; the rollout GPUs (``--rollout-num-gpus``) follow them, or, with ``--colocate``, start at the
actor's first GPU (and default to the actor's count). This slime starts the same layout without Ray:

- the trainer (``--train-backend megatron``) is one torchrun job, ``--nnodes`` = actor nodes,
  ``--nproc-per-node`` = actor GPUs per node, node ranks 0..N-1, rank 0 (node 0) hosting the loop;
  each node's ranks take its GPUs 0..G-1;
- the SGLang servers are ``--rollout-num-gpus / --rollout-num-gpus-per-engine`` servers (or those of
  ``--sglang-config``'s groups, in order) of consecutive GPUs, numbered as slime numbers them: colocated from node 0 GPU 0 over the trainer's
  GPUs, otherwise on the GPUs after the trainer's (the rest of the trainer's nodes, then further
  nodes). A node has ``--rollout-num-gpus-per-node`` GPUs (THUDM/slime's flag; at most the visible
  ones), else ``len(CUDA_VISIBLE_DEVICES)``, else 8 (slime's ``--num-gpus-per-node`` default).

Example: ``--actor-num-nodes 2 --actor-num-gpus-per-node 4 --rollout-num-gpus 8
--rollout-num-gpus-per-engine 2`` on 8-GPU nodes: node 0 trains on GPUs 0-3 and serves on 4-5, 6-7;
node 1 the same. With ``--colocate`` and no ``--rollout-num-gpus``: 8 rollout GPUs, four servers on
GPUs 0-1 and 2-3 of each node, sharing them with the trainer.

Rank 0 launches the servers of node 0 only (``slime.engines.fleet.plan``); a plan with servers on
other nodes is printed by ``slime train --dry-run`` but refused by a run: start those servers on their
nodes and pass them with ``--rollout-external-engine-addrs``. Not covered: a server spanning nodes.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Iterator, Mapping

from slime.config import EngineConfig, TrainConfig
from slime.errors import ConfigError

__all__ = ["NodePlan", "Placement", "placement_given", "build_placement", "check_torchrun_env", "DEFAULT_GPUS_PER_NODE"]

log = logging.getLogger(__name__)

DEFAULT_GPUS_PER_NODE = 8
"""GPUs of a node when nothing says otherwise (THUDM/slime's ``--num-gpus-per-node`` default)."""


@dataclasses.dataclass(frozen=True)
class NodePlan:
    node_rank: int
    trainer_gpus: tuple[int, ...]
    """Local GPU ids of this node's torchrun ranks (empty: no trainer rank here)."""
    servers: tuple[tuple[int, ...], ...]
    """Local GPU ids of each SGLang server on this node (``--tp-size`` = len)."""


@dataclasses.dataclass(frozen=True)
class Placement:
    actor_num_nodes: int
    actor_num_gpus_per_node: int
    gpus_per_node: int
    rollout_num_gpus: int
    colocate: bool
    megatron: bool
    nodes: tuple[NodePlan, ...]

    @property
    def servers_off_node0(self) -> bool:
        return any(n.servers for n in self.nodes[1:])

    def format(self) -> str:
        """Per node: the torchrun command of its trainer ranks and the GPUs of trainer and servers."""
        a, g = self.actor_num_nodes, self.actor_num_gpus_per_node
        trainer = (
            f"trainer {a} node(s) x {g} GPU(s)" if self.megatron else "trainer in one process on node 0 (torch backend)"
        )
        lines = [
            f"# slime placement: {len(self.nodes)} node(s) of {self.gpus_per_node} GPU(s); {trainer}, "
            f"SGLang servers on {self.rollout_num_gpus} GPU(s), {'colocated with' if self.colocate else 'apart from'} the trainer"
        ]
        for n in self.nodes:
            lines.append(
                f"[node {n.node_rank}] trainer GPUs {_ids(n.trainer_gpus)}; SGLang servers "
                f"{' '.join(f'[{_ids(s)}]' for s in n.servers) or 'none'}"
            )
            if n.trainer_gpus and self.megatron:
                lines.append(
                    f"  torchrun --nnodes {a} --nproc-per-node {g} --node-rank {n.node_rank} --master-addr $MASTER_ADDR "
                    f"--master-port $MASTER_PORT -m slime.cli train --train-backend megatron ..."
                )
        if self.servers_off_node0:
            lines.append(
                "# rank 0 launches node 0's servers only: start the others on their nodes (python -m sglang.launch_server, "
                "as a one-node --dry-run prints it) and pass them with --rollout-external-engine-addrs"
            )
        return "\n".join(lines)


def _ids(ids: tuple[int, ...]) -> str:
    return ",".join(map(str, ids)) if ids else "none"


def placement_given(train: TrainConfig, engine: EngineConfig) -> bool:
    """Whether the run names its placement (``--actor-num-nodes`` / ``--actor-num-gpus-per-node`` /
    ``--rollout-num-gpus-per-node``)."""
    return (
        train.actor_num_nodes is not None
        or train.actor_num_gpus_per_node is not None
        or engine.rollout_num_gpus_per_node is not None
    )


def build_placement(
    train: TrainConfig,
    engine: EngineConfig,
    *,
    colocate: bool = False,
    rollout_only: bool = False,
    gpus_per_node: int | None = None,
) -> Placement:
    """The per-node layout of trainer ranks and SGLang servers (module docstring).

    Args:
        train / engine: the run's sections (placement flags, parallel sizes; rollout GPUs and servers).
        colocate: ``--colocate``. rollout_only: ``--debug-rollout-only`` (no trainer ranks).
        gpus_per_node: GPUs of each node; default ``--rollout-num-gpus-per-node``, else
            ``len(CUDA_VISIBLE_DEVICES)``, else 8.

    Raises:
        ConfigError: one line naming the flags: several nodes without ``--train-backend megatron``;
            TP x PP x CP that does not divide the trainer's GPUs; more GPUs per node than a node
            has; rollout GPUs not a multiple of ``--rollout-num-gpus-per-engine``; a server that
            would span two nodes.
    """
    nodes, per_node = train.actor_num_nodes or 1, train.actor_num_gpus_per_node or 1
    megatron = train.train_backend == "megatron" and not rollout_only
    _check_trainer_nodes(nodes, per_node, megatron=megatron)
    gpus_per_node = _gpus_per_node(engine, per_node) if gpus_per_node is None else gpus_per_node
    if per_node > gpus_per_node:
        raise ConfigError(
            f"--actor-num-gpus-per-node={per_node} but a node has {gpus_per_node} GPU(s) "
            f"({'--rollout-num-gpus-per-node' if engine.rollout_num_gpus_per_node else 'CUDA_VISIBLE_DEVICES'})"
        )
    if megatron:
        _check_parallel_sizes(train, nodes * per_node)
    sizes = _server_sizes(engine)
    trainer_slots = [(n, g) for n in range(nodes) for g in range(per_node)] if megatron else []
    servers = _server_slots(sizes, _rollout_slots(nodes, per_node, gpus_per_node, colocate=colocate, megatron=megatron))
    _check_servers_fit(servers, gpus_per_node, nodes=nodes, per_node=per_node)
    num_nodes = max([nodes, *(s[0][0] + 1 for s in servers)])
    plans = tuple(
        NodePlan(
            n,
            tuple(g for nn, g in trainer_slots if nn == n),
            tuple(tuple(g for _, g in s) for s in servers if s[0][0] == n),
        )
        for n in range(num_nodes)
    )
    return Placement(nodes, per_node, gpus_per_node, sum(sizes), colocate, megatron, plans)


def _check_trainer_nodes(nodes: int, per_node: int, *, megatron: bool) -> None:
    """Raises ConfigError for node or GPU counts below 1, or several nodes without Megatron."""
    if nodes < 1 or per_node < 1:
        raise ConfigError(f"--actor-num-nodes={nodes} and --actor-num-gpus-per-node={per_node} must be >= 1")
    if not megatron and nodes > 1:
        raise ConfigError(
            f"--actor-num-nodes={nodes}: several trainer nodes need --train-backend megatron (the torch backend trains in one process)"
        )
    if not megatron and per_node > 1:
        log.info(
            "--actor-num-gpus-per-node=%d: the torch backend trains in one process; it places the SGLang servers only "
            "(--train-backend megatron starts %d ranks per node)",
            per_node,
            per_node,
        )


def _gpus_per_node(engine: EngineConfig, per_node: int) -> int:
    """``--rollout-num-gpus-per-node`` (at most the visible GPUs), else the visible count, else 8 (or the trainer's)."""
    visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if engine.rollout_num_gpus_per_node is not None and visible and engine.rollout_num_gpus_per_node > len(visible):
        raise ConfigError(
            f"--rollout-num-gpus-per-node={engine.rollout_num_gpus_per_node} but this node sees {len(visible)} GPU(s) "
            f"(CUDA_VISIBLE_DEVICES={','.join(visible)})"
        )
    return engine.rollout_num_gpus_per_node or len(visible) or max(DEFAULT_GPUS_PER_NODE, per_node)


def _check_parallel_sizes(train: TrainConfig, world: int) -> None:
    """Raises ConfigError when TP x PP x CP, or EP x ETP, does not divide the trainer's ``world`` GPUs."""
    m = train.megatron
    model = m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size
    if world % model:
        raise ConfigError(
            f"--tensor-model-parallel-size={m.tensor_model_parallel_size} x --pipeline-model-parallel-size="
            f"{m.pipeline_model_parallel_size} x --context-parallel-size={m.context_parallel_size} = {model} must divide "
            f"--actor-num-nodes={train.actor_num_nodes or 1} x --actor-num-gpus-per-node={train.actor_num_gpus_per_node or 1} "
            f"= {world} GPUs (data-parallel size = GPUs / {model})"
        )
    experts = m.expert_model_parallel_size * m.resolved_expert_tensor_parallel_size
    if world % experts:
        raise ConfigError(
            f"--expert-model-parallel-size={m.expert_model_parallel_size} x --expert-tensor-parallel-size="
            f"{m.resolved_expert_tensor_parallel_size} = {experts} must divide the trainer's {world} GPUs"
        )


def _server_sizes(engine: EngineConfig) -> list[int]:
    """GPUs of each SGLang server, in order: ``--sglang-config``'s groups, else ``--rollout-num-gpus`` in
    servers of ``--rollout-num-gpus-per-engine`` (raises ConfigError when it does not divide)."""
    if engine.sglang_config:  # its groups' servers, in order (they may differ in size)
        from slime.engines.fleet.groups import load_sglang_config

        return [
            g.gpus_per_engine or 1
            for g in load_sglang_config(engine.sglang_config, engine).groups
            for _ in range(g.num_engines)
        ]
    total, tp = engine.rollout_num_gpus or 0, engine.rollout_num_gpus_per_engine
    if total % tp:
        raise ConfigError(f"--rollout-num-gpus={total} must be a multiple of --rollout-num-gpus-per-engine={tp}")
    return [tp] * (total // tp)


def _rollout_slots(
    nodes: int, per_node: int, gpus_per_node: int, *, colocate: bool, megatron: bool
) -> Iterator[tuple[int, int]]:
    """The ``(node, gpu)`` slots the servers take in order (module docstring), without end: further
    nodes follow the trainer's."""
    if colocate:  # from the trainer's first GPU, then the GPUs after it
        yield from ((n, g) for n in range(nodes) for g in range(per_node))
        yield from ((n, g) for n in range(nodes) for g in range(per_node, gpus_per_node))
    else:  # after the trainer's GPUs: the rest of its nodes first
        yield from ((n, g) for n in range(nodes) for g in range(per_node if megatron else 0, gpus_per_node))
    for extra in itertools.count(nodes):
        yield from ((extra, g) for g in range(gpus_per_node))


def _server_slots(sizes: list[int], slots: Iterator[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Each server's ``(node, gpu)`` slots: the next ``size`` ones."""
    return [list(itertools.islice(slots, size)) for size in sizes]


def _check_servers_fit(servers: list[list[tuple[int, int]]], gpus_per_node: int, *, nodes: int, per_node: int) -> None:
    """Raises ConfigError for a server whose GPUs are not consecutive GPUs of one node."""
    for i, s in enumerate(servers):
        if len({n for n, _ in s}) > 1 or [g for _, g in s] != list(range(s[0][1], s[0][1] + len(s))):
            raise ConfigError(
                f"--rollout-num-gpus-per-engine={len(s)}: server {i} would take GPUs {[f'node{n}:{g}' for n, g in s]}, "
                f"not {len(s)} consecutive GPUs of one node (nodes of {gpus_per_node} GPUs, trainer {nodes} x {per_node})"
            )


def check_torchrun_env(train: TrainConfig, engine: EngineConfig, env: Mapping[str, str] | None = None) -> None:
    """Under torchrun, the job must be the one the placement flags describe.

    Raises:
        ConfigError: ``LOCAL_WORLD_SIZE`` / ``WORLD_SIZE`` disagree with ``--actor-num-gpus-per-node`` /
            nodes x GPUs per node (both values named).
    """
    env = os.environ if env is None else env
    t = train
    if t.train_backend != "megatron" or not placement_given(train, engine) or "WORLD_SIZE" not in env:
        return
    nodes, per_node = t.actor_num_nodes or 1, t.actor_num_gpus_per_node
    if per_node is not None and int(env.get("LOCAL_WORLD_SIZE", per_node)) != per_node:
        raise ConfigError(
            f"--actor-num-gpus-per-node={per_node} but torchrun started {env['LOCAL_WORLD_SIZE']} rank(s) on this node "
            f"(--nproc-per-node); make them equal"
        )
    want = nodes * (per_node or int(env.get("LOCAL_WORLD_SIZE", 1)))
    if int(env["WORLD_SIZE"]) != want:
        raise ConfigError(
            f"--actor-num-nodes={nodes} x --actor-num-gpus-per-node={per_node} = {want} ranks but torchrun's "
            f"WORLD_SIZE is {env['WORLD_SIZE']}; make them equal"
        )
