"""``slime train --ray``: the driver's own flags and what they do (``slime.cluster.launch``; docs/ray.md).

The flags are the driver's only: ``slime.cluster.commands.RAY_FLAGS`` keeps them off the trainer ranks'
command lines. Without ``--dry-run`` the run is placed on the cluster of ``--ray-address``; with it, the
placement and every command are printed for the cluster shape of ``--ray-plan-nodes`` and
``--ray-plan-gpus-per-node`` (no Ray, no cluster, no model files).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slime.config import Config

__all__ = ["add_ray_flags", "run_or_plan"]


def add_ray_flags(parser: argparse.ArgumentParser) -> None:
    """``--ray`` and its flags: the driver's own (never passed on to the trainer's ranks; docs/ray.md)."""
    ray = parser.add_argument_group("Ray (slime train --ray: the run placed and supervised on a Ray cluster)")
    ray.add_argument("--ray", action="store_true", help="place the run's engines and trainer ranks on Ray")
    ray.add_argument(
        "--ray-address",
        default="auto",
        help="auto (RAY_ADDRESS or this node's cluster, else a local Ray), local, or host:port",
    )
    ray.add_argument("--ray-plan-nodes", type=int, help="with --dry-run: the cluster's nodes to plan for")
    ray.add_argument("--ray-plan-gpus-per-node", type=int, help="with --dry-run: GPUs per node to plan for")


def run_or_plan(ns: argparse.Namespace, config: Config, argv: list[str]) -> int:
    """``slime train --ray``: the placement printed (``--dry-run``), or the run driven on the cluster."""
    from slime.cli.plan_inputs import check_plan_inputs
    from slime.cluster.launch import dry_run_on_ray, run_on_ray
    from slime.cluster.plan import ClusterShape
    from slime.errors import ConfigError

    if ns.dry_run:
        if not (ns.ray_plan_nodes and ns.ray_plan_gpus_per_node):
            raise ConfigError(
                "--ray --dry-run plans for a cluster given as --ray-plan-nodes N --ray-plan-gpus-per-node G"
            )
        # the inputs that are here checked as for any dry run; the cluster's own paths (/root/...) named, not refused
        if note := check_plan_inputs(config):
            print(note)
        print(dry_run_on_ray(config, argv, ClusterShape(ns.ray_plan_nodes, ns.ray_plan_gpus_per_node)))
        return 0
    return run_on_ray(config, argv, address=ns.ray_address)
