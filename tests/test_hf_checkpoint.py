"""A corrupt, truncated or missing file in a model directory is one line naming the file, wherever
slime loads a checkpoint (issue 14, item 9)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import pytest

from slime.errors import CheckpointError
from slime.hf_checkpoint import check_hf_dir, load_tokenizer
from tests.fixtures.tiny_model import write_tiny_llama


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "model", seed=0, with_tokenizer=True)


def _broken(src: Path, dst: Path, what: str) -> tuple[Path, Path]:
    """A copy of ``src`` at ``dst`` with one file broken; returns (dir, broken file)."""
    shutil.copytree(src, dst)
    if what == "config":
        file = dst / "config.json"
        file.write_text(file.read_text().replace(",", "", 1))  # drops the first comma
    elif what == "truncated":
        file = dst / "model.safetensors"
        with file.open("r+b") as f:
            f.truncate(50_000)
    elif what == "tokenizer":
        file = dst / "tokenizer_config.json"
        file.write_text('{"model_max_length": 128,\n')
    elif what == "missing shard":
        file = dst / "model.safetensors.index.json"
        (dst / "model.safetensors").rename(dst / "model-00001-of-00002.safetensors")
        names = ["model.embed_tokens.weight", "lm_head.weight"]
        file.write_text(
            json.dumps(
                {
                    "weight_map": {
                        names[0]: "model-00001-of-00002.safetensors",
                        names[1]: "model-00002-of-00002.safetensors",
                    }
                }
            )
        )
    else:
        raise ValueError(what)
    return dst, file


CASES = [
    ("config", r"invalid JSON at line \d+, column \d+: Expecting ',' delimiter"),
    (
        "truncated",
        r"truncated or corrupt safetensors file: 50000 bytes, expected \d+ \(8-byte length \+ \d+-byte header \+ \d+ bytes of tensor data\)",
    ),
    ("missing shard", r"names model-00002-of-00002.safetensors, which is missing"),
]


@pytest.mark.parametrize(
    "what, problem",
    CASES + [("tokenizer", r"invalid JSON at line 2, column 1: Expecting property name")],
    ids=[c[0] for c in CASES] + ["tokenizer"],
)
def test_the_checker_names_the_file_and_what_is_wrong(good_dir, tmp_path, what, problem):
    check_hf_dir(good_dir, tokenizer=True)
    model, file = _broken(good_dir, tmp_path / "m", what)
    with pytest.raises(CheckpointError) as info:
        check_hf_dir(model, tokenizer=True, flag="--hf-checkpoint")
    assert re.fullmatch(f"--hf-checkpoint: {re.escape(str(file))}: {problem}.*", str(info.value)), info.value
    assert "\n" not in str(info.value)


def test_the_checker_refuses_a_directory_without_weights_and_a_header_that_lies(good_dir, tmp_path):
    model = tmp_path / "m"
    shutil.copytree(good_dir, model)
    (model / "model.safetensors").write_bytes((10**6).to_bytes(8, "little") + b"{}")
    with pytest.raises(
        CheckpointError,
        match=r"model.safetensors: truncated or corrupt safetensors file: 10 bytes, but its header alone claims 1000008",
    ):
        check_hf_dir(model)
    (model / "model.safetensors").unlink()
    check_hf_dir(model, weights=False)
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(model))}: no weights \(no model.safetensors"):
        check_hf_dir(model)


def _torch_trainer(model: Path):
    from slime.config import TrainConfig
    from slime.train.torch_backend import TorchTrainer

    TorchTrainer(TrainConfig(), model_dir=str(model))


def _engine(model: Path):
    from slime.servers.embedded.model import load_model

    load_model(model)


def _megatron_reader(model: Path):
    from slime.train.megatron.arch import load_hf_config
    from slime.train.megatron.model import HFCheckpointReader

    load_hf_config(str(model))
    HFCheckpointReader(str(model))


def _driver(model: Path):
    from slime.config import Config, EngineConfig
    from slime.loop.driver import run_training

    asyncio.run(
        run_training(
            Config(engine=EngineConfig(hf_checkpoint=str(model)), run_dir=str(model.parent / "run")), progress=False
        )
    )


def _sft(model: Path):
    from slime.config import Config, DataConfig, EngineConfig, TrainConfig
    from slime.loop.sft import run_sft

    train = TrainConfig(loss_type="sft_loss", global_batch_size=16, micro_batch_size=16)
    config = Config(
        engine=EngineConfig(hf_checkpoint=str(model)),
        train=train,
        data=DataConfig(prompt_data=str(model / "sft.jsonl")),
        run_dir=str(model.parent / "run"),
    )
    asyncio.run(run_sft(config, progress=False))


LOADERS = [  # (loader, the broken file it must name)
    (_torch_trainer, "config"),
    (_torch_trainer, "truncated"),
    (_engine, "config"),
    (_engine, "truncated"),
    (_megatron_reader, "config"),
    (_megatron_reader, "truncated"),
    (_megatron_reader, "missing shard"),
    (_driver, "tokenizer"),
    (_sft, "tokenizer"),
    (_sft, "config"),
]


@pytest.mark.parametrize("load, what", LOADERS, ids=[f"{f.__name__[1:]}-{w}" for f, w in LOADERS])
def test_every_checkpoint_load_checks_the_files_first(good_dir, tmp_path, load, what):
    model, file = _broken(good_dir, tmp_path / "m", what)
    with pytest.raises(CheckpointError, match=re.escape(str(file))):
        load(model)


def test_the_engines_reload_from_disk_names_a_truncated_file(good_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from slime.servers.embedded.model import read_hf_weights

    model, file = _broken(good_dir, tmp_path / "m", "truncated")
    with pytest.raises(CheckpointError, match=re.escape(str(file)) + ": truncated"):
        read_hf_weights(model, AutoModelForCausalLM.from_pretrained(good_dir))


@pytest.mark.parametrize("what", ["config", "truncated"])
def test_slime_train_prints_one_line_naming_the_file(good_dir, tmp_path, capsys, what):
    from slime.cli import main

    model, file = _broken(good_dir, tmp_path / "m", what)
    assert main(["train", "--hf-checkpoint", str(model), "--save", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"slime train: error: --hf-checkpoint: {file}: ") and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_slime_convert_prints_one_line_naming_the_file(good_dir, tmp_path, capsys):
    from slime.train.megatron.convert_cli import main

    model, file = _broken(good_dir, tmp_path / "m", "truncated")
    assert main(["--hf-checkpoint", str(model), "--save", str(tmp_path / "out"), "--to", "megatron"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"slime convert: error: --hf-checkpoint: {file}: truncated") and err.count("\n") == 1, err


def test_a_directory_without_a_tokenizer_vocabulary_is_one_line_when_a_tokenizer_is_loaded(tmp_path):
    d = tmp_path / "notok"
    shutil.copytree(Path(__file__).parents[1] / "slime" / "data" / "assets" / "arith-warmstart", d)
    (d / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"--hf-checkpoint: .*notok: no tokenizer vocabulary \(tokenizer.json or"):
        load_tokenizer(d, flag="--hf-checkpoint")
