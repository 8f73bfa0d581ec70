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

Shapes: t = packed tokens, v = vocabulary rows on this rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from slime.train.logprobs import GREEDY_TEMPERATURE
from slime.train.megatron.fusion import fused

__all__ = ["vocab_parallel_logprobs"]

_CHUNK_ELEMENTS = 1 << 26
"""Tokens x vocabulary per eager chunk (256 MiB per fp32 temporary)."""


def _all_reduce(x: Tensor, op: Any, group: Any) -> Tensor:
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
        ctx, logits: Tensor, target: Tensor, scale: float, vocab_start: int, vocab_size: int, group: Any, entropy_grad: bool
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
        mean_z = lse - entropy  # sum_k p_k z_k, for the entropy's gradient (not the output itself: callers may edit that)
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
    group: Any = None,
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
