"""MoE in the megatron backend on the CPU: Qwen3-MoE / Qwen2-MoE conversion, forward, router metrics, train step.

Single process with the "allgather" token dispatcher (megatron-core's "alltoall" one allocates CUDA
streams when it is built); expert parallelism across processes runs in ``test_megatron_ep2.py``
and on GPUs (``scripts/gpu/megatron_checks.sh``).
"""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from slime.config import MegatronConfig, TrainConfig
from slime.train.megatron.arch import ModelArch, UnsupportedArchitecture, load_hf_config
from slime.train.megatron.convert import is_expert, mcore_names
from slime.train.megatron.convert_state import hf_to_mcore, mcore_to_hf

MOE_FAMILIES = ["qwen3_moe", "qwen2_moe"]
CPU_MOE = MegatronConfig(moe_token_dispatcher_type="allgather")


def _hf_state(hf_dir: str) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(hf_dir, "model.safetensors"))


@pytest.mark.parametrize("family", MOE_FAMILIES)
@pytest.mark.parametrize("tp, ep, etp", [(1, 1, 1), (2, 1, 2), (1, 2, 1), (1, 4, 1), (2, 2, 1), (2, 2, 2)])
def test_moe_round_trip_is_bit_exact_for_every_tp_ep_etp_layout(family, tp, ep, etp, hf_dirs):
    arch = ModelArch.from_hf_config(load_hf_config(hf_dirs[family]))
    hf = _hf_state(hf_dirs[family])
    hf["model.layers.0.mlp.gate.weight"] = hf["model.layers.0.mlp.gate.weight"].to(torch.bfloat16)  # dtypes survive too
    dense = [hf_to_mcore(hf, arch, tp_size=tp, tp_rank=r) for r in range(tp)]
    experts = [
        [
            hf_to_mcore(hf, arch, tp_size=tp, tp_rank=0, ep_size=ep, ep_rank=e, etp_size=etp, etp_rank=t)
            for t in range(etp)
        ]
        for e in range(ep)
    ]
    assert all(list(s) == mcore_names(arch, ep_size=ep) for row in experts for s in row)
    got = mcore_to_hf(dense, arch, expert_shard_states=experts)
    want = {k: v for k, v in hf.items() if k != "lm_head.weight" or not arch.tie_word_embeddings}
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_expert_shards_follow_the_ep_and_etp_layout(hf_dirs):
    """4 experts, EP=2, ETP=2: EP rank 1 holds experts 2, 3 as local 0, 1; ETP rank 1 the second half of each width."""
    arch = ModelArch.from_hf_config(load_hf_config(hf_dirs["qwen3_moe"]))
    hf = _hf_state(hf_dirs["qwen3_moe"])
    shard = hf_to_mcore(hf, arch, tp_size=1, tp_rank=0, ep_size=2, ep_rank=1, etp_size=2, etp_rank=1)
    pre, f = "model.layers.1.mlp.experts.3.", arch.moe_ffn_hidden_size // 2
    fc1 = shard["decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight"]
    assert torch.equal(fc1, torch.cat([hf[pre + "gate_proj.weight"][f:], hf[pre + "up_proj.weight"][f:]]))
    assert torch.equal(
        shard["decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight"], hf[pre + "down_proj.weight"][:, f:]
    )
    assert torch.equal(shard["decoder.layers.1.mlp.router.weight"], hf["model.layers.1.mlp.gate.weight"])
    assert sum(is_expert(n) for n in shard) == 2 * 2 * arch.num_layers  # 2 local experts x fc1/fc2 per layer


def test_moe_arch_reads_routing_shared_expert_and_dense_layers(hf_dirs):
    q3 = ModelArch.from_hf_config(load_hf_config(hf_dirs["qwen3_moe"]))
    assert (q3.num_experts, q3.moe_router_topk, q3.norm_topk_prob, q3.qk_norm, q3.shared_expert_ffn_hidden_size) == (
        4,
        2,
        True,
        True,
        0,
    )
    q2 = ModelArch.from_hf_config(load_hf_config(hf_dirs["qwen2_moe"]))
    assert q2.moe_layers == (True, False, True) and q2.shared_expert_gate and q2.qkv_bias and not q2.norm_topk_prob
    with pytest.raises(ValueError, match="num_experts=4"):
        q3.check_expert_parallel(3, 1)
    with pytest.raises(ValueError, match="moe_intermediate_size=16"):
        q3.check_expert_parallel(1, 3)
    dense = ModelArch.from_hf_config(load_hf_config(hf_dirs["qwen3"]))
    with pytest.raises(ValueError, match="has no experts"):
        dense.check_expert_parallel(2, 1)
    dense.check_expert_parallel(1, 2)  # the default ETP (= TP) of a dense model under TP=2 splits nothing
    with pytest.raises(UnsupportedArchitecture, match="no MoE layer"):
        ModelArch.from_hf_config(dict(load_hf_config(hf_dirs["qwen3_moe"]), mlp_only_layers=[0, 1]))


def _build(hf_dir: str, mcfg: MegatronConfig = CPU_MOE):
    from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config

    arch = ModelArch.from_hf_config(load_hf_config(hf_dir))
    model = build_gpt_model(arch, transformer_config(arch, mcfg, use_cpu_initialization=True), tp_size=1)
    load_hf_weights(model, HFCheckpointReader(hf_dir), arch, tp_size=1, tp_rank=0)
    return arch, model


def _packed(arch, lens, seed=1):
    from slime.train.batch import TrainBatch
    from slime.train.megatron.packing import pack_samples

    L = max(lens)
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lens), L, dtype=torch.long)
    for i, n in enumerate(lens):
        ids[i, :n] = torch.randint(0, arch.vocab_size, (n,), generator=g)
    z = torch.zeros(len(lens), L - 1)
    batch = TrainBatch(
        input_ids=ids,
        attention_mask=(torch.arange(L) < torch.tensor(lens)[:, None]).long(),
        loss_mask=z,
        rollout_logprobs=z,
        advantages=z,
        staleness=z.long(),
        sample_advantages=torch.zeros(len(lens)),
        rewards=torch.zeros(len(lens)),
        seq_lens=torch.tensor(lens),
        response_mask=z,
    )
    return ids, pack_samples(
        batch, list(range(len(lens))), pad_token_id=0, pad_to=1, head_dim=arch.head_dim, rope_theta=arch.rope_theta
    )


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_megatron_moe_logits_match_hf(family, hf_dirs, megatron_cpu, make_hf):
    """Routing (softmax, top-k, renormalised or not), experts, shared expert and its gate, dense layers: fp32 logits equal HF's."""
    arch, model = _build(hf_dirs[family])
    hf = make_hf(family)
    lens = [9, 4, 6]
    ids, mb = _packed(arch, lens)
    with torch.no_grad():
        logits = model.eval()(
            input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, packed_seq_params=mb.params
        )[0]
        ref = torch.cat([hf(input_ids=ids[i : i + 1, :n]).logits[0] for i, n in enumerate(lens)])
    torch.testing.assert_close(logits[:, : arch.vocab_size], ref, atol=2e-5, rtol=1e-5)


def test_router_metrics_match_megatron_load_balancing_loss_and_count_drops(hf_dirs, megatron_cpu):
    """RouterStats' loss equals the value megatron-core logs for its aux loss; loads sum to 1; a capacity
    factor of 0.5 drops exactly the slots the router's output map lacks; no-grad forwards are not counted."""
    from slime.train.megatron.router_metrics import attach_megatron_routers

    mu = pytest.importorskip("megatron.core.transformer.moe.moe_utils")
    mcfg = MegatronConfig(
        moe_token_dispatcher_type="allgather", moe_aux_loss_coeff=1e-2, moe_expert_capacity_factor=0.5
    )
    arch, model = _build(hf_dirs["qwen3_moe"], mcfg)
    stats = attach_megatron_routers(
        model, num_experts=arch.num_experts, topk=arch.moe_router_topk, device=torch.device("cpu")
    )
    assert stats.num_layers == arch.num_layers
    _, mb = _packed(arch, [12, 8])
    fwd = dict(input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, packed_seq_params=mb.params)
    maps = []
    handles = [r.register_forward_hook(lambda m, a, out: maps.append(out[1].clone())) for r in stats.routers]
    with torch.no_grad():
        model.eval()(**fwd)
    assert stats.collect(groups=[]) == {}  # the no-grad pass is not counted
    mu.clear_aux_losses_tracker()
    maps.clear()
    model.train()(**fwd).sum().backward()
    for h in handles:
        h.remove()
    megatron_lbl = mu.get_moe_layer_wise_logging_tracker()["load_balancing_loss"]["values"]  # per layer, unscaled
    m = stats.collect(groups=[])
    assert m["moe_load_balancing_loss"] == pytest.approx(float(megatron_lbl.mean()), rel=1e-5)
    loads = [m[f"moe_expert_load_{e}"] for e in range(arch.num_experts)]
    assert sum(loads) == pytest.approx(1.0) and m["moe_load_imbalance"] >= 1.0
    kept = sum(float(x.sum()) for x in maps) / len(maps)
    assert m["moe_routed_tokens"] == 20.0
    assert (
        m["moe_dropped_token_frac"] == pytest.approx(1.0 - kept / (20 * arch.moe_router_topk))
        and m["moe_dropped_token_frac"] > 0
    )


def test_moe_train_step_matches_the_torch_backend_and_logs_router_metrics(hf_dirs, megatron_cpu, cpu_megatron_trainer):
    """Same weights and groups: the megatron MoE trainer's loss, grad norm and ratios equal TorchTrainer's on the HF MoE model."""
    from test_megatron_trainer import _groups

    from slime.train.torch_backend import TorchTrainer

    config = TrainConfig(lr=1e-3, global_batch_size=4, micro_batch_size=2, megatron=CPU_MOE)
    megatron = cpu_megatron_trainer(config, hf_dirs["qwen3_moe"], megatron_cpu, rollout_temperature=0.9)
    reference = TorchTrainer(config, model_dir=hf_dirs["qwen3_moe"], rollout_temperature=0.9)
    groups = _groups(96)
    for _ in range(2):
        got, want = megatron.train_step(groups).to_dict(), reference.train_step(groups).to_dict()
        for key in (
            "loss",
            "grad_norm",
            "ratio_mean",
            "entropy",
            "approx_kl",
            "train_rollout_logprob_abs_diff",
            "num_train_tokens",
        ):
            assert got[key] == pytest.approx(want[key], rel=5e-4, abs=5e-6), key
    assert got["moe_routed_tokens"] == float(
        sum(len(s.prompt_ids) + len(s.response_ids) for g in groups for s in g.samples)
    )
    assert (
        sum(got[f"moe_expert_load_{e}"] for e in range(4)) == pytest.approx(1.0)
        and got["moe_dropped_token_frac"] == 0.0
    )


def test_expert_parallel_ranks_run_as_many_micro_batches_as_the_busiest_dp_rank(
    hf_dirs, megatron_cpu, cpu_megatron_trainer
):
    """Under EP each MoE forward is a collective over DP ranks: a rank with fewer samples pads with placeholders."""
    import dataclasses

    from test_megatron_trainer import _groups

    from slime.train.batch import build_train_batch

    config = TrainConfig(
        global_batch_size=8,
        micro_batch_size=1,
        megatron=MegatronConfig(
            moe_token_dispatcher_type="allgather", use_dynamic_batch_size=True, max_tokens_per_gpu=13
        ),
    )  # DP plan: 3 and 4 micro-batches
    trainer = cpu_megatron_trainer(config, hf_dirs["qwen3_moe"], megatron_cpu)
    batch = build_train_batch(_groups(96), pad_token_id=0, current_version=0)
    counts = {}
    for ep in (1, 2):
        for rank in (0, 1):
            trainer.step.ctx = dataclasses.replace(megatron_cpu, dp_size=2, dp_rank=rank, ep_size=ep)
            ((_, _, mbs),) = trainer._plan(batch)
            counts[ep, rank] = (len(mbs), sum(1 for mb in mbs if not mb.samples))
    trainer.step.ctx = megatron_cpu
    assert (
        counts[1, 0][0] != counts[1, 1][0] and counts[1, 0][1] == counts[1, 1][1] == 0
    )  # DP alone: uneven, no placeholders
    assert counts[2, 0][0] == counts[2, 1][0] == max(counts[1, 0][0], counts[1, 1][0])
    assert counts[2, 0][1] + counts[2, 1][1] == abs(counts[1, 0][0] - counts[1, 1][0])


def test_moe_under_tensor_parallelism_needs_sequence_parallel(hf_dirs):
    from slime.train.megatron.model import transformer_config

    arch = ModelArch.from_hf_config(load_hf_config(hf_dirs["qwen3_moe"]))
    with pytest.raises(ValueError, match="needs --sequence-parallel"):
        transformer_config(arch, MegatronConfig(tensor_model_parallel_size=2), use_cpu_initialization=True)
