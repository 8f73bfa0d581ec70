"""MoE routing replay on the CPU: SGLang's routed-experts format, and megatron's routers taking given experts.

On the tiny GLM-4.5 (sigmoid router with expert bias, groups, routed scaling): routes recorded from one forward,
replayed after the router weights were perturbed, are the experts every router uses (the perturbed routers alone
pick others), and replaying a model's own routes gives its own logits.
"""

from __future__ import annotations

import pytest
import torch

from slime.config import MegatronConfig
from slime.train.megatron.routing_replay import (
    RoutingReplay,
    decode_routed_experts,
    encode_routed_experts,
    moe_layer_routes,
)

CPU_MOE = MegatronConfig(moe_token_dispatcher_type="allgather")


def test_sglang_routed_experts_round_trip_and_moe_rows():
    routes = torch.arange(5 * 3 * 2, dtype=torch.int32).view(5, 3, 2)
    data = encode_routed_experts(routes)
    assert torch.equal(decode_routed_experts(data, num_layers=3, topk=2), routes)
    assert torch.equal(moe_layer_routes(routes, (False, True, True)), routes[:, 1:])
    with pytest.raises(ValueError, match="whole number of tokens"):
        decode_routed_experts(data, num_layers=4, topk=2)
    with pytest.raises(ValueError, match="the model has 2"):
        moe_layer_routes(routes, (False, True))


def _model(hf_dir: str):
    from slime.train.megatron.arch import ModelArch, load_hf_config
    from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config

    arch = ModelArch.from_hf_config(load_hf_config(hf_dir))
    model = build_gpt_model(arch, transformer_config(arch, CPU_MOE, use_cpu_initialization=True), tp_size=1)
    load_hf_weights(model, HFCheckpointReader(hf_dir), arch, tp_size=1, tp_rank=0)
    return arch, model.eval()


def _forward_with_routes(model, replay: RoutingReplay, mb, routes=None):
    """Logits [t, v] and the experts each router used, [t, L_moe, k] (sorted per token)."""
    maps = []
    hooks = [r.register_forward_hook(lambda m, a, out: maps.append(out[1].clone())) for r in replay._routers]
    ctx = replay.replaying(routes) if routes is not None else torch.no_grad()
    try:
        with torch.no_grad(), ctx:
            logits = model(
                input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, packed_seq_params=mb.params
            )[0]
    finally:
        for h in hooks:
            h.remove()
    k = int(maps[0][0].sum())
    used = torch.stack([m.nonzero()[:, 1].view(-1, k) for m in maps], dim=1)  # routing_map [t, E] -> [t, L, k]
    return logits, used


def test_replayed_routes_are_the_experts_every_router_uses(hf_dirs, megatron_cpu):
    from test_glm import _with_rotary
    from test_megatron_moe import _packed

    arch, model = _model(hf_dirs["glm4_moe"])
    replay = RoutingReplay(model)
    assert replay.num_layers == sum(arch.moe_layers)
    _, mb = _packed(arch, [9, 5, 7])
    mb = _with_rotary(mb, arch)
    logits, routes = _forward_with_routes(model, replay, mb)
    replayed_logits, same = _forward_with_routes(model, replay, mb, routes)
    assert torch.equal(same, routes)
    torch.testing.assert_close(replayed_logits, logits, atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        for router in replay._routers:
            router.weight.add_(torch.randn_like(router.weight), alpha=float(router.weight.abs().mean()) * 4)
    _, drifted = _forward_with_routes(model, replay, mb)
    assert not torch.equal(drifted, routes)  # the perturbed routers pick other experts on their own
    _, replayed = _forward_with_routes(model, replay, mb, routes)
    assert torch.equal(replayed, routes)
    _, after = _forward_with_routes(model, replay, mb)
    assert torch.equal(after, drifted)  # outside replaying(), routing is the routers' own again
    with pytest.raises(ValueError, match="expected \\[tokens, 2, top-k\\]"):
        with replay.replaying(routes[:, :1]):
            pass
