"""scripts/gpu/make_random_glm45.py on the CPU, at a smaller width: the model it writes is one the megatron backend
builds (``glm4_moe`` with the sigmoid router, partial RoPE, a dense first layer) and transformers loads, with the
arithmetic demo's tokenizer; ``glm_shape.sh``'s ``slime train`` flags pass ``--dry-run``."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _maker():
    spec = importlib.util.spec_from_file_location("make_random_glm45", ROOT / "scripts/gpu/make_random_glm45.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_random_glm45_model_is_built_by_the_megatron_backend_and_loads_in_transformers(tmp_path):
    import transformers

    from slime.train.megatron.arch import ModelArch, load_hf_config

    maker = _maker()
    small = dict(maker.SHAPE, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
    small.update(head_dim=16, moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2, num_hidden_layers=3)
    maker.SHAPE = small  # the GPU width would take minutes to initialise on a CPU
    maker.main(str(tmp_path / "m"))
    arch = ModelArch.from_hf_config(load_hf_config(str(tmp_path / "m")))
    assert (arch.family, arch.rotary_dim, arch.qk_norm, arch.qkv_bias, arch.moe_layers) == (
        "glm4_moe",
        8,
        True,
        True,
        (False, True, True),
    )
    assert arch.router is not None and arch.router.expert_bias and arch.router.scaling_factor == 2.5
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    assert type(model).__name__ == "Glm4MoeForCausalLM" and model.config.vocab_size == len(tok)


def test_glm_shape_sh_flags_pass_the_dry_run(tmp_path, capsys):
    from slime.cli import main

    maker = _maker()
    maker.SHAPE = dict(maker.SHAPE, hidden_size=64, intermediate_size=96, num_attention_heads=4, head_dim=16,
                       num_key_value_heads=2, moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2)  # fmt: skip
    maker.main(str(tmp_path / "m"))
    text = (ROOT / "scripts/gpu/glm_shape.sh").read_text()
    block = text[text.index("python3 -m slime.cli train") : text.index('--save "$run"')]
    block = block.replace('"$@"', "").replace('"$MODEL"', str(tmp_path / "m")).replace('"$STEPS"', "4")
    argv = [t for t in shlex.split(block.replace("\\\n", " ")) if t not in ("python3", "-m", "slime.cli")]
    assert argv[0] == "train"
    assert 'timeout -k 40 "${RL_LIMIT:-200}" python3 -m slime.cli train' in text  # each run is bounded
    assert main([*argv, "--dry-run", "--save", str(tmp_path / "run")]) == 0, capsys.readouterr().err
    assert "--model-path " + str(tmp_path / "m") in capsys.readouterr().out
