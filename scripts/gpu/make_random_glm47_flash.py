"""Write a GLM-4.7-Flash-shaped model (``Glm4MoeLiteForCausalLM``) with random bf16 weights into OUT_DIR, with the
arithmetic demo's tokenizer (no download).

    python scripts/gpu/make_random_glm47_flash.py OUT_DIR

GLM-4.7-Flash's attention at its own head sizes, on a narrower and shallower model: hidden 1024, 8 layers (layer 0
dense), 20 heads of multi-latent attention exactly as GLM-4.7-Flash's (q latent 768, kv latent 512, q/k heads
192 + 64 interleaved rope channels, v heads 256, RoPE base 1e6, no scaling), 64 routed experts of width 256 (top 4,
one group, sigmoid scores with a random expert bias, routed scaling 1.8) and one shared expert. About 0.5 B
parameters. ``first_k_dense_replace`` is written beside transformers' ``mlp_layer_types`` (SGLang 0.5.17 builds
its dense layers from the first, transformers from the second; ``slime.train.megatron.glm_lite`` checks that they
agree), ``rope_theta`` also at the top level (where SGLang's v4-style fallback reads it). The vocabulary is the demo
tokenizer's (``slime/data/assets/arith-warmstart``), so ``--builtin-task arith`` works (an untrained model earns ~0
reward: the point is the trainer/engine logprob gap). Idempotent: an existing complete OUT_DIR is kept.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import Any

ASSETS = os.path.join(os.path.dirname(__file__), "..", "..", "slime", "data", "assets", "arith-warmstart")
ROPE_THETA = 1_000_000.0
SHAPE: dict[str, Any] = dict(
    hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=20, num_key_value_heads=20,
    q_lora_rank=768, kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256,
    moe_intermediate_size=256, n_routed_experts=64, num_experts_per_tok=4, n_shared_experts=1, n_group=1,
    topk_group=1, routed_scaling_factor=1.8, norm_topk_prob=True, first_k_dense_replace=1, rms_norm_eps=1e-5,
    max_position_embeddings=4096, tie_word_embeddings=False, attention_bias=False, rope_interleave=True,
)  # fmt: skip


def _config(tok: Any) -> Any:
    """The ``Glm4MoeLiteConfig`` of ``SHAPE`` over ``tok``'s vocabulary (default layer list: layer 0 dense)."""
    from transformers import Glm4MoeLiteConfig

    rope = dict(rope_type="default", rope_theta=ROPE_THETA, partial_rotary_factor=1.0)
    special = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    return Glm4MoeLiteConfig(**SHAPE, vocab_size=len(tok), rope_parameters=rope, **special)


def _random_model(config: Any) -> Any:
    """The model in bf16 on the GPU when there is one (half the memory), a small random expert bias."""
    import torch
    from transformers import Glm4MoeLiteForCausalLM

    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = Glm4MoeLiteForCausalLM(config)
    finally:
        torch.set_default_dtype(before)  # the caller's default restored
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.02 * torch.randn_like(b))
    return model.to(torch.bfloat16)


def _write_sglang_keys(out: str) -> None:
    """``first_k_dense_replace`` and a top-level ``rope_theta`` in config.json (module docstring)."""
    path = os.path.join(out, "config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(first_k_dense_replace=SHAPE["first_k_dense_replace"], rope_theta=ROPE_THETA)
    with open(path, "w") as f:
        json.dump(config, f, indent=2)


def main(out: str) -> None:
    """Write the model, tokenizer and ``.complete`` (parameter count, seconds) into ``out``."""
    if os.path.exists(os.path.join(out, ".complete")):
        print(f"{out}: already made")
        return
    from transformers import AutoTokenizer

    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(ASSETS)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(ASSETS, name)):
            shutil.copy(os.path.join(ASSETS, name), out)
    model = _random_model(_config(tok))
    model.save_pretrained(out)
    _write_sglang_keys(out)
    num_params = sum(p.numel() for p in model.parameters())
    with open(os.path.join(out, ".complete"), "w") as f:
        json.dump({"num_params": num_params, "seconds": round(time.time() - t0, 1)}, f)
    print(f"{out}: GLM-4.7-Flash shape, {num_params / 1e6:.0f}M random bf16 parameters in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
