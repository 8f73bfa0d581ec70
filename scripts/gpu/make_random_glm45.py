"""Write a GLM-4.5-shaped MoE model (``Glm4MoeForCausalLM``) with random bf16 weights into OUT_DIR, with the arithmetic
demo's tokenizer (no download).

    python scripts/gpu/make_random_glm45.py OUT_DIR

GLM-4.5's layout scaled to one GPU next to SGLang: hidden 1024, 8 layers (the first dense, as GLM-4.5's
``first_k_dense_replace``), 16 query heads of 128 channels with 4 key/value heads, RoPE on half of each head
(``partial_rotary_factor`` 0.5), q/k/v bias and q/k norms, 32 routed experts (top 8) of width 384 with
sigmoid scores, a random expert bias and routed scaling 2.5, one shared expert. About 0.35B parameters. The vocabulary
is the demo tokenizer's (``slime/data/assets/arith-warmstart``), so ``--builtin-task arith`` prompts and
rewards work (an untrained model earns ~0 reward: the point is the trainer/engine logprob gap).
``partial_rotary_factor`` and ``rope_theta`` are also written at the top level of config.json (where configs
of transformers 4.x and SGLang's model code read them). Idempotent: an existing complete OUT_DIR is kept.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

ASSETS = os.path.join(os.path.dirname(__file__), "..", "..", "slime", "data", "assets", "arith-warmstart")
SHAPE = dict(
    hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
    head_dim=128, moe_intermediate_size=384, n_routed_experts=32, num_experts_per_tok=8, n_shared_experts=1,
    first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
    use_qk_norm=True, attention_bias=True, rms_norm_eps=1e-5, max_position_embeddings=4096,
    tie_word_embeddings=False,
)  # fmt: skip


def main(out: str) -> None:
    if os.path.exists(os.path.join(out, ".complete")):
        print(f"{out}: already made")
        return
    import torch
    from transformers import AutoTokenizer, Glm4MoeConfig, Glm4MoeForCausalLM

    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(ASSETS)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(ASSETS, name)):
            shutil.copy(os.path.join(ASSETS, name), out)
    rope = dict(rope_type="default", rope_theta=1_000_000.0, partial_rotary_factor=0.5)
    cfg = Glm4MoeConfig(**SHAPE, vocab_size=len(tok), rope_parameters=rope, pad_token_id=tok.pad_token_id,
                        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)  # fmt: skip
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 (half the memory); the caller's default restored after
    try:
        with torch.device(device):
            model = Glm4MoeForCausalLM(cfg)
    finally:
        torch.set_default_dtype(before)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.02 * torch.randn_like(b))
    model.to(torch.bfloat16).save_pretrained(out)
    path = os.path.join(out, "config.json")
    config = json.load(open(path))
    config.update(partial_rotary_factor=0.5, rope_theta=1_000_000.0)
    json.dump(config, open(path, "w"), indent=2)
    num_params = sum(p.numel() for p in model.parameters())
    with open(os.path.join(out, ".complete"), "w") as f:
        json.dump({"num_params": num_params, "seconds": round(time.time() - t0, 1)}, f)
    print(
        f"{out}: GLM-4.5 shape, {num_params / 1e6:.0f}M random bf16 parameters, built on {device} in {time.time() - t0:.0f} s"
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
