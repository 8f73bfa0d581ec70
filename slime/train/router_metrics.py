"""Per-step router metrics of an MoE model: load per expert, load-balancing loss, dropped tokens.

``RouterStats`` accumulates what the routers of one model did in the training forwards of one
train step. Forward hooks feed it: ``attach_hf_routers`` for transformers' MoE routers (the torch
backend) and ``slime.train.megatron.router_metrics.attach_megatron_routers`` for megatron-core's
``TopKRouter``. Only forwards with autograd on are counted (megatron's hook also needs
``router.training``: megatron's own condition for the aux loss), so the no-grad old-logprob pass
is left out and a layer under full activation recompute is counted once (its first, no-grad
forward is skipped). Under sequence parallelism each TP rank routes its own slice of a
micro-batch's tokens; ``record`` then sums that micro-batch's statistics over ``tp_group`` first
(3E + 1 numbers per layer), so the load-balancing loss is the micro-batch's as a whole, as
megatron-core computes it. ``collect`` sums the step's statistics over the data-parallel group and
returns:

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
0.125; imbalance 0.375 * 4 = 1.5.

Which tokens count: the torch backend masks out the padding of its padded [B, L] micro-batches
(``RouterStats.tokens``). The megatron backend counts every packed token, including the few pad
tokens that packing adds to reach a multiple of the TP size under sequence parallelism and the
placeholder micro-batches a rank runs under expert parallelism (``MegatronTrainer._plan``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["RouterStats", "attach_hf_routers"]


class RouterStats:
    """Router statistics of one train step on this rank; hooks ``record``, ``collect`` reduces and resets.

    Args:
        num_experts / topk: routed experts per MoE layer and experts per token.
        device: where the running sums live (the model's device).
        tp_group: the TP group when sequence parallelism splits each micro-batch over it; else None.
    """

    def __init__(self, *, num_experts: int, topk: int, device: torch.device, tp_group: dist.ProcessGroup | None = None):
        self.num_experts = num_experts
        self.topk = topk
        self.device = device
        self.tp_group = tp_group if tp_group is not None and dist.get_world_size(tp_group) > 1 else None
        self.routers: list[torch.nn.Module] = []
        self._sums = torch.zeros(
            0, num_experts + 3, dtype=torch.float64, device=device
        )  # [L, E + 3]: slots per expert, tokens, dropped slots, aux x tokens
        self._token_mask: Tensor | None = None

    @property
    def num_layers(self) -> int:
        return len(self.routers)

    def add_router(self, module: torch.nn.Module) -> int:
        """Register one router (one MoE layer); returns its row index for ``record``."""
        self.routers.append(module)
        self._sums = torch.cat([self._sums, self._sums.new_zeros(1, self.num_experts + 3)])
        return len(self.routers) - 1

    @contextlib.contextmanager
    def tokens(self, attention_mask: Tensor) -> Iterator[None]:
        """Inside: ``record`` keeps only the tokens where ``attention_mask`` ([b, l], 1 = real) is set."""
        self._token_mask = attention_mask.reshape(-1).bool()
        try:
            yield
        finally:
            self._token_mask = None

    @torch.no_grad()
    def record(self, idx: int, logits: Tensor, kept: Tensor) -> None:
        """One router forward: ``logits`` [T, E] (before any softmax), ``kept`` [T, E] bool (the
        (token, expert) slots actually routed, after any capacity dropping)."""
        E = self.num_experts
        logits, kept = logits.reshape(-1, E), kept.reshape(-1, E)
        if self._token_mask is not None and self._token_mask.numel() == logits.shape[0]:
            logits, kept = logits[self._token_mask], kept[self._token_mask]
        scores = torch.softmax(logits.float(), dim=-1)  # [T, E]
        chosen = torch.zeros_like(scores).scatter_(1, scores.topk(self.topk, dim=1).indices, 1.0)  # before dropping
        vec = torch.cat(
            [scores.sum(0), chosen.sum(0), kept.sum(0).float(), scores.new_full((1,), scores.shape[0])]
        )  # [3E + 1]
        if self.tp_group is not None:  # the whole micro-batch on every TP rank; collect sums over DP only
            dist.all_reduce(vec, group=self.tp_group)
        P, C, counts, num_tokens = vec[:E], vec[E : 2 * E], vec[2 * E : 3 * E].double(), vec[3 * E].double()
        aux = E / (self.topk * num_tokens.clamp_min(1.0) ** 2) * (P * C).sum().double()
        row = self._sums[idx]
        row[:E] += counts.to(row.device)
        row[E] += num_tokens.to(row.device)
        row[E + 1] += (num_tokens * self.topk - counts.sum()).to(row.device)
        row[E + 2] += (aux * num_tokens).to(row.device)

    def collect(self, *, groups: Sequence[dist.ProcessGroup | None]) -> dict[str, float]:
        """Sum this step's statistics over ``groups`` (each all-reduced in turn), reset, return metrics.

        Every rank must call it (the reductions are collective); every rank gets the same dict.
        Empty when no router is registered or no training forward ran.
        """
        if not self.routers:
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
        load = counts / counts.sum(1, keepdim=True).clamp_min(1.0)  # [L, E]
        out = {f"moe_expert_load_{e}": float(load[:, e].mean()) for e in range(E)}
        out.update(
            moe_load_imbalance=float((load.max(1).values * E).mean()),
            moe_load_balancing_loss=float((aux_tok / tokens.clamp_min(1.0)).mean()),
            moe_dropped_token_frac=float((dropped / (tokens * self.topk).clamp_min(1.0)).mean()),
            moe_routed_tokens=float(tokens.mean()),
        )
        return out


def _is_hf_router(module: torch.nn.Module) -> bool:
    """transformers 5's MoE router (``Qwen3MoeTopKRouter``, ``Qwen2MoeTopKRouter``, ...): a module with
    ``top_k``, ``num_experts`` and a [E, hidden] ``weight``, returning (logits, top-k weights, top-k indices)."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("TopKRouter")
        and isinstance(getattr(module, "top_k", None), int)
        and isinstance(getattr(module, "num_experts", None), int)
        and isinstance(weight, Tensor)
        and weight.dim() == 2
        and weight.shape[0] == module.num_experts
    )


def attach_hf_routers(model: torch.nn.Module) -> RouterStats | None:
    """Hook every transformers MoE router of ``model`` into a new ``RouterStats``; None if it has none.

    The hook reads the router's output (router logits [T, E], top-k weights, top-k indices [T, k]);
    nothing is dropped in transformers' MoE blocks, so the kept slots are the top-k ones.
    """
    routers = [m for m in model.modules() if _is_hf_router(m)]
    if not routers:
        return None
    first = routers[0]
    # ints (_is_hf_router checked them); read with getattr since nn.Module's __getattr__ types them Tensor | Module
    num_experts, topk = getattr(first, "num_experts"), getattr(first, "top_k")  # noqa: B009
    stats = RouterStats(num_experts=num_experts, topk=topk, device=torch.device("cpu"))
    for module in routers:
        idx = stats.add_router(module)

        def hook(mod: torch.nn.Module, args: tuple, output: tuple, idx: int = idx) -> None:
            if not torch.is_grad_enabled():
                return
            logits, _, indices = output
            kept = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, indices.reshape(-1, indices.shape[-1]), True)
            stats.record(idx, logits.detach(), kept)

        module.register_forward_hook(hook)
    return stats
