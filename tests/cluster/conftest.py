"""A local Ray cluster of three nodes on this machine (``ray.cluster_utils.Cluster``), shared by the Ray tests.

The head node (the driver's) has no GPU; two worker nodes have 4 fake GPUs each (Ray schedules on the
count only; nothing touches a device). One logical CPU per node and no dashboard keep it light: every
actor and bundle asks for 0 CPUs. At teardown, every raylet and Ray process the cluster started is gone.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

GPUS_PER_NODE = 4


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone: it has exited, its parent has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_gone(pids: list[int], timeout_s: float = 20.0) -> list[int]:
    """The pids of ``pids`` still alive after up to ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture(scope="package")  # up for tests/cluster only, not for the rest of a whole-suite run
def ray_cluster() -> Iterator[Cluster]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}  # ray.init replaces SIGTERM's
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=1, num_gpus=GPUS_PER_NODE) for _ in range(2)]
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    raylets = [n.all_processes["raylet"][0].process.pid for n in [cluster.head_node, *workers]]
    yield cluster
    ray.shutdown()
    cluster.shutdown()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    assert wait_gone(raylets) == [], "raylets left running after the cluster's shutdown"
