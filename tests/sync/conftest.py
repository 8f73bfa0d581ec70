"""Fixtures for weight-sync tests: a tiny Llama at v1 and a perturbed v2, live embedded engines, pools."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from slime.config import RolloutConfig
from slime.engines.pool import HttpEnginePool
from slime.servers.embedded import EngineServer
from tests.fixtures.tiny_model import perturb_weights, write_tiny_llama

torch.set_num_threads(1)

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
PROMPTS = [[0, 5, 9, 3], [0, 17, 2, 40, 8]]


@pytest.fixture(scope="session")
def v1_path(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("sync") / "v1", seed=0)


@pytest.fixture(scope="session")
def v2_path(v1_path, tmp_path_factory) -> Path:
    return perturb_weights(v1_path, tmp_path_factory.mktemp("sync") / "v2", seed=1, scale=0.3)


@pytest.fixture(scope="session")
def v2_state(v2_path) -> dict[str, torch.Tensor]:
    """v2's weights keyed by HF name (what a trainer's ``state_dict_for_sync`` would return)."""
    return load_file(str(v2_path / "model.safetensors"))


@pytest.fixture
async def engine(v1_path):
    async with EngineServer(v1_path, port=0, seed=0, weight_version="0") as server:
        yield server


@pytest.fixture
async def pool(engine):
    async with HttpEnginePool([engine.url], config=RolloutConfig(control_timeout_s=30.0)) as p:
        yield p


def live_state(engine: EngineServer) -> dict[str, torch.Tensor]:
    return engine.loaded.model.state_dict()


def assert_holds(engine: EngineServer, state: dict[str, torch.Tensor]) -> None:
    """Every tensor of ``state`` is in the engine, bit for bit."""
    live = live_state(engine)
    differ = [name for name, t in state.items() if not torch.equal(live[name], t)]
    assert not differ, f"{len(differ)} tensors differ, e.g. {differ[:3]}"


async def greedy_outputs(client) -> list[list[int]]:
    return [(await client.generate(p, GREEDY, return_logprob=False)).output_ids for p in PROMPTS]
