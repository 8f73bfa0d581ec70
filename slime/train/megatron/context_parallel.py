"""Context parallelism without Transformer Engine: the sequence split, K/V all-gather attention, per-token outputs.

megatron-core's context-parallel attention is Transformer Engine's; this module is what the
backend runs instead, inside ``SDPACoreAttention`` (megatron's ``cp_comm_type="all_gather"``
scheme, the one Llama 3 trained long context with).

Split (``cp_split``): megatron's load-balanced causal split, per packed sequence as Transformer
Engine's "thd" context parallelism does it. Every segment of the packed micro-batch (a sample,
padded by ``pack_samples`` to a multiple of 2 x CP tokens; the tail padding is one more
segment) is cut into 2 x CP equal chunks, and CP rank r holds chunks r and 2 x CP - 1 - r of
each segment, back to back, in segment order. Every rank holds the same number of tokens and
about the same causal attention work (an early chunk with a late one). Example, CP=2, one
segment of 8 tokens: rank 0 holds tokens 0 1 6 7, rank 1 tokens 2 3 4 5.

Attention (``cp_attention``): each rank projects and rotates the q, k, v of its own tokens
(RoPE at each token's true position); k and v are all-gathered over the CP group and put back in
full order; each local query chunk c (of m tokens) of a segment attends that segment's keys
``[0, (c + 1) m)``, causal aligned to the bottom right (its query i sees keys up to c m + i). In
the backward the K/V gradients of every rank are summed back onto the rank that owns the tokens
(reduce-scatter; all-reduce and slice on gloo). Memory per rank: full K and V of the micro-batch
per layer (2 x g x d values per token: small with grouped-query attention), everything else 1/CP.
The attention runs per segment and chunk (two SDPA calls per sequence per layer).

Outputs (``gather_full``): per-token logprobs and entropies are all-gathered into the full
packed order, so every CP rank computes the same loss of the whole micro-batch. Its backward
hands each rank the gradient of its own tokens only (no sum: the ranks' losses are identical
copies), so megatron DDP's gradient sum over data x context parallel ranks gives exactly the
one-rank gradient, whatever the loss (token means, sequence means, sequence-level ratios).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:  # layers.py imports this module at run time
    from slime.train.megatron.layers import PackedRoPEParams

__all__ = ["cp_split", "gather_full", "cp_attention"]


def cp_split(bounds: Sequence[int], cp_size: int, cp_rank: int) -> tuple[Tensor, Tensor, tuple[int, ...]]:
    """This rank's share of a packed stream whose segments are ``bounds`` (S+1 offsets, every
    segment a multiple of 2 x ``cp_size`` long; module docstring).

    Returns:
        local_index: [T / cp_size] int64, the full-stream position of each token this rank holds.
        full_index: [T] int64, for each full-stream position its place in the ranks' local
            streams laid end to end (rank 0's, then rank 1's, ...): ``gathered[full_index]`` is the
            full stream.
        local_bounds: S+1 offsets of the segments in this rank's local stream.
    """
    n = 2 * cp_size
    per_rank: list[list[Tensor]] = [[] for _ in range(cp_size)]
    for start, end in zip(bounds[:-1], bounds[1:]):
        if (end - start) % n:
            raise ValueError(f"segment [{start}, {end}) is not a multiple of 2 x CP = {n} tokens")
        c = (end - start) // n
        for r in range(cp_size):
            per_rank[r] += [
                torch.arange(start + r * c, start + (r + 1) * c),
                torch.arange(start + (n - 1 - r) * c, start + (n - r) * c),
            ]
    locals_ = [torch.cat(p) if p else torch.zeros(0, dtype=torch.long) for p in per_rank]
    order = torch.cat(locals_)  # gathered position k holds full position order[k]
    full_index = torch.empty_like(order)
    full_index[order] = torch.arange(len(order))
    local_bounds = tuple(int(b - bounds[0]) // cp_size for b in bounds)
    return locals_[cp_rank], full_index, local_bounds


class _GatherFull(torch.autograd.Function):
    """[t, ...] local -> [T, ...] full order (all-gather over ``group``, then ``full_index``)."""

    @staticmethod
    def forward(ctx, x: Tensor, full_index: Tensor, group: dist.ProcessGroup | None, sum_grads: bool) -> Tensor:
        size = dist.get_world_size(group)
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.group, ctx.sum_grads, ctx.local = group, sum_grads, x.shape[0]
        ctx.save_for_backward(full_index)
        return torch.cat(parts)[full_index]

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        (full_index,) = ctx.saved_tensors
        rank, t = dist.get_rank(ctx.group), ctx.local
        flat = torch.empty_like(grad)
        flat[full_index] = grad  # back to the ranks' local layouts, end to end
        if not ctx.sum_grads:  # every rank holds the same gradient: keep this rank's tokens
            return flat[rank * t : (rank + 1) * t].contiguous(), None, None, None
        if dist.get_backend(ctx.group) == "nccl":
            out = grad.new_empty((t, *grad.shape[1:]))
            dist.reduce_scatter_tensor(out, flat.contiguous(), group=ctx.group)
            return out, None, None, None
        dist.all_reduce(flat, group=ctx.group)  # gloo has no reduce-scatter
        return flat[rank * t : (rank + 1) * t].contiguous(), None, None, None


def gather_full(x: Tensor, full_index: Tensor, group: dist.ProcessGroup | None, *, sum_grads: bool) -> Tensor:
    """All-gather ``x`` [t, ...] (this CP rank's tokens) into the full packed order [T, ...].

    Differentiable. ``sum_grads``: each rank's gradient differs (K/V inside attention) and is
    summed onto the owning rank; False: every rank computes the same function of the result
    (the loss), and each keeps its own tokens' gradient.
    """
    return _GatherFull.apply(x, full_index, group, sum_grads)


def cp_attention(query: Tensor, key: Tensor, value: Tensor, params: PackedRoPEParams, scale: float) -> Tensor:
    """Causal attention of this rank's queries over the segments' gathered keys (module docstring).

    Args:
        query: [t, n, d], key / value [t, g, d]: this rank's tokens, RoPE applied.
        params: ``PackedRoPEParams`` with ``cp_size`` > 1 (``cp_group``, ``cp_rank``,
            ``cp_full_index``, ``seq_bounds`` local and ``cp_full_bounds`` full segment offsets).
        scale: softmax scale.

    Returns:
        [t, n, d] attention output of this rank's queries.
    """
    p = params
    assert p.cp_full_index is not None, "cp_attention needs a pack from cp_split"  # cp_size > 1 (the caller checks)
    k_full = gather_full(key, p.cp_full_index, p.cp_group, sum_grads=True)  # [T, g, d]
    v_full = gather_full(value, p.cp_full_index, p.cp_group, sum_grads=True)
    n = query.shape[1]
    if k_full.shape[1] != n:  # CausalBias dispatch does not take enable_gqa on every torch
        k_full = k_full.repeat_interleave(n // k_full.shape[1], dim=1)
        v_full = v_full.repeat_interleave(n // v_full.shape[1], dim=1)
    from torch.nn.attention.bias import causal_lower_right

    out = torch.empty_like(query)
    last = 2 * p.cp_size - 1
    for seg, (start, end) in enumerate(zip(p.seq_bounds[:-1], p.seq_bounds[1:])):
        if end == start:
            continue
        c = (end - start) // 2
        full_start = p.cp_full_bounds[seg]
        for q0, chunk in ((start, p.cp_rank), (start + c, last - p.cp_rank)):
            k_end = full_start + (chunk + 1) * c
            q = query[q0 : q0 + c].transpose(0, 1).unsqueeze(0)  # [1, n, c, d]
            k, v = (
                x[full_start:k_end].transpose(0, 1).unsqueeze(0) for x in (k_full, v_full)
            )  # [1, n, (chunk + 1) c, d]
            o = F.scaled_dot_product_attention(
                q, k, v, attn_mask=causal_lower_right(c, k_end - full_start), scale=scale
            )
            out[q0 : q0 + c] = o.squeeze(0).transpose(0, 1)
    return out
