"""torch ``_foreach`` stand-ins for megatron-core's multi-tensor fallbacks (no Apex, no Transformer Engine).

Without either library megatron-core's optimizer falls back to ``megatron.core.utils``'s local versions of
``multi_tensor_l2norm`` and ``multi_tensor_scale``. The local l2 norm turns every parameter's norm into a
Python float (``torch.tensor(list_of_cuda_scalars)``): one host sync per parameter tensor, 170 to 200 per
step at the Qwen2 0.5B / 1.5B shapes on an H200 (``scripts/gpu/bench_trainer.py --profile``, "sync" lines).
The local scale copies main parameters to model parameters (and scales clipped gradients) one tensor at a
time, two kernels each. ``use_foreach_multi_tensor_ops`` swaps in the same operations built from torch's
multi-tensor kernels: no host sync, a few launches per list. Only megatron's own fallbacks are replaced;
Apex or Transformer Engine kernels, where installed, stay.

The functions keep the Apex call signature that megatron's ``multi_tensor_applier(op, noop_flag, lists, *args)``
passes on: ``op(chunk_size, noop_flag, tensor_lists, *args)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from slime.train.megatron._mcore import mcore

__all__ = ["foreach_l2_norm", "foreach_scale", "use_foreach_multi_tensor_ops"]


def foreach_l2_norm(
    chunk_size: int, noop_flag: Tensor, tensor_lists: list[list[Tensor]], per_tensor: bool, *args: Any
) -> tuple[Tensor, None]:
    """The l2 norm over every tensor of ``tensor_lists[0]`` as a float32 [1] tensor on their device (no host
    sync), and None (per-tensor norms are not computed; megatron asks for none). Raises ValueError on an
    empty list (megatron never passes one)."""
    tensors = tensor_lists[0]
    if not tensors:
        raise ValueError("foreach_l2_norm: no tensors")
    wide = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    norms = torch._foreach_norm(tensors, 2.0, dtype=wide)
    return torch.linalg.vector_norm(torch.stack(norms)).reshape(1).float(), None


def foreach_scale(chunk_size: int, noop_flag: Tensor, tensor_lists: list[list[Tensor]], scale: float) -> None:
    """``dst = src * scale`` for each pair of ``tensor_lists`` = [sources, destinations] (dtypes may differ:
    fp32 main parameters into bf16 model parameters); in place when the two lists are the same tensors."""
    src, dst = tensor_lists
    if len(src) != len(dst):
        raise ValueError(f"foreach_scale: {len(src)} sources for {len(dst)} destinations")
    if not src:
        return
    if all(s is d for s, d in zip(src, dst)):
        if scale != 1.0:
            torch._foreach_mul_(dst, scale)
        return
    torch._foreach_copy_(dst, src if scale == 1.0 else torch._foreach_mul(src, scale))


def use_foreach_multi_tensor_ops() -> dict[str, str]:
    """Replace megatron-core's local l2-norm and scale fallbacks (and only those) in its optimizer modules;
    returns {module.attribute: "foreach" | "kept"}. Idempotent."""
    local = mcore("megatron.core.utils")
    swaps = {
        "l2_norm_impl": (local.local_multi_tensor_l2_norm, foreach_l2_norm),
        "multi_tensor_scale_impl": (local.local_multi_tensor_scale, foreach_scale),
    }
    done: dict[str, str] = {}
    for name in ("megatron.core.optimizer.clip_grads", "megatron.core.optimizer.optimizer"):
        module = mcore(name)
        for attr, (fallback, ours) in swaps.items():
            current = getattr(module, attr, None)
            if current is None:
                continue
            if current is fallback:
                setattr(module, attr, ours)
            done[f"{name.rsplit('.', 1)[-1]}.{attr}"] = "foreach" if getattr(module, attr) is ours else "kept"
    return done
