"""DeepSeek-style MoE layers read from an HF config: sigmoid router with expert bias, groups, shared experts.

DeepSeek-V3 / R1, Kimi-K2 (``DeepseekV3ForCausalLM``) and GLM-4.5 to 4.7 (``Glm4MoeForCausalLM``)
share one MoE layout, which HF configs spell with the same keys::

    n_routed_experts        -> num_moe_experts           moe_intermediate_size -> moe_ffn_hidden_size
    num_experts_per_tok     -> moe_router_topk           n_shared_experts * moe_intermediate_size
                                                            -> moe_shared_expert_intermediate_size (no gate)
    n_group, topk_group     -> moe_router_num_groups, moe_router_group_topk
    routed_scaling_factor   -> moe_router_topk_scaling_factor
    first_k_dense_replace   -> moe_layer_freq (layers < k dense, SwiGLU of intermediate_size)
    e_score_correction_bias -> the router's expert_bias buffer (moe_router_enable_expert_bias)

Routing, as HF's ``DeepseekV3TopkRouter`` computes it (fp32): ``s = sigmoid(x @ W.T)``; experts
are chosen by ``s + bias``: the ``topk_group`` groups of ``E / n_group`` experts with the largest
sum of their two best scores, then the top ``num_experts_per_tok`` experts inside those groups;
their weights are the unbiased ``s`` renormalised to sum to 1 (``norm_topk_prob``) and multiplied
by ``routed_scaling_factor``. megatron-core's ``topk_routing_with_score_function`` with
``score_function="sigmoid"`` is the same computation, with two limits checked here
(``UnsupportedArchitecture``): it always renormalises when k > 1 (so ``norm_topk_prob`` must be
true), and it sums the best ``k / topk_group`` scores per group (so ``k / topk_group`` must be 2
whenever the group limit removes any group).

The bias is not trained by gradient (auxiliary-loss-free balancing, DeepSeek-V3 section 2.1.2):
megatron-core counts the tokens routed to each expert during training forwards and, in
``finalize_model_grads`` after every optimizer step, moves each bias by
``moe_router_bias_update_rate * sign(mean_count - count)`` (the counts summed over TP x CP x DP
ranks), as THUDM/slime's megatron runs do with ``--moe-router-enable-expert-bias``. The rate is
``--moe-router-bias-update-rate`` (megatron's default ``1e-3``; slime's DeepSeek / GLM model scripts pass 0,
which keeps the bias as loaded).

Example: DeepSeek-V3 (256 experts, 8 groups of 32, top-4 groups, top-8, scale 2.5, 1 shared
expert of 2048, first 3 layers dense) -> ``SigmoidRouter(num_groups=8, group_topk=4,
scaling_factor=2.5)`` and experts / shared width / ``moe_layers`` as in ``deepseek_moe_fields``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["SigmoidRouter", "deepseek_moe_fields", "router_config_fields", "named_weights", "BIAS_UPDATE_RATE"]

BIAS_UPDATE_RATE = 1e-3
"""megatron-core's default ``moe_router_bias_update_rate`` (bias step per optimizer step)."""


class _Unsupported(ValueError):
    """Raised for a routing option megatron-core cannot reproduce; ``arch`` re-raises it as UnsupportedArchitecture."""


@dataclasses.dataclass(frozen=True)
class SigmoidRouter:
    """The DeepSeek-V3 router options (module docstring).

    Attributes:
        num_groups: ``n_group``; 0 when the group limit keeps every group (no group routing).
        group_topk: ``topk_group``, groups kept per token (0 with ``num_groups`` 0).
        scaling_factor: ``routed_scaling_factor``, multiplies the renormalised top-k weights.
        expert_bias: the router carries ``e_score_correction_bias`` (always for these families).
    """

    num_groups: int = 0
    group_topk: int = 0
    scaling_factor: float = 1.0
    expert_bias: bool = True

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], model_type: str) -> SigmoidRouter:
        """Read ``n_group``, ``topk_group``, ``routed_scaling_factor`` (and check ``norm_topk_prob``).

        Raises:
            ValueError: ``norm_topk_prob`` false with k > 1 (or true with k = 1), ``n_group`` not dividing the
                experts, or a group limit with ``num_experts_per_tok / topk_group`` other than 2 (module docstring).
        """
        experts, topk = int(config["n_routed_experts"]), int(config["num_experts_per_tok"])
        groups = int(config.get("n_group") or 1)
        group_topk = int(config.get("topk_group") or groups)
        norm = bool(config.get("norm_topk_prob", True))
        if topk > 1 and not norm:
            raise _Unsupported(f"{model_type} with norm_topk_prob=False: expected True (megatron renormalises top-k)")
        if topk == 1 and norm:  # HF renormalises the one weight to 1; megatron's sigmoid path keeps the raw score
            raise _Unsupported(
                f"{model_type} with num_experts_per_tok=1 and norm_topk_prob=True: expected norm_topk_prob=False "
                "(megatron does not renormalise a single expert's score)"
            )
        if experts % groups:
            raise _Unsupported(f"{model_type} with n_group={groups}: expected a divisor of n_routed_experts={experts}")
        if group_topk >= groups:  # every group is kept: plain top-k
            groups = group_topk = 0
        elif topk != 2 * group_topk:
            raise _Unsupported(
                f"{model_type} with num_experts_per_tok={topk}, topk_group={group_topk}: expected "
                "num_experts_per_tok == 2 * topk_group (HF scores a group by its best 2 experts, megatron by its best k / topk_group)"
            )
        return cls(
            num_groups=groups,
            group_topk=group_topk,
            scaling_factor=float(config.get("routed_scaling_factor") or 1.0),
        )


def deepseek_moe_fields(config: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """The MoE keyword arguments of ``ModelArch`` for a DeepSeek-V3 / GLM-4.5 config (module docstring).

    Layer ``i`` is an MoE layer when ``i >= first_k_dense_replace`` (and ``i % moe_layer_freq == 0``
    where a DeepSeek config sets that key); the others are dense SwiGLU layers.

    Returns:
        num_experts, moe_ffn_hidden_size, moe_router_topk, norm_topk_prob, shared_expert_ffn_hidden_size,
        shared_expert_gate (False), moe_layers, router (a ``SigmoidRouter``).

    Raises:
        ValueError: as ``SigmoidRouter.from_hf_config``, or a config with no MoE layer.
    """
    num_layers = int(config["num_hidden_layers"])
    first_dense = int(config.get("first_k_dense_replace") or 0)
    freq = int(config.get("moe_layer_freq") or 1)
    layers = tuple(i >= first_dense and i % freq == 0 for i in range(num_layers))
    if not any(layers):
        raise _Unsupported(f"{model_type} with first_k_dense_replace={first_dense} leaves no MoE layer")
    width = int(config["moe_intermediate_size"])
    return dict(
        num_experts=int(config["n_routed_experts"]),
        moe_ffn_hidden_size=width,
        moe_router_topk=int(config["num_experts_per_tok"]),
        norm_topk_prob=bool(config.get("norm_topk_prob", True)),
        shared_expert_ffn_hidden_size=int(config.get("n_shared_experts") or 0) * width,
        shared_expert_gate=False,
        moe_layers=layers,
        router=SigmoidRouter.from_hf_config(config, model_type),
    )


def router_config_fields(router: SigmoidRouter, *, bias_update_rate: float = BIAS_UPDATE_RATE) -> dict[str, object]:
    """The ``TransformerConfig`` routing fields of ``router``: sigmoid scores, expert bias, groups, scaling.

    They replace the softmax ones of ``model._moe_config``; the model builder allocates the bias
    buffers (``model.use_expert_bias``) and the trainer's ``finalize_model_grads`` updates them.
    """
    return dict(
        moe_router_score_function="sigmoid",
        moe_router_pre_softmax=False,
        moe_router_num_groups=router.num_groups or None,
        moe_router_group_topk=router.group_topk or None,
        moe_router_topk_scaling_factor=router.scaling_factor if router.scaling_factor != 1.0 else None,
        moe_router_enable_expert_bias=router.expert_bias,
        moe_router_bias_update_rate=bias_update_rate,
    )


def named_weights(model: torch.nn.Module) -> dict[str, Tensor]:
    """``model``'s parameters and its routers' ``expert_bias`` buffers by name: what conversion and weight sync carry.

    The bias is a buffer (no gradient; ``finalize_model_grads`` moves it), yet part of the model the
    engine must serve: HF's ``mlp.gate.e_score_correction_bias``. The routers' token counts
    (``local_tokens_per_expert``) are not weights and stay out.
    """
    out: dict[str, Tensor] = dict(model.named_parameters())
    out.update((name, b) for name, b in model.named_buffers() if name.endswith(".router.expert_bias"))
    return out
