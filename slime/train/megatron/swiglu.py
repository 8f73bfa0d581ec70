"""SwiGLU for megatron's gated ``linear_fc1`` output: ``silu(gate) * up`` as an autograd Function.

The Function saves only its input and runs one compiled kernel each way (``fusion.fused``: on CUDA a
``torch.compile`` kernel with the token dimension dynamic; eager on the CPU), megatron-core's
``bias_swiglu_impl`` structure. Measured side by side in one process on an H200 against
differentiating the compiled forward (``swiglu_forward``, now the ``swiglu_autodiff`` candidate of
``slime.bench.candidates``): train+opt 1.503 against 1.528 s at the Qwen2-1.5B shape, 0.640 against 0.645 s
at 0.5B (docs/benchmarks.md). Shapes: x [..., 2 f] -> [..., f], in x's dtype; bf16 math runs in fp32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from slime.train.megatron.fusion import fused

__all__ = ["swiglu", "swiglu_forward"]


@fused(dynamic_args=(0,))
def swiglu_forward(x: Tensor) -> Tensor:
    """[..., 2 f] -> [..., f]: ``silu(gate) * up`` on the halves megatron's gated ``linear_fc1`` writes."""
    gate, up = torch.chunk(x, 2, dim=-1)
    return F.silu(gate) * up


@fused(dynamic_args=(0, 1))
def swiglu_backward(grad: Tensor, x: Tensor) -> Tensor:
    """d/dx of ``sum(grad * swiglu_forward(x))``, [..., 2 f] in x's dtype: with s = sigmoid(gate),
    d/dgate = grad * up * s * (1 + gate (1 - s)) and d/dup = grad * gate * s."""
    dt = torch.promote_types(x.dtype, torch.float32)
    gate, up = torch.chunk(x.to(dt), 2, dim=-1)
    g = grad.to(dt)
    s = torch.sigmoid(gate)
    return torch.cat([g * up * s * (1 + gate * (1 - s)), g * gate * s], dim=-1).to(x.dtype)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return swiglu_forward(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return swiglu_backward(grad, x)


def swiglu(x: Tensor) -> Tensor:
    """[..., 2 f] -> [..., f], ``silu(gate) * up``; the backward recomputes from x (nothing else saved)."""
    return _SwiGLU.apply(x)
