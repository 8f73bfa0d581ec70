"""``slime train --dry-run`` on the MODEL_ARGS of THUDM/slime's DeepSeek-V3, Kimi-K2, GLM-4.5-355B-A32B and
GLM-4.7-30B-A3B (GLM-4.7-Flash) scripts, against the architecture keys of each model's released ``config.json``.

The flags are in ``tests/data/slime_scripts/*_model.txt`` as the scripts write them (variables expanded).
Every architecture flag is checked (``slime.cli.compat`` and ``slime.cli.compat_moe``): it matches, or the model
has no such part (``--kv-channels`` under multi-latent attention); a flag that disagrees is an error naming both
values. No check is patched away.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from slime.cli import main
from slime.cli.args import FLAGS, build_parser, config_from_args
from slime.cli.compat import COMPAT_FLAGS, NoOp
from slime.cli.compat_moe import LayerPattern
from slime.errors import ConfigError

DATA = Path(__file__).parent / "data" / "slime_scripts"

_DEEPSEEK_MLA = dict(kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
DEEPSEEK_V3 = dict(  # deepseek-ai/DeepSeek-V3's config.json (architecture keys)
    model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_size=7168, intermediate_size=18432,
    moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
    n_shared_experts=1, n_routed_experts=256, routed_scaling_factor=2.5, topk_method="noaux_tc", n_group=8,
    topk_group=4, num_experts_per_tok=8, moe_layer_freq=1, first_k_dense_replace=3, norm_topk_prob=True,
    scoring_func="sigmoid", hidden_act="silu", max_position_embeddings=163840, rms_norm_eps=1e-6, rope_theta=10000,
    rope_scaling=dict(beta_fast=32, beta_slow=1, factor=40, mscale=1.0, mscale_all_dim=1.0,
                      original_max_position_embeddings=4096, type="yarn"),
    tie_word_embeddings=False, vocab_size=129280, attention_bias=False, **_DEEPSEEK_MLA,
)  # fmt: skip
KIMI_K2 = dict(  # moonshotai/Kimi-K2-Instruct's config.json (architecture keys)
    DEEPSEEK_V3, model_type="kimi_k2", num_attention_heads=64, num_key_value_heads=64, n_routed_experts=384,
    routed_scaling_factor=2.827, n_group=1, topk_group=1, first_k_dense_replace=1, rope_theta=50000,
    vocab_size=163840, rope_scaling=dict(beta_fast=1.0, beta_slow=1.0, factor=32.0, mscale=1.0, mscale_all_dim=1.0,
                                         original_max_position_embeddings=4096, type="yarn"),
)  # fmt: skip
GLM4_5 = dict(  # zai-org/GLM-4.5's config.json (architecture keys)
    model_type="glm4_moe", architectures=["Glm4MoeForCausalLM"], attention_bias=True, first_k_dense_replace=3,
    head_dim=128, hidden_act="silu", hidden_size=5120, intermediate_size=12288, max_position_embeddings=131072,
    moe_intermediate_size=1536, n_group=1, n_routed_experts=160, n_shared_experts=1, norm_topk_prob=True,
    num_attention_heads=96, num_experts_per_tok=8, num_hidden_layers=92, num_key_value_heads=8,
    num_nextn_predict_layers=1, partial_rotary_factor=0.5, rms_norm_eps=1e-05, rope_theta=1000000,
    routed_scaling_factor=2.5, tie_word_embeddings=False, topk_group=1, use_qk_norm=True, vocab_size=151552,
)  # fmt: skip
GLM4_7_FLASH = dict(  # zai-org/GLM-4.7-Flash's config.json (architecture keys): MLA + GLM-4.5-style MoE
    model_type="glm4_moe_lite", architectures=["Glm4MoeLiteForCausalLM"], vocab_size=154880, hidden_size=2048,
    intermediate_size=10240, moe_intermediate_size=1536, num_hidden_layers=47, num_attention_heads=20,
    num_key_value_heads=20, hidden_act="silu", rms_norm_eps=1e-5, attention_bias=False,
    max_position_embeddings=202752, rope_theta=1000000.0, partial_rotary_factor=1.0, q_lora_rank=768,
    kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256, n_routed_experts=64,
    n_shared_experts=1, num_experts_per_tok=4, norm_topk_prob=True, routed_scaling_factor=1.8, n_group=1,
    topk_group=1, first_k_dense_replace=1, topk_method="noaux_tc", tie_word_embeddings=False,
)  # fmt: skip
SCRIPTS = {
    "deepseek-v3.sh": ("deepseek_v3_model.txt", DEEPSEEK_V3),
    "kimi-k2.sh": ("kimi_k2_model.txt", KIMI_K2),
    "glm4.5-355B-A32B.sh": ("glm4_5_355b_a32b_model.txt", GLM4_5),
    "glm4.7-30B-A3B.sh": ("glm4_7_30b_a3b_model.txt", GLM4_7_FLASH),
}


def _flags(name: str) -> list[list[str]]:
    lines = (DATA / name).read_text().splitlines()
    return [shlex.split(line) for line in lines if line.strip() and not line.startswith("#")]


def _hf_dir(path: Path, config: dict) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    save_file({"w": torch.zeros(1)}, str(path / "model.safetensors"))
    return path


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_model_script_is_accepted_and_every_architecture_flag_is_checked(script, tmp_path, caplog, capsys):
    name, config = SCRIPTS[script]
    flags = _flags(name)
    hf = _hf_dir(tmp_path / "model", config)
    caplog.set_level(logging.INFO, logger="slime.cli.compat")
    rc = main(["train", "--dry-run", "--hf-checkpoint", str(hf), *[t for tokens in flags for t in tokens]])
    assert rc == 0, capsys.readouterr().err
    lines = [r.getMessage() for r in caplog.records if r.name == "slime.cli.compat"]
    for flag, *_ in flags:
        assert flag in FLAGS or flag in COMPAT_FLAGS, f"{flag} has no fate"
        if flag not in COMPAT_FLAGS:
            continue
        said = [line for line in lines if line.split(":")[0].split(" ")[0] == flag]
        what = ("no-op here: ",) if isinstance(COMPAT_FLAGS[flag], NoOp) else ("checked: matches ", "checked: not used")
        assert len(said) == 1 and any(w in said[0] for w in what), (flag, said)
    assert not [line for line in lines if "not checked" in line]


@pytest.mark.parametrize(
    "script, flag, value, words",
    [
        ("glm4.5-355B-A32B.sh", "--moe-router-topk-scaling-factor", "2.25", "routed_scaling_factor = 2.5"),
        ("glm4.5-355B-A32B.sh", "--moe-layer-freq", "[0]*1+[1]*91", "first_k_dense_replace = 3 ([0]*3+[1]*89)"),
        ("glm4.5-355B-A32B.sh", "--moe-shared-expert-intermediate-size", "3072", "n_shared_experts * moe_intermediate_size = 1 * 1536"),
        ("glm4.5-355B-A32B.sh", "--rotary-percent", "0.25", "partial_rotary_factor = 0.5"),
        ("glm4.5-355B-A32B.sh", "--moe-router-score-function", "softmax", "model_type = glm4_moe (sigmoid)"),
        ("glm4.7-30B-A3B.sh", "--qk-head-dim", "128", "qk_nope_head_dim = 192"),
        ("deepseek-v3.sh", "--moe-router-num-groups", "4", "n_group = 8"),
        ("deepseek-v3.sh", "--q-lora-rank", "1024", "q_lora_rank = 1536"),
        ("kimi-k2.sh", "--mscale", "0.5", "rope_scaling.mscale = 1.0"),
    ],
)  # fmt: skip
def test_an_architecture_flag_that_disagrees_is_an_error_naming_both_values(
    script, flag, value, words, tmp_path, capsys
):
    name, config = SCRIPTS[script]
    flags = [t for t in _flags(name) if t[0] != flag] + [[flag, value]]
    hf = _hf_dir(tmp_path / "model", config)
    assert main(["train", "--dry-run", "--hf-checkpoint", str(hf), *[t for tokens in flags for t in tokens]]) == 2
    assert f"{flag} {value} disagrees with {hf / 'config.json'}: {words}" in capsys.readouterr().err


def test_mla_flags_on_a_model_without_mla_name_the_missing_key(tmp_path, capsys):
    hf = _hf_dir(tmp_path / "model", GLM4_5)
    assert main(["train", "--dry-run", "--hf-checkpoint", str(hf), "--multi-latent-attention"]) == 2
    err = capsys.readouterr().err
    assert "--multi-latent-attention disagrees with" in err and "kv_lora_rank = absent" in err


def test_the_bias_update_rate_is_applied_and_seq_aux_loss_trains_nothing():
    args = ["--moe-router-bias-update-rate", "0", "--moe-router-load-balancing-type", "seq_aux_loss"]
    config = config_from_args(build_parser().parse_args(args))
    assert config.train.megatron.moe_router_bias_update_rate == 0.0
    with pytest.raises(ConfigError, match=re.escape("seq_aux_loss with --moe-aux-loss-coeff=0.01")):
        config_from_args(build_parser().parse_args([*args, "--moe-aux-loss-coeff", "0.01"])).validate()


def test_layer_patterns_in_megatrons_three_spellings():
    layers = (0, 0, 1, 1)
    assert LayerPattern.parse("[0]*2+[1]*2") == LayerPattern.of(layers)
    assert LayerPattern.parse("[0,0,1,1]") == LayerPattern.of(layers) != LayerPattern.parse("([1]*4)")
    assert LayerPattern.parse("2") == LayerPattern.of((1, 0, 1, 0))  # every 2nd layer, from layer 0
    assert str(LayerPattern.of(layers)) == "[0]*2+[1]*2"
    for bad in ("[0]*2+[2]", "__import__('os')", "[[0]]"):
        with pytest.raises(ValueError):
            LayerPattern.parse(bad)


def test_rotary_percent_is_checked_where_transformers_5_saves_it(tmp_path, capsys):
    """transformers 5 writes ``partial_rotary_factor`` into ``rope_parameters``, where the model build reads it:
    the script's 0.5 matches there, and the full rotary that a top-level-only read would assume is an error."""
    saved = {k: v for k, v in GLM4_5.items() if k not in ("partial_rotary_factor", "rope_theta")}
    saved["rope_parameters"] = dict(rope_type="default", rope_theta=1000000, partial_rotary_factor=0.5)
    hf = _hf_dir(tmp_path / "model", saved)
    flags = [t for tokens in _flags("glm4_5_355b_a32b_model.txt") for t in tokens]
    assert main(["train", "--dry-run", "--hf-checkpoint", str(hf), *flags]) == 0, capsys.readouterr().err
    wrong = [t for tokens in _flags("glm4_5_355b_a32b_model.txt") if tokens[0] != "--rotary-percent" for t in tokens]
    assert main(["train", "--dry-run", "--hf-checkpoint", str(hf), *wrong, "--rotary-percent", "1.0"]) == 2
    assert "rope_parameters.partial_rotary_factor = 0.5" in capsys.readouterr().err


def test_a_key_the_config_leaves_out_is_checked_against_transformers_default(tmp_path, capsys):
    """GLM-4.5's file without routed_scaling_factor: the build takes Glm4MoeConfig's 1.0, so the script's 2.5
    is an error and 1.0 matches (not "not checked")."""
    hf = _hf_dir(tmp_path / "model", {k: v for k, v in GLM4_5.items() if k != "routed_scaling_factor"})
    flags = [t for tokens in _flags("glm4_5_355b_a32b_model.txt") for t in tokens]
    assert main(["train", "--dry-run", "--hf-checkpoint", str(hf), *flags]) == 2
    assert "routed_scaling_factor = 1.0" in capsys.readouterr().err
