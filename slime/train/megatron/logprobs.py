"""Token logprobs and entropies from megatron's vocab-parallel logits, as the engine reports them.

The quantity is the torch backend's (``slime.train.logprobs``): ``log_softmax(logits / T)`` at the
next token, with T the rollout temperature (unscaled when T <= ``GREEDY_TEMPERATURE``), and the
entropy of that same distribution. Here each tensor-parallel rank holds a slice of the
vocabulary, so the softmax normaliser is summed over the TP group, and rows beyond the HF
vocabulary (``ModelArch.padded_vocab_size``) are masked out.

``vocab_parallel_logprobs`` is one autograd function built from two row-wise passes over the
logits, with z = logits / T in fp32 (x: this rank's logits, bf16 in training):

    forward   _row_stats: per token, over this rank's real columns, m = max z, s = sum exp(z - m),
              q = sum exp(z - m) (z - m), and z at the target. Combined over TP (max, then sums
              rescaled to the global max), lse = M + log S, logprob = z[target] - lse,
              entropy = log S - Q / S.
    backward  _logits_grad: p = exp(z - lse) recomputed from the saved logits, and
              d/dz_j = g_logprob (1[j = target] - p_j) + g_entropy p_j (sum_k p_k z_k - z_j),
              written straight in the logits' dtype.

Nothing [tokens, vocabulary]-sized is kept for the backward but the logits themselves (which the
output layer produced anyway), and on CUDA each pass is one fused kernel (``fusion.fused``:
``torch.compile``) that reads the bf16 logits once and writes only per-token statistics (forward)
or the gradient (backward). Elsewhere (CPU, ``SLIME_MEGATRON_COMPILE=0``) the same functions run
eagerly over chunks of tokens, so the fp32 temporaries stay at ``_CHUNK_ELEMENTS`` per pass. The
entropy is differentiable only with ``entropy_grad`` (an entropy bonus); either way its gradient
costs no extra pass.

``fused_linear_logprobs`` (``--logprob-impl liger``) computes the same two quantities from the
last hidden states and the output weight with liger-kernel's fused linear + scaled cross entropy,
which never materialises the logits: chunks of tokens in PyTorch on the CPU and most GPUs, one CuTe
DSL kernel per pass on Hopper (SM90, bf16, needs nvidia-cutlass-dsl).

Shapes: t = packed tokens, v = vocabulary rows on this rank, h = hidden size.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from slime.train.logprobs import GREEDY_TEMPERATURE
from slime.train.megatron.fusion import fused

__all__ = ["vocab_parallel_logprobs", "fused_linear_logprobs", "check_logprob_impl"]

_CHUNK_ELEMENTS = 1 << 26
"""Tokens x vocabulary per eager chunk (256 MiB per fp32 temporary)."""


def _all_reduce(x: Tensor, op: dist.ReduceOp.RedOpType, group: dist.ProcessGroup | None) -> Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(x, op=op, group=group)
    return x


@fused(dynamic_args=(0, 1))
def _row_stats(x: Tensor, local_target: Tensor, scale: float, num_real: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """x [t, v] (any float dtype), local_target [t] in [0, v) -> fp32 [t] each:
    m = max_j z_j, s = sum_j exp(z_j - m), q = sum_j exp(z_j - m) (z_j - m) over columns j < num_real
    (num_real >= 1), and z at local_target, where z = x * scale in fp32."""
    z = x.float() * scale
    if num_real < x.shape[-1]:
        real = torch.arange(x.shape[-1], device=x.device) < num_real
        z = torch.where(real, z, float("-inf"))
        m = z.amax(-1, keepdim=True)
        zs = z - m
        e = torch.exp(zs)
        q = (e * torch.where(real, zs, 0.0)).sum(-1)
    else:
        m = z.amax(-1, keepdim=True)
        zs = z - m
        e = torch.exp(zs)
        q = (e * zs).sum(-1)
    at_target = x.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).float() * scale
    return m.squeeze(-1), e.sum(-1), q, at_target


@fused(dynamic_args=(0, 1, 2, 3, 4, 5))
def _logits_grad(
    x: Tensor,
    local_target: Tensor,
    lse: Tensor,
    coef_lp: Tensor,
    coef_ent: Tensor | None,
    mean_z: Tensor | None,
    scale: float,
    num_real: int,
) -> Tensor:
    """Gradient of sum_i coef_lp_i logprob_i (+ sum_i coef_ent_i entropy_i) with respect to x [t, v],
    in x's dtype. local_target is -1 where the target is on another rank (no one-hot term here);
    mean_z [t] = sum_k p_k z_k (global), needed with coef_ent only."""
    z = x.float() * scale
    cols = torch.arange(x.shape[-1], device=x.device)
    p = torch.exp(z - lse.unsqueeze(-1))
    if num_real < x.shape[-1]:
        real = cols < num_real
        p = torch.where(real, p, 0.0)
        z = torch.where(real, z, 0.0)
    onehot = (cols == local_target.unsqueeze(-1)).float()
    grad = coef_lp.unsqueeze(-1) * (onehot - p)
    if coef_ent is not None and mean_z is not None:
        grad = grad + coef_ent.unsqueeze(-1) * p * (mean_z.unsqueeze(-1) - z)
    return (grad * scale).to(x.dtype)


def _chunks(x: Tensor) -> list[tuple[int, int]]:
    """Token ranges for one pass: the whole tensor where it runs fused (no temporaries), else bounded chunks."""
    t, v = x.shape
    step = t if _row_stats.compiles_for(x) and _logits_grad.compiles_for(x) else max(1, _CHUNK_ELEMENTS // max(v, 1))
    return [(i, min(i + step, t)) for i in range(0, t, step)] or [(0, 0)]


class _LogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        logits: Tensor,
        target: Tensor,
        scale: float,
        vocab_start: int,
        vocab_size: int,
        group: dist.ProcessGroup | None,
        entropy_grad: bool,
    ) -> tuple[Tensor, Tensor]:
        t, local = logits.shape
        num_real = min(max(vocab_size - vocab_start, 0), local)  # this rank's columns inside the HF vocab
        in_range = (target >= vocab_start) & (target < vocab_start + num_real)  # [t]
        local_target = (target - vocab_start).clamp(0, max(local - 1, 0))
        dev = logits.device
        if num_real == 0 or t == 0:  # no real column on this rank (or no tokens): neutral statistics
            m = torch.full((t,), float("-inf"), device=dev)
            s, q, at_target = (torch.zeros(t, device=dev) for _ in range(3))
        else:
            parts = [_row_stats(logits[a:b], local_target[a:b], scale, num_real) for a, b in _chunks(logits)]
            m, s, q, at_target = (torch.cat(xs) if len(parts) > 1 else xs[0] for xs in zip(*parts))
        at_target = at_target * in_range
        if group is not None and dist.get_world_size(group) > 1:
            big_m = _all_reduce(m.clone(), dist.ReduceOp.MAX, group)
            shift = m - big_m  # <= 0; -inf on a rank without real columns
            factor = torch.exp(shift)
            q = torch.where(s > 0, (q + shift * s) * factor, 0.0)  # sum exp(z - M) (z - M) on this rank
            s = s * factor
            stats = _all_reduce(torch.stack([at_target, s, q]), dist.ReduceOp.SUM, group)
            at_target, s, q = stats
            m = big_m
        log_s = s.log()
        logprob = (at_target - m) - log_s
        entropy = log_s - q / s
        lse = m + log_s
        mean_z = (
            lse - entropy
        )  # sum_k p_k z_k, for the entropy's gradient (not the output itself: callers may edit that)
        ctx.save_for_backward(logits, torch.where(in_range, local_target, -1), lse, mean_z)
        ctx.scale, ctx.num_real = scale, num_real
        ctx.set_materialize_grads(False)
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob: Tensor | None, grad_entropy: Tensor | None) -> tuple[Tensor | None, ...]:
        logits, local_target, lse, mean_z = ctx.saved_tensors
        none = (None,) * 6
        if grad_logprob is None and grad_entropy is None:
            return (None,) + none
        if ctx.num_real == 0:
            return (torch.zeros_like(logits),) + none
        coef_lp = grad_logprob.float() if grad_logprob is not None else torch.zeros_like(lse)
        coef_ent = grad_entropy.float() if grad_entropy is not None else None
        mean_z = mean_z if grad_entropy is not None else None
        chunks = _chunks(logits)
        if len(chunks) == 1:
            grad = _logits_grad(logits, local_target, lse, coef_lp, coef_ent, mean_z, ctx.scale, ctx.num_real)
        else:
            grad = torch.empty_like(logits)
            for a, b in chunks:
                sl = slice(a, b)
                grad[sl] = _logits_grad(
                    logits[sl],
                    local_target[sl],
                    lse[sl],
                    coef_lp[sl],
                    None if coef_ent is None else coef_ent[sl],
                    None if mean_z is None else mean_z[sl],
                    ctx.scale,
                    ctx.num_real,
                )
        return (grad,) + none


def vocab_parallel_logprobs(
    logits: Tensor,
    target: Tensor,
    *,
    temperature: float,
    vocab_size: int,
    tp_rank: int = 0,
    group: dist.ProcessGroup | None = None,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor]:
    """Logprob of ``target`` and entropy at each position, under ``softmax(logits / temperature)``.

    Args:
        logits: [t, v] this rank's vocabulary slice (rows ``tp_rank * v .. (tp_rank + 1) * v``), any
            float dtype (computed in fp32; the gradient comes back in this dtype).
        target: [t] int64, global token ids.
        temperature: rollout temperature; <= ``GREEDY_TEMPERATURE`` means unscaled logits.
        vocab_size: the HF vocabulary; columns at or beyond it are padding and never sampled.
        tp_rank / group: tensor-parallel rank and group (None or a group of one: no reduction).
        entropy_grad: keep the entropy differentiable (entropy bonus); no extra memory or pass.

    Returns:
        logprob [t] float32 (differentiable) and entropy [t] float32, nats.
    """
    scale = 1.0 / temperature if temperature > GREEDY_TEMPERATURE else 1.0
    vocab_start = tp_rank * logits.shape[-1]
    return _LogprobEntropy.apply(logits, target, scale, vocab_start, vocab_size, group, bool(entropy_grad))


_LIGER_INSTALL = "pip install 'slime[liger]' (liger-kernel==0.8.5, which imports triton)"


def _liger_function() -> Any:  # Any: liger-kernel's autograd Function, an untyped third-party class
    """liger-kernel's ``LigerFusedLinearScaledCrossEntropyFunction``; ImportError naming the install if absent."""
    try:
        from liger_kernel.ops.fused_linear_scaled_cross_entropy import LigerFusedLinearScaledCrossEntropyFunction
    except ImportError as e:
        raise ImportError(f"--logprob-impl liger needs liger-kernel: {_LIGER_INSTALL} ({e})") from e
    return LigerFusedLinearScaledCrossEntropyFunction


def check_logprob_impl(
    impl: str, *, tensor_model_parallel_size: int, bf16: bool, device: torch.device | None = None
) -> None:
    """Refuse a ``--logprob-impl`` this set-up cannot run, before any model is built.

    Raises:
        ImportError: "liger" without liger-kernel (or, on a Hopper GPU, without nvidia-cutlass-dsl,
            which liger's SM90 kernel imports). ValueError: "liger" with TP > 1 (the vocabulary-sharded
            variant is not wired), or on a Hopper GPU without ``--bf16`` (its kernel takes bf16 only).
    """
    if impl != "liger":
        return
    if tensor_model_parallel_size > 1:
        raise ValueError(
            f"--logprob-impl liger runs at --tensor-model-parallel-size 1 only (got {tensor_model_parallel_size}); "
            "use --logprob-impl slime under tensor parallelism"
        )
    _liger_function()
    if device is not None and device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0):
        # liger dispatches every CUDA call on SM90 to its CuTe DSL kernel: bf16 only, and its import needs cutlass.
        if importlib.util.find_spec("cutlass") is None:
            raise ImportError(
                "--logprob-impl liger on an SM90 GPU (H100/H200) runs liger's CuTe DSL kernel, which needs nvidia-cutlass-dsl "
                "(pip install 'liger-kernel[cutedsl]==0.8.5'; scripts/gpu/fetch_wheels.sh with SLIME_FETCH_CUTEDSL=1)"
            )
        if not bf16:
            raise ValueError(
                "--logprob-impl liger on an SM90 GPU (H100/H200) needs --bf16 (liger's CuTe DSL kernel takes bf16 only)"
            )


def fused_linear_logprobs(
    hidden: Tensor, weight: Tensor, target: Tensor, *, temperature: float, vocab_size: int, entropy_grad: bool = False
) -> tuple[Tensor, Tensor]:
    """``vocab_parallel_logprobs(hidden @ weight.T, target, ...)`` at TP = 1, without the logits (liger-kernel).

    Args:
        hidden: [t, h] the final norm's output (any float dtype; cast to ``weight``'s, exact for a
            bf16 model whose hidden states came back as fp32 from ``Float16Module``).
        weight: [v, h] the output layer's weight (the embedding when tied); rows at or beyond
            ``vocab_size`` are padding and left out of the softmax (their gradient is zero).
        target: [t] int64 token ids in [0, vocab_size).
        temperature: rollout temperature; <= ``GREEDY_TEMPERATURE`` means unscaled logits.
        entropy_grad: keep the entropy differentiable (entropy bonus).

    Returns:
        logprob [t] float32 and entropy [t] float32, nats; gradients reach ``hidden`` and ``weight``.

    Raises:
        ImportError: liger-kernel is not installed.
    """
    fn = _liger_function()
    # Targets are packed token ids, always in range: skip the SM90 kernel's host-synchronising check.
    os.environ.setdefault("LIGER_SCALED_CE_SM90_VALIDATE_TARGETS", "0")
    w = weight[:vocab_size] if weight.shape[0] > vocab_size else weight
    if hidden.shape[0] == 0:  # liger refuses empty inputs; keep the graph connected for a loss of 0
        empty = hidden.sum(-1).float() * 0.0
        return empty, empty.detach()
    t = temperature if temperature > GREEDY_TEMPERATURE else 1.0
    nll, entropy = fn.apply(hidden.to(w.dtype), w, target, temperature=t, return_entropy=True)
    entropy = entropy.float()
    return -nll, entropy if entropy_grad else entropy.detach()
