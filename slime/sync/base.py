"""The ``WeightSync`` protocol every strategy follows, and the 0.5.23 weight-update session.

One update to version N, as ``slime.loop.step.run_step`` drives it::

    staged = await sync.save(N)         # 1. while generating: snapshot / write / encode the weights
    async with sched.paused(mode):      # 2. abort + drain, or pause in place (async mode)
        await sync.load(staged, N, abort_all_requests=mode == "abort")   # 3. engines at version N

``save`` must not touch the engines (generation goes on); ``load`` runs while nothing generates, so
that no token is sampled from a half-updated model between two buckets. Every strategy has an
idempotent ``close()``, called once at the end of the run: it releases what the strategy holds (a
process group) and does nothing for the others.

Sessions (docs/sglang.md#update-weights-from-distributed): SGLang 0.5.23 refuses ``/update_weights_from_tensor`` and
``/update_weights_from_distributed`` outside ``/begin_weight_update`` ... ``/end_weight_update``
(400, "... must run between begin_weight_update() and end_weight_update()"); 0.5.6 and older have no
such endpoints (404). ``weight_update_session`` opens one on every engine that knows them and
closes it afterwards, even on error. A session left open by a crashed trainer (a second begin
fails with 400) is ended and begun again once, with a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from slime.errors import EngineRequestError, EngineUnavailable

if TYPE_CHECKING:  # types only: this part never imports the client side at run time
    from slime.engines.client import EngineClient
    from slime.engines.interface import WorkerPool

__all__ = ["WeightSource", "WeightSync", "StateFn", "weight_update_session", "snapshot", "engines", "SESSION_HINT"]

log = logging.getLogger(__name__)

StateFn = Callable[[], dict[str, torch.Tensor]]
"""Blocking; returns a fresh copy of the trainer's weights keyed by HF name (``TorchTrainer.state_dict_for_sync``)."""

SESSION_HINT = "must run between begin_weight_update() and end_weight_update()"
"""The text of SGLang 0.5.23's 400 for an update outside a session (the embedded engine uses it too)."""


class WeightSource(Protocol):
    """What weight sync reads from a trainer (both backends implement it)."""

    def save_hf(self, out_dir: str) -> str:
        """Write the policy as an HF checkpoint into ``out_dir`` (blocking); returns the directory."""
        ...

    def state_dict_for_sync(self) -> dict[str, torch.Tensor]:
        """A fresh copy of the policy's weights keyed by HF name (blocking; see ``StateFn``)."""
        ...


class WeightSync(Protocol):
    async def save(
        self, version: int
    ) -> Any:  # Any: each strategy's own handle (a directory, named tensors), passed back to load
        """Step 1, while generating: stage the trainer's weights for ``version``; returns what ``load`` takes."""
        ...

    async def load(self, staged: Any, version: int, *, abort_all_requests: bool = True) -> None:
        """Step 3, while paused: make every engine hold ``staged`` as ``weight_version=str(version)``."""
        ...

    async def close(self) -> None:
        """Release what the strategy holds (a process group); idempotent, a no-op for most strategies."""
        ...


async def snapshot(state_fn: StateFn) -> list[tuple[str, torch.Tensor]]:
    """``state_fn()`` in a worker thread, as an ordered list of (name, tensor)."""
    return list((await asyncio.to_thread(state_fn)).items())


def engines(pool: WorkerPool) -> list[EngineClient]:
    """The pool's clients in rotation. Raises EngineUnavailable when there is none to sync."""
    clients = pool.clients
    if not clients:
        raise EngineUnavailable("no engine in rotation to receive the weights", endpoint="(weight sync)")
    return clients


async def _begin(client: EngineClient) -> bool:
    try:
        return await client.begin_weight_update()
    except EngineRequestError as exc:
        if exc.status != 400:
            raise
        log.warning(
            "%s: a weight-update session is already open (%s); ending it and beginning again",
            client.url,
            exc.engine_message,
        )
        await client.end_weight_update()
        return await client.begin_weight_update()


@contextlib.asynccontextmanager
async def weight_update_session(clients: Sequence[EngineClient]) -> AsyncIterator[dict[str, bool]]:
    """Open a 0.5.23 weight-update session on every engine that has them; yields ``{url: opened}``.

    Raises:
        EngineRequestError / EngineError: begin or end failed (after the one retry described above).
    """
    opened = dict(zip([c.url for c in clients], await asyncio.gather(*(_begin(c) for c in clients))))
    try:
        yield opened
    finally:
        await asyncio.gather(*(c.end_weight_update() for c in clients if opened[c.url]))
