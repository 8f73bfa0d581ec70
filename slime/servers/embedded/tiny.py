"""A tiny random ``LlamaForCausalLM`` in HF format, for ``slime check-plugin`` and smoke runs.

Defaults: vocab 64, hidden 32, 2 layers, 4 heads (2 KV heads), MLP 64, context 256, fp32, about
25k parameters; token 0 is BOS, token 1 EOS, token 2 pad. ``initializer_range=0.2`` makes the
next-token distributions peaked, so greedy decoding is stable. No tokenizer is written: the
embedded engine serves ``input_ids`` without one.

Example::

    path = write_tiny_llama("/tmp/tiny", seed=0)      # config.json + model.safetensors
    async with EngineServer(path, port=0) as engine: ...
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_tiny_llama"]


def write_tiny_llama(
    path: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 64,
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    max_position_embeddings: int = 256,
    eos_token_id: int = 1,
) -> Path:
    """Write a random tiny Llama (same ``seed``, same weights) into ``path`` (created). Returns ``Path(path)``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=eos_token_id,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)  # type: ignore[arg-type]  # transformers types .to() through a decorator that takes the model itself
    model.save_pretrained(path)
    return path
