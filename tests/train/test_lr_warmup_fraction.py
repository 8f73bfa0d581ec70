"""``--lr-warmup-fraction``: Megatron's warm-up as a fraction of the decay steps, resolved once the run's
optimizer steps are known (``slime.train.lr_schedule.resolve_lr_schedule``)."""

import pytest

from slime.cli.args import build_parser, config_from_args
from slime.errors import ConfigError
from slime.train.lr_schedule import lr_at, resolve_lr_schedule


def _train(*argv: str):
    return config_from_args(build_parser().parse_args(["--lr", "1e-5", *argv])).train


def test_the_fraction_of_the_runs_steps_becomes_the_warmup_and_a_cosine_decays_over_the_run():
    cfg = resolve_lr_schedule(
        _train("--lr-decay-style", "cosine", "--min-lr", "1e-6", "--lr-warmup-fraction", "0.1"), 1000
    )
    assert (cfg.megatron.lr_warmup_iters, cfg.megatron.lr_decay_iters) == (100, 1000)
    assert lr_at(cfg, 0) == pytest.approx(1e-7) and lr_at(cfg, 99) == pytest.approx(1e-5)
    assert lr_at(cfg, 999) == pytest.approx(1e-6, rel=1e-3)


def test_the_fraction_is_of_lr_decay_iters_when_given_and_of_the_run_for_a_constant_lr():
    assert (
        resolve_lr_schedule(
            _train("--lr-decay-style", "linear", "--lr-decay-iters", "200", "--lr-warmup-fraction", "0.25"), 1000
        ).megatron.lr_warmup_iters
        == 50
    )
    cfg = resolve_lr_schedule(_train("--lr-warmup-fraction", "0.5"), 8)
    assert (cfg.megatron.lr_warmup_iters, cfg.megatron.lr_decay_iters) == (4, None)
    assert resolve_lr_schedule(_train(), 8) == _train()  # nothing to derive


def test_the_fraction_with_warmup_iters_or_out_of_range_is_an_error():
    with pytest.raises(ConfigError, match="--lr-warmup-fraction with --lr-warmup-iters"):
        _train("--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "5")
    with pytest.raises(ConfigError, match="--lr-warmup-fraction=1.5"):
        _train("--lr-warmup-fraction", "1.5")
