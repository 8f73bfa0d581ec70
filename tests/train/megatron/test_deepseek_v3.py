"""DeepSeek-V3 (``DeepseekV3ForCausalLM``: multi-latent attention, sigmoid router with expert bias, groups, shared
experts, first-k dense, YaRN) in the megatron backend on the CPU: logits against transformers' own classes, conversion
round trips, and a train step against the torch backend (with the expert bias moving by megatron's rule)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from slime.config import MegatronConfig, TrainConfig
from slime.train.megatron.arch import ModelArch, UnsupportedArchitecture, load_hf_config
from slime.train.megatron.convert import is_expert, mcore_names
from slime.train.megatron.convert_state import hf_to_mcore, mcore_to_hf

CPU_MOE = MegatronConfig(moe_token_dispatcher_type="allgather")
BASE = dict(
    vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=4, n_group=4, topk_group=2,
    n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True, kv_lora_rank=16,
    qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, max_position_embeddings=128, tie_word_embeddings=False,
    initializer_range=0.2, num_nextn_predict_layers=1,
)  # fmt: skip
CONFIGS = {
    # DeepSeek-V3's shape: q latent, YaRN with both mscales (V3 ships factor 40, mscale = mscale_all_dim = 1)
    "yarn": dict(
        BASE,
        q_lora_rank=24,
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
    ),  # fmt: skip
    # DeepSeek-V2-Lite's: no q latent (q_proj), plain RoPE (v heads 8 against q/k heads of 12 channels)
    "plain": dict(BASE, q_lora_rank=None, v_head_dim=8, rope_parameters=dict(rope_type="default", rope_theta=5000.0)),
}


def _make_hf(name: str):
    import transformers as tf

    torch.manual_seed(0)
    model = tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(**CONFIGS[name]))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
        for bname, b in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn_like(b))  # nonzero: the bias changes which experts win
    return model.eval()


@pytest.fixture(scope="module")
def ds_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = {}
    for name in CONFIGS:
        path = tmp_path_factory.mktemp(f"hf_deepseek_{name}")
        _make_hf(name).save_pretrained(path)
        (Path(path) / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
        out[name] = str(path)
    return out


def _arch(hf_dir: str) -> ModelArch:
    return ModelArch.from_hf_config(load_hf_config(hf_dir))


def test_arch_reads_mla_yarn_and_deepseek_moe(ds_dirs, caplog):
    with caplog.at_level(logging.INFO, logger="slime.train.megatron.deepseek"):
        arch = _arch(ds_dirs["yarn"])
    assert [r.getMessage() for r in caplog.records if "multi-token-prediction" in r.getMessage()]  # one log line
    assert arch.family == "deepseek_v3" and arch.head_dim == 12 and arch.num_query_groups == 4
    assert arch.moe_layers == (False, True, True) and arch.shared_expert_ffn_hidden_size == 16
    assert arch.mla is not None and (arch.mla.q_lora_rank, arch.mla.rope_type, arch.mla.yarn_factor) == (
        24,
        "yarn",
        4.0,
    )
    assert arch.router is not None and (arch.router.num_groups, arch.router.group_topk) == (4, 2)
    assert _arch(ds_dirs["plain"]).mla.q_lora_rank == 0


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(rope_interleave=False), "rope_interleave"),
        (dict(attention_bias=True), "attention_bias"),
        (dict(hidden_act="gelu"), "hidden_act"),
        (dict(norm_topk_prob=False), "norm_topk_prob"),
        (dict(v_head_dim=13), "v_head_dim"),
        (dict(rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=8, truncate=False)), "truncate"),
    ],
)  # fmt: skip
def test_options_megatron_does_not_compute_are_refused_by_name(ds_dirs, change, field):
    with pytest.raises(UnsupportedArchitecture, match=field):
        ModelArch.from_hf_config(dict(load_hf_config(ds_dirs["yarn"]), **change))


def test_keys_the_file_leaves_out_take_transformers_defaults_for_its_model_type(ds_dirs):
    """DeepSeek-V3's class scales routed experts by 2.5 and first_k_dense_replace is 3; a file without
    them builds what DeepseekV3ForCausalLM builds, not a generic default (1.0, no dense layer)."""
    config = load_hf_config(ds_dirs["yarn"])
    for key in ("routed_scaling_factor", "first_k_dense_replace", "norm_topk_prob", "head_dim"):
        config.pop(key, None)
    arch = ModelArch.from_hf_config(dict(config, num_hidden_layers=4))
    assert arch.router.scaling_factor == 2.5 and arch.moe_layers == (False, False, False, True)
    assert arch.head_dim == 12  # derived from the file's own dims, not the class's 7168-wide default


def test_a_quantized_checkpoint_is_refused_with_what_to_do(ds_dirs):
    """DeepSeek-V3's and Kimi-K2's released weights are fp8 with a scale per 128x128 block."""
    quant = dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic", weight_block_size=[128, 128])
    with pytest.raises(UnsupportedArchitecture, match="quant_method='fp8'.*convert it to bf16 first"):
        ModelArch.from_hf_config(dict(load_hf_config(ds_dirs["yarn"]), quantization_config=quant))


def test_fp8_tensors_in_a_checkpoint_without_quantization_config_are_refused(ds_dirs, tmp_path, megatron_cpu):
    import shutil

    from safetensors.torch import save_file

    from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config

    src = Path(ds_dirs["yarn"])
    shutil.copytree(src, tmp_path / "fp8")
    state = load_file(str(src / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    state[name] = state[name].to(torch.float8_e4m3fn)  # the raw values of a scaled fp8 weight
    save_file(state, str(tmp_path / "fp8" / "model.safetensors"))
    arch = _arch(str(tmp_path / "fp8"))
    model = build_gpt_model(arch, transformer_config(arch, CPU_MOE, use_cpu_initialization=True), tp_size=1)
    with pytest.raises(RuntimeError, match="float8_e4m3fn weights; convert it to bf16 first"):
        load_hf_weights(model, HFCheckpointReader(str(tmp_path / "fp8")), arch, tp_size=1, tp_rank=0)


def test_tensor_parallel_must_split_the_latent_projections(ds_dirs):
    arch = _arch(ds_dirs["yarn"])
    arch.check_tensor_parallel(2)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        ModelArch.from_hf_config(dict(load_hf_config(ds_dirs["yarn"]), kv_lora_rank=17)).check_tensor_parallel(2)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("tp, ep, etp", [(1, 1, 1), (2, 1, 2), (1, 2, 1), (2, 4, 1), (2, 2, 2)])
def test_round_trip_is_bit_exact_for_every_tp_ep_etp_layout(name, tp, ep, etp, ds_dirs):
    arch = _arch(ds_dirs[name])
    hf = load_file(os.path.join(ds_dirs[name], "model.safetensors"))
    shards = [hf_to_mcore(hf, arch, tp_size=tp, tp_rank=r) for r in range(tp)]
    experts = [
        [
            hf_to_mcore(hf, arch, tp_size=tp, tp_rank=0, ep_size=ep, ep_rank=e, etp_size=etp, etp_rank=r)
            for r in range(etp)
        ]
        for e in range(ep)
    ]
    back = mcore_to_hf(shards, arch, expert_shard_states=experts)
    kept = {k: v for k, v in hf.items() if not k.startswith("model.layers.3.")}  # layer 3: the MTP layer, not built
    assert set(back) == set(kept)
    for key, value in kept.items():
        assert torch.equal(back[key], value), key
    names = mcore_names(arch, ep_size=ep)
    assert "decoder.layers.1.mlp.router.expert_bias" in names and "decoder.layers.0.mlp.linear_fc1.weight" in names
    assert sum(is_expert(n) for n in names) == 2 * 2 * (8 // ep)  # 2 MoE layers x fc1/fc2 x local experts


def _build(hf_dir: str, mcfg: MegatronConfig = CPU_MOE):
    from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config

    arch = _arch(hf_dir)
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
        input_ids=ids, attention_mask=(torch.arange(L) < torch.tensor(lens)[:, None]).long(), loss_mask=z,
        rollout_logprobs=z, advantages=z, staleness=z.long(), sample_advantages=torch.zeros(len(lens)),
        rewards=torch.zeros(len(lens)), seq_lens=torch.tensor(lens), response_mask=z,
    )  # fmt: skip
    mb = pack_samples(
        batch, list(range(len(lens))), pad_token_id=0, pad_to=1, head_dim=arch.head_dim, rope_theta=arch.rope_theta
    )
    return ids, mb


@pytest.mark.parametrize("name", list(CONFIGS))
def test_megatron_logits_match_hf_deepseek_v3(name, ds_dirs, megatron_cpu):
    """MLA (q latent or q_proj; YaRN or plain RoPE, interleaved), sigmoid + bias routing over groups, routed scaling,
    shared experts, a first dense layer: megatron's fp32 logits equal transformers' DeepseekV3ForCausalLM's to 1e-5,
    packed sequences included (positions restart at each; longer than YaRN's original 8 positions)."""
    arch, model = _build(ds_dirs[name])
    hf = _make_hf(name)
    lens = [19, 4, 11]
    ids, mb = _packed(arch, lens)
    with torch.no_grad():
        logits = model.eval()(
            input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, packed_seq_params=mb.params
        )[0]
        ref = torch.cat([hf(input_ids=ids[i : i + 1, :n]).logits[0] for i, n in enumerate(lens)])
    assert logits.shape[0] >= ref.shape[0]
    torch.testing.assert_close(logits[: ref.shape[0], : arch.vocab_size], ref, atol=1e-5, rtol=1e-5)


class _Chunk(torch.nn.Module):
    """The one model chunk ``finalize_model_grads`` takes: its gradients are already local (no DDP buffers to sync)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def finish_grad_sync(self, **_):
        pass


def test_train_step_matches_the_torch_backend_and_moves_the_expert_bias(ds_dirs, megatron_cpu, cpu_megatron_trainer):
    """Same weights and groups: the megatron DeepSeek-V3 trainer's loss, grad norm and ratios equal TorchTrainer's on HF's
    model. The step's training forwards counted each router's tokens; megatron's ``finalize_model_grads`` (which the GPU
    trainer's optimizer step runs; the CPU stand-in step skips it) then moves every bias by exactly 1e-3 (sign rule), and
    the HF export for weight sync carries the moved bias."""
    from test_megatron_trainer import _groups

    from slime.train.megatron._mcore import mcore
    from slime.train.megatron.weights import iter_hf_weights
    from slime.train.torch_backend import TorchTrainer

    config = TrainConfig(lr=1e-3, global_batch_size=4, micro_batch_size=2, megatron=CPU_MOE)
    megatron = cpu_megatron_trainer(config, ds_dirs["yarn"], megatron_cpu, rollout_temperature=0.9)
    reference = TorchTrainer(config, model_dir=ds_dirs["yarn"], rollout_temperature=0.9)
    groups = _groups(96)
    got, want = megatron.train_step(groups).to_dict(), reference.train_step(groups).to_dict()
    for key in ("loss", "grad_norm", "ratio_mean", "entropy", "approx_kl", "train_rollout_logprob_abs_diff"):
        assert got[key] == pytest.approx(want[key], rel=5e-4, abs=5e-6), key
    routers = [m for n, m in megatron.model.named_modules() if n.endswith("mlp.router")]
    assert len(routers) == 2 and all(float(r.local_tokens_per_expert.sum()) > 0 for r in routers)
    before = [r.expert_bias.clone() for r in routers]
    mcore("megatron.core.distributed").finalize_model_grads([_Chunk(megatron.model)], num_tokens=None)
    for r, b in zip(routers, before):
        torch.testing.assert_close((r.expert_bias - b).abs(), torch.full_like(b, 1e-3))
        assert float(r.local_tokens_per_expert.sum()) == 0.0  # counts reset for the next step
    exported = dict(iter_hf_weights(megatron.model, megatron.arch, megatron.ctx))
    assert torch.equal(exported["model.layers.1.mlp.gate.e_score_correction_bias"], routers[0].expert_bias)
