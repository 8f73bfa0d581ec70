"""One Ray placement group of GPU bundles for a run, in slime's order (``slime.cluster.plan`` for the order).

``reserve(shape)`` asks Ray for ``shape.bundles()`` bundles of ``{GPU: 1, CPU: cpus_per_bundle}`` (strategy
PACK: as few nodes as fit), waits until they are placed, probes each bundle with a one-GPU task for its node
id, node IP and GPU id, sorts the bundles by (node IP, node id, GPU id), and lays the run onto them
(``plan.layout``). The node id breaks ties between nodes of one IP (several raylets on one host, as
``ray.cluster_utils.Cluster`` starts them), which THUDM/slime's sort by IP and GPU alone would interleave.

Example: two nodes of 4 GPUs, ``RunShape(1, 4, 4, 2)`` -> 8 bundles; slots 0-3 (trainer ranks 0-3) on the
first node in sorted order, slots 4-7 (engines 0 and 1) on the second, whatever indices Ray gave them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import time

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from slime.cluster.plan import PlacementTable, RunShape, Slot, layout
from slime.errors import RunError

__all__ = ["Reservation", "reserve", "sort_key", "slots_in_order"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Reservation:
    """A placed placement group and the run's table on it; ``release()`` gives it back (idempotent)."""

    group: PlacementGroup
    table: PlacementTable
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            remove_placement_group(self.group)


@ray.remote(num_gpus=1, num_cpus=0)
def _where() -> tuple[str, str, int]:
    """(node id, node IP, GPU id) of the bundle this task runs on."""
    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), int(ray.get_gpu_ids()[0])


def sort_key(node_ip: str, node_id: str, gpu: int) -> tuple[int, int, str, str, int]:
    """slime's order: by node IP (numerically when it is one; else as text, after the IPs), node id, GPU."""
    try:
        return (0, int(ipaddress.ip_address(node_ip)), "", node_id, gpu)
    except ValueError:
        return (1, 0, node_ip, node_id, gpu)


def slots_in_order(probed: list[tuple[str, str, int]]) -> list[Slot]:
    """Slots from each bundle's probe ``(node id, IP, GPU id)`` (list index = bundle index), sorted; node
    ranks in order of first appearance."""
    order = sorted(range(len(probed)), key=lambda b: sort_key(probed[b][1], probed[b][0], probed[b][2]))
    ranks: dict[str, int] = {}
    slots = []
    for i, b in enumerate(order):
        node_id, ip, gpu = probed[b]
        slots.append(Slot(i, b, ranks.setdefault(node_id, len(ranks)), node_id, ip, gpu))
    return slots


def _wait_placed(group: PlacementGroup, bundles: int, timeout_s: float) -> None:
    """Block until ``group`` is placed, logging the cluster's GPUs every 30 s; ``RunError`` after ``timeout_s``."""
    start, ready = time.monotonic(), group.ready()
    while not ray.wait([ready], timeout=min(30.0, timeout_s))[0]:
        waited = time.monotonic() - start
        total, free = ray.cluster_resources().get("GPU", 0), ray.available_resources().get("GPU", 0)
        if waited >= timeout_s:
            remove_placement_group(group)
            raise RunError(
                f"Ray could not place {bundles} GPU bundle(s) within {timeout_s:g}s: the cluster has {total:g} GPU(s), "
                f"{free:g} free (start Ray on more nodes: docs/ray.md)"
            )
        log.info(
            "waiting %.0fs for a placement group of %d GPU bundle(s): %g GPU(s) in the cluster, %g free",
            waited,
            bundles,
            total,
            free,
        )


def reserve(shape: RunShape, *, cpus_per_bundle: float = 1.0, timeout_s: float = 600.0) -> Reservation:
    """Reserve, probe and sort one placement group for ``shape`` on the connected Ray cluster (module docstring).

    Raises ``ConfigError`` when the shape cannot be laid out (the group is given back first), ``RunError``
    when Ray cannot place the bundles within ``timeout_s`` seconds.
    """
    shape.check()
    n = shape.bundles()
    group = placement_group([{"GPU": 1, "CPU": cpus_per_bundle} for _ in range(n)], strategy="PACK")
    _wait_placed(group, n, timeout_s)
    try:
        probes = [
            _where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, b)).remote() for b in range(n)
        ]
        table = layout(shape, slots_in_order(ray.get(probes)))
    except BaseException:
        remove_placement_group(group)
        raise
    for s in table.slots:
        log.info("bundle %d -> slot %d: node %d (%s, %s) GPU %d", s.bundle, s.index, s.node, s.ip, s.node_id[:8], s.gpu)
    return Reservation(group, table)
