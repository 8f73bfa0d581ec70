"""Router metrics of the megatron backend: forward hooks on megatron-core's ``TopKRouter`` feeding a ``RouterStats``.

What is measured and how it is reduced: ``slime.train.router_metrics``. Here the hook reads the
router's input (to recompute the gate logits under no_grad: megatron's router returns only the
top-k probabilities and the routing map) and its output routing map, which has the capacity
factor's drops already applied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from slime.train.megatron._mcore import mcore
from slime.train.router_metrics import RouterStats

if TYPE_CHECKING:  # megatron-core ships no type information: this names its class (mypy reads it as Any)
    from megatron.core.transformer.moe.router import TopKRouter

__all__ = ["attach_megatron_routers"]


def attach_megatron_routers(
    model: torch.nn.Module,
    *,
    num_experts: int,
    topk: int,
    device: torch.device,
    tp_group: dist.ProcessGroup | None = None,
) -> RouterStats:
    """Hook every ``TopKRouter`` (subclasses included) of ``model`` into a new ``RouterStats``.

    Args:
        model: a ``GPTModel`` (wrappers allowed).
        num_experts / topk: ``num_moe_experts`` and ``moe_router_topk``.
        device: the model's device (the running sums live there).
        tp_group: the TP group under sequence parallelism, else None (``RouterStats``).
    """
    router_class = mcore("megatron.core.transformer.moe.router").TopKRouter
    stats = RouterStats(num_experts=num_experts, topk=topk, device=device, tp_group=tp_group)
    for module in model.modules():
        if not isinstance(module, router_class):
            continue
        idx = stats.add_router(module)

        def hook(router: TopKRouter, args: tuple, output: tuple, idx: int = idx) -> None:
            if not (router.training and torch.is_grad_enabled()):
                return
            with torch.no_grad():
                logits = router.gating(args[0])  # [s, b, E] in the router dtype
            stats.record(idx, logits, output[1])  # output: (probs, routing_map [T, E] bool)

        module.register_forward_hook(hook)
    return stats
