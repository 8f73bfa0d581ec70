"""Weight sync by broadcast: the trainer is rank 0 of a process group with every engine TP rank (docs/sglang.md#update-weights-from-distributed).

One update to version N (inside ``weight_update_session``)::

    for bucket in buckets(weights, update_weight_buffer_size):        # bytes per bucket
        concurrently:
            POST /update_weights_from_distributed {names, dtypes, shapes, group_name,
                 weight_version: "N", abort_all_requests, flush_cache, load_format}   # every engine
            broadcast(src=0) each tensor in list order                # or one flat uint8 buffer

The group is made on the first ``load`` (engines must be up) and kept: world size = 1 + the sum of
the engines' ``tp_size`` (``/server_info``), engine i joins at ``rank_offset`` = 1 + the TP sizes of
engines before it. It is made again when the pool's engines change, and after a failed update
(the collective stream is then out of step). Backend: ``nccl`` when the trainer's tensors are on
CUDA, ``gloo`` on CPU (the embedded engine). ``load_format="flattened_bucket"`` (one collective per
bucket) when every engine reports SGLang >= 0.5.6 (the embedded engine reports 0.5.23), else one
broadcast per tensor. See ``slime.sync.group`` for how the group stays apart from a training job's
own default group.

Failure: if an engine's HTTP call fails while the trainer broadcasts, the error is raised at once;
the trainer's broadcast thread stays blocked until the group's ``timeout_s`` and then ends (logged).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Literal

from slime.config import SyncConfig
from slime.sync.base import StateFn, engines, snapshot, weight_update_session
from slime.sync.group import WeightsUpdateGroup, address_towards, backend_for, master_store
from slime.sync.wire import NamedTensors, buckets, dtype_name

if TYPE_CHECKING:  # types only: this part never imports the client side at run time
    from torch.distributed import TCPStore

    from slime.engines.client import EngineClient
    from slime.engines.interface import WorkerPool

__all__ = ["DistributedWeightSync", "sglang_version"]

log = logging.getLogger(__name__)
_group_ids = itertools.count()


def sglang_version(info: dict[str, Any]) -> tuple[int, ...]:
    """``/server_info`` ``version`` as a tuple (``"0.5.6.post2"`` -> (0, 5, 6)); () when absent."""
    parts = []
    for part in str(info.get("version", "")).split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def _log_outcome(what: str):
    def done(fut: asyncio.Future) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            log.warning("%s ended with %r", what, fut.exception())

    return done


class DistributedWeightSync:
    """Push trainer weights to every engine over ``/update_weights_from_distributed``.

    Args:
        config: ``update_weight_buffer_size`` (bytes per bucket) and ``update_weights_timeout_s``
            (each HTTP call, the rendezvous and every collective).
        pool: the ``HttpEnginePool`` (its ``clients`` and ``update_weights_from_distributed``).
        state_fn: blocking, returns a copy of the trainer's weights (CPU -> gloo, CUDA -> nccl).
        load_format: ``"auto"`` (see module doc), ``None`` (one broadcast per tensor) or
            ``"flattened_bucket"``.
    """

    def __init__(
        self,
        config: SyncConfig,
        *,
        pool: WorkerPool,
        state_fn: StateFn,
        load_format: Literal["auto", "flattened_bucket"] | None = "auto",
    ):
        self.config = config
        self.pool = pool
        self.state_fn = state_fn
        self.load_format = load_format
        self.stats: dict[str, float] = {}
        self._group: WeightsUpdateGroup | None = None
        self._group_urls: list[str] = []
        self._flattened = False

    async def save(self, version: int) -> NamedTensors:
        return await snapshot(self.state_fn)

    async def load(self, staged: NamedTensors, version: int, *, abort_all_requests: bool = True) -> None:
        if not staged:
            raise ValueError("nothing to sync: the trainer's state dict is empty")
        t0 = time.monotonic()
        device = staged[0][1].device
        group = await self._ensure_group(backend_for(device))
        timeout_s = self.config.update_weights_timeout_s
        num_bytes = 0
        parts = buckets(staged, self.config.update_weight_buffer_size)
        try:
            async with weight_update_session(self.pool.clients):
                for bucket in parts:
                    names = [n for n, _ in bucket]
                    tensors = [t.to(device) for _, t in bucket]
                    http = self.pool.update_weights_from_distributed(
                        names,
                        [dtype_name(t.dtype) for t in tensors],
                        [list(t.shape) for t in tensors],
                        group_name=group.name,
                        weight_version=str(version),
                        abort_all_requests=abort_all_requests,
                        flush_cache=abort_all_requests,
                        load_format="flattened_bucket" if self._flattened else None,
                        timeout_s=timeout_s,
                    )
                    send = asyncio.ensure_future(asyncio.to_thread(group.broadcast, tensors, flattened=self._flattened))
                    try:
                        await http
                    except BaseException:
                        send.add_done_callback(_log_outcome(f"broadcast to group {group.name}"))
                        raise
                    await send
                    num_bytes += sum(t.numel() * t.element_size() for t in tensors)
        except BaseException:
            await self._drop_group()  # the collective stream is out of step: make a new group next time
            raise
        dt = time.monotonic() - t0
        self.stats = {
            "bytes": num_bytes,
            "seconds": dt,
            "num_buckets": len(parts),
            "gb_per_s": num_bytes / max(dt, 1e-9) / 1e9,
        }

    async def _ensure_group(self, backend: str) -> WeightsUpdateGroup:
        """The group with the pool's current engines (a new one when they changed)."""
        clients = engines(self.pool)
        urls = [c.url for c in clients]
        if self._group is not None and urls == self._group_urls:
            return self._group
        await self._drop_group()
        timeout_s = self.config.update_weights_timeout_s
        infos = await asyncio.gather(*(c.server_info() for c in clients))
        tp_sizes = [int(info.get("tp_size") or 1) for info in infos]
        self._flattened = self.load_format == "flattened_bucket" or (
            self.load_format == "auto" and all(sglang_version(i) >= (0, 5, 6) for i in infos)
        )
        world_size = 1 + sum(tp_sizes)
        offsets = [1 + sum(tp_sizes[:i]) for i in range(len(clients))]
        address = address_towards(urls[0])
        store = master_store(address, world_size, timeout_s)
        name = (
            f"slime_weights_{os.getpid()}_{next(_group_ids)}"  # fresh per group: a stale one on an engine cannot clash
        )
        group = await self._rendezvous(
            clients, name=name, backend=backend, world_size=world_size, offsets=offsets, address=address, store=store
        )
        self._group, self._group_urls = group, urls
        log.info(
            "weights-update group %s: %s backend, world size %d (trainer rank 0 at %s:%d, engines %s at ranks %s), %s",
            name,
            backend,
            world_size,
            address,
            store.port,
            urls,
            offsets,
            "flattened buckets" if self._flattened else "one broadcast per tensor",
        )
        return group

    async def _rendezvous(
        self,
        clients: list[EngineClient],
        *,
        name: str,
        backend: str,
        world_size: int,
        offsets: list[int],
        address: str,
        store: TCPStore,
    ) -> WeightsUpdateGroup:
        """Join group ``name`` as rank 0 while every engine joins at its ``rank_offset`` (all at once).

        If an engine's ``/init_weights_update_group`` fails, that error is raised at once; the trainer's
        join thread ends at ``timeout_s`` (logged).
        """
        timeout_s = self.config.update_weights_timeout_s
        join = asyncio.ensure_future(
            asyncio.to_thread(
                WeightsUpdateGroup.join,
                group_name=name,
                rank=0,
                world_size=world_size,
                backend=backend,
                timeout_s=timeout_s,
                store=store,
            )
        )
        calls = [
            c.init_weights_update_group(
                master_address=address,
                master_port=store.port,
                rank_offset=off,
                world_size=world_size,
                group_name=name,
                backend=backend,
                timeout_s=timeout_s,
            )
            for c, off in zip(clients, offsets)
        ]
        try:
            await asyncio.gather(*calls)
        except BaseException:
            join.add_done_callback(_log_outcome(f"trainer side of group {name}"))
            raise
        return await join

    async def _drop_group(self) -> None:
        group, self._group, urls = self._group, None, self._group_urls
        if group is None:
            return
        by_url = {c.url: c for c in self.pool.clients}
        results = await asyncio.gather(
            *(
                by_url[u].destroy_weights_update_group(group.name, timeout_s=self.config.update_weights_timeout_s)
                for u in urls
                if u in by_url
            ),
            return_exceptions=True,
        )
        for exc in (r for r in results if isinstance(r, BaseException)):
            log.warning("destroy_weights_update_group(%s) failed: %s", group.name, exc)
        group.destroy()

    async def close(self) -> None:
        """Destroy the group on the engines and here. Idempotent."""
        await self._drop_group()
