"""Kernel candidates for the megatron backend, measured in the model side by side with the default before
one replaces it: ``scripts/gpu/bench_trainer.py --backends transformers,megatron,megatron+NAME`` builds the
megatron backend a second time inside ``CANDIDATES[NAME]()``, which swaps the candidate in for that backend's
build and steps only (after the default's, in the order of ``--backends``: put the candidate first in a second
run to see order effects). Only the megatron backend takes candidates.

    swiglu_function   SwiGLU as an autograd Function that saves only its input, with one fused backward
                      kernel (megatron-core's ``bias_swiglu_impl`` structure, compiled under slime's
                      ``fusion.fused`` rules). The default differentiates the compiled forward. Kernel
                      micro-bench on an H200 (docs/bench_kernels_h200.json, megatron's own function as the
                      stand-in, one width per process): 0.55 against 0.73 ms at f = 4,864, 0.79-1.11 against
                      0.97-1.18 ms at 8,960.
    cudnn_varlen      packed causal attention through cuDNN's ragged SDPA instead of torch's FA2 varlen
                      kernel: torch's own ``varlen_attn`` cuDNN branch, which torch 2.11-2.13 keep switched off
                      (``_should_use_cudnn`` returns False; later torch turns it on for SM90/SM100 with cuDNN >=
                      9.18), with key/value heads repeated (that branch takes no GQA). On an H200 dense cuDNN SDPA
                      ran 1.60 ms against varlen's 2.90 (4 x 4,096 tokens, 12 x 128 heads). Run it last in
                      ``--backends``: a kernel fault would end the process. The bench's loss and grad norm
                      beside the default's are its correctness check.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["CANDIDATES", "cudnn_varlen", "cudnn_varlen_attention", "swiglu", "swiglu_function"]


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


def cudnn_varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_len: int, scale: float) -> Tensor:
    """Causal attention per packed sequence by cuDNN: q [t, n, d], k/v [t, g, d], cu_seqlens [s + 1] int32 -> [t, n, d]
    (``layers._VARLEN``'s contract); torch's custom op keeps its autograd."""
    from torch.nn.attention import varlen

    n = q.shape[1]
    if k.shape[1] != n:
        k, v = k.repeat_interleave(n // k.shape[1], dim=1), v.repeat_interleave(n // v.shape[1], dim=1)
    kwargs: dict[str, Any] = {"is_causal": True}
    if "scale" in inspect.signature(varlen.varlen_attn).parameters:
        kwargs["scale"] = scale
    elif not math.isclose(scale, q.shape[-1] ** -0.5):  # older torch: the op's own 1/sqrt(d) only
        raise RuntimeError(f"cudnn_varlen: this torch's varlen op takes no softmax scale, and the model's is {scale}")
    return varlen._varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, **kwargs)[0]


@contextmanager
def cudnn_varlen() -> Iterator[None]:
    """``layers._VARLEN`` is ``cudnn_varlen_attention`` and torch's varlen op takes its cuDNN branch inside the block."""
    from torch.nn.attention import varlen

    from slime.train.megatron import layers

    default_fn, default_choice = layers._VARLEN, varlen._should_use_cudnn
    layers._VARLEN = cudnn_varlen_attention
    varlen._should_use_cudnn = lambda device_index: True  # type: ignore[assignment]
    try:
        yield
    finally:
        layers._VARLEN, varlen._should_use_cudnn = default_fn, default_choice


CANDIDATES: dict[str, Callable[[], AbstractContextManager[None]]] = {"swiglu_function": swiglu_function, "cudnn_varlen": cudnn_varlen}
