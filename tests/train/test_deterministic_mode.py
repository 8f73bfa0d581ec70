"""``--deterministic-mode``: the trainer turns on deterministic torch kernels and seeds itself."""

from __future__ import annotations

import logging
import os

import torch

from slime.cli.args import build_parser, config_from_args
from slime.train.determinism import DETERMINISTIC_ENV
from slime.train.torch_backend import TorchTrainer


def test_the_flag_makes_the_trainer_deterministic_and_says_what_it_does_not_cover(tiny_model_dir, monkeypatch, caplog):
    for key in DETERMINISTIC_ENV:  # set then deleted: monkeypatch restores the state before the test
        monkeypatch.setenv(key, "x")
        monkeypatch.delenv(key)
    monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1")  # a value the user set is kept
    config = config_from_args(build_parser().parse_args(["--deterministic-mode", "--seed", "7"]))
    cfg = config.train
    assert cfg.deterministic_mode
    caplog.set_level(logging.INFO, logger="slime.train.determinism")
    try:
        TorchTrainer(
            cfg, model_dir=tiny_model_dir, **config.trainer_kwargs()
        )  # the run's seed, as the driver passes it
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert torch.initial_seed() == 7
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and os.environ["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == "1"
    assert [r.getMessage() for r in caplog.records if r.name == "slime.train.determinism"] == [
        "--deterministic-mode: deterministic torch kernels, seed 7; not covered: the engines "
        "(--sglang-enable-deterministic-inference) and NCCL's reduction order"
    ]


def test_without_the_flag_nothing_changes(tiny_model_dir):
    TorchTrainer(config_from_args(build_parser().parse_args([])).train, model_dir=tiny_model_dir)
    assert not torch.are_deterministic_algorithms_enabled()
