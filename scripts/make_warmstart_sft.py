"""Re-make the arithmetic demo's warm start with ``slime train --loss-type sft_loss`` and measure it.

Usage::

    python scripts/make_warmstart_sft.py [--run-dir DIR] [--steps N] [--seed S] [--threads T]

The recipe of ``scripts/make_warmstart.py`` (which it imports for the model and the report), run
through the SFT mode of ``slime train`` instead of a hand-written loop:

1. ``DIR/init/``: the randomly initialised Llama of ``make_warmstart.make_model`` (same dims, same
   seed, so the same weights) and the character tokenizer.
2. ``DIR/data/train.jsonl``: ``steps x batch_size`` plain rows ``{"prompt", "response"}`` in the order
   ``make_warmstart.py`` draws them (``arith.iter_problems(seed, "train")``; each response the worked
   solution, or ``#<answer>`` with probability ``--direct-fraction``, from the same style stream), so
   one pass in file order is exactly its batches. ``DIR/data/eval.jsonl``: the 200 held-out eval
   problems (worked solutions), for the run's eval loss.
3. ``slime train --loss-type sft_loss`` with its hyper-parameters (batch 64, AdamW lr 3e-3, betas
   0.9/0.95, weight decay 0.1, clip 1.0, 50 warm-up steps then cosine to 3e-4 over 1,200 steps,
   per-token loss), checkpoints every 200 steps and the eval loss every 100, into ``DIR/sft/``.
4. The report of ``make_warmstart.py`` on ``DIR/sft/model`` (greedy and T=1 accuracy on the 200 eval
   problems, pass@8, direct-answer share), and greedy accuracy of the shipped checkpoint
   (``slime/data/assets/arith-warmstart``) on the same problems, side by side.

The shipped checkpoint is never written. Measured (2026-11-30, shared 2-core AMD EPYC, 1 thread):
873 s of training; greedy held-out 0.490 against the shipped 0.490, and the weights are
bit-identical to the shipped ``model.safetensors`` (docs/benchmarks.md, "SFT mode re-makes the
arithmetic warm start").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_warmstart import make_model, report  # noqa: E402

from slime.data import arith  # noqa: E402
from slime.data.tokenizer import build_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "slime" / "data" / "assets" / "arith-warmstart"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "arith-warmstart-sft")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads of the trainer and the evaluation")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--direct-fraction", type=float, default=0.5)
    p.add_argument("--num-eval", type=int, default=200)
    p.add_argument("--eval-only", action="store_true", help="only measure DIR/sft/model")
    return p.parse_args()


def write_init(out: Path, seed: int) -> None:
    tokenizer = build_tokenizer()
    model = make_model(tokenizer, seed)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=False, max_new_tokens=arith.MAX_RESPONSE_CHARS + 2)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def write_data(data_dir: Path, args: argparse.Namespace) -> tuple[Path, Path]:
    """The training rows in ``make_warmstart.train``'s order, and the eval problems."""
    data_dir.mkdir(parents=True, exist_ok=True)
    problems = arith.iter_problems(args.seed, "train")
    style_rng = random.Random(f"style:{args.seed}")
    train = data_dir / "train.jsonl"
    with train.open("w") as f:
        for _ in range(args.steps * args.batch_size):
            prompt, label, solution = next(problems)
            response = f"#{label}" if style_rng.random() < args.direct_fraction else solution
            f.write(json.dumps({"prompt": prompt, "response": response}) + "\n")
    evals = data_dir / "eval.jsonl"
    with evals.open("w") as f:
        eval_problems = arith.iter_problems(args.seed, "eval")  # the stream of arith.generate_dataset(n, seed, "eval")
        for _ in range(args.num_eval):
            prompt, _, solution = next(eval_problems)
            f.write(json.dumps({"prompt": prompt, "response": solution}) + "\n")
    return train, evals


def sft_command(args: argparse.Namespace, init: Path, train: Path, evals: Path, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "slime.cli", "train", "--loss-type", "sft_loss",
        "--hf-checkpoint", str(init), "--prompt-data", str(train), "--eval-prompt-data", str(evals),
        "--num-eval-prompts", str(args.num_eval), "--input-key", "prompt",
        "--rollout-batch-size", str(args.batch_size), "--global-batch-size", str(args.batch_size),
        "--micro-batch-size", str(args.batch_size), "--num-rollout", str(args.steps),
        "--lr", str(args.lr), "--min-lr", str(args.lr / 10), "--lr-warmup-iters", str(args.warmup_steps),
        "--lr-decay-style", "cosine", "--lr-decay-iters", str(args.steps),
        "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--clip-grad", "1.0",
        "--calculate-per-token-loss", "--train-threads", str(args.threads), "--seed", str(args.seed),
        "--save", str(out), "--save-interval", "200", "--eval-interval", "100", "--no-progress",
    ]


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    run_dir = args.run_dir.resolve()
    init, out = run_dir / "init", run_dir / "sft"
    if not args.eval_only:
        if out.exists():
            sys.exit(f"{out} exists; choose another --run-dir (or --eval-only)")
        write_init(init, args.seed)
        train, evals = write_data(run_dir / "data", args)
        cmd = sft_command(args, init, train, evals, out)
        print("$ " + " ".join(cmd), flush=True)
        start = time.monotonic()
        subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        print(f"slime train (SFT) took {time.monotonic() - start:.1f}s", flush=True)
    eval_rows = arith.generate_dataset(args.num_eval, seed=args.seed, split="eval")
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    model = LlamaForCausalLM.from_pretrained(out / "model", dtype=torch.float32)
    print(f"SFT model {out / 'model'}:", flush=True)
    report(model, tokenizer, eval_rows, args.seed)
    shipped = LlamaForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32)
    greedy = arith.evaluate_hf_model(shipped, AutoTokenizer.from_pretrained(SHIPPED), eval_rows, temperature=0.0)
    mine = arith.evaluate_hf_model(model, tokenizer, eval_rows, temperature=0.0)
    print(f"greedy held-out accuracy: slime train SFT {mine:.3f}  shipped {greedy:.3f}  difference {100 * (mine - greedy):+.1f} points")


if __name__ == "__main__":
    main()
