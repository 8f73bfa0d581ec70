"""The megatron train step's metrics (``slime.train.megatron.step``): token-weighted sums over the
micro-batches, reduced over the DP and pipeline ranks, their token means and the batch's own
metrics (the torch backend's fields, ``slime.train.torch_backend``, minus the critic's)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from slime.train.batch import TrainBatch, rl_batch_metrics
from slime.train.megatron.packing import to_device
from slime.train.megatron.parallel import ParallelContext

__all__ = ["TOKEN_METRICS", "TokenSums", "reduce_over_ranks", "token_means", "batch_metrics"]

TOKEN_METRICS = (
    "pg_clipfrac", "approx_kl", "ratio_mean", "entropy", "tis_mean", "tis_clipfrac", "dual_clipfrac", "kl_loss",
    "mis_rho_mean", "mis_mask_frac_low", "mis_mask_frac_high", "mis_mean", "behav_imp_weight_mean", "behav_mask_frac", "nll",
)  # fmt: skip
"""Token-mean metrics (as the torch backend reports them); the first four always (RL), ``nll`` with ``sft_loss``."""


class TokenSums:
    """This rank's token metric x micro-batch tokens, summed over the step, then the tokens:
    ``sums`` [len(TOKEN_METRICS) + 1] float64 on the CPU; ``seen``: the metrics some micro-batch reported."""

    def __init__(self) -> None:
        self.sums = torch.zeros(len(TOKEN_METRICS) + 1, dtype=torch.float64)
        self.seen: set[str] = set()

    def add(self, metrics: dict[str, float]) -> None:
        """One micro-batch's metrics (``objective.micro_batch_loss``), weighted by its ``num_tokens``."""
        self.seen.update(k for k in TOKEN_METRICS if k in metrics)
        for k, key in enumerate(TOKEN_METRICS):
            self.sums[k] += metrics.get(key, 0.0) * metrics["num_tokens"]
        self.sums[-1] += metrics["num_tokens"]


def reduce_over_ranks(ctx: ParallelContext, sums: Tensor, losses: list[Tensor]) -> tuple[Tensor, Tensor]:
    """``sums`` summed over DP ranks and the per-optimizer-step ``losses`` ([] float64 each, this rank's)
    likewise, both taken from the last pipeline stage; on the CPU. Collective: every rank calls it."""
    losses_t = torch.stack(losses) if losses else torch.zeros(0, dtype=torch.float64, device=ctx.device)
    if ctx.dp_size > 1 or ctx.pp_size > 1:
        both = torch.cat([to_device(sums, ctx.device), losses_t])
        if ctx.dp_size > 1:
            dist.all_reduce(both, group=ctx.dp_group)
        if ctx.pp_size > 1:  # losses and metrics live on the last stage; rank 0 (stage 0) reports them
            dist.broadcast(both, src=ctx.last_stage_rank, group=ctx.pp_group)
        sums, losses_t = both[: len(sums)], both[len(sums) :]
    return sums.cpu(), losses_t.cpu()


def token_means(sums: Tensor, seen: set[str], *, sft: bool) -> dict[str, float]:
    """Token means of the metrics in ``seen`` (and, with an RL loss, the first four always) from the
    reduced ``sums`` (``reduce_over_ranks``)."""
    num_tokens = max(float(sums[-1]), 1.0)
    always = 0 if sft else 4
    return {key: float(sums[k]) / num_tokens for k, key in enumerate(TOKEN_METRICS) if key in seen or k < always}


def batch_metrics(batch: TrainBatch, *, measured_mismatch: bool) -> dict[str, float]:
    """``rl_batch_metrics``, or with ``sft_loss`` (no old logprobs) the sample and token counts."""
    n = batch.num_train_tokens
    if batch.old_logprobs is None:  # --loss-type sft_loss
        return {"num_samples": float(batch.num_samples), "num_train_tokens": float(n)}
    return rl_batch_metrics(batch, measured_mismatch=measured_mismatch)
