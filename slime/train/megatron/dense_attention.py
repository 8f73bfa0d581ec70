"""The dense path of slime's packed attention (``slime.train.megatron.layers.SDPACoreAttention``).

A packed micro-batch of b sequences whose lengths are close runs as one right-padded [b, heads, L, d] batch
through ``F.scaled_dot_product_attention`` (cuDNN's dense kernels on a Hopper GPU), instead of the varlen
kernel over the packed tokens. ``attention_layout`` decides (the padded causal work over the unpadded),
``dense_index`` maps packed tokens to padded rows, ``dense_attention`` runs it. Exact: with right padding and
causal masking a real query only sees real keys of its own sequence.

Shapes: t = packed tokens, n = query heads, g = key/value heads, d = head_dim, b = sequences, L = padded length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["attention_layout", "dense_attention", "dense_index"]


def attention_layout(bounds: tuple[int, ...], ratio: float, multiple: int = 1) -> tuple[int, int] | None:
    """(b, L) when the packed sequences between ``bounds`` (S+1 offsets) should run as one dense batch of b
    right-padded sequences of L tokens (the longest rounded up to ``multiple``), else None (varlen): dense
    when b * L^2 <= ``ratio`` * sum(l^2), the attention work padded over the work unpadded (empty segments
    dropped); ``ratio`` <= 0 never pads."""
    lens = [b - a for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    if ratio <= 0 or not lens:
        return None
    longest = -(-max(lens) // multiple) * multiple
    return (len(lens), longest) if len(lens) * longest * longest <= ratio * sum(n * n for n in lens) else None


def dense_attention(
    query: Tensor, key: Tensor, value: Tensor, layout: tuple[int, int], scale: float, index: Tensor | None
) -> Tensor:
    """Causal attention of the packed sequences as one padded batch: q [t, n, d], k/v [t, g, d] -> [t, n, d].

    ``layout`` is ``attention_layout``'s (b, L); ``index`` [r] int64 (``dense_index``) the padded row of each of
    the first r packed tokens, None when the first r = b * L tokens are b sequences of exactly L (a view, no
    copy). Tokens after those r (the padding that rounds t up) get zeros. Padded rows are zeros; a real query
    attends only to keys at or before it in its own sequence, all real, and padded rows' outputs are dropped
    (their gradient is zero)."""
    b, length = layout
    t, n, d = query.shape
    real = b * length if index is None else index.numel()

    def pad(x: Tensor) -> Tensor:  # [t, h, d] -> [b, h, L, d], a transposed contiguous [b, L, h, d] (BSHD)
        x = x[:real]
        full = x.contiguous() if index is None else x.new_zeros(b * length, x.shape[1], d).index_copy(0, index, x)
        return full.view(b, length, x.shape[1], d).transpose(1, 2)

    q, k, v = pad(query), pad(key), pad(value)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=k.shape[1] != n)
    out = out.transpose(1, 2).reshape(b * length, n, d)
    out = out if index is None else out.index_select(0, index)
    return out if real == t else torch.cat([out, out.new_zeros(t - real, n, d)])


def dense_index(bounds: tuple[int, ...], length: int) -> Tensor | None:
    """[t] int64: sequence i's j-th token -> row i * ``length`` + j of the padded batch (empty segments take no
    row); None when every segment is ``length`` long (the packed tokens are the batch already)."""
    spans = [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    if all(b - a == length for a, b in spans):
        return None
    return torch.cat([torch.arange(i * length, i * length + (b - a)) for i, (a, b) in enumerate(spans)])
