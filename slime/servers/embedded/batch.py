"""The running batch's KV cache: left-padded, one row per request, built on HF ``DynamicCache``.

Layout (B rows, L cached positions, H KV heads, D head dim)::

    cache.layers[i].keys / .values   [B, H, L, D]   padding positions hold zeros (prefill pads: junk)
    mask                             [B, L] bool     True = a real token of that row
    row r holds its tokens right-aligned: mask[r] = [F F F T T T ... T]

We hand the model a ready 4-D additive mask ([B, 1, q, L + q]: 0 = attend, finfo.min = not), so
HF's own mask construction is skipped and padding never leaks into attention; positions come from
``position_ids`` = number of real tokens before each query. Padding rows in prefill attend to
themselves so no softmax row is empty. Each row's numbers then equal an unpadded forward up to
float reassociation (about 1e-6 on fp32 logits).

Example: rows with 3 and 5 real tokens, L = 5: mask = [[F, F, T, T, T], [T, T, T, T, T]]; the next
decode step feeds position_ids [[3], [5]] and the mask grows a True column.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from slime.hf_compat import CACHE_KWARG

__all__ = ["BatchKV", "prefill_inputs"]

NEG = torch.finfo(torch.float32).min


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    """bool [B, q, k] -> float32 [B, 1, q, k] with 0 where allowed and finfo.min elsewhere."""
    return torch.zeros(allowed.shape, dtype=torch.float32).masked_fill_(~allowed, NEG).unsqueeze(1)


def prefill_inputs(contexts: list[list[int]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Left-padded model inputs for a batch of fresh contexts.

    Returns:
        ``input_ids`` [K, T] (pad = ``pad_id``), ``position_ids`` [K, T], ``attention_mask``
        [K, 1, T, T] additive, and ``mask`` [K, T] bool (True = real token), with T the longest context.
    """
    num_rows, width = len(contexts), max(len(c) for c in contexts)
    input_ids = torch.full((num_rows, width), pad_id, dtype=torch.long)
    mask = torch.zeros((num_rows, width), dtype=torch.bool)
    for r, ctx in enumerate(contexts):
        input_ids[r, width - len(ctx) :] = torch.tensor(ctx, dtype=torch.long)
        mask[r, width - len(ctx) :] = True
    position_ids = (mask.long().cumsum(dim=1) - 1).clamp_(min=0)
    causal = torch.ones((width, width), dtype=torch.bool).tril_()
    allowed = (causal[None] & mask[:, None, :]) | torch.eye(width, dtype=torch.bool)[None]
    return {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": _additive(allowed), "mask": mask}


class BatchKV:
    """KV cache plus padding mask of the running rows (see module docstring for the layout)."""

    def __init__(self, cache: DynamicCache, mask: torch.Tensor):
        self.cache = cache
        self.mask = mask  # [B, L] bool

    @property
    def num_rows(self) -> int:
        return self.mask.shape[0]

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    def decode_inputs(self, last_ids: list[int]) -> dict[str, torch.Tensor]:
        """Inputs for one decode step feeding ``last_ids`` [B]; grows ``mask`` by one column.

        Returns:
            ``input_ids`` [B, 1], ``position_ids`` [B, 1], ``attention_mask`` [B, 1, 1, L + 1], and the cache under
            ``CACHE_KWARG`` (``cache`` or ``past_key_values``, by transformers release).
        """
        position_ids = self.mask.sum(dim=1, keepdim=True)
        self.mask = torch.cat([self.mask, torch.ones((self.num_rows, 1), dtype=torch.bool)], dim=1)
        return {
            "input_ids": torch.tensor(last_ids, dtype=torch.long)[:, None],
            "position_ids": position_ids,
            "attention_mask": _additive(self.mask[:, None, :]),
            CACHE_KWARG: self.cache,  # type: ignore[dict-item]  # the model takes its cache with the tensors
        }

    def _layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (keys, values), [B, heads, L, head_dim]: full-attention layers only (Llama/Qwen)."""
        out = []
        for i, layer in enumerate(self.cache.layers):
            keys, values = (
                getattr(layer, "keys", None),
                getattr(layer, "values", None),
            )  # linear-attention layers have neither
            if keys is None or values is None:
                raise RuntimeError(
                    f"BatchKV: cache layer {i} holds no keys/values (only full-attention models are supported)"
                )
            out.append((keys, values))
        return out

    def _rebuild(self, layers: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> None:
        self.cache = DynamicCache(ddp_cache_data=layers)
        self.mask = mask

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order), then drop leading columns that are padding in every row."""
        index = torch.tensor(rows, dtype=torch.long)
        mask = self.mask[index]
        real_cols = mask.any(dim=0).nonzero()
        start = int(real_cols[0]) if len(real_cols) else mask.shape[1]
        layers = [(k[index, :, start:], v[index, :, start:]) for k, v in self._layers()]
        self._rebuild(layers, mask[:, start:])

    def extend(self, other: BatchKV) -> None:
        """Append ``other``'s rows after ours, left-padding the shorter side with zeros."""
        width = max(self.length, other.length)

        def pad(t: torch.Tensor, n: int) -> torch.Tensor:  # left-pad dim -2 (positions) by n
            return t if n == 0 else torch.nn.functional.pad(t, (0, 0, n, 0))

        a, b = width - self.length, width - other.length
        layers = [
            (torch.cat([pad(k1, a), pad(k2, b)]), torch.cat([pad(v1, a), pad(v2, b)]))
            for (k1, v1), (k2, v2) in zip(self._layers(), other._layers())
        ]
        mask = torch.cat(
            [
                torch.nn.functional.pad(self.mask, (a, 0), value=False),
                torch.nn.functional.pad(other.mask, (b, 0), value=False),
            ]
        )
        self._rebuild(layers, mask)
