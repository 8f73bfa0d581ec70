"""Issue 30: an async run without ``--max-staleness`` trains one version off-policy (THUDM/slime's train_async),
not at AReaL's 4; every other mode keeps 4, a given flag and a resumed run's own value win."""

from slime.cli.args import build_parser, config_from_args
from slime.config import Config, LoopConfig


def _loop(*argv: str, base: Config | None = None) -> LoopConfig:
    return config_from_args(build_parser().parse_args(["--global-batch-size", "64", *argv]), base).loop


def test_async_bounds_staleness_at_one_version_by_default():
    assert _loop("--rollout-mode", "async").max_staleness == 1
    assert _loop("--rollout-mode", "async", "--max-staleness", "4").max_staleness == 4
    assert _loop("--rollout-mode", "async", "--max-staleness", "0").max_staleness == 0


def test_the_other_modes_keep_four():
    assert _loop("--partial-rollout").max_staleness == 4
    assert _loop("--rollout-mode", "sync").max_staleness == 4
    assert _loop().max_staleness == 4


def test_a_resumed_run_keeps_its_own_bound():
    saved = Config(loop=LoopConfig(mode="async", max_staleness=3))
    assert _loop(base=saved).max_staleness == 3


def test_the_trainer_gets_the_resolved_bound():
    # the trainer refuses tokens over this bound (slime/train/batch.py): it must be the mode's, not the field's
    config = config_from_args(build_parser().parse_args(["--global-batch-size", "64", "--rollout-mode", "async"]))
    assert config.trainer_kwargs()["max_staleness"] == 1
