"""MFU of a megatron-backend RL train step on one GPU, against a bf16 matmul ceiling measured here.

    python scripts/bench_megatron_mfu.py [--num-samples 16] [--seq-len 4096] [--max-tokens-per-gpu 16384]

Model: Qwen2-0.5B's shape with random weights (no download), bf16, megatron-core local spec with
slime's SDPA attention. Workload: ``--num-samples`` samples of exactly ``--seq-len`` tokens (1/8
prompt), one optimizer step per train step, micro-batches packed to ``--max-tokens-per-gpu``.

FLOPs per token (N = matmul parameters incl. the output layer, s = sequence length, causal):
forward 2 N + 2 s * heads * head_dim * layers; training (forward + backward) 3x that. Reported:

    mfu_fwd_bwd_opt   training FLOPs / (train_step time - old-logprob pass time) / ceiling
    mfu_rl_step       (training + one forward) FLOPs / train_step time / ceiling
    ceiling_tflops    a bf16 8192^3 matmul in this process (mean of 10 after 3 warm-ups)

Writes $OUT/megatron_mfu.json (target: mfu_fwd_bwd_opt >= 0.35). ``warmup_step_s`` is the first
step, torch.compile of the fused kernels included; ``fused`` says which of them ran compiled
(``SLIME_MEGATRON_COMPILE=0`` runs everything eagerly). ``--profile`` adds one more train step under
``torch.profiler`` and writes $OUT/megatron_mfu_profile.json: CUDA time per kernel class (matmul,
attention, compiled Triton fusions, other) and the top kernels.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
from megatron_common import QWEN2_05B, make_groups, make_hf_dir, write_json  # noqa: E402


def matmul_ceiling_tflops(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * 10 / (start.elapsed_time(end) / 1e3) / 1e12


def flops_per_token(shape: dict, seq_len: int) -> tuple[float, float]:
    """(forward, forward + backward) FLOPs per token."""
    h, ffn, layers, heads, kv = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"], shape["num_attention_heads"], shape["num_key_value_heads"]
    d = h // heads
    per_layer = h * (heads + 2 * kv) * d + heads * d * h + 3 * h * ffn
    n_matmul = layers * per_layer + shape["vocab_size"] * h
    fwd = 2 * n_matmul + 2 * seq_len * heads * d * layers
    return fwd, 3 * fwd


_KERNEL_CLASSES = (  # first match wins: flash kernels' names contain "cutlass", so attention goes first
    ("attention", re.compile(r"flash|fmha|attn", re.I)),
    ("matmul", re.compile(r"gemm|nvjet|cutlass|xmma|cublas|sm90_", re.I)),
    ("triton (torch.compile fusions)", re.compile(r"^triton_", re.I)),
    ("optimizer (fused adam / foreach / l2norm)", re.compile(r"adam|foreach|multi_tensor|l2norm", re.I)),
    ("memcpy / memset", re.compile(r"memcpy|memset", re.I)),
)


def profile_step(trainer, groups, top: int = 30) -> dict:
    """CUDA kernel time of one train step (old-logprob pass included), by class and top kernels."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        trainer.train_step(groups)
        torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3
    kernels = {}
    for evt in prof.key_averages():
        us = getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0.0)
        if us > 0:
            kernels[evt.key] = (kernels.get(evt.key, (0.0, 0))[0] + us, evt.count)
    total_ms = sum(us for us, _ in kernels.values()) / 1e3
    classes: dict[str, float] = {}
    for name, (us, _) in kernels.items():
        cls = next((c for c, pattern in _KERNEL_CLASSES if pattern.search(name)), "other (eager elementwise, reductions, casts)")
        classes[cls] = classes.get(cls, 0.0) + us / 1e3
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
    out = {
        "step_wall_ms": wall_ms,  # under the profiler; wall - CUDA time bounds the GPU's idle time
        "cuda_ms_total": total_ms,
        "classes_ms": {k: round(v, 2) for k, v in sorted(classes.items(), key=lambda kv: -kv[1])},
        "classes_pct": {k: round(100 * v / total_ms, 1) for k, v in sorted(classes.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": n[:160], "ms": round(us / 1e3, 2), "calls": c} for n, (us, c) in ranked],
    }
    print(f"profile of one train step: {total_ms:.1f} ms CUDA time in {wall_ms:.1f} ms wall", flush=True)
    for k, v in out["classes_ms"].items():
        print(f"  {k:45s} {v:9.1f} ms  {out['classes_pct'][k]:5.1f} %", flush=True)
    for row in out["top_kernels"][:15]:
        print(f"  {row['ms']:9.2f} ms {row['calls']:5d}x  {row['name'][:110]}", flush=True)
    return out


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
    groups = make_groups(vocab_size=QWEN2_05B["vocab_size"], num_groups=args.num_samples // 8, group_size=8, prompt_len=prompt, response_len=args.seq_len - prompt, ragged=False)
    cfg = TrainConfig(
        train_backend="megatron", global_batch_size=args.num_samples, micro_batch_size=1, lr=1e-6, max_staleness=1 << 30,
        megatron=MegatronConfig(bf16=True, use_dynamic_batch_size=True, max_tokens_per_gpu=args.max_tokens_per_gpu, recompute_granularity=args.recompute_granularity, recompute_method="uniform" if args.recompute_granularity == "full" else None),
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
        metrics = trainer.train_step(groups)
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
            write_json("megatron_mfu_profile.json", profile_step(trainer, groups))
        except Exception as exc:  # the measurement above stands without it
            print(f"profile failed: {type(exc).__name__}: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
