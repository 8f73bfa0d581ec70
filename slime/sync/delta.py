"""Weight sync by delta: send only what changed since the version the engines hold, verified by checksum.

The trainer side keeps ``base``: the exact tensors every engine was last confirmed to hold (a full
copy of the weights in the engine's dtype, in CPU memory). One update to version N::

    encoded = [codec.encode_tensor(name, base[name], new[name]) ...]   # unchanged tensors drop out
    for each engine, concurrently, inside weight_update_session:
        for bucket in buckets(encoded, update_weight_buffer_size):     # payload bytes per request
            POST /update_weights_from_delta  <safetensors payload>      # first bucket: base_weight_version
            compare the engine's sha256 of every tensor it wrote with ours
        on a mismatch or a refusal (wrong base version, weights released, ...):
            log a warning and send that engine a full sync (every tensor raw) the same way;
            a mismatch after a full sync raises RuntimeError (a bug, not drift)
    base = new

Before the first update ``base`` is what the caller says the engines loaded (the trainer's initial
weights: both sides read the same checkpoint), checked by the checksums like any delta; with no base
the first update is a full sync. Every request carries ``weight_version``.

Transport: the embedded engine serves ``/update_weights_from_delta`` (not an SGLang endpoint). A real
SGLang server would take the same payload through ``/update_weights_from_tensor`` with
``load_format="slime.sync.sglang_loader.load_delta"``, a loader registered with
``--custom-weight-loader`` (docs/sglang.md#update-weights-from-tensor); ``slime.sync.sglang_loader`` has both halves. That path is chosen
for engines whose ``/server_info`` does not say ``"engine": "slime-embedded"``; it is not verified
against a live SGLang server. Real SGLang engines hold bf16: pass ``engine_dtype=torch.bfloat16`` so
that deltas are taken between what the engine actually holds (docs/benchmarks.md has the sizes).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import pickle
import time
from typing import TYPE_CHECKING, Any

import torch

from slime.config import SyncConfig
from slime.errors import EngineRequestError
from slime.sync.base import StateFn, engines, snapshot, weight_update_session
from slime.sync.codec import ZLIB_LEVEL, EncodedTensor, encode_payload, encode_tensor
from slime.sync.wire import bucket_indices, serialize_cuda_ipc

if TYPE_CHECKING:  # types only: this part never imports the client side at run time
    from slime.engines.client import EngineClient
    from slime.engines.interface import WorkerPool

__all__ = ["DeltaWeightSync", "SGLANG_LOADER"]

log = logging.getLogger(__name__)

SGLANG_LOADER = "slime.sync.sglang_loader.load_delta"
"""The ``load_format`` (and ``--custom-weight-loader`` value) of the real-SGLang delta path."""


class DeltaWeightSync:
    """Push only changed weights to every engine, each checked by sha256 (see module doc).

    Args:
        config: ``update_weight_buffer_size`` (payload bytes per request), ``update_weights_timeout_s``.
        pool: the ``HttpEnginePool`` (its ``clients``).
        state_fn: blocking, returns a copy of the trainer's weights.
        base: the weights the engines hold now (None: the first update is a full sync).
        engine_dtype: the dtype the engines hold (None: the trainer's dtype; the embedded engine is fp32).
        level: zlib level of the delta parts.
    """

    def __init__(
        self,
        config: SyncConfig,
        *,
        pool: WorkerPool,
        state_fn: StateFn,
        base: dict[str, torch.Tensor] | None = None,
        engine_dtype: torch.dtype | None = None,
        level: int = ZLIB_LEVEL,
    ):
        self.config = config
        self.pool = pool
        self.state_fn = state_fn
        self.engine_dtype = engine_dtype
        self.level = level
        self.stats: dict[str, float] = {}
        self._base = None if base is None else {n: self._cast(t) for n, t in base.items()}
        self._base_version: str | None = None  # None: the engines' version string is not checked
        self._embedded: dict[str, bool] = {}

    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach().cpu()
        return t.to(self.engine_dtype) if self.engine_dtype is not None and t.is_floating_point() else t

    async def save(self, version: int) -> dict[str, torch.Tensor]:
        return {n: self._cast(t) for n, t in await snapshot(self.state_fn)}

    async def load(self, staged: dict[str, torch.Tensor], version: int, *, abort_all_requests: bool = True) -> None:
        t0 = time.monotonic()
        encoded = await asyncio.to_thread(self._encode, staged, self._base)
        clients = engines(self.pool)
        for c in clients:
            if c.url not in self._embedded:
                self._embedded[c.url] = (await c.server_info()).get("engine") == "slime-embedded"
        control = {
            "weight_version": str(version),
            "abort_all_requests": abort_all_requests,
            "flush_cache": abort_all_requests,
        }
        full: list[asyncio.Future] = []  # the full encoding, made once, on the first fallback
        # through the pool's weight state: a rejoining engine is compared with this version, cache-hit tokens with
        # the flush, and no rejoin slips in between two engines' loads
        async with (
            self.pool.weight_update(str(version), flush_cache=abort_all_requests),
            weight_update_session(clients),
        ):
            results = await asyncio.gather(*(self._push(c, encoded, staged, control, full) for c in clients))
        self._base, self._base_version = staged, str(version)
        sent = sum(r[0] for r in results)
        dt = time.monotonic() - t0
        full_bytes = sum(t.numel() * t.element_size() for t in staged.values())
        self.stats = {
            "bytes": sent,
            "full_bytes": full_bytes * len(clients),
            "seconds": dt,
            "num_changed_tensors": len(encoded),
            "num_full_fallbacks": sum(r[1] for r in results),
            "bytes_ratio": sent / max(1, full_bytes * len(clients)),
            "gb_per_s": full_bytes * len(clients) / max(dt, 1e-9) / 1e9,
        }

    def _encode(self, new: dict[str, torch.Tensor], base: dict[str, torch.Tensor] | None) -> list[EncodedTensor]:
        full = base is None
        out = [
            encode_tensor(n, None if base is None else base.get(n), t, level=self.level, full=full)
            for n, t in new.items()
        ]
        return [e for e in out if e is not None]

    async def _push(
        self,
        client: EngineClient,
        encoded: list[EncodedTensor],
        new: dict[str, torch.Tensor],
        control: dict[str, Any],
        full: list[asyncio.Future],
    ) -> tuple[int, bool]:
        """Send ``encoded`` to one engine; on a mismatch or refusal, a full sync. Returns (bytes sent, fell back)."""
        sent, problem = 0, None
        try:
            sent, problem = await self._send(client, encoded, {**control, "base_weight_version": self._base_version})
        except EngineRequestError as exc:
            if exc.status != 400:
                raise
            problem = f"the engine refused it: {exc.engine_message}"
        if problem is None:
            return sent, False
        log.warning(
            "delta weight sync to %s (version %s): %s; falling back to a full sync",
            client.url,
            control["weight_version"],
            problem,
        )
        if not full:
            full.append(asyncio.ensure_future(asyncio.to_thread(self._encode, new, None)))
        more, problem = await self._send(client, await full[0], {**control, "base_weight_version": None})
        if problem is not None:
            raise RuntimeError(
                f"full weight sync to {client.url} (version {control['weight_version']}) still mismatches: {problem}"
            )
        return sent + more, True

    async def _send(
        self, client: EngineClient, encoded: list[EncodedTensor], control: dict[str, Any]
    ) -> tuple[int, str | None]:
        """Send in buckets; returns (bytes, None) or (bytes, a description of the checksum mismatch)."""
        sent, bad = 0, []
        timeout_s = self.config.update_weights_timeout_s
        for i, bucket in enumerate(_buckets(encoded, self.config.update_weight_buffer_size)):
            payload = encode_payload(bucket, control if i == 0 else {**control, "base_weight_version": None})
            sent += len(payload)
            if self._embedded[client.url]:
                reply = await client.update_weights_from_delta(payload, timeout_s=timeout_s)
                got = reply.get("checksums") or {}
                bad += [e.name for e in bucket if got.get(e.name) != e.meta["sha256"]]
            else:  # real SGLang: the custom loader verifies the checksums itself and fails the call
                serialized, keepalive = _sglang_payload(payload)  # a CUDA IPC sender keeps the tensor alive
                await client.update_weights_from_tensor(
                    [serialized],
                    weight_version=control["weight_version"],
                    load_format=SGLANG_LOADER,
                    abort_all_requests=control["abort_all_requests"],
                    flush_cache=control["flush_cache"],
                    timeout_s=timeout_s,
                )
                del keepalive  # the engine has answered: it no longer reads the tensor
        if bad:
            return sent, f"sha256 mismatch on {len(bad)} of {len(encoded)} tensors (e.g. {bad[:3]})"
        return sent, None

    async def close(self) -> None:
        """Nothing to release (for symmetry with ``DistributedWeightSync.close``)."""


def _buckets(encoded: list[EncodedTensor], max_bytes: int) -> list[list[EncodedTensor]]:
    """``wire.buckets``' grouping of the encoded tensors (by their parts' bytes); one empty group when nothing
    changed (the request still sets ``weight_version``)."""
    groups = bucket_indices([(e.name, e.nbytes) for e in encoded], max_bytes)
    return [[encoded[i] for i in group] for group in groups] or [[]]


def _sglang_payload(payload: bytes) -> tuple[str, torch.Tensor]:
    """The payload as SGLang's ``serialized_named_tensors`` entry ``[("slime_delta", uint8 tensor)]``, and
    the tensor to keep alive until the engine answered: through CUDA IPC when a GPU is visible, else a
    plain pickle of a CPU tensor (⚠ whether 0.5.23's safe unpickler admits that is not verified)."""
    tensor = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    if torch.cuda.is_available():
        tensor = tensor.cuda()
        return serialize_cuda_ipc([("slime_delta", tensor)]), tensor
    return base64.b64encode(pickle.dumps([("slime_delta", tensor)])).decode("ascii"), tensor
