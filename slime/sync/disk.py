"""Weight sync through a shared file system: safetensors on disk + ``/update_weights_from_disk``.

Ordering for one update to version N (a test pins it):

1. the trainer writes ``WEIGHTS_DIR/vN/`` (HF config + ``model.safetensors``) atomically, while
   generation goes on;
2. the scheduler pauses: gate closed, every request aborted and returned (partials kept);
3. every engine loads ``vN`` with ``weight_version="N"`` (``abort_all_requests`` as a guard; the
   prefix cache is flushed only then: never while requests are paused in place);
4. the version held by the engines becomes N, and generation resumes, partial rollouts first.

Only the last ``keep_last`` versions stay on disk.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from slime.config import SyncConfig

if TYPE_CHECKING:  # types only: this part never imports the client side at run time
    from slime.engines.interface import EnginePool

__all__ = ["DiskWeightSync"]


class DiskWeightSync:
    """Push trainer weights to every engine through the file system.

    Args:
        config: the sync section (``weights_dir``, ``keep_last``).
        pool: an ``EnginePool`` (``slime.engines.interface``; ``update_weights_from_disk(path, weight_version=)``).
        save_fn: blocking ``save_fn(out_dir)`` writing an HF checkpoint (run in a thread).
    """

    def __init__(self, config: SyncConfig, *, pool: EnginePool, save_fn: Callable[[str], object]):
        if not config.weights_dir:
            raise ValueError("SyncConfig.weights_dir is empty")
        self.config = config
        self.pool = pool
        self.save_fn = save_fn
        self.dir = Path(config.weights_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._written: list[Path] = []

    async def save(self, version: int) -> Path:
        """Write the trainer's weights for ``version`` (step 1; generation may go on)."""
        path = self.dir / f"v{version}"
        await asyncio.to_thread(self.save_fn, str(path))
        self._written.append(path)
        return path

    async def load(self, path: Path, version: int, *, abort_all_requests: bool = True) -> None:
        """Make every engine load ``path`` as ``version`` (step 3; call while paused).

        ``abort_all_requests=False`` for an in-place update (async mode): paused requests stay and
        continue on the new weights, and the prefix cache is not flushed (SGLang 0.5.17 asserts the
        flush succeeded and dies when requests are paused in place; ``kv_cache_version`` records it)."""
        await self.pool.update_weights_from_disk(
            str(path), weight_version=str(version), abort_all_requests=abort_all_requests, flush_cache=abort_all_requests
        )
        while len(self._written) > max(1, self.config.keep_last):
            old = self._written.pop(0)
            await asyncio.to_thread(shutil.rmtree, old, True)

    async def close(self) -> None:
        """Nothing to release (for symmetry with ``DistributedWeightSync.close``)."""
