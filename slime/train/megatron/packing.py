"""Split an optimizer step over data-parallel ranks and pack each rank's samples into micro-batches.

A micro-batch is one packed ("thd") row: the samples' prompt + response tokens back to back, no
padding between them, attention kept inside each sample by ``cu_seqlens``. Shape legend:
t = packed tokens (a multiple of ``pad_to``), S = sequences in the pack (samples, plus one
padding sequence when t had to be rounded up), b = samples, L = longest sample - 1.

Planning (``plan_step``), worked example: 6 samples with lengths [900, 300, 700, 100, 500, 600],
2 data-parallel ranks, ``max_tokens_per_gpu=1200`` with ``use_dynamic_batch_size``:

    DP split, longest first onto the lighter rank:  rank 0 <- 900, 500, 100 (1500 tokens)
                                                    rank 1 <- 700, 600, 300 (1600 tokens)
    first-fit-decreasing packs of <= 1200 tokens:   rank 0: [900, 100] [500]   rank 1: [700, 300] [600]

Without ``use_dynamic_batch_size`` each rank cuts its samples (in index order) into micro-batches
of ``micro_batch_size`` samples, still packed. A sample longer than the token budget gets a
micro-batch of its own. Ranks may end up with different micro-batch counts: gradients are summed
over data-parallel ranks once per optimizer step, so that is fine; a rank with no sample runs
one empty micro-batch (``PackedMicroBatch.empty``) so that it joins the gradient reduce.

Unpacking (``PackedMicroBatch.unpack``): packed position ``i`` predicts token ``i + 1``; for a
sample at offset ``o`` with ``n`` tokens, positions ``o .. o + n - 2`` go to row ``j``, columns
``0 .. n - 2`` of a [b, L] tensor, the layout of ``slime.train.batch.TrainBatch``.

Context parallelism (``cp_size`` > 1): each sample is padded to a multiple of 2 x CP tokens
(pad tokens after its last one, positions continuing), the tail to a multiple of 2 x CP x
``pad_to``, and each CP rank keeps its share (``slime.train.megatron.context_parallel``): chunks
r and 2 CP - 1 - r of every sample. ``input_ids`` / ``position_ids`` / ``labels`` are that
share (t = T / CP tokens, labels taken from the full stream, so a chunk's last token predicts
the next chunk's first); ``PackedMicroBatch.full`` all-gathers per-token outputs back into the
full order (T) that ``unpack`` reads. With ``--use-dynamic-batch-size`` a micro-batch holds up
to ``max_tokens_per_gpu`` x CP tokens (each GPU about ``max_tokens_per_gpu``), as in THUDM slime.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from slime.train.batch import TrainBatch
from slime.train.megatron.context_parallel import cp_split, gather_full
from slime.train.megatron.layers import PackedRoPEParams, rope_cos_sin

__all__ = ["plan_step", "PackedMicroBatch", "pack_samples", "select_samples", "to_device", "batch_to"]


def to_device(x: Tensor, device: torch.device | str) -> Tensor:
    """``x.to(device)`` without a host sync for a CPU tensor bound for a GPU: staged through pinned memory
    and copied asynchronously (a copy from pageable memory makes the host wait for the GPU to drain:
    one sync per tensor, ~90 per RL step at 16k-token micro-batches). ``x`` is first copied into a new
    pinned buffer (contiguous), which torch's host allocator holds until the copy has run, so ``x`` may be
    freed or changed at once."""
    device = torch.device(device)
    if device.type == "cuda" and x.device.type == "cpu":
        staged = torch.empty(x.shape, dtype=x.dtype, pin_memory=True).copy_(x)  # always a new buffer, contiguous
        return staged.to(device, non_blocking=True)
    return x.to(device)


def plan_step(
    seq_lens: Sequence[int],
    *,
    dp_size: int,
    micro_batch_size: int,
    max_tokens_per_gpu: int | None,
) -> list[list[list[int]]]:
    """Sample indices of each micro-batch of each data-parallel rank, for one optimizer step.

    Args:
        seq_lens: tokens (prompt + response) of each sample of the step, indexed from 0.
        dp_size: data-parallel ranks.
        micro_batch_size: samples per micro-batch when ``max_tokens_per_gpu`` is None.
        max_tokens_per_gpu: token budget of a micro-batch (``--use-dynamic-batch-size``), or None.

    Returns:
        ``plan[dp_rank][micro_batch] = [sample indices]``; every index appears exactly once.
    """
    loads = [0] * dp_size
    per_rank: list[list[int]] = [[] for _ in range(dp_size)]
    for i in sorted(range(len(seq_lens)), key=lambda i: (-seq_lens[i], i)):
        r = min(range(dp_size), key=lambda r: (loads[r], r))
        per_rank[r].append(i)
        loads[r] += seq_lens[i]
    plan = []
    for samples in per_rank:
        if max_tokens_per_gpu is None:
            samples = sorted(samples)
            plan.append([samples[k : k + micro_batch_size] for k in range(0, len(samples), micro_batch_size)])
            continue
        bins: list[list[int]] = []
        room: list[int] = []
        for i in samples:  # already longest first
            for b, free in enumerate(room):
                if seq_lens[i] <= free:
                    bins[b].append(i)
                    room[b] -= seq_lens[i]
                    break
            else:
                bins.append([i])
                room.append(max_tokens_per_gpu - seq_lens[i])
        plan.append([sorted(b) for b in bins])
    return plan


def batch_to(batch: TrainBatch, device: torch.device) -> TrainBatch:
    """Every tensor of ``batch`` on ``device`` through ``to_device`` (pinned memory, no host sync on CUDA)."""
    return dataclasses.replace(
        batch,
        **{
            f.name: to_device(getattr(batch, f.name), device)
            for f in dataclasses.fields(batch)
            if getattr(batch, f.name) is not None
        },
    )


def select_samples(batch: TrainBatch, indices: Sequence[int]) -> TrainBatch:
    """Rows ``indices`` of ``batch`` (any order), with T trimmed to their longest sequence (``TrainBatch.select``)."""
    return batch.select(indices)


@dataclasses.dataclass
class PackedMicroBatch:
    """One packed micro-batch on one rank.

    Attributes:
        samples: rows of the step's ``TrainBatch`` in pack order (empty for a placeholder).
        input_ids: [1, t] int64, tokens back to back, then ``pad_token_id`` up to t.
        position_ids: [1, t] int64, position inside each sequence (restarts at 0 per sample).
        labels: [1, t] int64, ``input_ids`` shifted left by one (the token each position predicts;
            meaningless at each sequence's last position, which ``unpack`` drops).
        params: the "thd" ``PackedSeqParams`` with RoPE tables (``PackedRoPEParams``).
        rows / cols / flat: [num_predictions] int64: ``unpack`` writes packed position ``flat[k]``
            to ``[rows[k], cols[k]]``.
        num_rows / num_cols: b and L of the unpacked tensor.
        routes: [t, L_moe, k] int32, the engine's experts per packed token (``routing_replay.StepRoutes``), or None.
    """

    samples: list[int]
    input_ids: Tensor
    position_ids: Tensor
    labels: Tensor
    params: PackedRoPEParams
    rows: Tensor
    cols: Tensor
    flat: Tensor
    num_rows: int
    num_cols: int
    routes: Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens this rank runs (its context-parallel share)."""
        return int(self.input_ids.shape[1])

    def full(self, local: Tensor) -> Tensor:
        """[t] per-token values of this CP rank -> [T] in full packed order (identity without CP).

        Differentiable: every CP rank must compute the same function of the result (the loss);
        each rank's backward keeps its own tokens' gradient (``context_parallel.gather_full``)."""
        p = self.params
        if p.cp_size == 1:
            return local
        if p.cp_full_index is None:
            raise RuntimeError(
                f"PackedMicroBatch.full: cp_size={p.cp_size} but params.cp_full_index is unset (packs with CP come from cp_split)"
            )
        return gather_full(local, p.cp_full_index, p.cp_group, sum_grads=False)

    def unpack(self, packed: Tensor) -> Tensor:
        """[t] per-position values (e.g. logprobs, differentiable) -> [b, L] in ``TrainBatch`` layout, 0 elsewhere."""
        dense = packed.new_zeros((self.num_rows, self.num_cols))
        return dense.index_put((self.rows, self.cols), packed[self.flat])


def pack_samples(
    batch: TrainBatch,
    samples: Sequence[int],
    *,
    pad_token_id: int,
    pad_to: int,
    head_dim: int,
    rope_theta: float,
    rotary_dim: int | None = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    cp_group: object = None,
    device: torch.device | str = "cpu",
) -> PackedMicroBatch:
    """Pack rows ``samples`` of ``batch`` into one micro-batch on ``device``.

    Args:
        batch: the step's padded batch.
        samples: its rows to pack, in order; empty gives a placeholder of ``pad_to`` (>= 2) pad
            tokens and nothing to unpack.
        pad_token_id: fills the tail up to a multiple of ``pad_to``.
        pad_to: t is rounded up to a multiple of this (the TP size under sequence parallelism,
            which splits t evenly; 1 otherwise).
        head_dim / rope_theta / rotary_dim: for the RoPE tables (``layers.rope_cos_sin``; rotary_dim
            below head_dim for partial RoPE).
        cp_size / cp_rank / cp_group: context parallelism: this rank keeps its share of every
            sample (module docstring).
        device: where the micro-batch goes: the index tensors are built on the CPU and copied
            (``to_device``), the RoPE tables computed there from the copied positions (on a GPU a few
            kernels; on the CPU they took ~12 ms per 16k-token micro-batch plus a 16 MB copy).
    """
    layout, pad_tokens = _lay_out(batch, samples, pad_token_id=pad_token_id, pad_to=pad_to, cp_size=cp_size)
    bounds = layout.bounds
    input_ids, position_ids, labels = layout.tensors()  # [1, t] each
    cp: _CPShare | None = None
    if cp_size > 1:
        local, full_index, local_bounds = cp_split(bounds, cp_size, cp_rank)
        input_ids, position_ids, labels = (x[:, local] for x in (input_ids, position_ids, labels))
        # under CP the local segments mix padding into every sample's share: no padding segment
        pad_tokens, cp = 0, _CPShare(cp_size, cp_rank, cp_group, to_device(full_index, device), tuple(bounds))
        bounds = list(local_bounds)
    input_ids, position_ids, labels = (to_device(x, device) for x in (input_ids, position_ids, labels))
    rows, cols, flat = layout.unpack_index(device)
    num_cols = max((int(batch.seq_lens[s]) for s in samples), default=2) - 1
    params = _rope_params(bounds, position_ids, pad_tokens, cp, head_dim=head_dim, rope_theta=rope_theta,
                          rotary_dim=rotary_dim, device=device)  # fmt: skip
    return PackedMicroBatch(
        samples=list(samples),
        input_ids=input_ids,
        position_ids=position_ids,
        labels=labels,
        params=params,
        rows=rows,
        cols=cols,
        flat=flat,
        num_rows=len(samples),
        num_cols=max(num_cols, 1),
    )


def _lay_out(
    batch: TrainBatch, samples: Sequence[int], *, pad_token_id: int, pad_to: int, cp_size: int
) -> tuple[_Segments, int]:
    """``pack_samples``'s segments on the CPU: each sample (padded to a multiple of 2 x CP tokens under
    CP), then a padding segment up to the pack's multiple; and that padding segment's length (0: none)."""
    seg = 2 * cp_size if cp_size > 1 else 1  # every segment a multiple of this
    layout = _Segments()
    for j, s in enumerate(samples):
        layout.add_sample(batch.input_ids[s, : int(batch.seq_lens[s])], j, seg=seg, pad_token_id=pad_token_id)
    t = layout.bounds[-1]  # the samples' tokens
    multiple = 2 * cp_size * pad_to if cp_size > 1 else pad_to  # a placeholder (no sample): 2 tokens, padded
    padded = layout.pad_to_multiple(multiple, pad_token_id, min_tokens=0 if samples else 2)
    return layout, padded - t


@dataclasses.dataclass
class _Segments:
    """A pack being laid out on the CPU: token and position pieces, segment bounds (cumulative, from
    0), and where each sample's predictions go when unpacked (``PackedMicroBatch.rows/cols/flat``)."""

    pieces: list[Tensor] = dataclasses.field(default_factory=list)
    positions: list[Tensor] = dataclasses.field(default_factory=list)
    bounds: list[int] = dataclasses.field(default_factory=lambda: [0])
    rows: list[Tensor] = dataclasses.field(default_factory=list)
    cols: list[Tensor] = dataclasses.field(default_factory=list)
    flat: list[Tensor] = dataclasses.field(default_factory=list)

    def add_sample(self, ids: Tensor, j: int, *, seg: int, pad_token_id: int) -> None:
        """Sample ``j`` of the pack (``ids`` [n]), padded to a multiple of ``seg`` tokens."""
        n = int(ids.shape[0])
        m = -(-n // seg) * seg
        self.pieces.append(ids)
        if m > n:
            self.pieces.append(torch.full((m - n,), pad_token_id, dtype=torch.long))
        self.positions.append(torch.arange(m))
        o = self.bounds[-1]
        self.rows.append(torch.full((n - 1,), j, dtype=torch.long))
        self.cols.append(torch.arange(n - 1))
        self.flat.append(torch.arange(o, o + n - 1))
        self.bounds.append(o + m)

    def pad_to_multiple(self, multiple: int, pad_token_id: int, *, min_tokens: int) -> int:
        """A padding segment up to a multiple of ``multiple`` tokens, at least ``min_tokens`` (none if the
        samples fill it); returns the padded length."""
        t = self.bounds[-1]
        padded = -(-max(t, min_tokens) // multiple) * multiple
        if padded > t:
            self.pieces.append(torch.full((padded - t,), pad_token_id, dtype=torch.long))
            self.positions.append(torch.arange(padded - t))
            self.bounds.append(padded)
        return padded

    def tensors(self) -> tuple[Tensor, Tensor, Tensor]:
        """``input_ids``, ``position_ids`` and ``labels`` (``input_ids`` shifted left by one), [1, t] each."""
        input_ids = torch.cat(self.pieces).unsqueeze(0)
        return input_ids, torch.cat(self.positions).unsqueeze(0), torch.roll(input_ids, shifts=-1, dims=1)

    def unpack_index(self, device: torch.device | str) -> tuple[Tensor, Tensor, Tensor]:
        """``rows``, ``cols``, ``flat`` [num_predictions] int64 on ``device``."""
        empty = torch.zeros(0, dtype=torch.long)
        rows, cols, flat = (torch.cat(x) if x else empty for x in (self.rows, self.cols, self.flat))
        return to_device(rows, device), to_device(cols, device), to_device(flat, device)


class _CPShare(NamedTuple):
    """A pack's context-parallel fields of ``PackedRoPEParams`` (``cp_*``)."""

    size: int
    rank: int
    group: object
    full_index: Tensor
    full_bounds: tuple[int, ...]


def _rope_params(
    bounds: list[int],
    position_ids: Tensor,
    pad_tokens: int,
    cp: _CPShare | None,
    *,
    head_dim: int,
    rope_theta: float,
    rotary_dim: int | None,
    device: torch.device | str,
) -> PackedRoPEParams:
    """The "thd" ``PackedRoPEParams`` of segments ``bounds`` (this rank's) with RoPE tables of
    ``position_ids`` [1, t] (on ``device``), the padding segment's length and the CP fields (None: no CP)."""
    cu = to_device(torch.tensor(bounds, dtype=torch.int32), device)  # [S+1]
    max_len = max(b - a for a, b in zip(bounds[:-1], bounds[1:]))
    cos, sin = rope_cos_sin(
        position_ids[0], head_dim=head_dim, rope_theta=rope_theta, rotary_dim=rotary_dim
    )  # [t, 1, d]
    return PackedRoPEParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        max_seqlen_q=max_len,
        max_seqlen_kv=max_len,
        seq_bounds=tuple(bounds),
        rope_cos=cos,
        rope_sin=sin,
        pad_tokens=pad_tokens,
        cp_size=1 if cp is None else cp.size,
        cp_rank=0 if cp is None else cp.rank,
        cp_group=None if cp is None else cp.group,
        cp_full_index=None if cp is None else cp.full_index,
        cp_full_bounds=() if cp is None else cp.full_bounds,
    )
