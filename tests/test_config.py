"""One field per fact: a ``Config`` built in Python cannot disagree with itself (the engines sampling at one
temperature while the trainer scores tokens at another), because each fact has one field and the run's
wiring hands it to whoever needs it. Each section checks its own fields in its own ``validate``."""

from __future__ import annotations

import json

import msgspec
import pytest

import slime.config as config_package
from slime.config import (
    Config,
    DataConfig,
    DebugConfig,
    EngineConfig,
    LoopConfig,
    MegatronConfig,
    ObsConfig,
    RolloutConfig,
    SyncConfig,
    TrainConfig,
)
from slime.errors import ConfigError

SECTIONS = (
    DataConfig,
    RolloutConfig,
    LoopConfig,
    TrainConfig,
    MegatronConfig,
    SyncConfig,
    EngineConfig,
    ObsConfig,
    DebugConfig,
)


def _paths(obj, prefix="") -> dict[str, list[str]]:
    """``{field name: [dotted paths]}`` of every leaf field of ``obj``."""
    out: dict[str, list[str]] = {}
    for f in msgspec.structs.fields(obj):
        value = getattr(obj, f.name)
        children = (
            _paths(value, f"{prefix}{f.name}.") if isinstance(value, msgspec.Struct) else {f.name: [prefix + f.name]}
        )
        for name, paths in children.items():
            out.setdefault(name, []).extend(paths)
    return out


def test_no_field_name_is_stored_in_two_places():
    assert {name: paths for name, paths in _paths(Config()).items() if len(paths) > 1} == {}


@pytest.mark.parametrize(
    "section, field",
    [
        ("train", "rollout_temperature"),
        ("train", "max_staleness"),
        ("train", "seed"),
        ("data", "seed"),
        ("loop", "n_samples_per_prompt"),
    ],
)
def test_the_former_copies_no_longer_exist(section, field):
    with pytest.raises(msgspec.ValidationError, match=f"unknown field `{field}`"):
        msgspec.convert({section: {field: 1}}, Config)


def test_the_trainer_is_handed_the_facts_of_their_owning_sections():
    c = Config(rollout=RolloutConfig(rollout_temperature=0.7), loop=LoopConfig(max_staleness=2), seed=5)
    assert c.trainer_kwargs() == dict(rollout_temperature=0.7, max_staleness=2, seed=5)


class _Built(Exception):
    pass


async def test_the_rl_driver_builds_its_trainer_with_the_rollout_temperature_of_the_rollout_section(
    tmp_path, monkeypatch
):
    import slime.train.torch_backend as torch_backend
    from slime.loop.driver import run_training
    from tests.fixtures.tiny_model import write_tiny_llama

    seen = {}

    def fake_trainer(config, **kwargs):
        seen.update(kwargs, train=config)
        raise _Built

    monkeypatch.setattr(torch_backend, "TorchTrainer", fake_trainer)
    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "w3 w9"}) + "\n")
    config = Config(
        data=DataConfig(prompt_data=str(prompts)),
        rollout=RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=8, rollout_temperature=0.7),
        loop=LoopConfig(rollout_batch_size=1, over_sampling_batch_size=1, num_rollout=1, max_staleness=2),
        train=TrainConfig(global_batch_size=2, micro_batch_size=2),
        engine=EngineConfig(hf_checkpoint=str(model)),
        run_dir=str(tmp_path / "run"),
        seed=5,
    )
    with pytest.raises(_Built):
        await run_training(config, reward_fn=lambda s: 0.0, progress=False)
    assert (seen["rollout_temperature"], seen["max_staleness"], seen["seed"]) == (0.7, 2, 5)


def test_every_section_has_its_own_validate_and_the_root_runs_them(monkeypatch):
    assert all("validate" in vars(cls) for cls in SECTIONS)
    with pytest.raises(ConfigError, match="--tensor-model-parallel-size=0"):  # train's validate runs megatron's
        Config(train=TrainConfig(megatron=MegatronConfig(tensor_model_parallel_size=0))).validate()
    called = []
    top = [cls for cls in SECTIONS if cls is not MegatronConfig]
    for cls in top:
        monkeypatch.setattr(cls, "validate", lambda self, _n=cls.__name__: called.append(_n))
    Config().validate()
    assert sorted(called) == sorted(c.__name__ for c in top)


@pytest.mark.parametrize(
    "section, message",
    [
        (LoopConfig(max_staleness=-1), "--max-staleness=-1"),
        (RolloutConfig(rollout_temperature=0.0), "--rollout-temperature=0.0"),
        (TrainConfig(opd_only=True), "--opd-only needs --use-opd"),
        (MegatronConfig(tensor_model_parallel_size=0), "--tensor-model-parallel-size=0"),
        (SyncConfig(colocate=True, method="delta"), "--colocate with --weight-sync"),
        (EngineConfig(num_engines=0), "--rollout-num-engines=0"),
        (ObsConfig(metrics_port=70000), "--metrics-port=70000"),
        (DebugConfig(save_debug_rollout_data="r.msgpack"), "needs \\{rollout_id\\}"),
        (DataConfig(rollout_max_prompt_len=0), "--rollout-max-prompt-len=0"),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, msgspec.Struct) else None,
)
def test_a_section_checks_its_own_fields_alone(section, message):
    with pytest.raises(ConfigError, match=message):
        section.validate()


def test_each_config_module_stays_under_400_lines():
    from pathlib import Path

    sizes = {p.name: len(p.read_text().splitlines()) for p in Path(config_package.__path__[0]).glob("*.py")}
    assert sizes and max(sizes.values()) < 400, sizes


def test_a_rollout_only_run_does_not_need_a_global_batch_size_that_divides_its_samples():
    with pytest.raises(ConfigError, match="--global-batch-size=128 must divide"):
        Config(loop=LoopConfig(rollout_batch_size=2), rollout=RolloutConfig(n_samples_per_prompt=2)).validate()
    Config(
        loop=LoopConfig(rollout_batch_size=2),
        rollout=RolloutConfig(n_samples_per_prompt=2),
        debug=DebugConfig(debug_rollout_only=True),
    ).validate()
