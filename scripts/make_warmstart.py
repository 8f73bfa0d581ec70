"""Make the arithmetic demo's warm start with ``slime train --loss-type sft_loss``, and measure it.

Usage::

    python scripts/make_warmstart.py [--task arith|chain] [--run-dir DIR] [--steps N] [--seed S] [--threads T] [--out DIR --save-dtype D]
        [--hidden-size H --intermediate-size I --num-layers L --num-heads A --num-kv-heads K] [--compare-with DIR]

A small Llama, from scratch, fine-tuned on ``prompt + solution + <eos>`` from the train split of
``slime.data.arith``, with the loss on the solution and ``<eos>`` tokens only. The script holds no
training loop; in ``DIR`` (``--run-dir``) it writes

1. ``DIR/init/``: the randomly initialised ``LlamaForCausalLM`` (``MODEL_DIMS``,
   ``torch.manual_seed(--seed)``), its generation config and the character tokenizer
   (``slime.data.tokenizer``);
2. ``DIR/data/train.jsonl``: ``steps x batch_size`` plain rows ``{"prompt", "response"}`` in training
   order (``arith.iter_problems(seed, "train")``; each response the worked solution, or ``#<answer>``
   with probability ``--direct-fraction``, from a seeded style stream), so one pass in file order is
   exactly the batches; ``DIR/data/eval.jsonl``: the 200 held-out eval problems (worked solutions),
   for the run's eval loss;

then runs ``slime train --loss-type sft_loss`` (``sft_command``: batch 64, AdamW lr 3e-3, betas
0.9/0.95, weight decay 0.1, clip 1.0, 50 warm-up steps then cosine to 3e-4 at the last step, the
NLL averaged over the batch's response tokens) into ``DIR/sft/``, and measures ``DIR/sft/model`` on
200 eval problems: greedy, and sampled at temperature 1.0 (8 samples each, with pass@8 and the
share of 8-sample groups whose rewards are mixed, which GRPO learns from); last, it compares the
weights and the greedy accuracy with the shipped checkpoint (``slime/data/assets/arith-warmstart``),
which it never writes: copy ``DIR/sft/model`` there to ship a new one.

Training stops early on purpose: the warm start must be weak but not hopeless, so the RL demo has
room to raise accuracy and most GRPO groups carry signal.

Half of the SFT targets answer directly (``#441``) instead of working the sum out
(``--direct-fraction 0.5``): the warm start learns both styles, and the direct style is usually
wrong on 3- and 4-term sums. That is the room RL has: GRPO quickly learns to prefer the worked
solution (a strategy, not new arithmetic), which is why the CPU demo gains 20+ points in minutes.

``--task chain`` trains on ``slime.data.chain`` instead (addition chains of 2 to 10 one-digit terms,
long-tailed lengths; same format, vocabulary and reward) into ``runs/chain-warmstart``; the
generation config's ``max_new_tokens`` and the measurements then use chain's longest response. The
shipped ``slime/data/assets/chain-warmstart`` is ``--task chain --steps 1000 --threads 1`` (measured
in ``slime/data/chain.py``'s docstring).

Measured (defaults: 1,200 steps, seed 0, 2 threads on a shared 2-core AMD EPYC, torch 2.13 CPU,
2026-11-30, by this recipe's earlier hand-written loop): 1,069 s of training (other jobs sharing the
cores; about 0.4 s a step when they are quiet, so about 8 minutes); held-out greedy 0.490, sampled
at T=1 0.485, pass@8 0.900, groups of 8 with mixed rewards 0.735; greedy by terms 2: 0.85, 3: 0.32,
4: 0.30; 60% of greedy and 49% of sampled answers are direct. The shipped checkpoint is that run's
output (6.5 MB); this script re-makes it through ``slime train`` with ``model.safetensors``
byte-for-byte equal (``--threads 1``, same day, 590 s of training; docs/benchmarks.md, "SFT mode
re-makes the demo warm starts"). Other runs, same seed and eval set (greedy / T=1 / pass@8 / mixed
groups / direct share of greedy answers)::

    --direct-fraction 0    --steps 600     0.465 / 0.326 / 0.755 / 0.725 / -
    --direct-fraction 0.5  --steps 600     0.160 / 0.098 / 0.305 / 0.285 / -
    --direct-fraction 0.5  --steps 800     0.255 / 0.346 / 0.710 / 0.575 / 0.965
    --direct-fraction 0.5  --steps 1000    0.550 / 0.464 / 0.895 / 0.760 / 0.510
    --direct-fraction 0.5  --steps 1200    0.490 / 0.485 / 0.900 / 0.735 / 0.59   (shipped)

Greedy accuracy hinges on one token: when ``#`` outweighs the first digit of the worked solution,
greedy answers directly. That is why 1,000 steps score above 1,200 greedy, and why 800 steps sit
below T=1.

Why the mix (a scratch on-policy GRPO loop, not shipped: 32 prompts x 8 samples at T=1, advantage
``(r - mean) / std`` per group, one AdamW step per batch at lr 3e-5, eval on the same 200
problems): from the all-worked 600-step model, greedy went 0.465 -> 0.55 in 90 steps (lr 1e-4 was
flat, lr 2e-4 fell to 0.33); from the shipped model, greedy 0.49 -> 0.805 in 20 steps and 0.85 in
50, T=1 0.458 -> 0.605 in 50, direct share of greedy answers 0.59 -> 0.00, mean response 13 -> 20
tokens; from the 800-step model, greedy 0.255 -> 0.455 in 10 steps.
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
from safetensors.torch import load_file
from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

from slime.data import arith, chain
from slime.data.tokenizer import build_tokenizer

TASKS = {"arith": arith, "chain": chain}  # the same format, vocabulary and reward (arith.score)

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "slime" / "data" / "assets" / "arith-warmstart"

MODEL_DIMS = dict(
    hidden_size=192,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=True,
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--task",
        choices=sorted(TASKS),
        default="arith",
        help="built-in task whose problems it trains on (chain: slime.data.chain, long-tailed lengths)",
    )
    p.add_argument("--run-dir", type=Path, default=None, help="default: runs/TASK-warmstart")
    p.add_argument("--steps", type=int, default=1200, help="optimizer steps (stops early on purpose)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads of the trainer and the evaluation")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument(
        "--direct-fraction",
        type=float,
        default=0.5,
        help="share of SFT targets that answer directly ('#441') instead of working it out",
    )
    p.add_argument("--num-eval", type=int, default=200)
    p.add_argument("--eval-interval", type=int, default=100, help="eval loss every N steps")
    p.add_argument("--eval-only", action="store_true", help="only measure DIR/sft/model")
    # Model size (defaults: the shipped warm start, MODEL_DIMS); scripts/make_opd_teacher.py sets a larger one.
    p.add_argument("--hidden-size", type=int, default=MODEL_DIMS["hidden_size"])
    p.add_argument("--intermediate-size", type=int, default=MODEL_DIMS["intermediate_size"])
    p.add_argument("--num-layers", type=int, default=MODEL_DIMS["num_hidden_layers"])
    p.add_argument("--num-heads", type=int, default=MODEL_DIMS["num_attention_heads"])
    p.add_argument("--num-kv-heads", type=int, default=MODEL_DIMS["num_key_value_heads"])
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="also save the trained model here, in --save-dtype, and measure that copy (e.g. to ship it)",
    )
    p.add_argument(
        "--save-dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="dtype of the --out copy (bfloat16 halves the file; engines and trainers load it as float32)",
    )
    p.add_argument(
        "--compare-with",
        type=Path,
        default=SHIPPED,
        help="shipped checkpoint to compare weights and greedy accuracy with",
    )
    return p.parse_args()


def model_dims(args: argparse.Namespace) -> dict:
    return {
        **MODEL_DIMS,
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.num_layers,
        "num_attention_heads": args.num_heads,
        "num_key_value_heads": args.num_kv_heads,
    }


def make_model(tokenizer, seed: int, dims: dict = MODEL_DIMS) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **dims,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float()


def write_init(
    out: Path, seed: int, dims: dict = MODEL_DIMS, max_new_tokens: int = arith.MAX_RESPONSE_CHARS + 2
) -> None:
    tokenizer = build_tokenizer()
    model = make_model(tokenizer, seed, dims)
    print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters, {dims}", flush=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        max_new_tokens=max_new_tokens,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def write_data(data_dir: Path, args: argparse.Namespace) -> tuple[Path, Path]:
    """The training rows in training order (step ``k`` trains rows ``k * batch_size ..``), and the eval problems."""
    data_dir.mkdir(parents=True, exist_ok=True)
    problems = TASKS[args.task].iter_problems(args.seed, "train")
    style_rng = random.Random(f"style:{args.seed}")
    train = data_dir / "train.jsonl"
    with train.open("w") as f:
        for _ in range(args.steps * args.batch_size):
            prompt, label, solution = next(problems)
            response = f"#{label}" if style_rng.random() < args.direct_fraction else solution
            f.write(json.dumps({"prompt": prompt, "response": response}) + "\n")
    evals = data_dir / "eval.jsonl"
    with evals.open("w") as f:
        eval_problems = TASKS[args.task].iter_problems(
            args.seed, "eval"
        )  # the stream of generate_dataset(n, seed, "eval")
        for _ in range(args.num_eval):
            prompt, _, solution = next(eval_problems)
            f.write(json.dumps({"prompt": prompt, "response": solution}) + "\n")
    return train, evals


def sft_recipe(
    *,
    batch_size: int,
    steps: int,
    lr: float,
    warmup_steps: int,
    threads: int,
    seed: int,
    save: Path,
    save_interval: int,
    eval_interval: int,
) -> list[str]:
    """The demo warm starts' shared ``slime train --loss-type sft_loss`` flags (data flags not included).

    Batch ``batch_size`` rows a step in one micro-batch, AdamW (betas 0.9/0.95, weight decay 0.1, clip
    1.0), ``warmup_steps`` of linear warm-up then cosine to ``lr / 10`` at ``steps``, the NLL averaged
    over the batch's trained tokens. Also used by ``scripts/make_tool_warmstart.py``.
    """
    return [
        sys.executable,
        "-m",
        "slime.cli",
        "train",
        "--loss-type",
        "sft_loss",
        "--rollout-batch-size",
        str(batch_size),
        "--global-batch-size",
        str(batch_size),
        "--micro-batch-size",
        str(batch_size),
        "--num-rollout",
        str(steps),
        "--lr",
        str(lr),
        "--min-lr",
        str(lr / 10),
        "--lr-warmup-iters",
        str(warmup_steps),
        "--lr-decay-style",
        "cosine",
        "--lr-decay-iters",
        str(steps),
        "--weight-decay",
        "0.1",
        "--adam-beta1",
        "0.9",
        "--adam-beta2",
        "0.95",
        "--clip-grad",
        "1.0",
        "--calculate-per-token-loss",
        "--train-threads",
        str(threads),
        "--seed",
        str(seed),
        "--save",
        str(save),
        "--save-interval",
        str(save_interval),
        "--eval-interval",
        str(eval_interval),
        "--no-progress",
    ]


def sft_command(args: argparse.Namespace, init: Path, train: Path, evals: Path, out: Path) -> list[str]:
    return sft_recipe(
        batch_size=args.batch_size,
        steps=args.steps,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        threads=args.threads,
        seed=args.seed,
        save=out,
        save_interval=200,
        eval_interval=args.eval_interval,
    ) + [
        "--hf-checkpoint",
        str(init),
        "--prompt-data",
        str(train),
        "--eval-prompt-data",
        str(evals),
        "--num-eval-prompts",
        str(args.num_eval),
        "--input-key",
        "prompt",
    ]


def report(
    model: LlamaForCausalLM,
    tokenizer,
    eval_rows: list[dict],
    seed: int,
    max_new_tokens: int = arith.MAX_RESPONSE_CHARS + 2,
) -> None:
    """Print greedy and temperature-1 held-out accuracy, pass@8, mixed groups and direct-answer share."""
    greedy = [
        texts[0]
        for texts in arith.sample_hf_model(model, tokenizer, eval_rows, temperature=0.0, max_new_tokens=max_new_tokens)
    ]
    sampled = arith.sample_hf_model(
        model, tokenizer, eval_rows, num_samples=8, temperature=1.0, seed=seed, max_new_tokens=max_new_tokens
    )
    greedy_scores = [arith.score(text, row["label"]) for text, row in zip(greedy, eval_rows)]
    sampled_scores = [[arith.score(t, row["label"]) for t in texts] for texts, row in zip(sampled, eval_rows)]
    num_rows = len(eval_rows)
    print(
        f"held-out ({num_rows} eval problems): greedy {sum(greedy_scores) / num_rows:.3f}  "
        f"sampled@T=1 {sum(map(sum, sampled_scores)) / (8 * num_rows):.3f}  "
        f"pass@8 {sum(map(max, sampled_scores)) / num_rows:.3f}  "
        f"mixed 8-sample groups {sum(0 < sum(s) < 8 for s in sampled_scores) / num_rows:.3f}"
    )
    direct_greedy = sum(t.startswith("#") for t in greedy) / num_rows
    direct_sampled = sum(t.startswith("#") for texts in sampled for t in texts) / (8 * num_rows)
    print(f"direct answers: greedy {direct_greedy:.3f}  sampled@T=1 {direct_sampled:.3f}")
    by_terms: dict[int, list[float]] = {}
    for row, g in zip(eval_rows, greedy_scores):
        by_terms.setdefault(row["prompt"].count("+") + 1, []).append(g)
    print(
        "greedy by number of terms: "
        + "  ".join(f"{k}: {sum(v) / len(v):.2f} (n={len(v)})" for k, v in sorted(by_terms.items()))
    )


def compare_weights(mine: Path, shipped: Path) -> str:
    """Bit-identical, or the largest absolute difference, over every tensor of two ``model.safetensors``."""
    a, b = load_file(mine / "model.safetensors"), load_file(shipped / "model.safetensors")
    if a.keys() != b.keys():
        return f"different tensors: {sorted(a.keys() ^ b.keys())}"
    if any(a[k].shape != b[k].shape or a[k].dtype != b[k].dtype for k in a):
        return "different shapes or dtypes"
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    same = all(torch.equal(a[k], b[k]) for k in a)
    return f"{'bit-identical' if same else 'not identical'} over {len(a)} tensors (max |difference| {diff:.3g})"


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    run_dir = (args.run_dir or ROOT / "runs" / f"{args.task}-warmstart").resolve()
    init, out = run_dir / "init", run_dir / "sft"
    start = time.monotonic()
    if not args.eval_only:
        if out.exists():
            sys.exit(f"{out} exists; choose another --run-dir (or --eval-only)")
        write_init(init, args.seed, model_dims(args), TASKS[args.task].MAX_RESPONSE_CHARS + 2)
        train, evals = write_data(run_dir / "data", args)
        cmd = sft_command(args, init, train, evals, out)
        print("$ " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        print(f"slime train (SFT) took {time.monotonic() - start:.1f}s", flush=True)
    eval_rows = TASKS[args.task].generate_dataset(args.num_eval, seed=args.seed, split="eval")
    measured = out / "model"
    if args.out is not None:  # the copy to ship: cast, save, and measure what was saved (rounded weights included)
        trained = LlamaForCausalLM.from_pretrained(measured, dtype=torch.float32)
        trained.to(getattr(torch, args.save_dtype)).save_pretrained(args.out)
        AutoTokenizer.from_pretrained(measured).save_pretrained(args.out)
        measured = args.out
    tokenizer = AutoTokenizer.from_pretrained(measured)
    model = LlamaForCausalLM.from_pretrained(measured, dtype=torch.float32)
    print(f"SFT model {measured}:", flush=True)
    report(model, tokenizer, eval_rows, args.seed, TASKS[args.task].MAX_RESPONSE_CHARS + 2)
    shipped_dir = args.compare_with
    if shipped_dir is not None and (shipped_dir / "model.safetensors").is_file():
        shipped = LlamaForCausalLM.from_pretrained(shipped_dir, dtype=torch.float32)
        theirs = arith.evaluate_hf_model(
            shipped,
            AutoTokenizer.from_pretrained(shipped_dir),
            eval_rows,
            temperature=0.0,
            max_new_tokens=TASKS[args.task].MAX_RESPONSE_CHARS + 2,
        )
        mine = arith.evaluate_hf_model(
            model, tokenizer, eval_rows, temperature=0.0, max_new_tokens=TASKS[args.task].MAX_RESPONSE_CHARS + 2
        )
        print(
            f"greedy held-out accuracy: this run {mine:.3f}  shipped {theirs:.3f}  difference {100 * (mine - theirs):+.1f} points"
        )
        print(f"weights against the shipped {shipped_dir}: {compare_weights(measured, shipped_dir)}")
    print(f"total wall time {time.monotonic() - start:.1f}s")


if __name__ == "__main__":
    main()
