"""What each process of ``slime train --ray`` runs: the engines' servers, the router, the trainer's ranks.

The commands come from the same places as on one machine, so a Ray run starts what a launch-mode run
would: the engines' command lines are the launch plan's (``slime.engines.fleet.plan.build_launch_plan``:
SGLang servers with every ``--sglang-*`` flag and the sharing defaults, or embedded engines), with the
host and port the placement gave them (and, for an engine wider than a node, SGLang's ``--nnodes
--node-rank --dist-init-addr``); the router's is the plan's with the engines' real addresses. Each
trainer rank runs ``python -m slime.cli train`` with the user's own flags (minus the driver's), plus
``--ray-placed-engines ROLE=URL ...`` (the placed engines: the rank attaches to them instead of launching
what its flags describe, and waits for a dead one as for a launched engine, since Ray restarts it); so the
rank's config, which the run saves, is the user's, and ``--load`` resumes the same run. Rank 0 drives the run,
exactly as torchrun's rank 0 does, and the other ranks serve its train steps (``MASTER_ADDR`` and the
rest of torchrun's variables come from ``ClusterRun``).

Example: ``slime train --ray --rollout-num-engines 2 --save runs/x`` on two nodes -> ``engine-0``:
``python -m slime.servers.embedded.server --model M --host 10.0.0.3 --port 41000 ...``; ``trainer-0``:
``python -m slime.cli train --rollout-num-engines 2 --save runs/x --ray-placed-engines
actor=http://10.0.0.3:15000 actor=http://10.0.0.3:15001``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator, Sequence

import msgspec

from slime.cluster.plan import Process, RunShape
from slime.cluster.supervise import Command, Rendezvous
from slime.config import EngineConfig, TrainConfig
from slime.engines.fleet.groups import ACTOR
from slime.engines.fleet.plan import build_launch_plan
from slime.engines.fleet.plan_specs import LaunchPlan, ServerSpec
from slime.errors import ConfigError

__all__ = ["RAY_FLAGS", "RunCommands", "run_shape", "strip_flags", "launch_plan_for_ray"]

RAY_FLAGS = {
    "--ray": False,
    "--ray-address": True,
    "--ray-plan-nodes": True,
    "--ray-plan-gpus-per-node": True,
    "--dry-run": False,
}
"""The driver's own flags (flag -> takes a value): never passed on to the trainer's ranks."""


def strip_flags(argv: Sequence[str], flags: dict[str, bool]) -> list[str]:
    """``argv`` without each of ``flags`` (``--flag``, ``--flag value``, ``--flag=value``; flag -> takes a value).

    Example: ``strip_flags(["--ray", "--seed", "1", "--ray-address=auto"], RAY_FLAGS)`` -> ``["--seed", "1"]``.
    """
    out: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        name = token.split("=", 1)[0]
        if name in flags:
            skip = flags[name] and "=" not in token
            continue
        out.append(token)
    return out


@contextlib.contextmanager
def _driver_gpus_hidden() -> Iterator[None]:
    """The launch plan must not count the driver's own GPUs: on Ray each engine's come from its bundle."""
    saved = os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def launch_plan_for_ray(engine: EngineConfig, *, seed: int, colocate: bool, in_place_updates: bool) -> LaunchPlan:
    """The run's launch plan as a Ray run starts it: every server's command (ports and GPUs replaced later);
    the arguments are ``build_launch_plan``'s.

    Raises ``ConfigError`` for a run that attaches to running engines (nothing to place) and from the plan.
    """
    engine = msgspec.structs.replace(engine, ray_placed_engines=())  # a resumed run's were the last placement's
    if engine.rollout_external_engine_addrs:
        raise ConfigError(
            "--ray places and starts the run's engines; --rollout-external-engine-addrs attaches to running "
            "ones: drop one of them"
        )
    with _driver_gpus_hidden():
        return build_launch_plan(
            engine,
            seed=seed,
            trainer_gpus=0,  # the servers' GPUs are their bundles'; sharing is --colocate's
            colocate=colocate,
            in_place_updates=in_place_updates,
            gpus_per_node=max(1, engine.rollout_num_gpus or 1),
            is_free=lambda host, port: True,  # ports are asked of each node at start
        )


def run_shape(train: TrainConfig, plan: LaunchPlan, *, colocate: bool) -> RunShape:
    """The placement flags (``--actor-num-*``, ``--colocate``) as a ``RunShape``: the trainer's nodes x GPUs, one bundle per
    embedded engine or per SGLang GPU, the router when the plan launches one.

    Raises ``ConfigError`` when the plan's servers do not all take the same GPU count (one
    ``--rollout-num-gpus-per-engine`` per run on Ray).
    """
    t = train
    tps = {_tp(s) for s in plan.servers}
    if len(tps) > 1:
        raise ConfigError(f"--ray lays out engines of one size; the plan's servers take {sorted(tps)} GPUs each")
    per_engine = tps.pop() if tps else 1
    return RunShape(
        trainer_nodes=t.actor_num_nodes or 1,  # rank 0 drives the run, also a rollout-only one
        trainer_gpus_per_node=t.actor_num_gpus_per_node or 1,
        rollout_gpus=per_engine * len(plan.servers),
        gpus_per_engine=per_engine,
        colocate=colocate,
        router=any(r.argv is not None for r in plan.routers),
    )


def _tp(server: ServerSpec) -> int:
    argv = list(server.argv)
    return int(argv[argv.index("--tp-size") + 1]) if "--tp-size" in argv else 1


@dataclasses.dataclass(frozen=True)
class RunCommands:
    """``ClusterRun``'s command function for one run: ``RunCommands(argv, plan)(process, rendezvous)``."""

    argv: tuple[str, ...]
    """The user's ``slime train`` flags as given."""
    plan: LaunchPlan
    python: str = sys.executable
    """The interpreter on every node (a Ray cluster runs one environment at one path)."""

    def __call__(self, p: Process, r: Rendezvous) -> Command:
        if p.role == "engine":
            # the plan's GPU ids are not the bundle's: ClusterRun sets CUDA_VISIBLE_DEVICES
            env = {k: v for k, v in self.plan.servers[p.rank].env.items() if k != "CUDA_VISIBLE_DEVICES"}
            return Command(tuple(self.engine_argv(p, r)), env)
        if p.role == "router":
            return Command(tuple(self.router_argv(r)))
        return Command(tuple(self.trainer_argv(r)))

    def engine_argv(self, p: Process, r: Rendezvous) -> list[str]:
        """Server ``p.rank``'s command from the plan, bound to its node's IP and its port."""
        argv = list(self.plan.servers[p.rank].argv)
        host = r.ip if r.dist_init is None or p.node_rank == 0 else "0.0.0.0"
        _set_value(argv, "--host", host)
        _set_value(argv, "--port", str(r.port if r.port is not None else 0))
        if p.nnodes > 1:  # SGLang's multi-node engine: the same command on each node, its rank and the head's address
            assert r.dist_init is not None  # ClusterRun gives every node of a wide engine its head's address
            argv += ["--nnodes", str(p.nnodes), "--node-rank", str(p.node_rank)]
            argv += ["--dist-init-addr", f"{r.dist_init[0]}:{r.dist_init[1]}"]
        return argv

    def router_argv(self, r: Rendezvous) -> list[str]:
        """The plan's actor router with the engines' real addresses, bound to its node's IP and port."""
        router = next(x for x in self.plan.routers if x.argv is not None)
        assert router.argv is not None
        real = dict(zip((s.url for s in self.plan.servers), r.engines))
        argv = [real.get(token, token) for token in router.argv]
        _set_value(argv, "--host", r.ip)
        _set_value(argv, "--port", str(r.port))
        return argv

    def trainer_argv(self, r: Rendezvous) -> list[str]:
        """``python -m slime.cli train`` with the user's flags as given, plus the placed engines (module doc):
        the rank's config, saved as the run's, is the user's, so ``--load`` resumes the same run."""
        placed = [
            f"{'actor' if model == ACTOR else 'teacher'}={url}"
            for model, urls in _urls_by_model(self.plan, r.engines).items()
            for url in urls
        ]
        if r.router is not None:  # the pool calls the placed router (its workers: the placed engines)
            placed.append(f"router=http://{r.router[0]}:{r.router[1]}")
        return [
            self.python,
            "-m",
            "slime.cli",
            "train",
            *strip_flags(self.argv, RAY_FLAGS),
            "--ray-placed-engines",
            *placed,
        ]


def _urls_by_model(plan: LaunchPlan, urls: Sequence[str]) -> dict[str, list[str]]:
    """Model -> the placed engines' urls serving it (regular and decode servers: what a pool calls)."""
    out: dict[str, list[str]] = {}
    for server, url in zip(plan.servers, urls):
        if server.role != "prefill":  # a prefill server is reached through the PD router only
            out.setdefault(server.model, []).append(url)
    return out


def _set_value(argv: list[str], flag: str, value: str) -> None:
    """Set ``flag``'s value in ``argv`` (its last occurrence), or append ``flag value``."""
    for i in range(len(argv) - 1, -1, -1):
        if argv[i] == flag and i + 1 < len(argv):
            argv[i + 1] = value
            return
    argv += [flag, value]
