"""The experts each token of a sample was routed to, as the engine reports them (``--use-rollout-routing-replay``).

Format (SGLang 0.5.17's ``meta_info.routed_experts``, asked with ``return_routed_experts: true`` from a
server started with ``--enable-return-routed-experts``; the embedded engine answers the same): base64 of
int32 ``[T, L, k]`` in C order. T = the request's input + output tokens - 1: one row per token the model was
fed (the last sampled token never was); row ``q`` holds the experts of the forward at position ``q``, which
produced the logprob of token ``q + 1``. L = ``num_hidden_layers`` (a dense layer's rows are zeros), k =
``num_experts_per_tok``. Here a row is kept flat, ``R = L * k`` ints, so nothing below needs the model's shape.

Partial rollouts (abort, then resume): the resumed request sends prompt + the tokens so far, and its routes
cover all of them again, recomputed by its own prefill. ``merge_segment`` keeps, for every position that
produced a response token, the routes of the request that *sampled* that token (the row that goes with the
engine's logprob of it, ``Sample.rollout_logprobs``), and takes the prompt's rows (positions before the last
prompt token: they produce no trained logprob) and the new tokens' rows from the newest request. Example:
prompt 4 tokens, segment 1 samples 3 tokens (its routes: 4 + 3 - 1 = 6 rows, positions 0..5), segment 2
samples 2 more (its routes: 7 + 2 - 1 = 8 rows): kept = seg2[0:3] + seg1[3:6] + seg2[6:8]. Why not the newest
request's rows everywhere: its prefill recomputed the old tokens under possibly newer weights (an abort
usually comes with a weight update), while the rollout logprob that the trainer's logprob is compared with
(and that TIS / the old-policy ratio use) came from the old request's forward with its own experts.
Tokens not sampled by the engine (multi-turn tool output) get the rows of the next request that fed them.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import numpy as np
import torch

from slime.types import Sample

__all__ = ["route_rows", "encode_rows", "merge_segment", "routed_row_count", "stack_routes"]


def route_rows(data: str, num_rows: int) -> np.ndarray:
    """base64 routes -> int32 [num_rows, R] (R = layers x top-k, read from the length).

    Raises:
        ValueError: the decoded ints are not ``num_rows`` whole rows.
    """
    flat = np.frombuffer(base64.b64decode(data), dtype=np.int32)
    if num_rows <= 0 or flat.size % num_rows or not flat.size:
        raise ValueError(f"routed_experts: {flat.size} ints are not {num_rows} rows (one per token fed to the model)")
    return flat.reshape(num_rows, -1)


def encode_rows(rows: np.ndarray) -> str:
    """int [T, R] (or [T, L, k]) -> base64 of int32 in C order (``route_rows``' inverse)."""
    return base64.b64encode(np.ascontiguousarray(rows, dtype=np.int32).tobytes()).decode("ascii")


def routed_row_count(data: str) -> int:
    """How many int32 the base64 ``data`` holds (rows x R)."""
    return len(base64.b64decode(data)) // 4


def merge_segment(kept: str | None, new: str, *, prompt_len: int, input_len: int, num_new: int) -> str:
    """The sample's routes after one more request (module docstring): ``kept`` (earlier requests' merged
    routes, or None) and ``new`` (this request's, input + output - 1 rows).

    Args:
        kept: base64 routes of positions ``0 .. len(kept) - 1`` from earlier requests, or None.
        new: this request's base64 routes, ``input_len + num_new - 1`` rows.
        prompt_len: the sample's prompt tokens.
        input_len: tokens this request sent (prompt + the response so far).
        num_new: tokens it returned.

    Raises:
        ValueError: ``new`` is not ``input_len + num_new - 1`` rows, or ``kept`` has another row size or
            more rows than the request's input covers.
    """
    rows_new = route_rows(new, input_len + num_new - 1)
    if kept is None:
        return new
    width = rows_new.shape[1]
    old_ints = routed_row_count(kept)
    if old_ints % width or old_ints // width > input_len:
        raise ValueError(
            f"routed_experts: the kept routes ({old_ints} ints) are not whole rows of {width} within the {input_len} "
            "tokens the resumed request sent"
        )
    rows_old = route_rows(kept, old_ints // width)
    # each sampled token's row from the request that sampled it; the prompt's and the new tokens' from this one
    start, end = max(prompt_len - 1, 0), rows_old.shape[0]
    merged = rows_new.copy()
    merged[start:end] = rows_old[start:end]
    return encode_rows(merged)


def stack_routes(samples: Sequence[Sample], num_cols: int) -> torch.Tensor | None:
    """The samples' routes as one int32 [B, L, R] tensor (``TrainBatch.routed_experts``: row ``t`` of sample ``b``
    is the experts of the forward at position ``t``; 0 past its tokens), or None when no sample has any.

    Args:
        samples: the batch's rows, in its order; each with ``prompt + response - 1`` rows of routes.
        num_cols: L, the batch's next-token positions (``TrainBatch.loss_mask.shape[1]``).

    Raises:
        ValueError: some samples carry routes and others do not (e.g. offline samples mixed in), or their rows
            are of different sizes.
    """
    have = [s.routed_experts is not None for s in samples]
    if not any(have):
        return None
    if not all(have):
        s = samples[have.index(False)]
        raise ValueError(
            f"Sample(group={s.group_id}, index={s.index}) has no routed_experts while others of the batch have them "
            "(--use-rollout-routing-replay: every trained sample needs the engine's routes)"
        )
    rows = [route_rows(s.routed_experts or "", len(s.prompt_ids) + len(s.response_ids) - 1) for s in samples]
    widths = sorted({r.shape[1] for r in rows})
    if len(widths) != 1:
        raise ValueError(f"routed_experts: samples of one batch have rows of different sizes {widths}")
    out = torch.zeros((len(samples), num_cols, widths[0]), dtype=torch.int32)  # [B, L, R]
    for b, r in enumerate(rows):
        out[b, : r.shape[0]] = torch.from_numpy(r.copy())
    return out
