"""Weight sync: getting the trainer's new weights into every engine after each train step.

| ``--weight-sync`` | transport | bytes on the wire | engines |
| --- | --- | --- | --- |
| ``disk`` (default) | safetensors on a shared file system, ``/update_weights_from_disk`` | full, via disk | any |
| ``distributed`` | broadcast from the trainer (rank 0) over a gloo (CPU) / NCCL (GPU) group, ``/update_weights_from_distributed`` | full, one collective per tensor or per bucket | any; NCCL needs separate GPUs |
| ``tensor`` | ``/update_weights_from_tensor``: CUDA IPC handles (real SGLang) or safetensors (embedded engine) | none for CUDA IPC (same node) | colocated |
| ``delta`` | only changed tensors / elements, sha256-checked, full-sync fallback | see docs/benchmarks.md | embedded engine; SGLang via a custom loader |

Every strategy is a ``WeightSync`` (``base.py``): ``save(version)`` stages while generation goes
on, ``load(staged, version, abort_all_requests=)`` pushes while the scheduler has generation paused;
``--update-weight-buffer-size`` bounds each request (and each flat broadcast). ``close()`` releases
what a strategy holds (the process group). With ``--colocate`` the step releases engine memory
before training and resumes it before the sync (``slime.loop.step``).

Layout::

    base.py           WeightSync protocol, the 0.5.23 begin/end session, snapshots
    wire.py           buckets, flat buckets, checksums, tensor payloads (safetensors / CUDA IPC)
    group.py          the weights-update process group, apart from any default group
    codec.py          delta encodings and the delta payload
    hf_layout.py      HF checkpoint names vs transformers' in-memory names (fused MoE experts)
    disk.py, distributed.py, tensor.py, delta.py    the strategies
    sglang_loader.py  the delta loader a real SGLang server would run (--custom-weight-loader)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from slime.config import SyncConfig
from slime.sync.base import WeightSource, WeightSync

if TYPE_CHECKING:  # types only: sync never imports the client side at run time
    from slime.engines.interface import WorkerPool

__all__ = ["WeightSync", "build_weight_sync"]


def build_weight_sync(config: SyncConfig, *, pool: WorkerPool, trainer: WeightSource, weights_dir: str) -> WeightSync:
    """The strategy ``config.method`` names, wired to ``pool`` and ``trainer`` (``save_hf``,
    ``state_dict_for_sync``). ``delta`` starts from the trainer's current weights as the engines'
    base: both loaded the same checkpoint, and the checksums catch it if not."""
    if config.method == "disk":
        from slime.sync.disk import DiskWeightSync

        return DiskWeightSync(
            msgspec.structs.replace(config, weights_dir=weights_dir), pool=pool, save_fn=trainer.save_hf
        )
    if config.method == "distributed":
        from slime.sync.distributed import DistributedWeightSync

        return DistributedWeightSync(config, pool=pool, state_fn=trainer.state_dict_for_sync)
    if config.method == "tensor":
        from slime.sync.tensor import TensorWeightSync

        return TensorWeightSync(config, pool=pool, state_fn=trainer.state_dict_for_sync)
    if config.method == "delta":
        from slime.sync.delta import DeltaWeightSync

        return DeltaWeightSync(
            config, pool=pool, state_fn=trainer.state_dict_for_sync, base=trainer.state_dict_for_sync()
        )
    raise ValueError(f"unknown weight sync method {config.method!r}")
