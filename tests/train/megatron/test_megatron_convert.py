"""HF <-> megatron-core weight conversion: bit-exact round trips, TP=2 sharding, distributed checkpoints."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from slime.train.megatron.arch import ModelArch, UnsupportedArchitecture, load_hf_config
from slime.train.megatron.convert import mcore_names
from slime.train.megatron.convert_state import hf_to_mcore, mcore_to_hf
from tests.train.megatron.conftest import _free_port

FAMILIES = ["llama", "qwen2", "qwen3"]


def _hf_state(hf_dir: str) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(hf_dir, "model.safetensors"))


def _assert_bit_exact(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    want = {k: v for k, v in want.items() if k != "lm_head.weight" or k in got}  # tied models drop lm_head
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tp_size", [1, 2])
def test_hf_to_megatron_to_hf_round_trip_is_bit_exact(family, tp_size, hf_dirs):
    arch = ModelArch.from_hf_config(load_hf_config(hf_dirs[family]))
    hf = _hf_state(hf_dirs[family])
    shards = [hf_to_mcore(hf, arch, tp_size=tp_size, tp_rank=r) for r in range(tp_size)]
    assert all(list(s) == mcore_names(arch) for s in shards)
    _assert_bit_exact(mcore_to_hf(shards, arch), hf)


def test_round_trip_is_bit_exact_in_bf16_with_vocab_padding(hf_dirs):
    arch = ModelArch.from_hf_config(dict(load_hf_config(hf_dirs["qwen2"]), vocab_size=95))
    hf = {k: v.to(torch.bfloat16) for k, v in _hf_state(hf_dirs["qwen2"]).items()}
    hf["model.embed_tokens.weight"] = hf["model.embed_tokens.weight"][:95].clone()
    shards = [hf_to_mcore(hf, arch, tp_size=2, tp_rank=r) for r in range(2)]
    assert shards[0]["embedding.word_embeddings.weight"].shape[0] == 48  # 95 padded to 96, split in 2
    assert torch.equal(
        shards[1]["embedding.word_embeddings.weight"][-1], torch.zeros(arch.hidden_size, dtype=torch.bfloat16)
    )
    _assert_bit_exact(mcore_to_hf(shards, arch), hf)


def test_tp2_shards_follow_megatron_layouts(hf_dirs):
    """QKV grouped per key/value head and split by group; gate/up stacked per rank; row-parallel split on inputs."""
    arch = ModelArch.from_hf_config(load_hf_config(hf_dirs["qwen2"]))  # 4 heads, 2 kv heads, head_dim 8
    hf = _hf_state(hf_dirs["qwen2"])
    r1 = hf_to_mcore(hf, arch, tp_size=2, tp_rank=1)
    q, k, v = (hf[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
    d = arch.head_dim
    assert torch.equal(
        r1["decoder.layers.0.self_attention.linear_qkv.weight"],
        torch.cat([q[2 * d : 4 * d], k[d : 2 * d], v[d : 2 * d]]),
    )
    qb = hf["model.layers.0.self_attn.q_proj.bias"]
    assert torch.equal(r1["decoder.layers.0.self_attention.linear_qkv.bias"][: 2 * d], qb[2 * d : 4 * d])
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(r1["decoder.layers.0.mlp.linear_fc1.weight"], torch.cat([gate[24:], up[24:]]))
    assert torch.equal(r1["decoder.layers.0.mlp.linear_fc2.weight"], hf["model.layers.0.mlp.down_proj.weight"][:, 24:])
    assert "output_layer.weight" not in r1  # tied


@pytest.mark.parametrize(
    "override, field",
    [
        (dict(model_type="mixtral", architectures=["MixtralForCausalLM"]), "MixtralForCausalLM"),
        (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5}), "llama3"),
        (dict(attention_bias=True), "attention_bias"),
        (dict(hidden_act="gelu"), "hidden_act"),
    ],
)
def test_unsupported_architecture_is_named(override, field, hf_dirs):
    with pytest.raises(UnsupportedArchitecture, match=field):
        ModelArch.from_hf_config(dict(load_hf_config(hf_dirs["llama"]), **override))


def test_tp_that_does_not_divide_the_heads_is_rejected(hf_dirs):
    arch = ModelArch.from_hf_config(load_hf_config(hf_dirs["llama"]))
    with pytest.raises(ValueError, match="num_attention_heads=4"):
        arch.check_tensor_parallel(3)


@pytest.mark.parametrize("family", ["qwen3", "qwen2_moe"])
def test_distributed_checkpoint_round_trip_through_the_cli_functions(family, hf_dirs, megatron_cpu, tmp_path):
    pytest.importorskip("psutil", reason="megatron-core's checkpoint writer imports psutil without declaring it")
    from slime.train.megatron.convert_cli import hf_to_megatron, megatron_to_hf

    mdir, hdir = tmp_path / "mcore", tmp_path / "hf"
    hf_to_megatron(hf_dirs[family], str(mdir))
    assert json.loads((mdir / "slime_megatron.json").read_text())["params_dtype"] == "float32"
    megatron_to_hf(str(mdir), str(hdir))
    _assert_bit_exact(load_file(hdir / "model.safetensors"), _hf_state(hf_dirs[family]))
    assert (hdir / "config.json").is_file() and (hdir / "tokenizer_config.json").is_file()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--to", "megatron", "--save", "out"], "needs --hf-checkpoint"),
        (["--to", "hf", "--save", "out"], "needs --load"),
    ],
)
def test_convert_cli_names_the_missing_flag(argv, message):
    from slime.train.megatron.convert_cli import main

    with pytest.raises(SystemExit, match=message):
        main(argv)


def test_a_conversion_the_machine_cannot_do_is_a_one_line_error_that_leaves_nothing_behind(
    hf_dirs, tmp_path, capsys, monkeypatch
):
    import types

    from slime.train.megatron import convert_cli

    def save(state, out_dir):  # what megatron-core 0.16.1 raises without a CUDA device (in some process states)
        open(os.path.join(out_dir, "common.pt"), "w").close()
        raise RuntimeError("Found no NVIDIA driver on your system; CUDA is needed")

    real_mcore = convert_cli.mcore
    monkeypatch.setattr(
        convert_cli,
        "mcore",
        lambda name: types.SimpleNamespace(save=save) if name.endswith("dist_checkpointing") else real_mcore(name),
    )
    for var, value in dict(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())
    ).items():
        monkeypatch.setenv(var, value)
    out = tmp_path / "mcore"
    assert convert_cli.main(["--to", "megatron", "--hf-checkpoint", str(hf_dirs["qwen3"]), "--save", str(out)]) == 2
    assert "slime convert: error: megatron-core's dist_checkpointing needs a CUDA device" in capsys.readouterr().err
    assert list(out.iterdir()) == []
