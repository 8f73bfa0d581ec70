"""Token logprobs and entropies from megatron's vocab-parallel logits, as the engine reports them.

The quantity is the torch backend's (``slime.train.logprobs``): ``log_softmax(logits / T)`` at the
next token, with T the rollout temperature (unscaled when T <= ``GREEDY_TEMPERATURE``), and the
entropy of that same distribution. Here each tensor-parallel rank holds a slice of the
vocabulary, so the softmax normaliser is summed over the TP group, and rows beyond the HF
vocabulary (``ModelArch.padded_vocab_size``) are masked out.

``vocab_parallel_logprobs`` is one autograd function: it saves only the softmax for the backward
pass (d logprob / d logit_j = 1[j = target] - p_j), not the intermediate copies a composite
``log_softmax`` + ``gather`` would keep, which matters at [16k tokens, 152k vocabulary]. Its
entropy is detached; with an entropy bonus (``entropy_grad``) a composite version runs instead.

Shapes: t = packed tokens, v = vocabulary rows on this rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from slime.train.logprobs import GREEDY_TEMPERATURE
from slime.train.megatron._mcore import mcore

__all__ = ["vocab_parallel_logprobs"]


def _all_reduce(x: Tensor, op: Any, group: Any) -> Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(x, op=op, group=group)
    return x


class _LogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, scale: float, vocab_start: int, vocab_size: int, group: Any) -> tuple[Tensor, Tensor]:
        z = logits.float() * scale  # [t, v], a new tensor
        local = z.shape[-1]
        num_real = min(max(vocab_size - vocab_start, 0), local)  # this rank's columns inside the HF vocab
        if num_real < local:
            z[:, num_real:] = float("-inf")
        m = z.max(dim=-1).values  # [t]
        _all_reduce(m, dist.ReduceOp.MAX, group)
        z -= m.unsqueeze(-1)
        in_range = (target >= vocab_start) & (target < vocab_start + num_real)  # [t]
        local_target = (target - vocab_start).clamp(0, local - 1)
        predicted = z.gather(-1, local_target.unsqueeze(-1)).squeeze(-1) * in_range  # [t]
        ez = torch.exp(z)  # [t, v]
        sum_exp = ez.sum(-1)  # [t]
        if num_real < local:
            z[:, num_real:] = 0.0
        pz = torch.einsum("tv,tv->t", ez, z)  # [t], sum of exp(z) * z over this rank's vocabulary (no [t, v] temporary)
        del z
        stats = torch.stack([predicted, sum_exp, pz])  # [3, t]
        _all_reduce(stats, dist.ReduceOp.SUM, group)
        predicted, sum_exp, pz = stats
        log_z = sum_exp.log()
        logprob = predicted - log_z
        entropy = log_z - pz / sum_exp
        softmax = ez.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_target, in_range)
        ctx.scale = scale
        ctx.mark_non_differentiable(entropy)
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob: Tensor, _grad_entropy: Tensor | None) -> tuple[Tensor | None, ...]:
        softmax, local_target, in_range = ctx.saved_tensors
        grad = softmax.mul_(-grad_logprob.unsqueeze(-1))  # [t, v], reuses the saved buffer
        grad.scatter_add_(-1, local_target.unsqueeze(-1), (grad_logprob * in_range).unsqueeze(-1))
        grad.mul_(ctx.scale)
        return grad, None, None, None, None, None


def _composite(logits: Tensor, target: Tensor, scale: float, vocab_start: int, vocab_size: int, group: Any) -> tuple[Tensor, Tensor]:
    """Same values through plain autograd ops, so the entropy carries gradient (entropy bonus)."""

    def reduce(x: Tensor) -> Tensor:  # all-reduce forward, identity backward (every TP rank holds the same loss)
        if group is None or dist.get_world_size(group) == 1:
            return x
        return mcore("megatron.core.tensor_parallel.mappings").reduce_from_tensor_model_parallel_region(x, group=group)

    z = logits.float() * scale
    local = z.shape[-1]
    num_real = min(max(vocab_size - vocab_start, 0), local)
    pad = torch.zeros(local, dtype=torch.bool, device=z.device)
    pad[num_real:] = True
    z = z.masked_fill(pad, float("-inf"))
    with torch.no_grad():
        m = _all_reduce(z.max(dim=-1).values.clone(), dist.ReduceOp.MAX, group)
    z = z - m.unsqueeze(-1)
    log_z = reduce(z.exp().sum(-1)).log()
    in_range = (target >= vocab_start) & (target < vocab_start + num_real)
    local_target = (target - vocab_start).clamp(0, local - 1)
    predicted = reduce(z.gather(-1, local_target.unsqueeze(-1)).squeeze(-1) * in_range)
    p = (z - log_z.unsqueeze(-1)).exp()
    entropy = log_z - reduce((p * z.masked_fill(pad, 0.0)).sum(-1))
    return predicted - log_z, entropy


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
            float dtype (computed in fp32).
        target: [t] int64, global token ids.
        temperature: rollout temperature; <= ``GREEDY_TEMPERATURE`` means unscaled logits.
        vocab_size: the HF vocabulary; columns at or beyond it are padding and never sampled.
        tp_rank / group: tensor-parallel rank and group (None or a group of one: no reduction).
        entropy_grad: keep the entropy differentiable (entropy bonus); costs more memory.

    Returns:
        logprob [t] float32 (differentiable) and entropy [t] float32, nats.
    """
    scale = 1.0 / temperature if temperature > GREEDY_TEMPERATURE else 1.0
    vocab_start = tp_rank * logits.shape[-1]
    if entropy_grad and torch.is_grad_enabled():
        return _composite(logits, target, scale, vocab_start, vocab_size, group)
    return _LogprobEntropy.apply(logits, target, scale, vocab_start, vocab_size, group)
