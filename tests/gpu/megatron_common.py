"""Shared pieces of the megatron GPU checks: random HF checkpoints (no downloads) and synthetic RL groups.

Used by ``tests/gpu/megatron_*.py``, ``scripts/gpu/bench_trainer.py`` and ``scripts/bench_megatron_mfu.py`` through
``scripts/gpu/megatron_checks.sh``; in CI only the CPU smoke test of the trainer benchmark
(tests/train/megatron/test_bench_trainer.py) uses it, on the CPU.
"""

from __future__ import annotations

import json
import os

import torch

from slime.bench.trainer import SHAPES

QWEN2_05B = dict(SHAPES["qwen2-0.5b"])
"""Qwen2-0.5B's shape (494M parameters), with random weights."""

SMALL = dict(QWEN2_05B, num_hidden_layers=4)
"""Qwen2-0.5B's width and vocabulary, 4 layers: quick parity checks."""


QWEN3_MOE_SMALL = dict(
    vocab_size=32768, hidden_size=1024, intermediate_size=2816, moe_intermediate_size=512, num_experts=8, num_experts_per_tok=2,
    norm_topk_prob=True, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
    max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.02,
)  # fmt: skip
"""A small Qwen3-MoE (``Qwen3MoeForCausalLM``): 4 MoE layers of 8 experts, top-2, about 128M parameters, random weights."""


def make_hf_dir(
    path: str,
    shape: dict,
    *,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    family: str = "qwen2",
    device: str = "cuda",
) -> str:
    """Save a random model of ``shape`` (initialised on ``device``) as an HF directory; return ``path``.

    ``family``: "qwen2" (``Qwen2ForCausalLM``) or "qwen3_moe" (``Qwen3MoeForCausalLM``).
    """
    import transformers as tf

    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    cfg_cls, model_cls = {
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM),
    }[family]
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(cfg_cls(**shape)).to(dtype)
    model.save_pretrained(path)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": 32768}, f)
    return path


def make_groups(
    *,
    vocab_size: int,
    num_groups: int,
    group_size: int,
    prompt_len: int,
    response_len: int,
    seed: int = 0,
    ragged: bool = True,
):
    """Rewarded groups of random tokens; response lengths vary inside each group when ``ragged``."""
    from slime.types import Group, Sample, Status

    g = torch.Generator().manual_seed(seed)
    groups = []
    for gi in range(num_groups):
        samples = []
        for i in range(group_size):
            r = response_len - (int(torch.randint(0, response_len // 2, (1,), generator=g)) if ragged else 0)
            s = Sample(
                prompt_ids=torch.randint(1, vocab_size, (prompt_len,), generator=g).tolist(),
                index=i,
                group_id=gi,
                reward=float((i + gi) % 2),
                status=Status.COMPLETED,
            )
            s.append(
                torch.randint(1, vocab_size, (r,), generator=g).tolist(),
                (-torch.rand(r, generator=g) * 3).tolist(),
                policy_version=0,
            )
            samples.append(s)
        groups.append(Group(group_id=gi, samples=samples))
    return groups


def write_json(name: str, payload: dict, *, out_dir: str | None = None) -> None:
    """Print ``payload`` and write it to ``out_dir/name`` (default ``$OUT``, else the working directory)."""
    text = json.dumps(payload, indent=2, sort_keys=True)
    print(text, flush=True)
    with open(os.path.join(out_dir or os.environ.get("OUT", "."), name), "w") as f:
        f.write(text + "\n")
