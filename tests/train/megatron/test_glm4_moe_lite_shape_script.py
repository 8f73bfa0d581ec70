"""scripts/gpu/make_random_glm47_flash.py on the CPU, at a smaller width: the model it writes is one the megatron
backend builds (``glm4_moe_lite``: MLA, sigmoid router with bias, layer 0 dense) and transformers loads, with the
arithmetic demo's tokenizer and the ``first_k_dense_replace`` SGLang reads; the GPU shape is 0.3-1 B parameters; and
``glm_flash_shape.sh`` runs ``glm_shape.sh``'s ``slime train`` flags (which pass ``--dry-run`` on this model) under
its own file names."""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
SMALL = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24, moe_intermediate_size=16,
    n_routed_experts=8,
)  # fmt: skip


def _maker(small: bool = True):
    path = ROOT / "scripts/gpu/make_random_glm47_flash.py"
    spec = importlib.util.spec_from_file_location("make_random_glm47_flash", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if small:  # the GPU width would take minutes to initialise on a CPU
        module.SHAPE = dict(module.SHAPE, **SMALL)
    return module


def test_the_random_flash_model_is_built_by_the_megatron_backend_and_loads_in_transformers(tmp_path):
    import transformers

    from slime.train.megatron.arch import ModelArch, load_hf_config

    _maker().main(str(tmp_path / "m"))
    config = load_hf_config(str(tmp_path / "m"))
    assert config["first_k_dense_replace"] == 1 and config["mlp_layer_types"] == ["dense", "sparse", "sparse"]
    arch = ModelArch.from_hf_config(config)
    assert (arch.family, arch.moe_layers, arch.num_experts, arch.moe_router_topk) == (
        "glm4_moe_lite",
        (False, True, True),
        8,
        4,
    )
    assert arch.mla is not None and (arch.mla.q_lora_rank, arch.mla.kv_lora_rank, arch.mla.v_head_dim) == (32, 32, 24)
    assert arch.router is not None and arch.router.expert_bias and arch.router.scaling_factor == 1.8
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    assert type(model).__name__ == "Glm4MoeLiteForCausalLM" and model.config.vocab_size == len(tok)
    bias = model.model.layers[1].mlp.gate.e_score_correction_bias
    assert float(bias.abs().sum()) > 0  # random, so the bias matters for routing


def test_the_gpu_shape_is_a_half_billion_parameter_flash():
    import transformers

    maker = _maker(small=False)
    tok = transformers.AutoTokenizer.from_pretrained(maker.ASSETS)
    with torch.device("meta"):
        model = transformers.Glm4MoeLiteForCausalLM(maker._config(tok))
    n = sum(p.numel() for p in model.parameters())
    assert 0.3e9 < n < 1e9, n
    attn = model.model.layers[0].self_attn
    assert (attn.q_b_proj.out_features, attn.kv_b_proj.out_features) == (20 * 256, 20 * (192 + 256))


def test_glm_flash_shape_sh_runs_glm_shape_sh_whose_flags_pass_the_dry_run(tmp_path, capsys):
    from slime.cli import main

    wrapper = (ROOT / "scripts/gpu/glm_flash_shape.sh").read_text()
    assert "GLM_SHAPE_TAG=glm_flash GLM_SHAPE_MAKER=scripts/gpu/make_random_glm47_flash.py" in wrapper
    assert 'exec bash "$(dirname "$0")/glm_shape.sh" "$@"' in wrapper
    text = (ROOT / "scripts/gpu/glm_shape.sh").read_text()
    assert 'python3 "$MAKER" "$MODEL"' in text and 'LOG="$OUT/${TAG}_shape.log"' in text
    _maker().main(str(tmp_path / "m"))
    block = text[text.index("python3 -m slime.cli train") : text.index('--save "$run"')]
    block = block.replace('"$@"', "").replace('"$MODEL"', str(tmp_path / "m")).replace('"$STEPS"', "4")
    argv = [t for t in shlex.split(block.replace("\\\n", " ")) if t not in ("python3", "-m", "slime.cli")]
    assert main([*argv, "--dry-run", "--save", str(tmp_path / "run")]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "m" / ".complete").read_text())["num_params"] > 0
