"""Kernel candidates for the megatron backend, measured in the model side by side with the default before
one replaces it: ``scripts/gpu/bench_trainer.py --backends transformers,megatron,megatron+NAME`` builds the
megatron backend a second time inside ``CANDIDATES[NAME]()``, which swaps the candidate in for that backend's
build and steps only.

    swiglu_function   SwiGLU as an autograd Function that saves only its input, with one fused backward
                      kernel (megatron-core's ``bias_swiglu_impl`` structure, compiled under slime's
                      ``fusion.fused`` rules). The default differentiates the compiled forward. Kernel
                      micro-bench on an H200 (docs/bench_kernels_h200.json, megatron's own function as the
                      stand-in): 0.55 against 0.73 ms at f = 4,864, 0.79-1.11 against 0.97-1.18 ms at 8,960.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["CANDIDATES", "swiglu_function"]


def _swiglu_forward(x: Tensor) -> Tensor:
    """[..., 2 f] -> [..., f]: ``silu(gate) * up`` on the halves of megatron's gated ``linear_fc1`` output."""
    gate, up = torch.chunk(x, 2, dim=-1)
    return F.silu(gate) * up


def _swiglu_backward(grad: Tensor, x: Tensor) -> Tensor:
    """d/dx of ``sum(grad * _swiglu_forward(x))``, [..., 2 f] in x's dtype: with s = sigmoid(gate),
    d/dgate = grad * up * s * (1 + gate (1 - s)) and d/dup = grad * gate * s."""
    dt = torch.promote_types(x.dtype, torch.float32)  # bf16 math in fp32
    gate, up = torch.chunk(x.to(dt), 2, dim=-1)
    g = grad.to(dt)
    s = torch.sigmoid(gate)
    return torch.cat([g * up * s * (1 + gate * (1 - s)), g * gate * s], dim=-1).to(x.dtype)


_kernels: dict[str, Any] = {}


def _fused_kernels() -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor, Tensor], Tensor]]:
    """The two functions wrapped by ``fusion.fused`` (imported on first use: the megatron extra)."""
    if not _kernels:
        from slime.train.megatron.fusion import fused

        _kernels["fwd"] = fused(dynamic_args=(0,))(_swiglu_forward)
        _kernels["bwd"] = fused(dynamic_args=(0, 1))(_swiglu_backward)
    return _kernels["fwd"], _kernels["bwd"]


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return _fused_kernels()[0](x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return _fused_kernels()[1](grad, x)


def swiglu(x: Tensor) -> Tensor:
    """[..., 2 f] -> [..., f], the ``swiglu_function`` candidate for ``slime.train.megatron.layers._swiglu``."""
    return _SwiGLU.apply(x)


@contextmanager
def swiglu_function() -> Iterator[None]:
    """``layers._swiglu`` is ``swiglu`` inside the block (``SwiGLUMLP`` looks it up at each call)."""
    from slime.train.megatron import layers

    default = layers._swiglu
    layers._swiglu = swiglu  # type: ignore[assignment]
    try:
        yield
    finally:
        layers._swiglu = default


CANDIDATES: dict[str, Callable[[], AbstractContextManager[None]]] = {"swiglu_function": swiglu_function}
