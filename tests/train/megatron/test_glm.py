"""GLM-4 (``Glm4ForCausalLM``) and GLM-4.5 (``Glm4MoeForCausalLM``) in the megatron backend on the CPU: RoPE
layout, conversion, logits against transformers' own classes, an RL step and the weights it syncs back.

The tiny GLM-4 (conftest ``ARCH_CONFIGS["glm4"]``) has head_dim 12 with RoPE on 6 channels,
interleaved, q/k/v biases, the post-attention and post-MLP norms, and the fused ``gate_up_proj``.
The tiny GLM-4.5 (``ARCH_CONFIGS["glm4_moe"]``) has RoPE on 6 of 12 channels (halves), q/k/v biases, q/k
norms, a dense first layer, then 8 experts in 4 groups (top-1 group, top-2 experts), sigmoid scores with a
random expert bias, routed scaling 2.5 and one shared expert.
"""

from __future__ import annotations

import os

import msgspec
import pytest
import torch
from safetensors.torch import load_file

from slime.config import MegatronConfig, TrainConfig
from slime.train.megatron.arch import ModelArch, load_hf_config
from slime.train.megatron.convert import mcore_names
from slime.train.megatron.convert_state import hf_to_mcore, mcore_to_hf
from slime.train.megatron.glm import rope_permutation

GLM_FAMILIES = ["glm4", "glm4_moe"]
CPU_MOE = MegatronConfig(moe_token_dispatcher_type="allgather")  # "alltoall" allocates CUDA streams


def _hf_state(hf_dir: str) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(hf_dir, "model.safetensors"))


def test_rope_permutation_pairs_the_rotated_channels_and_leaves_the_rest_at_frequency_zero():
    assert rope_permutation(8, 4, True).tolist() == [0, 2, 4, 5, 1, 3, 6, 7]
    assert rope_permutation(8, 4, False).tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    assert rope_permutation(8, 8, False) is None  # Llama's layout: nothing to move
    with pytest.raises(ValueError, match="rotary_dim=3"):
        rope_permutation(8, 3, False)


def test_rope_tables_rotate_only_rotary_dim_channels():
    from slime.train.megatron.layers import rope_cos_sin

    cos, sin = rope_cos_sin(torch.tensor([0, 5]), head_dim=8, rope_theta=100.0, rotary_dim=4)
    assert cos.shape == (2, 1, 8)
    # pairs (c, c + 4): c = 0, 1 rotate at 100 ** (-0 / 4), 100 ** (-2 / 4); c = 2, 3 do not rotate
    torch.testing.assert_close(sin[1, 0, :4], torch.tensor([5.0, 0.5, 0.0, 0.0]).sin())
    assert torch.equal(cos[1, 0, 2:4], torch.ones(2)) and torch.equal(cos[:, 0, :4], cos[:, 0, 4:])


def test_glm4_arch_reads_partial_interleaved_rope_biases_and_post_norms(hf_dirs):
    arch = ModelArch.from_hf_config(load_hf_config(hf_dirs["glm4"]))
    assert (arch.family, arch.head_dim, arch.rotary_dim, arch.rope_interleaved) == ("glm4", 12, 6, True)
    assert arch.qkv_bias and arch.post_norms and not arch.qk_norm and not arch.is_moe


def test_glm4_moe_arch_reads_the_deepseek_style_router_and_partial_rope(hf_dirs):
    arch = ModelArch.from_hf_config(load_hf_config(hf_dirs["glm4_moe"]))
    assert (arch.rotary_dim, arch.rope_interleaved, arch.post_norms) == (6, False, False)
    assert arch.qkv_bias and arch.qk_norm and arch.moe_layers == (False, True, True)
    assert (arch.num_experts, arch.moe_router_topk, arch.shared_expert_ffn_hidden_size) == (8, 2, 16)
    r = arch.router
    assert r is not None and (r.num_groups, r.group_topk, r.scaling_factor, r.expert_bias) == (4, 1, 2.5, True)


@pytest.mark.parametrize("family", GLM_FAMILIES)
@pytest.mark.parametrize("tp_size, ep_size", [(1, 1), (2, 1), (1, 2), (2, 4)])
def test_glm_round_trip_is_bit_exact_over_tp_and_ep(family, tp_size, ep_size, hf_dirs):
    arch = ModelArch.from_hf_config(load_hf_config(hf_dirs[family]))
    hf = _hf_state(hf_dirs[family])
    ep_size = ep_size if arch.is_moe else 1
    shards = [hf_to_mcore(hf, arch, tp_size=tp_size, tp_rank=r) for r in range(tp_size)]
    experts = [
        [hf_to_mcore(hf, arch, tp_size=tp_size, tp_rank=t, ep_size=ep_size, ep_rank=e) for t in range(tp_size)]
        for e in range(ep_size)
    ]
    assert all(list(s) == mcore_names(arch, ep_size=ep_size) for row in experts for s in row)
    got = mcore_to_hf(shards, arch, expert_shard_states=experts)
    assert sorted(got) == sorted(hf)  # on-disk names: gate_up_proj, post_self_attn_layernorm, post_mlp_layernorm
    for name, tensor in hf.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_glm4_fused_mlp_splits_into_megatrons_gate_up_layout(hf_dirs):
    """TP rank 1 holds the second half of the gate rows then the second half of the up rows of ``gate_up_proj``."""
    arch = ModelArch.from_hf_config(load_hf_config(hf_dirs["glm4"]))
    hf = _hf_state(hf_dirs["glm4"])
    fused = hf["model.layers.0.mlp.gate_up_proj.weight"]
    f = arch.ffn_hidden_size
    fc1 = hf_to_mcore(hf, arch, tp_size=2, tp_rank=1)["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(fc1, torch.cat([fused[f // 2 : f], fused[f + f // 2 :]]))


def _build(hf_dir: str):
    from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config

    arch = ModelArch.from_hf_config(load_hf_config(hf_dir))
    model = build_gpt_model(arch, transformer_config(arch, CPU_MOE, use_cpu_initialization=True), tp_size=1)
    load_hf_weights(model, HFCheckpointReader(hf_dir), arch, tp_size=1, tp_rank=0)
    return arch, model.eval()


@pytest.mark.parametrize("family", GLM_FAMILIES)
def test_glm_logits_match_transformers_in_fp32(family, hf_dirs, megatron_cpu, make_hf):
    """Three packed sequences: each one's megatron logits equal transformers' own GLM class's, within 1e-5."""
    from test_megatron_moe import _packed

    arch, model = _build(hf_dirs[family])
    hf = make_hf(family)
    lens = [9, 4, 6]
    ids, mb = _packed(arch, lens)
    mb = _with_rotary(mb, arch)
    with torch.no_grad():
        logits = model(
            input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, packed_seq_params=mb.params
        )[0]
        ref = torch.cat([hf(input_ids=ids[i : i + 1, :n]).logits[0] for i, n in enumerate(lens)])
    torch.testing.assert_close(logits[:, : arch.vocab_size], ref, atol=1e-5, rtol=1e-5)


def _with_rotary(mb, arch):
    """``mb`` with RoPE tables of ``arch.rotary_dim`` (``_packed`` builds full-width ones)."""
    from slime.train.megatron.layers import rope_cos_sin

    cos, sin = rope_cos_sin(
        mb.position_ids[0], head_dim=arch.head_dim, rope_theta=arch.rope_theta, rotary_dim=arch.rotary_dim
    )
    mb.params.rope_cos, mb.params.rope_sin = cos, sin
    return mb


@pytest.mark.parametrize("family", GLM_FAMILIES)
def test_glm_rl_step_matches_the_torch_backend_and_syncs_back_to_hf_names(
    family, hf_dirs, megatron_cpu, cpu_megatron_trainer, tmp_path
):
    """Two GRPO steps: the megatron trainer's metrics equal TorchTrainer's on transformers' GLM class, and the trained
    weights, gathered to HF's on-disk names (what weight sync sends) and loaded by transformers, give the torch
    backend's trained logits."""
    import transformers
    from test_megatron_trainer import _groups

    from slime.train.megatron.weights import iter_hf_weights, write_hf_dir
    from slime.train.torch_backend import TorchTrainer

    config = TrainConfig(lr=1e-3, global_batch_size=4, micro_batch_size=2, megatron=CPU_MOE)
    megatron = cpu_megatron_trainer(config, hf_dirs[family], megatron_cpu, rollout_temperature=0.9)
    reference = TorchTrainer(config, model_dir=hf_dirs[family], rollout_temperature=0.9)
    groups = _groups(96)
    for _ in range(2):
        got, want = megatron.train_step(groups).to_dict(), reference.train_step(groups).to_dict()
        for key in ("loss", "grad_norm", "ratio_mean", "entropy", "approx_kl", "train_rollout_logprob_abs_diff"):
            assert got[key] == pytest.approx(want[key], rel=5e-4, abs=5e-6), key
    synced = write_hf_dir(
        iter_hf_weights(megatron.model, megatron.arch, megatron_cpu),
        str(tmp_path / "synced"),
        source_dir=hf_dirs[family],
    )
    loaded = transformers.AutoModelForCausalLM.from_pretrained(synced, dtype=torch.float32).eval()
    ids = torch.randint(1, 96, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=ids).logits, reference.model.eval()(input_ids=ids).logits, atol=1e-4, rtol=1e-4
        )


def test_the_bf16_wrap_keeps_the_checkpoints_expert_bias_exact_and_syncs_it_back(hf_dirs, megatron_cpu):
    """``--bf16``: the trainer's model routes with, and syncs to the engines, the fp32 bias the checkpoint holds
    (``Float16Module`` alone rounds it to bf16 and its token counts with it)."""
    from slime.train.megatron.float16 import wrap_float16
    from slime.train.megatron.model import transformer_config
    from slime.train.megatron.weights import iter_hf_weights

    arch, model = _build(hf_dirs["glm4_moe"])
    name = "model.layers.1.mlp.gate.e_score_correction_bias"
    bias = _hf_state(hf_dirs["glm4_moe"])[name]
    assert bias.dtype == torch.float32 and not torch.equal(bias, bias.bfloat16().float())  # bf16 would change it
    wrapped = wrap_float16(model, transformer_config(arch, msgspec.structs.replace(CPU_MOE, bf16=True)))
    router = next(m for n, m in model.named_modules() if n.endswith("mlp.router"))
    assert router.expert_bias.dtype == torch.float32 and torch.equal(router.expert_bias, bias)
    assert router.local_tokens_per_expert.dtype == torch.float32  # counts past 256 stay exact
    assert next(p for p in model.parameters() if p.dim() == 2).dtype == torch.bfloat16  # the rest is bf16
    synced = dict(iter_hf_weights(wrapped, arch, megatron_cpu, dtype=torch.float32))
    assert torch.equal(synced[name], bias)
