"""slime's ``glm4.7-30B-A3B.sh`` MODEL_ARGS (``--moe-layer-freq [0]*1+[1]*46``) against a GLM-4.7-Flash config whose
dense/MoE layers come from ``mlp_layer_types`` (what transformers builds from; a config transformers 5 saves has it,
and may lack ``first_k_dense_replace``): the flag is checked against that list, and one that disagrees names both.
``tests/test_slime_model_scripts.py`` runs every other flag of the script against the released config.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from slime.cli import main

FLASH = dict(  # zai-org/GLM-4.7-Flash's config.json (architecture keys) as transformers 5 writes its layer list
    model_type="glm4_moe_lite", architectures=["Glm4MoeLiteForCausalLM"], num_hidden_layers=47, n_routed_experts=64,
    moe_intermediate_size=1536, n_shared_experts=1, num_experts_per_tok=4, routed_scaling_factor=1.8,
    mlp_layer_types=["dense"] + ["sparse"] * 46,
)  # fmt: skip
MOE_FLAGS = ["--num-experts", "64", "--moe-router-topk", "4", "--moe-router-score-function", "sigmoid"]


def _dry_run(tmp_path: Path, config: dict, layer_freq: str) -> int:
    hf = tmp_path / "model"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(config))
    save_file({"w": torch.zeros(1)}, str(hf / "model.safetensors"))
    return main(["train", "--dry-run", "--hf-checkpoint", str(hf), *MOE_FLAGS, "--moe-layer-freq", layer_freq])


def test_the_scripts_layer_pattern_matches_mlp_layer_types(tmp_path, capsys):
    assert _dry_run(tmp_path, FLASH, "[0]*1+[1]*46") == 0, capsys.readouterr().err


def test_a_layer_pattern_that_disagrees_with_mlp_layer_types_names_both(tmp_path, capsys):
    config = dict(FLASH, mlp_layer_types=["dense"] * 2 + ["sparse"] * 45, first_k_dense_replace=1)
    assert _dry_run(tmp_path, config, "[0]*1+[1]*46") == 2
    err = capsys.readouterr().err
    assert "--moe-layer-freq [0]*1+[1]*46 disagrees with" in err
    assert "mlp_layer_types = ['dense']*2+['sparse']*45 ([0]*2+[1]*45)" in err
