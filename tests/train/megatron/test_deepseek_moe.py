"""DeepSeek-style routing (slime.train.megatron.deepseek_moe): megatron-core's sigmoid router with the fields read
from an HF config picks the experts and weights HF's DeepseekV3TopkRouter picks; unsupported options are refused."""

from __future__ import annotations

import pytest
import torch

from slime.train.megatron.deepseek_moe import SigmoidRouter, deepseek_moe_fields, router_config_fields

DEEPSEEK = dict(
    num_hidden_layers=4,
    first_k_dense_replace=1,
    n_routed_experts=8,
    num_experts_per_tok=4,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    n_shared_experts=2,
    moe_intermediate_size=16,
)


def test_fields_read_groups_scaling_shared_experts_and_first_k_dense():
    f = deepseek_moe_fields(DEEPSEEK, "deepseek_v3")
    assert f["moe_layers"] == (False, True, True, True)
    assert (f["num_experts"], f["moe_router_topk"], f["shared_expert_ffn_hidden_size"]) == (8, 4, 32)
    assert f["router"] == SigmoidRouter(num_groups=4, group_topk=2, scaling_factor=2.5)
    assert not f["shared_expert_gate"]
    fields = router_config_fields(f["router"])
    assert fields["moe_router_score_function"] == "sigmoid" and fields["moe_router_enable_expert_bias"]
    assert (fields["moe_router_num_groups"], fields["moe_router_group_topk"]) == (4, 2)


def test_a_group_limit_that_keeps_every_group_is_plain_top_k():
    router = SigmoidRouter.from_hf_config(dict(DEEPSEEK, topk_group=4, num_experts_per_tok=3), "deepseek_v3")
    assert (router.num_groups, router.group_topk) == (0, 0)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(norm_topk_prob=False), "norm_topk_prob"),
        (dict(num_experts_per_tok=1, n_group=1, topk_group=1), "num_experts_per_tok=1 and norm_topk_prob=True"),
        (dict(n_group=3), "n_group"),
        (dict(num_experts_per_tok=3), "topk_group"),
        (dict(first_k_dense_replace=4), "first_k_dense_replace"),
    ],
)
def test_options_megatron_cannot_reproduce_are_refused_by_name(change, field):
    with pytest.raises(ValueError, match=field):
        deepseek_moe_fields(dict(DEEPSEEK, **change), "deepseek_v3")


def test_megatron_sigmoid_routing_equals_hf_deepseek_v3_router():
    """Same logits and bias: megatron's topk_routing_with_score_function (fields from router_config_fields)
    chooses HF's experts with HF's weights, group limit and scaling included."""
    moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils")
    tf = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    cfg = tf.DeepseekV3Config(hidden_size=16, **{k: v for k, v in DEEPSEEK.items() if k != "num_hidden_layers"})
    hf = DeepseekV3TopkRouter(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(hf.weight.shape, generator=g))
        hf.e_score_correction_bias.copy_(0.3 * torch.randn(8, generator=g))
    x = torch.randn(64, 16, generator=g)
    _, hf_w, hf_idx = hf(x)
    fields = router_config_fields(SigmoidRouter.from_hf_config(DEEPSEEK, "deepseek_v3"))
    probs, routing_map = moe_utils.topk_routing_with_score_function(
        x @ hf.weight.T,
        topk=4,
        use_pre_softmax=fields["moe_router_pre_softmax"],
        num_groups=fields["moe_router_num_groups"],
        group_topk=fields["moe_router_group_topk"],
        scaling_factor=fields["moe_router_topk_scaling_factor"],
        score_function=fields["moe_router_score_function"],
        expert_bias=hf.e_score_correction_bias,
    )
    want_map = torch.zeros(64, 8, dtype=torch.bool).scatter(1, hf_idx, True)
    assert torch.equal(routing_map, want_map)
    want = torch.zeros(64, 8).scatter(1, hf_idx, hf_w)
    torch.testing.assert_close(probs, want, atol=1e-6, rtol=1e-6)
    assert not torch.equal(want_map, torch.zeros(64, 8).scatter(1, (x @ hf.weight.T).topk(4).indices, 1.0).bool())
