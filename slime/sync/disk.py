"""Weight sync through a shared file system: safetensors on disk + ``/update_weights_from_disk``.

Ordering for one update to version N (a test pins it):

1. the trainer writes ``WEIGHTS_DIR/vN/`` (HF config + ``model.safetensors``) atomically, while
   generation goes on;
2. the scheduler pauses: gate closed, every request aborted and returned (partials kept);
3. every engine loads ``vN`` with ``weight_version="N"`` (``abort_all_requests`` as a guard; the
   prefix cache is flushed only then: never while requests are paused in place);
4. the version held by the engines becomes N, and generation resumes, partial rollouts first.

Only the last ``keep_last`` versions stay on disk. A full disk is one line naming ``ENOSPC``'s path and
the disk (``slime.errors.DiskFullError``).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from slime.config import SyncConfig
from slime.errors import DiskFullError, disk_full_error

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
        """Write the trainer's weights for ``version`` (step 1; generation may go on).

        Raises:
            DiskFullError: the disk of ``weights_dir`` is full (``ENOSPC``): one line naming the path, the
                disk, its free space and the size of the last version (``save_fn``'s partial folder is its to remove).
        """
        path = self.dir / f"v{version}"
        try:
            await asyncio.to_thread(self.save_fn, str(path))
        except Exception as exc:
            full = disk_full_error(
                exc, what=f"weight sync (--weight-sync disk) of version {version}", path=path, needed_bytes=self._size()
            )
            if full is None:
                raise
            raise DiskFullError(
                f"{full}; free space there, or set weights_dir (the sync section) to a larger disk"
            ) from exc
        self._written.append(path)
        return path

    def _size(self) -> int | None:
        """Bytes of the last version written (what the next one needs), or None before the first."""
        if not self._written or not self._written[-1].is_dir():
            return None
        return sum(p.stat().st_size for p in self._written[-1].rglob("*") if p.is_file())

    async def load(self, path: Path, version: int, *, abort_all_requests: bool = True) -> None:
        """Make every engine load ``path`` as ``version`` (step 3; call while paused).

        ``abort_all_requests=False`` for an in-place update (async mode): paused requests stay and
        continue on the new weights, and the prefix cache is not flushed (SGLang 0.5.17 asserts the
        flush succeeded and dies when requests are paused in place; ``kv_cache_version`` records it)."""
        await self.pool.update_weights_from_disk(
            str(path),
            weight_version=str(version),
            abort_all_requests=abort_all_requests,
            flush_cache=abort_all_requests,
        )
        while len(self._written) > max(1, self.config.keep_last):
            old = self._written.pop(0)
            await asyncio.to_thread(shutil.rmtree, old, True)

    async def close(self) -> None:
        """Nothing to release (for symmetry with ``DistributedWeightSync.close``)."""
