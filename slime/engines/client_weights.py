"""``WeightSyncCalls``: the weight-update calls of ``EngineClient`` beyond ``/update_weights_from_disk``.

A mixin so that ``client.py`` stays about transport and generation; every method goes through
``EngineClient._call`` (same error mapping: 4xx and ``"success": false`` raise ``EngineRequestError``).
Protocol facts: docs/sglang.md. The strategies that use these calls live in
``slime/sync/``; the embedded engine serves them in ``slime/servers/embedded/weights.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from slime.errors import EngineRequestError

__all__ = ["WeightSyncCalls"]


class WeightSyncCalls:
    """Mixed into ``EngineClient``; needs its ``_call(method, endpoint, body, *, timeout_s, raw)``."""

    if TYPE_CHECKING:  # provided by EngineClient, which this class is mixed into

        async def _call(
            self, method: str, endpoint: str, body: Any = None, *, timeout_s: float | None = None, raw: bytes | None = None
        ) -> Any: ...

    # ``timeout_s`` defaults to ``control_timeout_s``; the sync strategies pass their own bound.

    async def begin_weight_update(self, selector: str = "all") -> bool:
        """``POST /begin_weight_update {"selector"}`` (docs/sglang.md#update-weights-from-distributed, 0.5.23). True: a session is open; False:
        404, the engine has no sessions (SGLang before 0.5.23 needs none).

        Raises:
            EngineRequestError: 400, e.g. a session is already open (a second begin without end fails).
        """
        return await self._call_unless_404("/begin_weight_update", {"selector": selector})

    async def end_weight_update(self) -> bool:
        """``POST /end_weight_update {}`` (docs/sglang.md#update-weights-from-distributed, 0.5.23). True: the session is closed; False: 404 (no sessions)."""
        return await self._call_unless_404("/end_weight_update", {})

    async def _call_unless_404(self, endpoint: str, body: dict[str, Any]) -> bool:
        try:
            await self._call("POST", endpoint, body)
        except EngineRequestError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """``POST /init_weights_update_group`` (docs/sglang.md#update-weights-from-distributed): the engine's TP ranks join as ``rank_offset + tp_rank``.
        Blocks until every rank (the trainer, rank 0, included) has joined: start the trainer's side first."""
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        return await self._call("POST", "/init_weights_update_group", body, timeout_s=timeout_s)

    async def destroy_weights_update_group(self, group_name: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """``POST /destroy_weights_update_group {"group_name"}`` (docs/sglang.md#update-weights-from-distributed, 0.5.6+)."""
        return await self._call("POST", "/destroy_weights_update_group", {"group_name": group_name}, timeout_s=timeout_s)

    async def update_weights_from_distributed(
        self,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        *,
        group_name: str,
        weight_version: str,
        abort_all_requests: bool = False,
        flush_cache: bool = True,
        load_format: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """``POST /update_weights_from_distributed`` (docs/sglang.md#update-weights-from-distributed). The engine receives one ``broadcast(src=0)``
        per tensor in list order (one flat uint8 buffer with ``load_format="flattened_bucket"``) while
        this call is pending; the caller must broadcast the same tensors concurrently.
        ``dtypes`` are torch attribute names (``"float32"``)."""
        body = {
            "names": list(names),
            "dtypes": list(dtypes),
            "shapes": [list(s) for s in shapes],
            "group_name": group_name,
            "weight_version": weight_version,
            "abort_all_requests": abort_all_requests,
            "flush_cache": flush_cache,
            "load_format": load_format,
        }
        return await self._call("POST", "/update_weights_from_distributed", body, timeout_s=timeout_s)

    async def update_weights_from_tensor(
        self,
        serialized_named_tensors: Sequence[str],
        *,
        weight_version: str,
        load_format: str | None = None,
        abort_all_requests: bool = False,
        flush_cache: bool = True,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """``POST /update_weights_from_tensor`` (docs/sglang.md#update-weights-from-tensor): one base64 payload per TP rank (see ``slime.sync.wire``)."""
        body = {
            "serialized_named_tensors": list(serialized_named_tensors),
            "load_format": load_format,
            "weight_version": weight_version,
            "abort_all_requests": abort_all_requests,
            "flush_cache": flush_cache,
        }
        return await self._call("POST", "/update_weights_from_tensor", body, timeout_s=timeout_s)

    async def update_weights_from_delta(self, payload: bytes, *, timeout_s: float | None = None) -> dict[str, Any]:
        """``POST /update_weights_from_delta`` (slime's embedded engine only, not SGLang): ``payload`` is a
        safetensors file from ``slime.sync.codec.encode_payload``. Returns ``{"success", "message",
        "checksums": {name: sha256 hex}}`` of every tensor it wrote, read back from the live model."""
        return await self._call("POST", "/update_weights_from_delta", raw=payload, timeout_s=timeout_s)
