"""``--ray-address``: which Ray cluster a run joins (issue 28; docs/ray.md).

- ``auto`` (the default): the cluster this machine belongs to (``RAY_ADDRESS``, else the one ``ray start``
  left on this node), and when none runs, a local Ray started for the run (and stopped with it);
- ``local``: always a new local Ray, even when one runs;
- anything else (``10.0.0.1:6379``, ``ray://head:10001``): that cluster, or one ``RunError`` line.

Under ``ray job submit`` Ray sets ``RAY_ADDRESS`` for the driver, so ``auto`` joins the job's cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import ray

from slime.errors import RunError

__all__ = ["Connection", "connect", "DEFAULT_ADDRESS"]

DEFAULT_ADDRESS = "auto"


@dataclasses.dataclass(frozen=True)
class Connection:
    """The cluster joined: its GCS address, and whether this process started it (then it stops it too)."""

    address: str
    started: bool


InitFn = Callable[..., object]
"""``ray.init``'s shape: keyword arguments in, a context out (only its ``address_info`` is read)."""


def connect(address: str = DEFAULT_ADDRESS, *, init: InitFn = ray.init, **ray_kwargs: object) -> Connection:
    """Join the cluster ``address`` names (module docstring); ``ray_kwargs`` go to ``ray.init`` (``num_cpus``
    only matters for a local start). Already connected: that connection, unchanged.

    Raises ``RunError`` (one line) when ``address`` names a cluster that cannot be reached.
    """
    if ray.is_initialized():
        return Connection(_gcs_address(None), started=False)
    if address == "local":
        return Connection(_gcs_address(init(**ray_kwargs)), started=True)
    try:
        context = init(address=address, **ray_kwargs)
    except ConnectionError as e:
        if address != "auto":
            raise RunError(
                f"--ray-address {address}: no Ray cluster reachable there ({e}); start one with `ray start --head` (docs/ray.md)"
            ) from e
        return Connection(_gcs_address(init(**ray_kwargs)), started=True)  # none runs here: a local one for this run
    return Connection(_gcs_address(context), started=False)


def _gcs_address(context: object) -> str:
    info = getattr(context, "address_info", None)  # ray's RayContext; None when already connected
    if isinstance(info, dict) and "gcs_address" in info:
        return str(info["gcs_address"])
    return str(ray.get_runtime_context().gcs_address)


def disconnect(connection: Connection) -> None:
    """Leave the cluster; a Ray this process started stops with it (``ray.shutdown`` does both)."""
    del connection  # the same call either way: a local Ray's processes are this driver's children
    ray.shutdown()
