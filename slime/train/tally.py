"""The torch backend's running sums over one train step: token-weighted metric sums and the
per-optimizer-step losses, norms and learning rates (``slime.train.torch_backend``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

__all__ = ["TOKEN_METRICS", "StepTally"]

TOKEN_METRICS = (
    "pg_clipfrac", "approx_kl", "ratio_mean", "entropy", "tis_mean", "tis_clipfrac", "dual_clipfrac", "kl_loss",
    "mis_rho_mean", "mis_mask_frac_low", "mis_mask_frac_high", "mis_mean", "behav_imp_weight_mean", "behav_mask_frac",
    "value_clipfrac",
)  # fmt: skip
"""Token-mean metrics averaged over the step's trained tokens; the first four are always reported."""


@dataclasses.dataclass
class StepTally:
    """What one ``TorchTrainer.train_step`` adds up over its optimizer steps and micro-batches."""

    sums: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys((*TOKEN_METRICS, "nll"), 0.0))
    """Token metric x micro-batch tokens, summed (``TOKEN_METRICS`` then ``nll``)."""
    seen: set[str] = dataclasses.field(default_factory=set)
    """The token metrics some micro-batch reported."""
    num_tokens: float = 0.0
    losses: list[float] = dataclasses.field(default_factory=list)
    grad_norms: list[float] = dataclasses.field(default_factory=list)
    value_losses: list[float] = dataclasses.field(default_factory=list)
    critic_norms: list[float] = dataclasses.field(default_factory=list)
    lrs: list[float] = dataclasses.field(default_factory=list)
    num_skipped: int = 0

    def add(self, metrics: dict[str, float]) -> None:
        """One micro-batch's metrics, weighted by its ``num_tokens``."""
        self.num_tokens += metrics["num_tokens"]
        self.seen.update(k for k in self.sums if k in metrics)
        for key in self.sums:
            self.sums[key] += metrics.get(key, 0.0) * metrics["num_tokens"]

    def token_means(self, always: Sequence[str]) -> dict[str, float]:
        """Token means of the metrics seen (and of ``always``, 0.0 if never seen)."""
        return {
            key: self.sums[key] / max(self.num_tokens, 1.0) for key in self.sums if key in self.seen or key in always
        }
