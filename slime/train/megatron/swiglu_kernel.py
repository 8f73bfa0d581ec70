"""SwiGLU over megatron's fused ``linear_fc1`` output as two Triton kernels (forward, backward), on CUDA.

megatron's gated ``linear_fc1`` writes one [t, 2 f] tensor, gate then up. Compiled by Inductor
(``layers._swiglu``), the backward is one pointwise kernel over the [t, 2 f] gradient whose two halves
each load what they need (gate, up and the output gradient for the gate half; gate and the output gradient
for the up half): 5 loads per f-column where 3 suffice. At the Qwen2-1.5B shape on an H200 it ran
0.70 ms per 16k-token micro-batch, ~2.1 TB/s (docs/benchmarks.md). Here one program handles a tile of
f-columns of one row and writes both halves of the gradient, so each input element is read once.

No kernel library fits this layout: liger-kernel's ``LigerSiLUMulFunction`` takes gate and up as two
contiguous tensors (a copy of both halves here, more traffic than it saves), megatron-core's
``bias_swiglu_impl`` is the same Inductor/TorchScript pointwise code, and Transformer Engine's fused
``dswiglu`` is not installable on the target image.

Math (fp32 inside, one rounding to the input dtype at the end, as Inductor's fused kernel rounds):
``y = silu(g) * u``; ``dg = dy * u * s * (1 + g (1 - s))`` with ``s = sigmoid(g)``; ``du = dy * silu(g)``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU wheel of torch brings no Triton: ``available()`` says False
    triton = None

__all__ = ["available", "swiglu"]

_BLOCK = 1024  # f-columns per program: 2-3 KiB of each input row per tile, 4 warps


def available(x: Tensor) -> bool:
    """Whether ``swiglu`` can run on ``x``: Triton importable, ``x`` on CUDA (or the Triton interpreter,
    ``TRITON_INTERPRET=1``, for CPU tests), a floating dtype, an even last dimension."""
    if (
        triton is None
        or x.dim() == 0
        or x.dtype not in (torch.bfloat16, torch.float16, torch.float32)
        or x.shape[-1] % 2
    ):
        return False  # fp64 too: the kernels compute in fp32
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:

    @triton.jit
    def _forward_kernel(x_ptr, y_ptr, f, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < f
        gate = tl.load(x_ptr + row * 2 * f + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * 2 * f + f + cols, mask=mask, other=0.0).to(tl.float32)
        y = gate * tl.sigmoid(gate) * up
        tl.store(y_ptr + row * f + cols, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _backward_kernel(x_ptr, dy_ptr, dx_ptr, f, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < f
        gate = tl.load(x_ptr + row * 2 * f + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * 2 * f + f + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * f + cols, mask=mask, other=0.0).to(tl.float32)
        s = tl.sigmoid(gate)
        d_gate = dy * up * s * (1.0 + gate * (1.0 - s))
        d_up = dy * gate * s
        out = dx_ptr.dtype.element_ty
        tl.store(dx_ptr + row * 2 * f + cols, d_gate.to(out), mask=mask)
        tl.store(dx_ptr + row * 2 * f + f + cols, d_up.to(out), mask=mask)


def _grid(rows: int, f: int) -> tuple[int, int]:
    return (rows, triton.cdiv(f, _BLOCK))


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        x = x.contiguous()
        f = x.shape[-1] // 2
        rows = x.numel() // (2 * f) if f else 0
        y = x.new_empty(*x.shape[:-1], f)
        if rows and f:
            _forward_kernel[_grid(rows, f)](x, y, f, BLOCK=_BLOCK, num_warps=4)
        ctx.save_for_backward(x)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dy: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        dy = dy.contiguous()
        f = x.shape[-1] // 2
        rows = x.numel() // (2 * f) if f else 0
        dx = torch.empty_like(x)
        if rows and f:
            _backward_kernel[_grid(rows, f)](x, dy, dx, f, BLOCK=_BLOCK, num_warps=4)
        return dx


def swiglu(x: Tensor) -> Tensor:
    """[..., 2 f] (gate, then up) -> [..., f]: ``silu(gate) * up``, differentiable; needs ``available(x)``.

    Raises:
        RuntimeError: Triton is not installed.
    """
    if triton is None:
        raise RuntimeError("swiglu_kernel.swiglu needs Triton (a CUDA build of torch brings it)")
    return _SwiGLU.apply(x)
