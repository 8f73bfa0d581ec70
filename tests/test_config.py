"""``Config.validate`` on configs built in Python (not through the CLI): the facts the CLI copies into
several sections must agree, or the run scores tokens at one temperature while engines sample at another."""

from __future__ import annotations

import msgspec
import pytest

from slime.config import SHARED_FIELDS, Config, DataConfig, DebugConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.errors import ConfigError


@pytest.mark.parametrize(
    "config, message",
    [
        (Config(rollout=RolloutConfig(rollout_temperature=0.7)), "train.rollout_temperature=1.0 disagrees with rollout.rollout_temperature=0.7"),
        (Config(train=TrainConfig(max_staleness=2)), "train.max_staleness=2 disagrees with loop.max_staleness=4"),
        (Config(loop=LoopConfig(n_samples_per_prompt=4), train=TrainConfig(global_batch_size=4)),
         "loop.n_samples_per_prompt=4 disagrees with rollout.n_samples_per_prompt=8"),
        (Config(seed=7), "data.seed=1234 disagrees with seed=7"),
        (Config(train=TrainConfig(seed=0)), "train.seed=0 disagrees with seed=1234"),
    ],
    ids=["temperature", "max_staleness", "n_samples_per_prompt", "seed vs data.seed", "seed vs train.seed"],
)
def test_a_python_config_whose_copies_disagree_is_refused_naming_both_fields(config, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        config.validate()


def test_every_disagreement_is_named_at_once():
    config = Config(rollout=RolloutConfig(rollout_temperature=0.7), train=TrainConfig(max_staleness=2))
    with pytest.raises(ConfigError) as info:
        config.validate()
    assert "train.rollout_temperature=1.0 disagrees" in str(info.value) and "train.max_staleness=2 disagrees" in str(info.value)


def test_sft_configs_are_checked_too():
    with pytest.raises(ConfigError, match="train.rollout_temperature"):
        Config(rollout=RolloutConfig(rollout_temperature=0.5), train=TrainConfig(loss_type="sft_loss")).validate()


def test_a_config_whose_copies_agree_is_accepted():
    c = Config(rollout=RolloutConfig(rollout_temperature=0.7, n_samples_per_prompt=4), loop=LoopConfig(max_staleness=2, n_samples_per_prompt=4),
               train=TrainConfig(rollout_temperature=0.7, max_staleness=2, seed=5, global_batch_size=16, micro_batch_size=8), data=DataConfig(seed=5), seed=5)
    assert c.validate() is c


def test_every_copy_exists_and_has_the_owners_default():
    c = msgspec.to_builtins(Config())
    for owner, copies in SHARED_FIELDS.items():
        assert copies and all(_get(c, copy) == _get(c, owner) for copy in copies), owner


def _get(tree, path):
    for key in path.split("."):
        tree = tree[key]
    return tree


def test_every_field_that_appears_in_several_sections_is_a_declared_shared_fact():
    paths: dict[str, list[str]] = {}

    def walk(obj, prefix):
        for f in msgspec.structs.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, msgspec.Struct):
                walk(value, f"{prefix}{f.name}.")
            else:
                paths.setdefault(f.name, []).append(prefix + f.name)

    walk(Config(), "")
    repeated = {tuple(sorted(p)) for p in paths.values() if len(p) > 1}
    declared = {tuple(sorted([owner, *copies])) for owner, copies in SHARED_FIELDS.items()}
    assert repeated == declared


def test_a_rollout_only_run_does_not_need_a_global_batch_size_that_divides_its_samples():
    with pytest.raises(ConfigError, match="--global-batch-size=128 must divide"):
        Config(loop=LoopConfig(rollout_batch_size=2, n_samples_per_prompt=2), rollout=RolloutConfig(n_samples_per_prompt=2)).validate()
    Config(loop=LoopConfig(rollout_batch_size=2, n_samples_per_prompt=2), rollout=RolloutConfig(n_samples_per_prompt=2),
           debug=DebugConfig(debug_rollout_only=True)).validate()

