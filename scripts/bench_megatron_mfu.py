"""MFU of a megatron-backend RL train step on one GPU, against a bf16 matmul ceiling measured here.

    python scripts/bench_megatron_mfu.py [--num-samples 16] [--seq-len 4096] [--max-tokens-per-gpu 16384]

Model: Qwen2-0.5B's shape with random weights (no download), bf16, megatron-core local spec with
slime's SDPA attention. Workload: ``--num-samples`` samples of exactly ``--seq-len`` tokens (1/8
prompt), one optimizer step per train step, micro-batches packed to ``--max-tokens-per-gpu``.

FLOPs per token: ``slime.bench.trainer.flops_per_token`` (N = matmul parameters incl. the output
layer, s = sequence length: forward 2 N + 2 s * heads * head_dim * layers; training 3x that). Reported:

    mfu_fwd_bwd_opt   training FLOPs / (train_step time - old-logprob pass time) / ceiling
    mfu_rl_step       (training + one forward) FLOPs / train_step time / ceiling
    ceiling_tflops    a bf16 8192^3 matmul in this process (mean of 10 after 3 warm-ups)

Writes $OUT/megatron_mfu.json (target: mfu_fwd_bwd_opt >= 0.35). ``warmup_step_s`` is the first
step, torch.compile of the fused kernels included; ``fused`` says which of them ran compiled
(``SLIME_MEGATRON_COMPILE=0`` runs everything eagerly). ``--profile`` adds one more train step under
``torch.profiler`` and writes $OUT/megatron_mfu_profile.json (``slime.bench.step_profile.profile_summary``:
CUDA time per kernel class, the top kernels, GPU busy vs wall, host syncs, kernel launches). The
side-by-side benchmark against plain transformers is ``scripts/gpu/bench_trainer.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
from megatron_common import QWEN2_05B, make_groups, make_hf_dir, write_json  # noqa: E402

from slime.bench.step_profile import format_profile, profile_summary  # noqa: E402
from slime.bench.trainer import flops_per_token, matmul_ceiling_tflops  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--num-samples", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--max-tokens-per-gpu", type=int, default=16384)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    p.add_argument("--profile", action="store_true", help="profile one more train step (megatron_mfu_profile.json)")
    args = p.parse_args()

    from slime.config import MegatronConfig, TrainConfig
    from slime.train.batch import build_train_batch
    from slime.train.megatron import fusion
    from slime.train.megatron.trainer import MegatronTrainer

    ceiling = matmul_ceiling_tflops()
    model_dir = make_hf_dir("/tmp/slime_gpu/qwen2_05b", QWEN2_05B)
    prompt = args.seq_len // 8
    groups = make_groups(
        vocab_size=QWEN2_05B["vocab_size"],
        num_groups=args.num_samples // 8,
        group_size=8,
        prompt_len=prompt,
        response_len=args.seq_len - prompt,
        ragged=False,
    )
    cfg = TrainConfig(
        train_backend="megatron",
        global_batch_size=args.num_samples,
        micro_batch_size=1,
        lr=1e-6,
        megatron=MegatronConfig(
            bf16=True,
            use_dynamic_batch_size=True,
            max_tokens_per_gpu=args.max_tokens_per_gpu,
            recompute_granularity=args.recompute_granularity,
            recompute_method="uniform" if args.recompute_granularity == "full" else None,
        ),
    )
    trainer = MegatronTrainer(cfg, model_dir=model_dir)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    t0 = time.perf_counter()
    trainer.train_step(groups)  # warm-up (allocator, kernels, torch.compile)
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t0
    step_times, fwd_times = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        metrics = trainer.train_step(groups).to_dict()
        torch.cuda.synchronize()
        step_times.append(time.perf_counter() - t0)
        batch = build_train_batch(groups, pad_token_id=0, current_version=trainer.policy_version)
        plan = trainer._plan(batch)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        trainer._before_update(batch, plan)
        torch.cuda.synchronize()
        fwd_times.append(time.perf_counter() - t0)
    step_s, fwd_s = min(step_times), min(fwd_times)
    tokens = args.num_samples * args.seq_len
    fwd_flops, train_flops = (x * tokens for x in flops_per_token(QWEN2_05B, args.seq_len))
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "megatron_core": __import__("megatron.core", fromlist=["__version__"]).__version__,
        "num_params": n_params,
        "tokens_per_step": tokens,
        "seq_len": args.seq_len,
        "max_tokens_per_gpu": args.max_tokens_per_gpu,
        "ceiling_tflops": ceiling,
        "train_step_s": step_s,
        "old_logprob_pass_s": fwd_s,
        "tflops_fwd_bwd_opt": train_flops / (step_s - fwd_s) / 1e12,
        "mfu_fwd_bwd_opt": train_flops / (step_s - fwd_s) / 1e12 / ceiling,
        "mfu_rl_step": (train_flops + fwd_flops) / step_s / 1e12 / ceiling,
        "tokens_per_s": tokens / step_s,
        "warmup_step_s": warmup_s,
        "fused": fusion.status(),
        "step_times_s": step_times,
        "old_logprob_pass_times_s": fwd_times,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"],
        "target_met": train_flops / (step_s - fwd_s) / 1e12 / ceiling >= 0.35,
    }
    write_json("megatron_mfu.json", result)
    if args.profile:
        try:
            summary = profile_summary(lambda: trainer.train_step(groups), "cuda")
            print(format_profile("one train step", summary), flush=True)
            write_json("megatron_mfu_profile.json", summary)
        except Exception as exc:  # the measurement above stands without it
            print(f"profile failed: {type(exc).__name__}: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
