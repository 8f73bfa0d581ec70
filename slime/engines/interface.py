"""What the rest of slime needs from a pool of engines, as Protocols (the typed seam of the client side).

Three levels, each a superset of the one before; a caller names the smallest one it uses:

    GeneratePool   generate                              generate functions (default, multi-turn, plugins),
                                                         the teacher scorer, the decode-cost probe
    EnginePool     + abort, pause/continue, weights      the scheduler, steps, eval, disk weight sync,
                     from disk, memory release/resume    the bench's in-process pools
    WorkerPool     + each worker's client, in-flight     weight sync over tensors/NCCL (per worker),
                     counts, tensor/NCCL weight updates   metrics, starting engines

``HttpEnginePool`` (``pool.py``) is the one implementation of all three over SGLang's HTTP API; the
benchmark's in-process pools (``slime/bench/overhead.py``) implement ``EnginePool``. The type
checker (docs/ARCHITECTURE.md, "Typed seams") checks both against these Protocols.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Literal, Protocol

from slime.engines.client import EngineClient
from slime.engines.protocol import GenerateResult
from slime.types import JsonObject

__all__ = ["GeneratePool", "EnginePool", "WorkerPool", "PauseMode"]

PauseMode = Literal["abort", "retract", "in_place"]
"""SGLang's ``/pause_generation`` modes (docs/sglang.md#pause)."""


class GeneratePool(Protocol):
    """One ``/generate`` call on some engine of the pool."""

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, object],
        *,
        rid: str | None = None,
        return_logprob: bool = True,
        sticky_key: str | None = None,
        logprob_start_len: int | None = None,
    ) -> GenerateResult:
        """The engine's result for ``input_ids`` (``[num_tokens]`` token ids) and SGLang ``sampling_params``.

        ``rid`` names the request for aborts (docs/sglang.md#abort); ``sticky_key`` keeps one trajectory's
        turns on one engine. An aborted request returns its tokens so far with ``finish_reason`` abort.

        Raises:
            EngineRequestError: the engine refused the request (4xx); the sample fails, the run goes on.
            EngineUnavailable: no engine answered after the pool's retries.
        """
        ...

    @property
    def kv_cache_version(self) -> str | None:
        """The ``weight_version`` at which every engine's prefix cache was last emptied; None when unknown
        or not tracked (a pool without a prefix cache: its tokens are then never tagged older)."""
        ...


class EnginePool(GeneratePool, Protocol):
    """A pool the rollout loop can drive: generate, abort, pause, and load weights from disk.

    Every call addresses every engine; each returns ``{engine url: reply}`` for the engines that answered.
    """

    async def abort_all(self) -> dict[str, None]:
        """Abort every request in flight; they come back with their tokens so far (PARTIAL samples)."""
        ...

    async def pause_generation(self, mode: PauseMode = "abort") -> dict[str, None]: ...

    async def continue_generation(self) -> dict[str, None]: ...

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str, *, abort_all_requests: bool = False, flush_cache: bool = True
    ) -> dict[str, JsonObject]:
        """Every engine loads the HF checkpoint at ``model_path`` and reports ``weight_version`` from then on."""
        ...

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> dict[str, None]:
        """Free the engines' GPU memory (``tags``: None = weights and KV cache) for a colocated trainer."""
        ...

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> dict[str, None]: ...

    @property
    def num_prefix_cache_hits(self) -> int:
        """Results that reused cached KV (``cached_tokens > 0``) since ``kv_cache_version`` was last set
        (0 for a pool without a prefix cache); async updates abort and flush once it is above 0."""
        ...

    def give_up_inflight(self, reason: str, *, running_for_s: float = 0.0) -> list[str] | None:
        """End every generate on an engine for ``running_for_s`` s or more (a hung engine) as an abort;
        returns the urls of those engines, or None when the pool cannot tell its requests per engine
        (an in-process pool: the scheduler's drain then says the engine ignores aborts)."""
        ...


class WorkerPool(EnginePool, Protocol):
    """An ``EnginePool`` whose workers are addressed one by one (weight sync over tensors or NCCL, metrics)."""

    @property
    def clients(self) -> list[EngineClient]:
        """Workers in rotation: the ones control calls and weight updates address."""
        ...

    @property
    def urls(self) -> list[str]:
        """Every worker, in rotation or not."""
        ...

    @property
    def num_inflight(self) -> int:
        """Generate calls in flight over all workers."""
        ...

    @property
    def paused_mode(self) -> str | None: ...

    @property
    def memory_released(self) -> bool: ...

    @property
    def router_url(self) -> str | None:
        """The router in front of the workers, None without one."""
        ...

    def weight_update(self, weight_version: str, *, flush_cache: bool) -> AbstractAsyncContextManager[None]:
        """Inside: a sync that sends to each worker itself loads ``weight_version`` (no rejoin meanwhile); the
        pool's ``latest_version`` and, when the caches were flushed, ``kv_cache_version`` say so."""
        ...

    async def update_weights_from_tensor(
        self,
        serialized_named_tensors: Sequence[str],
        *,
        weight_version: str,
        load_format: str | None = None,
        abort_all_requests: bool = False,
        flush_cache: bool = True,
        timeout_s: float | None = None,
    ) -> dict[str, JsonObject]:
        """Every worker loads the same payload (one base64 string per TP rank); ``{url: reply}``."""
        ...

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
    ) -> dict[str, JsonObject]:
        """Every worker receives one bucket over the weights-update group (the caller broadcasts it)."""
        ...

    async def wait_ready(self, timeout_s: float) -> None:
        """Wait until every worker answers ``/health_generate``; raises ``EngineTimeout`` past ``timeout_s``."""
        ...
