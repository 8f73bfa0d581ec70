"""What this machine offers a launch plan (``slime.engines.fleet.host``): the trainer's GPU count and the
packages the plan's commands must import."""

from __future__ import annotations

import pytest

from slime.config import EngineConfig
from slime.engines.fleet.plan import build_launch_plan
from slime.errors import ConfigError
from tests.engines.fleet.test_plan import PY


def test_trainer_gpus_counts_the_local_torchrun_ranks_of_the_megatron_backend(monkeypatch):
    from slime.config import TrainConfig
    from slime.engines.fleet.host import trainer_gpus

    for var in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    megatron = TrainConfig(train_backend="megatron")
    assert trainer_gpus(TrainConfig()) == 0 and trainer_gpus(megatron) == 1
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert trainer_gpus(megatron) == 8
    assert trainer_gpus(megatron, rollout_only=True) == 0


@pytest.mark.parametrize(
    "argv_extra, colocate, missing, message",
    [
        (
            (),
            False,
            "sglang",
            'cannot import sglang: pip install "sglang==0.5.17", or put its site-packages on PYTHONPATH',
        ),
        (("--router-policy", "manual"), False, "sglang_router", "routers for ['actor']"),
        ((), True, "torch_memory_saver", "servers with --enable-memory-saver"),
    ],
)
def test_check_launchable_names_the_package_the_commands_cannot_import(
    monkeypatch, argv_extra, colocate, missing, message
):
    import importlib.util

    from slime.engines.fleet.host import check_launchable

    engine = EngineConfig(hf_checkpoint="/m", rollout_num_gpus=1, router_args=argv_extra)
    plan = build_launch_plan(engine, python=PY, is_free=lambda h, p: True, colocate=colocate)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name != missing else None)
    with pytest.raises(ConfigError) as info:
        check_launchable(plan)
    assert message in str(info.value) and "\n" not in str(info.value)
    if missing != "sglang":  # a package the plan does not need is not asked for
        check_launchable(
            build_launch_plan(
                EngineConfig(hf_checkpoint="/m", rollout_num_gpus=1), python=PY, is_free=lambda h, p: True
            )
        )
