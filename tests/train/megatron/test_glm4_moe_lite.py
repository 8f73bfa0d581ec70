"""GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``: DeepSeek-V3's multi-latent attention and MoE, GLM's dense/MoE layer
list) in the megatron backend on the CPU: the config read, refusals, conversion round trips over TP/EP/ETP (the
checkpoint's multi-token-prediction layer not read), fp32 logits against transformers' own class, and a train step
against the torch backend with the expert bias exported for weight sync.

Two tiny configs cover every feature: "flash" is GLM-4.7-Flash's shape (q latent, plain RoPE, value heads as wide as
query heads, ``first_k_dense_replace=1`` beside transformers' default layer list, ``rms_norm_eps`` 1e-5 while the latent
norms keep HF's 1e-6) with 4 groups of 2 experts, top-2 groups, top-4, routed scaling 1.8, a shared expert and a random
expert bias; "pattern" has no q latent, YaRN, narrower value heads and an ``mlp_layer_types`` list with a dense layer in
the middle.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_deepseek_v3 import CPU_MOE, _packed

from slime.config import TrainConfig
from slime.train.megatron.arch import ModelArch, UnsupportedArchitecture, load_hf_config
from slime.train.megatron.convert import is_expert, mcore_names
from slime.train.megatron.convert_state import hf_to_mcore, mcore_to_hf

BASE = dict(
    vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=4, n_group=4, topk_group=2,
    n_shared_experts=1, routed_scaling_factor=1.8, norm_topk_prob=True, kv_lora_rank=16, qk_nope_head_dim=8,
    qk_rope_head_dim=4, max_position_embeddings=128, tie_word_embeddings=False, initializer_range=0.2,
    num_nextn_predict_layers=1, pad_token_id=0, eos_token_id=1,
)  # fmt: skip
CONFIGS = {
    "flash": dict(
        BASE,
        q_lora_rank=24,
        v_head_dim=12,
        first_k_dense_replace=1,
        rms_norm_eps=1e-5,
        rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=1.0),
    ),
    "pattern": dict(
        BASE,
        q_lora_rank=None,
        v_head_dim=6,
        mlp_layer_types=["sparse", "dense", "sparse"],
        rms_norm_eps=1e-2,
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=10000.0,
            factor=4.0,
            original_max_position_embeddings=8,
            beta_fast=32,
            beta_slow=1,
            mscale=1.0,
            mscale_all_dim=0.8,
        ),
    ),
}
MTP = "model.layers.3."  # the multi-token-prediction layer a checkpoint carries after num_hidden_layers


def make_glm_lite(name: str):
    """A random tiny ``Glm4MoeLiteForCausalLM`` (fp32, eval): norms around 1, a nonzero expert bias."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.Glm4MoeLiteForCausalLM(tf.Glm4MoeLiteConfig(**CONFIGS[name]))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
        for bname, b in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn_like(b))  # nonzero: the bias changes which experts win
    return model.eval()


@pytest.fixture(scope="module")
def lite_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Saved tiny checkpoints, each with an extra MTP layer tensor (as GLM-4.7-Flash's layer 47) that is not read."""
    out = {}
    for name in CONFIGS:
        path = Path(tmp_path_factory.mktemp(f"hf_glm_lite_{name}"))
        make_glm_lite(name).save_pretrained(path)
        weights = load_file(path / "model.safetensors")
        weights[MTP + "eh_proj.weight"] = torch.randn(32, 64)
        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
        out[name] = str(path)
    return out


def _arch(hf_dir: str) -> ModelArch:
    return ModelArch.from_hf_config(load_hf_config(hf_dir))


def test_arch_reads_deepseek_layers_and_glms_layer_list(lite_dirs, caplog):
    with caplog.at_level(logging.INFO, logger="slime.train.megatron.deepseek"):
        flash = _arch(lite_dirs["flash"])
    assert [r.getMessage() for r in caplog.records if "multi-token-prediction" in r.getMessage()]
    assert flash.family == "glm4_moe_lite" and flash.head_dim == 12 and flash.num_query_groups == 4
    assert flash.moe_layers == (False, True, True) and flash.shared_expert_ffn_hidden_size == 16
    assert flash.mla is not None and (flash.mla.q_lora_rank, flash.mla.v_head_dim, flash.mla.rope_type) == (
        24,
        12,
        "rope",
    )
    assert flash.router is not None and (flash.router.num_groups, flash.router.scaling_factor) == (4, 1.8)
    assert flash.rms_norm_eps == 1e-5 and flash.rope_theta == 1e6
    pattern = _arch(lite_dirs["pattern"])
    assert pattern.moe_layers == (True, False, True) and pattern.mla.q_lora_rank == 0
    assert pattern.mla.rope_type == "yarn"


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(first_k_dense_replace=2), "first_k_dense_replace=2"),  # SGLang would build layer 1 dense
        (dict(mlp_layer_types=["dense", "dense"]), "expected 3 of"),
        (dict(mlp_layer_types=["dense"] * 3, first_k_dense_replace=3), "leaves no MoE layer"),
        (dict(rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=0.5)), "partial_rotary_factor=0.5"),
        (dict(rope_interleave=False), "glm4_moe_lite with rope_interleave=False"),
        (dict(attention_bias=True), "attention_bias"),
        (dict(norm_topk_prob=False), "norm_topk_prob"),
    ],
)  # fmt: skip
def test_what_megatron_or_sglang_would_build_differently_is_refused_by_name(lite_dirs, change, words):
    with pytest.raises(UnsupportedArchitecture, match=words):
        ModelArch.from_hf_config(dict(load_hf_config(lite_dirs["flash"]), **change))


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("tp, ep, etp", [(1, 1, 1), (2, 1, 2), (1, 2, 1), (2, 4, 1), (2, 2, 2)])
def test_round_trip_is_bit_exact_for_every_tp_ep_etp_layout(name, tp, ep, etp, lite_dirs):
    arch = _arch(lite_dirs[name])
    hf = load_file(os.path.join(lite_dirs[name], "model.safetensors"))
    shards = [hf_to_mcore(hf, arch, tp_size=tp, tp_rank=r) for r in range(tp)]
    experts = [
        [
            hf_to_mcore(hf, arch, tp_size=tp, tp_rank=0, ep_size=ep, ep_rank=e, etp_size=etp, etp_rank=r)
            for r in range(etp)
        ]
        for e in range(ep)
    ]
    back = mcore_to_hf(shards, arch, expert_shard_states=experts)
    kept = {k: v for k, v in hf.items() if not k.startswith(MTP)}
    assert len(kept) == len(hf) - 1 and set(back) == set(kept)
    for key, value in kept.items():
        assert torch.equal(back[key], value), key
    names = mcore_names(arch, ep_size=ep)
    moe, dense = (1, 0) if name == "flash" else (0, 1)
    assert f"decoder.layers.{moe}.mlp.router.expert_bias" in names
    assert f"decoder.layers.{dense}.mlp.linear_fc1.weight" in names
    assert sum(is_expert(n) for n in names) == 2 * 2 * (8 // ep)  # 2 MoE layers x fc1/fc2 x local experts


def _build(hf_dir: str):
    from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config

    arch = _arch(hf_dir)
    model = build_gpt_model(arch, transformer_config(arch, CPU_MOE, use_cpu_initialization=True), tp_size=1)
    load_hf_weights(model, HFCheckpointReader(hf_dir), arch, tp_size=1, tp_rank=0)
    return arch, model


@pytest.mark.parametrize("name", list(CONFIGS))
def test_megatron_logits_match_transformers_glm4_moe_lite(name, lite_dirs, megatron_cpu):
    """fp32 logits equal transformers' Glm4MoeLiteForCausalLM's to 1e-5 on packed sequences (positions restart at each;
    longer than YaRN's original 8): MLA with interleaved RoPE, the latent norms at HF's 1e-6 beside other norms' eps,
    sigmoid + bias routing over groups, routed scaling, a shared expert, GLM's dense layers."""
    arch, model = _build(lite_dirs[name])
    hf = make_glm_lite(name)
    lens = [19, 4, 11]
    ids, mb = _packed(arch, lens)
    with torch.no_grad():
        logits = model.eval()(
            input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, packed_seq_params=mb.params
        )[0]
        ref = torch.cat([hf(input_ids=ids[i : i + 1, :n]).logits[0] for i, n in enumerate(lens)])
    assert logits.shape[0] >= ref.shape[0]
    torch.testing.assert_close(logits[: ref.shape[0], : arch.vocab_size], ref, atol=1e-5, rtol=1e-5)


def test_train_step_matches_the_torch_backend_and_exports_hf_names(lite_dirs, megatron_cpu, cpu_megatron_trainer):
    """Same weights and groups: the megatron trainer's loss, grad norm and ratios equal TorchTrainer's on transformers'
    Glm4MoeLite; the weights it exports for weight sync are the checkpoint's HF names (no MTP layer), the moved weights
    among them, and the expert bias under ``mlp.gate.e_score_correction_bias``."""
    from test_megatron_trainer import _groups

    from slime.train.megatron.weights import iter_hf_weights
    from slime.train.torch_backend import TorchTrainer

    config = TrainConfig(lr=1e-3, global_batch_size=4, micro_batch_size=2, megatron=CPU_MOE)
    megatron = cpu_megatron_trainer(config, lite_dirs["flash"], megatron_cpu, rollout_temperature=0.9)
    reference = TorchTrainer(config, model_dir=lite_dirs["flash"], rollout_temperature=0.9)
    groups = _groups(96)
    got, want = megatron.train_step(groups).to_dict(), reference.train_step(groups).to_dict()
    for key in ("loss", "grad_norm", "ratio_mean", "entropy", "approx_kl", "train_rollout_logprob_abs_diff"):
        assert got[key] == pytest.approx(want[key], rel=5e-4, abs=5e-6), key
    exported = dict(iter_hf_weights(megatron.model, megatron.arch, megatron.ctx))
    on_disk = load_file(os.path.join(lite_dirs["flash"], "model.safetensors"))
    assert set(exported) == {k for k in on_disk if not k.startswith(MTP)}
    kv_b = "model.layers.1.self_attn.kv_b_proj.weight"
    assert not torch.equal(exported[kv_b], on_disk[kv_b])  # the step moved it, and the export carries the move
    trained = dict(reference.model.named_parameters())[kv_b].detach()  # the torch backend's step moved it alike
    torch.testing.assert_close(exported[kv_b], trained, atol=1e-5, rtol=1e-4)
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    router = dict(megatron.model.named_buffers())["decoder.layers.1.mlp.router.expert_bias"]
    assert torch.equal(exported[bias], router)


def test_slime_convert_round_trips_through_a_megatron_checkpoint(lite_dirs, megatron_cpu, tmp_path):
    """``slime convert`` (its functions): HF -> megatron-core distributed checkpoint -> HF gives the checkpoint back bit
    for bit, the MTP tensor left out, with a config.json transformers loads as Glm4MoeLiteForCausalLM."""
    pytest.importorskip("psutil", reason="megatron-core's checkpoint writer imports psutil without declaring it")
    import transformers

    from slime.train.megatron.convert_cli import hf_to_megatron, megatron_to_hf

    mdir, hdir = tmp_path / "mcore", tmp_path / "hf"
    hf_to_megatron(lite_dirs["pattern"], str(mdir))
    megatron_to_hf(str(mdir), str(hdir))
    back = load_file(hdir / "model.safetensors")
    want = {k: v for k, v in load_file(os.path.join(lite_dirs["pattern"], "model.safetensors")).items()}
    assert set(back) == {k for k in want if not k.startswith(MTP)}
    assert all(torch.equal(back[k], want[k]) for k in back)
    config = transformers.AutoConfig.from_pretrained(str(hdir))
    assert type(config).__name__ == "Glm4MoeLiteConfig" and config.mlp_layer_types == ["sparse", "dense", "sparse"]


RELEASED = dict(  # zai-org/GLM-4.7-Flash's config.json (architecture keys)
    model_type="glm4_moe_lite", architectures=["Glm4MoeLiteForCausalLM"], vocab_size=154880, hidden_size=2048,
    intermediate_size=10240, moe_intermediate_size=1536, num_hidden_layers=47, num_attention_heads=20,
    num_key_value_heads=20, hidden_act="silu", rms_norm_eps=1e-5, attention_bias=False, max_position_embeddings=202752,
    rope_theta=1000000.0, partial_rotary_factor=1.0, q_lora_rank=768, kv_lora_rank=512, qk_nope_head_dim=192,
    qk_rope_head_dim=64, v_head_dim=256, n_routed_experts=64, n_shared_experts=1, num_experts_per_tok=4,
    norm_topk_prob=True, routed_scaling_factor=1.8, n_group=1, topk_group=1, first_k_dense_replace=1,
    topk_method="noaux_tc", num_nextn_predict_layers=1, rope_interleave=True, tie_word_embeddings=False,
)  # fmt: skip


def test_the_released_config_is_built_and_splits_over_tp_1_2_4():
    arch = ModelArch.from_hf_config(RELEASED)
    assert arch.moe_layers == (False,) + (True,) * 46 and arch.head_dim == 256 and arch.rope_theta == 1e6
    assert arch.router is not None and (arch.router.num_groups, arch.router.scaling_factor) == (0, 1.8)
    assert arch.shared_expert_ffn_hidden_size == 1536 and arch.mla is not None and arch.mla.v_head_dim == 256
    for tp in (1, 2, 4):
        arch.check_tensor_parallel(tp)
    with pytest.raises(ValueError, match="num_attention_heads=20"):
        arch.check_tensor_parallel(8)
    arch.check_expert_parallel(8, 1)
