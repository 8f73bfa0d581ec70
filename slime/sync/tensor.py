"""Weight sync by tensor payload (colocated engines): ``/update_weights_from_tensor`` (docs/sglang.md#update-weights-from-tensor).

One update to version N (inside ``weight_update_session``)::

    for bucket in buckets(weights, update_weight_buffer_size):
        POST /update_weights_from_tensor {serialized_named_tensors: [payload] * tp_size,
             load_format: null, weight_version: "N", abort_all_requests, flush_cache}   # every engine

The payload follows the trainer's device (``slime.sync.wire``): CUDA tensors go as SGLang expects,
a ``ForkingPickler`` pickle of CUDA IPC handles (the engine maps the trainer's GPU memory; no bytes
cross the wire, so trainer and engine must share the node), kept alive until every engine answered.
CPU tensors go as a safetensors file, which only the embedded engine accepts (it never unpickles).
With ``tp_size > 1`` every TP rank gets the same payload, which is what SGLang expects when one
trainer process serves a TP group (⚠ not verified against a live multi-GPU server; slime itself
gathers one payload per TP rank from the matching trainer ranks).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from slime.config import SyncConfig
from slime.sync.base import StateFn, engines, snapshot, weight_update_session
from slime.sync.wire import NamedTensors, buckets, serialize_cuda_ipc, serialize_safetensors

if TYPE_CHECKING:  # types only: this part never imports the client side at run time
    from slime.engines.interface import WorkerPool

__all__ = ["TensorWeightSync"]


class TensorWeightSync:
    """Push trainer weights to colocated engines as tensor payloads.

    Args:
        config: ``update_weight_buffer_size`` (bytes per request), ``update_weights_timeout_s``.
        pool: a ``WorkerPool`` (``slime.engines.interface``; its ``clients`` and ``update_weights_from_tensor``).
        state_fn: blocking, returns a copy of the trainer's weights (CPU or CUDA).
    """

    def __init__(self, config: SyncConfig, *, pool: WorkerPool, state_fn: StateFn):
        self.config = config
        self.pool = pool
        self.state_fn = state_fn
        self.stats: dict[str, float] = {}
        self._tp_size: int | None = None

    async def save(self, version: int) -> NamedTensors:
        return await snapshot(self.state_fn)

    async def load(self, staged: NamedTensors, version: int, *, abort_all_requests: bool = True) -> None:
        t0 = time.monotonic()
        if self._tp_size is None:
            sizes = {
                int(info.get("tp_size") or 1)
                for info in await asyncio.gather(*(c.server_info() for c in engines(self.pool)))
            }
            if len(sizes) != 1:
                raise ValueError(f"tensor weight sync needs engines of one tp_size, got {sorted(sizes)}")
            self._tp_size = sizes.pop()
        parts = buckets(staged, self.config.update_weight_buffer_size)
        num_bytes = 0
        async with weight_update_session(self.pool.clients):  # ``staged`` keeps CUDA IPC sources alive throughout
            for bucket in parts:
                cuda = bucket[0][1].device.type == "cuda"
                payload = await asyncio.to_thread(serialize_cuda_ipc if cuda else serialize_safetensors, bucket)
                await self.pool.update_weights_from_tensor(
                    [payload] * self._tp_size,
                    weight_version=str(version),
                    load_format=None,
                    abort_all_requests=abort_all_requests,
                    flush_cache=abort_all_requests,
                    timeout_s=self.config.update_weights_timeout_s,
                )
                num_bytes += sum(t.numel() * t.element_size() for _, t in bucket)
        dt = time.monotonic() - t0
        self.stats = {
            "bytes": num_bytes,
            "seconds": dt,
            "num_buckets": len(parts),
            "gb_per_s": num_bytes / max(dt, 1e-9) / 1e9,
        }

    async def close(self) -> None:
        """Nothing to release (for symmetry with ``DistributedWeightSync.close``)."""
