"""slime/hf_compat.py: the KV cache reaches the model under the installed transformers' own name.

On a release that does not know the name, the model takes it into ``**kwargs`` and runs without
the cache (transformers 5.12.1 with ``cache=``): these tests fail there.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import transformers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from slime.hf_compat import CACHE_KWARG, output_cache


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"])
def test_the_cache_keyword_is_a_named_parameter_of_the_model_forward(name):
    assert CACHE_KWARG in inspect.signature(getattr(transformers, name).forward).parameters


def test_a_decode_step_through_the_cache_equals_the_full_forward():
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    ids = torch.tensor([[3, 7, 1, 9, 4]])
    with torch.no_grad():
        full = model(input_ids=ids).logits[0, -1]
        prefix = model(input_ids=ids[:, :-1], **{CACHE_KWARG: DynamicCache()}, use_cache=True)
        assert output_cache(prefix).get_seq_length() == 4
        step = model(
            input_ids=ids[:, -1:],
            position_ids=torch.tensor([[4]]),
            **{CACHE_KWARG: output_cache(prefix)},
            use_cache=True,
        )
    torch.testing.assert_close(step.logits[0, -1], full, atol=1e-5, rtol=1e-5)
