"""``SyncConfig``: how new weights reach the engines (``slime.sync``)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from slime.config._base import STRUCT, Range, check_ranges, require

__all__ = ["SyncConfig"]


class SyncConfig(msgspec.Struct, **STRUCT):
    """How new weights reach the engines after each train step (``slime/sync/``)."""

    method: Literal["disk", "distributed", "tensor", "delta"] = "disk"
    """``--weight-sync``: ``disk`` (safetensors + ``/update_weights_from_disk``), ``distributed``
    (broadcast over a gloo/NCCL group, ``/update_weights_from_distributed``), ``tensor`` (colocated:
    ``/update_weights_from_tensor``), ``delta`` (only what changed, checksummed; embedded engine)."""
    update_weight_buffer_size: Annotated[int, Range(ge=1, note="byte")] = 512 * 1024**2
    """Bytes per bucket of ``distributed`` / ``tensor`` / ``delta`` updates (``--update-weight-buffer-size``,
    slime's default 512 MiB): one HTTP call (and one flat broadcast) per bucket."""
    update_weights_timeout_s: Annotated[float, Range(gt=0, flag="update_weights_timeout_s")] = 600.0
    """Bound on each weight-update HTTP call, the process-group rendezvous and each collective."""
    colocate: bool = False
    """Engines share the trainer's devices (``--colocate``): each step pauses generation, releases
    engine memory, trains, resumes it and syncs (``/release_memory_occupation``, docs/sglang.md#memory). Launched
    SGLang servers then get the trainer's GPUs and ``--enable-memory-saver`` (``slime/engines/fleet/plan.py``)."""
    weights_dir: str = ""
    """Where new safetensors are written for ``/update_weights_from_disk`` (default: RUN_DIR/weights)."""
    keep_last: Annotated[int, Range(ge=1, flag="keep_last")] = 2
    """How many weight versions to keep on disk."""

    def validate(self) -> None:
        """Check this section's values.

        Raises:
            ConfigError: naming the flag.
        """
        check_ranges(self)
        require(
            [
                (
                    not (self.colocate and self.method == "delta"),
                    "--colocate with --weight-sync",
                    self.method,
                    "disk, distributed or tensor: released engine weights are lost (docs/sglang.md#memory), so every delta would be a full sync",
                ),
            ]
        )
