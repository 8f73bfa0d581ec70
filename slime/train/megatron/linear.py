"""The transformer layers' linear layers without megatron's extra passes, where no communication is involved.

Without Apex (``fused_weight_gradient_mlp_cuda``) megatron-core's linear function adds the bias in a
kernel of its own after the GEMM (a broadcast add, ~0.09 ms per 16k-token micro-batch for the Qwen2-1.5B
QKV projection on an H200), and its weight gradient is a bf16 GEMM output that megatron's DDP hook then
adds into the fp32 ``main_grad`` (one more pass over every weight per micro-batch: 792 fp32 adds, 26 ms of
a 1.5B RL step; docs/benchmarks.md). ``local_linear`` does what megatron's own
``gradient_accumulation_fusion`` does with Apex, with torch: the forward is ``F.linear`` (cuBLASLt adds the
bias in the GEMM's epilogue) and the backward accumulates the weight gradient straight into ``main_grad``
(``addmm`` with an fp32 output from bf16/fp16 inputs, torch >= 2.8 on CUDA), marking the weight
``grad_added_to_main_grad`` as megatron's function does, so the DDP hook skips its add.

``LocalColumnParallelLinear`` / ``LocalRowParallelLinear`` (class swaps of megatron's layers, same state)
take this path only when the call involves no communication inside the linear function: no data-gradient
all-reduce, no sequence-parallel gather, no deferred or remat'd weight gradient, megatron's own fusion off,
a trainable weight. Everything else goes to megatron's function unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from slime.train.megatron._mcore import mcore

__all__ = [
    "LocalColumnParallelLinear",
    "LocalRowParallelLinear",
    "local_linear",
    "accumulate_wgrad",
    "use_local_linears",
]


@functools.cache
def _mixed_addmm_works(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``aten.addmm.dtype_out`` accumulates ``dtype`` products into fp32 on this device type."""
    try:
        c = torch.ones(2, 2, device=device_type)  # in place: the result must keep what c held
        a = torch.ones(2, 3, device=device_type, dtype=dtype)
        torch.ops.aten.addmm.dtype_out(c, a, a.t(), torch.float32, out=c)
        return bool((c == 4).all())
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


def accumulate_wgrad(main_grad: Tensor, grad_output: Tensor, input: Tensor) -> bool:
    """``main_grad += grad_output.T @ input`` in one GEMM (grad_output [n, out], input [n, in], main_grad
    [out, in]); False (nothing done) when this device cannot accumulate those dtypes into main_grad's."""
    if grad_output.dtype == main_grad.dtype:
        main_grad.addmm_(grad_output.t(), input)
        return True
    if main_grad.dtype == torch.float32 and _mixed_addmm_works(main_grad.device.type, grad_output.dtype):
        torch.ops.aten.addmm.dtype_out(main_grad, grad_output.t(), input, torch.float32, out=main_grad)
        return True
    return False


class _LocalLinear(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx: Any, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(input)
        ctx.weight, ctx.has_bias = weight, bias is not None  # the Parameter itself: its main_grad
        return F.linear(input, weight, bias)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        (input,) = ctx.saved_tensors
        weight = ctx.weight
        grad_input = grad_output.matmul(weight) if ctx.needs_input_grad[0] else None
        g2 = grad_output.reshape(-1, grad_output.shape[-1])
        x2 = input.reshape(-1, input.shape[-1])
        main_grad = getattr(weight, "main_grad", None)
        grad_weight: Tensor | None = None
        if not ctx.needs_input_grad[1]:
            pass
        elif main_grad is not None and hasattr(weight, "grad_added_to_main_grad"):
            # Once this step has set the flag the DDP hook skips every add for this weight, so every call
            # accumulates here (a plain GEMM + add where this device cannot fuse the dtypes)
            if not accumulate_wgrad(main_grad, g2, x2):
                main_grad.add_(g2.t().matmul(x2))
            weight.grad_added_to_main_grad = True
            # megatron's convention: a placeholder keeps the DDP hook on this thread; zeros where the hook adds it anyway
            zeros = getattr(weight, "zero_out_wgrad", False)
            grad_weight = (torch.zeros if zeros else torch.empty)(weight.shape, dtype=input.dtype, device=input.device)
        else:
            grad_weight = g2.t().matmul(x2)
        grad_bias = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_input, grad_weight, grad_bias


def local_linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(input, weight, bias)`` ([..., in] -> [..., out]) whose backward accumulates the weight
    gradient into ``weight.main_grad`` when megatron's DDP gave it one (module docstring)."""
    return _LocalLinear.apply(input, weight, bias)


enabled = True
"""False: every call goes to megatron's function (the bench's ``megatron_linear`` candidate). Change it between
optimizer steps only: a weight whose gradient went to ``main_grad`` here has DDP skip its add until the next
``zero_grad_buffer``, so a later call through megatron's function in the same step would lose its gradient."""


def _local_call(weight: Tensor, kwargs: dict[str, object]) -> bool:
    return (
        enabled
        and weight.requires_grad
        and not kwargs.get("allreduce_dgrad", False)
        and not kwargs.get("sequence_parallel", False)
        and not kwargs.get("gradient_accumulation_fusion", False)
        and kwargs.get("grad_output_buffer") is None
        and kwargs.get("gtp_remat_size", 1) == 1
    )


class _LocalImpl:
    def _forward_impl(self, input: Tensor, weight: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if args or not _local_call(weight, kwargs):
            return super()._forward_impl(input, weight, *args, **kwargs)  # type: ignore[misc]  # megatron's layer
        return local_linear(input, weight, kwargs.get("bias"))


_tp: Any = mcore("megatron.core.tensor_parallel")


class LocalColumnParallelLinear(_LocalImpl, _tp.ColumnParallelLinear):
    """megatron's ``ColumnParallelLinear`` taking ``local_linear`` for calls without communication."""


class LocalRowParallelLinear(_LocalImpl, _tp.RowParallelLinear):
    """megatron's ``RowParallelLinear`` taking ``local_linear`` (its communication is outside the linear)."""


def use_local_linears(model: torch.nn.Module) -> int:
    """Make the linear layers inside ``model``'s transformer layers (QKV, output projection, FFN) the
    ``Local*`` classes (same state; the embedding and the output layer stay); returns how many."""
    layer_cls = mcore("megatron.core.transformer.transformer_layer").TransformerLayer
    swaps = {_tp.ColumnParallelLinear: LocalColumnParallelLinear, _tp.RowParallelLinear: LocalRowParallelLinear}
    n = 0
    for layer in model.modules():
        if isinstance(layer, layer_cls):
            for module in layer.modules():
                if type(module) in swaps:
                    module.__class__ = swaps[type(module)]
                    n += 1
    return n
