"""Fixtures for the torch training backend: a tiny random Llama saved as an HF directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.set_num_threads(1)

TINY_LLAMA = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random tiny Llama (fp32) with a stand-in tokenizer_config.json, saved once per session."""
    path = tmp_path_factory.mktemp("tiny_llama")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).save_pretrained(path)
    (Path(path) / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    return str(path)


@pytest.fixture
def tiny_model(tiny_model_dir: str) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
