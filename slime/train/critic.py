"""The critic of PPO with GAE (``--advantage-estimator ppo``): a value model, its clipped loss, and explained variance.

Design: a separate copy of the policy checkpoint's transformer (the HF base model of an
``AutoModelForCausalLM``, its LM head dropped) with a ``torch.nn.Linear(hidden_size, 1)`` value
head on the final (normed) hidden states. It has its own AdamW (``--critic-lr``, default ``--lr``)
and is stepped alongside the policy in the same optimizer steps and micro-batches. This is slime's
design (a critic initialised from the actor checkpoint with a scalar output) at the smallest size
we can make it; a head on the *policy's* hidden states would couple the two updates through
shared weights, which slime and OpenRLHF avoid. The head starts at zero, so the first values are
0 and the first advantages are Monte-Carlo returns; the backbone starts from the policy weights.

Value positions follow the logprob layout (``slime.train.batch``): ``values[b, t]`` is V of the
prefix ``0..t``, the state in which token ``t + 1`` is chosen, so it lines up with the advantage
of that token.

Value loss (PPO2 value clipping, as slime's ``value_loss_function``; Schulman et al. 2017's
baselines implementation): ``max((V - R)^2, (V_old + clip(V - V_old, -value_clip, value_clip) - R)^2)``,
aggregated like the policy loss. Like slime, and unlike AReaL/OpenRLHF, there is no 1/2 factor.

Not covered: saving or resuming the critic, critic-only warm-up steps (slime's
``--num-critic-only-steps``), value-head-only training, a separate critic checkpoint
(``--critic-load``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM

from slime.train.losses import LossAgg, aggregate

__all__ = ["ValueModel", "value_loss", "explained_variance"]


class ValueModel(nn.Module):
    """Transformer backbone + scalar head.

    Args:
        backbone: an HF base model whose forward returns ``last_hidden_state`` [B, T, H].
        hidden_size: H.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained(cls, model_dir: str) -> ValueModel:
        """Load the base transformer of the causal LM in ``model_dir`` (fp32, SDPA attention, CPU) and add a zero head."""
        lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
        model = cls(lm.base_model, int(lm.config.hidden_size))
        model.eval()  # dropout off, as for the policy
        return model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Values of every next-token position.

        Args:
            input_ids: [B, T] int64, right-padded.
            attention_mask: [B, T] int, 1 = real token.

        Returns:
            [B, T-1] float32: ``values[b, t]`` = V(tokens 0..t); 0.0 where token ``t + 1`` is padding.
        """
        position_ids = (attention_mask.long().cumsum(dim=-1) - 1).clamp_min(0)  # [B, T]
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        hidden = out.last_hidden_state[:, :-1, :].float()  # [B, T-1, H]
        return self.value_head(hidden).squeeze(-1) * attention_mask[:, 1:].to(hidden.dtype)  # [B, T-1]


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    loss_mask: Tensor,
    *,
    value_clip: float,
    loss_agg: LossAgg = "seq_mean",
    loss_denominator: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss (see the module docstring).

    Args:
        values: [B, L] float32, current critic values (carry gradient).
        old_values: [B, L] float32, values before this train step.
        returns: [B, L] float32, GAE targets (advantages + old values).
        loss_mask: [B, L] float, 1 = the token trains.
        value_clip: the clipped value stays within ``old_values +- value_clip``.
        loss_agg / loss_denominator: as for the policy loss (``slime.train.losses.aggregate``).

    Returns:
        loss: scalar tensor. metrics: ``value_loss`` (the scalar) and ``value_clipfrac`` (token
        mean over ``loss_mask`` of ``|V - V_old| > value_clip``).
    """
    mask = loss_mask.float()
    old_values, returns = old_values.detach(), returns.detach()
    clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)  # [B, L]
    loss_tok = torch.maximum((values - returns).square(), (clipped - returns).square())  # [B, L]
    loss = aggregate(loss_tok, mask, loss_agg=loss_agg, loss_denominator=loss_denominator)
    with torch.no_grad():
        clipfrac = float((((values - old_values).abs() > value_clip).float() * mask).sum() / mask.sum().clamp_min(1.0))
    return loss, {"value_loss": float(loss.detach()), "value_clipfrac": clipfrac}


def explained_variance(returns: Tensor, values: Tensor, mask: Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)`` over the masked tokens (population variances).

    1 = the values predict the returns perfectly; 0 = no better than their mean; NaN when the
    returns do not vary. Example: returns [1, 2, 3], values [1, 2, 2] -> 1 - (2/9) / (2/3) = 0.6667.
    """
    mask = mask.float()
    count = mask.sum().clamp_min(1.0)

    def _var(x: Tensor) -> Tensor:
        mean = (x * mask).sum() / count
        return ((x - mean).square() * mask).sum() / count

    var_returns = _var(returns)
    if float(var_returns) == 0.0:
        return float("nan")
    return float(1.0 - _var(returns - values) / var_returns)
