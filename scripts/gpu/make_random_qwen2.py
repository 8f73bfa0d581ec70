"""Write a Qwen2-0.5B-shaped model with random bf16 weights, and a tokenizer, into OUT_DIR (no download).

    python scripts/gpu/make_random_qwen2.py OUT_DIR

Shape of Qwen2-0.5B: hidden 896, 24 layers, 14 heads (head_dim 64), 2 KV heads, intermediate 4864,
vocab 151936, tied embeddings; 494M parameters, ~1 GB of safetensors. The tokenizer is a word-level
one with one token per model id (``<unk> <s> </s> <pad> t4 t5 ...``), so every id the engine samples
detokenizes; the benchmark sends token ids and never reads text. Built on the GPU when there is one
(random init of 494M parameters on a CPU takes much longer). Idempotent: an existing complete
OUT_DIR is kept.
"""

from __future__ import annotations

import json
import os
import sys
import time

VOCAB = 151936


def main(out: str) -> None:
    if os.path.exists(os.path.join(out, ".complete")):
        print(f"{out}: already made")
        return
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {tok: i for i, tok in enumerate(specials)} | {f"t{i}": i for i in range(len(specials), VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    fast.save_pretrained(out)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    model.to(torch.bfloat16).save_pretrained(out)
    num_params = sum(p.numel() for p in model.parameters())
    with open(os.path.join(out, ".complete"), "w") as f:
        json.dump({"num_params": num_params, "seconds": round(time.time() - t0, 1)}, f)
    print(
        f"{out}: Qwen2-0.5B shape, {num_params / 1e6:.0f}M random bf16 parameters, built on {device} in {time.time() - t0:.0f} s: "
        f"{sorted(os.listdir(out))}"
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
