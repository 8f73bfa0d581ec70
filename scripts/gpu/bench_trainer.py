"""The megatron backend against a plain-transformers reference, side by side in one process (issue 18 item 1).

    python scripts/gpu/bench_trainer.py [--shapes qwen2-0.5b,qwen2-1.5b] [--steps 7] [--warmup 4] [--profile] [--ragged | --fresh-data]

For each shape (``slime.bench.trainer.SHAPES``, random bf16 weights written once under
``--model-root``): the same rewarded groups (``--num-samples`` samples of ``--seq-len`` tokens, 1/8
prompt, GRPO, one optimizer step per RL step) go through each backend of ``--backends``:

    transformers  slime.bench.trainer.TransformersReference: AutoModelForCausalLM, SDPA, eager,
                  micro-batches padded to --max-tokens-per-gpu, fused AdamW, bf16 autocast over fp32
                  master weights (--reference-precision bf16: bf16 weights, no master copy)
    megatron      MegatronTrainer, --bf16 (fp32 master weights), --use-dynamic-batch-size
                  --max-tokens-per-gpu (packed micro-batches), its fused AdamW, --logprob-impl
                  (slime: logits + slime's logprob function; liger: liger-kernel's fused linear CE)
    torch         slime's torch backend on the GPU with --bf16 (optional)
    megatron+NAME megatron with the candidate kernel NAME of ``slime.bench.candidates`` swapped in; its
                  result has ``rl_step_vs_megatron`` (the default's RL step time / its own, same process);
                  ``megatron+A+B`` swaps in several candidates together

Each backend: ``--warmup`` RL steps (excluded: allocator, torch.compile), then ``--steps`` RL steps
each followed by one old-logprob pass alone; medians. Reported per backend: the train+optimizer step
(RL step - old-logprob pass) and its MFU, the whole RL step (old-logprob pass + train step) and its
MFU, peak memory; per shape the megatron / transformers speed-ups. A shape whose backend runs out of
memory is recorded as skipped and the run goes on (``qwen2-7b`` uses ``--large-num-samples``).
FLOPs formula and ceiling: ``slime.bench.trainer.flops_per_token`` / ``matmul_ceiling_tflops``.

Writes $OUT/bench_trainer.json (and, with ``--profile``, two more RL steps per backend, one under
torch.profiler and one under CUDA's sync debug mode: $OUT/bench_trainer_profile.json: kernel classes, top
kernels, GPU busy vs wall, idle gaps, host syncs and the lines that made them, kernel launches), prints a markdown table and ``bench_trainer: PASSED`` when every shape ran.
On a machine without CUDA the megatron backend cannot run (megatron-core's optimizer and DDP allocate on the
GPU): ``--shapes tiny --backends transformers,torch`` runs there, and the CPU smoke test
(tests/train/megatron/test_bench_trainer.py) substitutes a CPU megatron trainer.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "gpu"))
from megatron_common import make_groups, make_hf_dir  # noqa: E402

from slime.bench.candidates import CANDIDATES  # noqa: E402
from slime.bench.step_profile import format_profile, profile_summary, sync_sites  # noqa: E402
from slime.bench.trainer import (  # noqa: E402
    SHAPES,
    TransformersReference,
    flops_per_token,
    markdown_table,
    matmul_ceiling_tflops,
    measure,
    megatron_backend,
    torch_backend,
)  # fmt: skip
from slime.config import MegatronConfig, TrainConfig  # noqa: E402

Factory = Callable[[TrainConfig, str, torch.device], Any]
"""(config, model_dir, device) -> a BackendUnderTest."""


def _megatron(cfg: TrainConfig, model_dir: str, device: torch.device):
    import torch.distributed as dist

    from slime.train.megatron.parallel import _free_port
    from slime.train.megatron.trainer import MegatronTrainer

    if (
        not dist.is_initialized() and "MASTER_PORT" in os.environ
    ):  # the previous shape's trainer closed its group: a fresh rendezvous port
        os.environ["MASTER_PORT"] = str(_free_port())
    return megatron_backend(MegatronTrainer(cfg, model_dir=model_dir))


def _torch(cfg: TrainConfig, model_dir: str, device: torch.device):
    from slime.train.torch_backend import TorchTrainer

    return torch_backend(TorchTrainer(msgspec.structs.replace(cfg, device=device.type), model_dir=model_dir))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="qwen2-0.5b,qwen2-1.5b", help=f"comma-separated, of {sorted(SHAPES)}")
    p.add_argument(
        "--backends",
        default="transformers,megatron",
        help="comma-separated, of transformers, megatron, torch, and megatron+CANDIDATE (slime.bench.candidates) for a candidate kernel",
    )
    p.add_argument("--num-samples", type=int, default=16)
    p.add_argument("--large-num-samples", type=int, default=4, help="samples per step at the qwen2-7b shape")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument(
        "--ragged",
        action="store_true",
        help="responses of 1/2 to all of their --seq-len share (default: every sample --seq-len tokens)",
    )
    p.add_argument(
        "--fresh-data",
        action="store_true",
        help="new --ragged groups every step (new shapes, as in RL); MFU: mean FLOPs over median time",
    )
    p.add_argument("--max-tokens-per-gpu", type=int, default=16384)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument(
        "--warmup",
        type=int,
        default=4,
        help="excluded steps; at 0.5B the megatron steps still fell over the first 5 after 2 (docs/benchmarks.md)",
    )
    p.add_argument("--reference-precision", choices=["autocast", "bf16"], default="autocast")
    p.add_argument(
        "--logprob-impl", choices=["slime", "liger"], default="slime", help="the megatron backend's --logprob-impl"
    )
    p.add_argument("--profile", action="store_true", help="one more RL step per backend under torch.profiler")
    p.add_argument("--model-root", default="/tmp/slime_gpu/bench_trainer")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/slime_gpu_out"))
    return p.parse_args(argv)


def _write_json(path: str, payload: Any) -> None:
    """Whole or not at all: a kill during the write leaves the previous file."""
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def run_shape(
    name: str, args: argparse.Namespace, factories: dict[str, Factory], device: torch.device, ceiling: float
) -> tuple[dict, dict]:
    """Every backend on one shape; returns (results, profiles)."""
    shape = SHAPES[name]
    num_samples = args.large_num_samples if name == "qwen2-7b" else args.num_samples
    model_dir = make_hf_dir(os.path.join(args.model_root, name), shape, dtype=torch.bfloat16, device=device.type)
    prompt = args.seq_len // 8

    def data(seed: int) -> list:
        return make_groups(
            vocab_size=shape["vocab_size"],
            num_groups=max(num_samples // 8, 1),
            group_size=min(num_samples, 8),
            prompt_len=prompt,
            response_len=args.seq_len - prompt,
            ragged=args.ragged or args.fresh_data,
            seed=seed,
        )

    # --fresh-data: new ragged groups every step (seeds 1, 2, ...), as RL brings; else one set for every step
    per_step = [data(i + 1) for i in range(args.warmup + args.steps)] if args.fresh_data else [data(0)]
    groups_at = (lambda i: per_step[i]) if args.fresh_data else (lambda i: per_step[0])
    timed = per_step[args.warmup :] if args.fresh_data else per_step
    lens = [
        [len(s.prompt_ids) + len(s.response_ids) for g in gs for s in g.samples] for gs in timed
    ]  # --seq-len each by default
    tokens = sum(map(sum, lens)) / len(lens)  # per step (a mean over the timed steps with --fresh-data)
    flat = [n for ls in lens for n in ls]
    per_token = [flops_per_token(shape, n) for n in flat]  # (forward, training) FLOPs per token of each sample
    fwd = sum(n * f for n, (f, _) in zip(flat, per_token)) / len(lens)
    train = sum(n * t for n, (_, t) in zip(flat, per_token)) / len(lens)
    cfg = TrainConfig(
        global_batch_size=num_samples,
        micro_batch_size=1,
        lr=1e-6,
        megatron=MegatronConfig(
            bf16=True,
            use_dynamic_batch_size=True,
            max_tokens_per_gpu=args.max_tokens_per_gpu,
            logprob_impl=args.logprob_impl,
        ),
    )
    result: dict[str, Any] = {
        "shape": shape,
        "num_samples": num_samples,
        "seq_len": args.seq_len,
        "tokens_per_step": tokens,
        "fwd_flops_per_step": fwd,
        "train_flops_per_step": train,
        "backends": {},
    }
    profiles: dict[str, Any] = {}
    for backend_name in args.backends.split(","):
        _free(device)
        backend = None
        base, _, candidate = backend_name.partition("+")
        t0 = time.perf_counter()
        try:
            with contextlib.ExitStack() as swapped:
                for c in filter(None, candidate.split("+")):
                    swapped.enter_context(CANDIDATES[c]())
                try:
                    backend = factories[base](cfg, model_dir, device)
                    r = measure(
                        backend,
                        groups_at,
                        warmup=args.warmup,
                        steps=args.steps,
                        fwd_flops=fwd,
                        train_flops=train,
                        ceiling_tflops=ceiling,
                    )
                    r["build_and_measure_s"] = time.perf_counter() - t0
                    if args.profile:
                        step = lambda: backend.rl_step(per_step[0])  # noqa: B023, E731  # called within this iteration
                        profiles[backend_name] = profile_summary(step, device) | {"sync_sites": sync_sites(step)}
                        print(format_profile(f"{name} {backend_name}", profiles[backend_name]), flush=True)
                finally:
                    if backend is not None:
                        backend.close()
                    backend = None
        except torch.OutOfMemoryError as exc:
            r = {"skipped": f"out of memory: {str(exc).splitlines()[0][:200]}"}
        except Exception as exc:  # a candidate that fails is a result, not the end of the run
            if not candidate:
                raise
            r = {"skipped": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
        result["backends"][backend_name] = r
        print(
            f"{name} {backend_name}: " + json.dumps({k: v for k, v in r.items() if not isinstance(v, list)}), flush=True
        )
    ref, meg = result["backends"].get("transformers", {}), result["backends"].get("megatron", {})
    if "rl_step_s" in ref and "rl_step_s" in meg:
        result["speedup_rl_step"] = ref["rl_step_s"] / meg["rl_step_s"]
        result["speedup_train_opt"] = ref["train_opt_s"] / meg["train_opt_s"]
    for backend_name, r in result["backends"].items():  # each candidate against the default, same process
        if "+" in backend_name and "rl_step_s" in r and "rl_step_s" in meg:
            r["rl_step_vs_megatron"] = meg["rl_step_s"] / r["rl_step_s"]
            r["train_opt_vs_megatron"] = meg["train_opt_s"] / r["train_opt_s"]
            print(
                f"{name}: {backend_name} RL step {r['rl_step_vs_megatron']:.3f}x megatron's (train+opt {r['train_opt_vs_megatron']:.3f}x)"
            )
    return result, profiles


def main(argv: list[str] | None = None, factories: dict[str, Factory] | None = None) -> int:
    """Run the benchmark; ``factories`` replaces backend constructors (the CPU smoke test's megatron stand-in)."""
    args = parse_args(argv)
    factories = {
        "transformers": lambda cfg, d, dev: TransformersReference(
            cfg, model_dir=d, device=dev, precision=args.reference_precision
        ),
        "megatron": _megatron,
        "torch": _torch,
        **(factories or {}),
    }
    names = args.backends.split(",")
    unknown = (
        set(args.shapes.split(",")) - SHAPES.keys()
        | {n.partition("+")[0] for n in names} - factories.keys()
        | {c for n in names for c in n.split("+")[1:]} - CANDIDATES.keys()
        | {n for n in names if "+" in n and not n.startswith("megatron+")}  # candidates patch the megatron backend only
    )
    if unknown:
        raise SystemExit(f"unknown shapes/backends: {sorted(unknown)}")
    if (
        "megatron" in {n.partition("+")[0] for n in names}
        and factories["megatron"] is _megatron
        and not torch.cuda.is_available()
    ):
        raise SystemExit("the megatron backend needs CUDA; on a CPU: --shapes tiny --backends transformers,torch")
    os.makedirs(args.out, exist_ok=True)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    ceiling = matmul_ceiling_tflops(device)
    results: dict[str, Any] = {}
    profiles: dict[str, Any] = {}
    mcore = None
    try:
        mcore = __import__("megatron.core", fromlist=["__version__"]).__version__
    except ImportError:
        pass
    payload = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "megatron_core": mcore,
        "ceiling_tflops": ceiling,
        "args": vars(args),
        "shapes": results,
    }
    for name in args.shapes.split(","):
        results[name], profiles[name] = run_shape(name, args, factories, device, ceiling)
        # written after every shape: a later shape that ends the process (a kernel fault, the call's limit) keeps these
        _write_json(os.path.join(args.out, "bench_trainer.json"), payload)
        if args.profile:
            _write_json(os.path.join(args.out, "bench_trainer_profile.json"), profiles)
    print(
        f"\nceiling {ceiling:.1f} TFLOP/s ({payload['device']}), {args.num_samples} x {args.seq_len} tokens per step, "
        f"{args.max_tokens_per_gpu}-token micro-batches, median of {args.steps} after {args.warmup} warm-up\n",
        flush=True,
    )
    print(markdown_table(results), flush=True)
    ran = all(any("rl_step_s" in r for r in res["backends"].values()) for res in results.values())
    print(f"bench_trainer: {'PASSED' if ran else 'FAILED'}", flush=True)
    return 0 if ran else 1


if __name__ == "__main__":
    sys.exit(main())
