"""Fixtures for the embedded-engine tests: tiny random Llama dirs, a live engine on port 0, a session."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
import torch

from slime.servers.embedded import EngineServer
from tests.fixtures.tiny_model import perturb_weights, write_tiny_llama

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("engine") / "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_model_v2_path(tiny_model_path, tmp_path_factory) -> Path:
    return perturb_weights(tiny_model_path, tmp_path_factory.mktemp("engine") / "tiny-v2", seed=1)


@pytest.fixture(scope="session")
def tiny_tokenizer_model_path(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("engine") / "tiny-tok", seed=0, with_tokenizer=True)


@pytest.fixture(scope="session")
def hf_model(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def loaded(tiny_model_path):
    from slime.servers.embedded.model import load_model

    return load_model(tiny_model_path)


@pytest.fixture
async def engine(tiny_model_path):
    async with EngineServer(tiny_model_path, port=0, seed=0) as server:
        yield server


@pytest.fixture
async def session():
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s
