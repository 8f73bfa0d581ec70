"""Per-step router metrics of an MoE model: load per expert, load-balancing loss, dropped tokens.

``RouterStats.attach(model)`` puts a forward hook on every megatron-core ``TopKRouter``. The hook
counts only training forwards with autograd on (``router.training and torch.is_grad_enabled()``,
megatron's own condition for the aux loss), so the no-grad old-logprob pass is left out and a
layer under full activation recompute is counted once (its first, no-grad forward is skipped).
Under sequence parallelism each TP rank routes its own slice of a micro-batch's tokens; the hook
then sums that micro-batch's statistics over ``tp_group`` first (2E + 2 numbers per layer), so the
load-balancing loss is the micro-batch's as a whole, as megatron-core computes it. ``collect``
sums the step's statistics over the data-parallel group and returns:

    moe_expert_load_{e}       share of the routed (token, expert) slots that expert e took,
                              mean over MoE layers; 1 / num_experts each when balanced
    moe_load_imbalance        max_e(load_e) * num_experts, mean over MoE layers; 1.0 = balanced
    moe_load_balancing_loss   Switch Transformer's loss (arXiv 2101.03961, eq. 4, as megatron-core's
                              ``switch_load_balancing_loss_func`` with coefficient 1):
                              E / (k T^2) * sum_e P_e C_e per micro-batch, P_e the summed softmax
                              probability of expert e, C_e its top-k count before any dropping;
                              token-weighted mean over micro-batches, mean over layers; 1.0 when
                              balanced. Logged whether or not ``--moe-aux-loss-coeff`` trains it.
    moe_dropped_token_frac    share of top-k slots dropped by the capacity factor (0 when dropless)
    moe_routed_tokens         tokens routed per MoE layer in the step (all DP ranks)

Example: 4 experts, top-2, one layer, 8 tokens routed 6/4/4/2 slots -> loads 0.375, 0.25, 0.25,
0.125; imbalance 0.375 * 4 = 1.5. Tokens counted include the few pad tokens that packing adds to
reach a multiple of the TP size under sequence parallelism, and the placeholder micro-batches a
rank runs under expert parallelism when it has fewer than the busiest DP rank
(``MegatronTrainer._plan``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from slime.train.megatron._mcore import mcore

__all__ = ["RouterStats"]


class RouterStats:
    """Accumulates router statistics over one train step on this rank; ``collect`` reduces and resets.

    Args:
        num_experts / topk: the model's ``num_moe_experts`` and ``moe_router_topk``.
        device: where the running sums live (the model's device).
        tp_group: the TP group when sequence parallelism splits each micro-batch over it; else None.
    """

    def __init__(self, *, num_experts: int, topk: int, device: torch.device, tp_group: Any = None):
        self.num_experts = num_experts
        self.topk = topk
        self.device = device
        self.tp_group = tp_group if tp_group is not None and dist.get_world_size(tp_group) > 1 else None
        self._layers: list[Any] = []
        self._sums: Tensor | None = None  # [L, E + 3] float64: slot counts per expert, then tokens, dropped slots, aux * tokens
        self._handles: list[Any] = []

    def attach(self, model: Any) -> "RouterStats":
        """Hook every ``TopKRouter`` (subclasses included) of ``model``; returns self."""
        TopKRouter = mcore("megatron.core.transformer.moe.router").TopKRouter
        for module in model.modules():
            if isinstance(module, TopKRouter):
                idx = len(self._layers)
                self._layers.append(module)
                self._handles.append(module.register_forward_hook(self._hook(idx)))
        self._sums = torch.zeros(len(self._layers), self.num_experts + 3, dtype=torch.float64, device=self.device)
        return self

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    def _hook(self, idx: int):
        def hook(router: Any, args: tuple, output: tuple[Tensor, Tensor]) -> None:
            if not (router.training and torch.is_grad_enabled()):
                return
            with torch.no_grad():
                E = self.num_experts
                _, routing_map = output  # [T, E] bool, after capacity dropping
                scores = torch.softmax(router.gating(args[0]).reshape(-1, E).float(), dim=-1)  # [T, E]
                chosen = torch.zeros_like(scores).scatter_(1, scores.topk(self.topk, dim=1).indices, 1.0)  # before dropping
                T = scores.new_full((1,), scores.shape[0])
                vec = torch.cat([scores.sum(0), chosen.sum(0), routing_map.sum(0).float(), T])  # [3E + 1]
                if self.tp_group is not None:  # the whole micro-batch on every TP rank; collect sums over DP only
                    dist.all_reduce(vec, group=self.tp_group)
                P, C, counts, num_tokens = vec[:E], vec[E : 2 * E], vec[2 * E : 3 * E].double(), vec[3 * E].double()
                aux = E / (self.topk * num_tokens.clamp_min(1.0) ** 2) * (P * C).sum().double()
                row = self._sums[idx]
                row[:E] += counts
                row[E] += num_tokens
                row[E + 1] += num_tokens * self.topk - counts.sum()
                row[E + 2] += aux * num_tokens

        return hook

    def collect(self, *, groups: list[Any]) -> dict[str, float]:
        """Sum this step's statistics over ``groups`` (each all-reduced in turn), reset, return metrics.

        Every rank must call it (the reductions are collective); every rank gets the same dict.
        Empty when the model has no router or no training forward ran.
        """
        if not self._layers:
            return {}
        sums = self._sums.clone()
        self._sums.zero_()
        for group in groups:
            if group is not None and dist.get_world_size(group) > 1:
                dist.all_reduce(sums, group=group)
        sums = sums.cpu()
        E = self.num_experts
        counts, tokens, dropped, aux_tok = sums[:, :E], sums[:, E], sums[:, E + 1], sums[:, E + 2]
        if float(tokens.sum()) == 0:
            return {}
        slots = counts.sum(1, keepdim=True).clamp_min(1.0)
        load = counts / slots  # [L, E]
        out = {f"moe_expert_load_{e}": float(load[:, e].mean()) for e in range(E)}
        out.update(
            moe_load_imbalance=float((load.max(1).values * E).mean()),
            moe_load_balancing_loss=float((aux_tok / tokens.clamp_min(1.0)).mean()),
            moe_dropped_token_frac=float((dropped / (tokens * self.topk).clamp_min(1.0)).mean()),
            moe_routed_tokens=float(tokens.mean()),
        )
        return out
