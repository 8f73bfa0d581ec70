"""One megatron-backend RL train step on one long sample at the Qwen2-1.5B shape: peak memory and step time.

    python tests/gpu/megatron_long_context.py [--seq-len 16384] [--recompute-granularity full] [--name NAME]

Model: Qwen2-1.5B's shape (hidden 1536, 28 layers, 12 heads, 2 KV heads, intermediate 8960,
vocabulary 151936, tied embeddings; 1.54B parameters) with random bf16 weights (no download),
megatron-core local spec with slime's SDPA / varlen attention, fused AdamW, one GPU. Workload:
one GRPO group of two samples of exactly ``--seq-len`` tokens each (1/8 prompt; rewards 0 and 1),
one micro-batch per sample (``max_tokens_per_gpu`` = ``--seq-len``), one optimizer step; the
train step includes the old-logprob pass. Peak memory is that of one ``--seq-len`` micro-batch. ``--recompute-granularity full`` recomputes every
layer (megatron-core's ``recompute_method="uniform"``, one layer per group).

Writes $OUT/megatron_long_context_NAME.json: warm-up step time (torch.compile included), the
second step's time, peak allocated and reserved memory, loss and grad norm. Exit 0 when both
steps finish with a finite loss and grad norm.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_common import QWEN2_05B, make_groups, make_hf_dir, write_json  # noqa: E402

QWEN2_15B = dict(
    QWEN2_05B,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
)
"""Qwen2-1.5B's shape (1.54B parameters), random weights."""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seq-len", type=int, default=16384)
    p.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    p.add_argument("--name", default="default")
    args = p.parse_args()

    from slime.config import MegatronConfig, TrainConfig
    from slime.train.megatron.trainer import MegatronTrainer

    model_dir = make_hf_dir("/tmp/slime_gpu/qwen2_15b", QWEN2_15B)
    prompt = args.seq_len // 8
    # One GRPO group of two samples (rewards 0 and 1: non-zero advantages), one micro-batch each.
    groups = make_groups(
        vocab_size=QWEN2_15B["vocab_size"],
        num_groups=1,
        group_size=2,
        prompt_len=prompt,
        response_len=args.seq_len - prompt,
        ragged=False,
    )
    full = args.recompute_granularity == "full"
    cfg = TrainConfig(
        train_backend="megatron", global_batch_size=2, micro_batch_size=1, lr=1e-6,
        megatron=MegatronConfig(bf16=True, use_dynamic_batch_size=True, max_tokens_per_gpu=args.seq_len, recompute_granularity=args.recompute_granularity,
                                recompute_method="uniform" if full else None, recompute_num_layers=1 if full else None),
    )  # fmt: skip
    trainer = MegatronTrainer(cfg, model_dir=model_dir)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    torch.cuda.reset_peak_memory_stats()
    times, metrics = [], {}
    for _ in range(2):  # the first includes torch.compile of the fused kernels
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        metrics = trainer.train_step(groups).to_dict()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    ok = (
        all(math.isfinite(metrics[k]) for k in ("loss", "grad_norm"))
        and metrics["num_skipped_steps"] == 0
        and metrics["grad_norm"] > 0
    )
    write_json(f"megatron_long_context_{args.name}.json", {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "megatron_core": __import__("megatron.core", fromlist=["__version__"]).__version__,
        "shape": "Qwen2-1.5B (random bf16 weights)",
        "num_params": n_params,
        "seq_len": args.seq_len,
        "recompute_granularity": args.recompute_granularity,
        "warmup_step_s": times[0],
        "step_s": times[1],
        "tokens_per_step": 2 * args.seq_len,
        "tokens_per_s": 2 * args.seq_len / times[1],
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
        "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"],
        "num_train_tokens": metrics.get("num_train_tokens"),
        "ok": ok,
    })  # fmt: skip
    trainer.close()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
