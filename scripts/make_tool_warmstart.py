"""Make the tool-calling demo's warm start with ``slime train --loss-type sft_loss`` on calculator conversations, and measure it.

Usage::

    python scripts/make_tool_warmstart.py [--run-dir DIR] [--seed S] [--threads T] [--direct-fraction F]

A small Llama, from scratch, fine-tuned on chat conversations of the train split of
``slime.data.calc`` with the ``calculator`` tool's schema, rendered by the character-level chat
tokenizer's template (``slime.data.tokenizer.build_chat_tokenizer``). The loss covers the assistant
turns only (their text and their ``<|im_end|>``; the system, user and tool turns and the role
headers carry none): ``slime train`` computes that mask from the one full render
(``slime.data.chat_mask``). Two kinds of conversation:

- with the tool: user question -> assistant ``<tool_call>{...}</tool_call>`` -> tool result ->
  assistant ``#<answer>``;
- direct: user question -> assistant ``#<answer>``. The model cannot multiply large numbers in its
  head, so these answers are usually wrong when it samples them. The choice between the two is
  made at the first token of the assistant turn and does not depend on the question, so RL has
  one clear thing to learn: call the tool.

What it does, in ``DIR`` (``--run-dir``):

1. ``DIR/init/``: the randomly initialised Llama (``MODEL_DIMS``, ``torch.manual_seed(--seed)``), its
   generation config and the chat tokenizer (with ``chat_template.jinja``).
2. ``DIR/data/stage1.jsonl`` and ``stage2.jsonl``: ``steps x batch_size`` chat rows ``{"messages",
   "tools"}`` each, in training order (one pass in file order is exactly the batches), and
   ``DIR/data/eval.jsonl``: 64 held-out tool conversations (eval split, seed 1) for the eval loss.
3. Stage 1, ``slime train`` into ``DIR/stage1/``: from scratch, ``--stage1-steps`` (2,000) on tool
   conversations only (problem seed ``--seed``), peak lr 3e-3. Copying the expression into the call
   and the result into the answer needs induction-style attention, which this model only forms
   after a plateau (the loss sits near 0.45 for ~600 steps, then drops; see "Measured").
4. Stage 2, ``slime train`` into ``DIR/stage2/`` from ``DIR/stage1/model`` (a fresh optimizer and lr
   schedule): ``--steps`` (1,500) at peak lr 1e-3 (problem seed ``--seed + 1``); the first
   ``--tool-only-steps`` (1,000) still on tool conversations only, then the mix, in which
   ``--direct-fraction`` (0.6) of the conversations answer directly. This last part sets how often
   the warm start calls the tool (about 40% of samples): weak, but with mixed rewards in most GRPO
   groups. ``--init-from HF_DIR`` skips stage 1 and starts stage 2 from ``HF_DIR``.
5. Measures ``DIR/stage2/model``: a teacher-forced check on each stage's checkpoints (the share of
   held-out tool conversations whose call turn and answer turn the model predicts exactly, and its
   mean probability of starting with ``<tool_call>``), then the held-out accuracy on the 200 eval
   problems that ``slime train --builtin-task calc`` evaluates on (seed 0), through the embedded
   engine and ``slime.rollout.multiturn.calculator_generate``, the same path as the RL run's eval:
   greedy (with the share of rollouts that call the tool and the accuracy of each kind), and sampled
   at temperature 1.0 (8 samples each, with pass@8 and the share of groups with mixed rewards,
   which GRPO learns from). Last, it compares the weights with the shipped checkpoint.

Both stages: batch 32, AdamW betas 0.9/0.95, weight decay 0.1, clip 1.0, 50 warm-up steps then
cosine decay to 10% of the peak at the stage's last step, the NLL averaged over the batch's
assistant tokens (``--calculate-per-token-loss``). The shipped checkpoint
(``slime/data/assets/calc-warmstart``) is never written: copy ``DIR/stage2/model`` there to ship a
new one.

Measured (the shipped checkpoint, made by this recipe's earlier hand-written loop, defaults, 2-core
CPU, 2026-11-30; 28 min): stage 1 sat at loss ~0.45 until step ~600, then the copy formed
(teacher-forced tool call exact 0.45 at step 1,000, 1.00 at 2,000). After stage 2, on the 200
held-out problems: greedy accuracy 0.000 (greedy never calls the tool: p(<tool_call>) at the first
token is 0.44), sampled at T=1 0.426 with tool calls in 44% of samples (accuracy 0.97 with the
tool, 0.00 without), pass@8 0.99, and 99% of 8-sample groups with mixed rewards. This script,
through ``slime train`` (``--threads 1``, same day, 3,377 s of which 3,336 s training): weights
bit-identical to the shipped ``model.safetensors``, hence the same numbers (T=1 0.426, tool calls in
43.7% of samples, pass@8 0.990, mixed groups 0.990; docs/benchmarks.md, "SFT mode re-makes the demo
warm starts").
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from slime.data import calc
from slime.data.chat_mask import render_with_assistant_mask
from slime.data.tokenizer import build_chat_tokenizer
from slime.rollout.tools.calculator import calculator_tool

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_warmstart  # noqa: E402  (scripts/make_warmstart.py: model dims and the SFT recipe)

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "slime" / "data" / "assets" / "calc-warmstart"
TOOL_SCHEMAS = [calculator_tool().schema]
MAX_RESPONSE_LEN = 160
"""Response budget of the evaluation rollouts (model and tool tokens), as in scripts/quickstart_tools.sh."""

MODEL_DIMS = {**make_warmstart.MODEL_DIMS, "max_position_embeddings": 320}
"""The arithmetic warm start's model, with room for a whole tool conversation."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """One SFT stage (one ``slime train`` run): AdamW from a fresh state, linear warm-up then cosine
    decay to 10% of ``lr`` at its last step."""

    name: str
    steps: int
    lr: float
    tool_only_steps: int
    """The first steps train on tool conversations only; the rest on the mix."""
    direct_fraction: float
    seed: int
    """Seeds the problem stream and the choice of conversation kind."""
    warmup_steps: int = 50


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "calc-warmstart")
    p.add_argument("--seed", type=int, default=0, help="stage 1 uses it, stage 2 uses seed + 1")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads of the trainer and the evaluation")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--stage1-steps", type=int, default=2000, help="stage 1: from scratch, tool conversations only")
    p.add_argument("--stage1-lr", type=float, default=3e-3)
    p.add_argument("--steps", type=int, default=1500, help="stage 2 steps")
    p.add_argument("--lr", type=float, default=1e-3, help="stage 2 peak learning rate")
    p.add_argument(
        "--tool-only-steps",
        type=int,
        default=1000,
        help="stage 2: first steps on tool conversations only, then the mix",
    )
    p.add_argument(
        "--direct-fraction",
        type=float,
        default=0.6,
        help="stage 2, after --tool-only-steps: share of conversations that answer directly, without the tool",
    )
    p.add_argument("--init-from", type=Path, default=None, help="skip stage 1: start stage 2 from this HF directory")
    p.add_argument(
        "--save-interval",
        type=int,
        default=500,
        help="checkpoint every N steps of each stage (the teacher-forced check runs on each)",
    )
    p.add_argument("--num-eval", type=int, default=200)
    p.add_argument("--eval-only", action="store_true", help="only measure DIR/stage2/model")
    return p.parse_args()


def make_model(tokenizer, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **MODEL_DIMS,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float()


def write_init(out: Path, seed: int) -> None:
    tokenizer = build_chat_tokenizer()
    model = make_model(tokenizer, seed)
    print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters, {MODEL_DIMS}", flush=True)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        max_new_tokens=MAX_RESPONSE_LEN,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def write_rows(path: Path, stage: Stage, batch_size: int) -> None:
    """``stage.steps * batch_size`` chat rows in training order: step ``k``'s batch is rows
    ``k * batch_size ..`` (``--rollout-batch-size`` rows a step, in file order)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    problems = calc.iter_problems(stage.seed, "train")
    style_rng = random.Random(f"style:{stage.seed}")
    with path.open("w") as f:
        for step in range(stage.steps):
            for _ in range(batch_size):
                expression, label = next(problems)
                # the kind is drawn only after the tool-only steps, so the mix's draws start there
                direct = step >= stage.tool_only_steps and style_rng.random() < stage.direct_fraction
                f.write(
                    json.dumps(
                        {"messages": calc.conversation(expression, label, use_tool=not direct), "tools": TOOL_SCHEMAS}
                    )
                    + "\n"
                )


def check_rows() -> list[dict]:
    """The held-out problems of the teacher-forced check and the eval loss (eval split, seed 1)."""
    return calc.generate_dataset(64, seed=1, split="eval")


def write_eval(path: Path) -> None:
    with path.open("w") as f:
        for r in check_rows():
            f.write(
                json.dumps(
                    {"messages": calc.conversation(r["prompt"], r["label"], use_tool=True), "tools": TOOL_SCHEMAS}
                )
                + "\n"
            )


def sft_command(args: argparse.Namespace, stage: Stage, init: Path, train: Path, evals: Path, out: Path) -> list[str]:
    # the arithmetic warm start's recipe, with this stage's numbers
    return make_warmstart.sft_recipe(
        batch_size=args.batch_size,
        steps=stage.steps,
        lr=stage.lr,
        warmup_steps=stage.warmup_steps,
        threads=args.threads,
        seed=args.seed,
        save=out,
        save_interval=args.save_interval,
        eval_interval=100,
    ) + [
        "--hf-checkpoint",
        str(init),
        "--prompt-data",
        str(train),
        "--input-key",
        "messages",
        "--tool-key",
        "tools",
        "--eval-prompt-data",
        str(evals),
        "--num-eval-prompts",
        "64",
    ]


def run(cmd: list[str], threads: int) -> None:
    print("$ " + " ".join(cmd), flush=True)
    start = time.monotonic()
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    print(f"slime train (SFT) took {time.monotonic() - start:.1f}s", flush=True)


def teacher_forced_check(model_dir: Path, rows: list[dict]) -> str:
    """On tool conversations of ``rows``, teacher-forced: the share whose tool-call turn, and whose
    final-answer turn, the model predicts exactly (argmax on every assistant token), and the mean
    probability of ``<tool_call>`` as the first assistant token (how often sampling calls the tool)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seqs = [
        render_with_assistant_mask(tokenizer, calc.conversation(r["prompt"], r["label"], use_tool=True), TOOL_SCHEMAS)
        for r in rows
    ]
    max_len = max(len(ids) for ids, _ in seqs)
    input_ids = torch.full((len(seqs), max_len), tokenizer.pad_token_id, dtype=torch.long)  # [B, T]
    attention_mask = torch.zeros_like(input_ids)  # [B, T]
    for b, (ids, _) in enumerate(seqs):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        attention_mask[b, : len(ids)] = 1
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # [B, T, V]
    tool_call_id = tokenizer.convert_tokens_to_ids("<tool_call>")
    call_ok = answer_ok = 0
    p_tool = 0.0
    for b, (ids, mask) in enumerate(seqs):
        pos = [i for i in range(1, len(ids)) if mask[i]]  # assistant tokens, predicted at position i - 1
        hit = {i: logits[b, i - 1].argmax().item() == ids[i] for i in pos}
        first_end = next(i for i in pos if ids[i] == tokenizer.eos_token_id)  # the tool-call turn's <|im_end|>
        call_ok += all(hit[i] for i in pos if i <= first_end)
        answer_ok += all(hit[i] for i in pos if i > first_end)
        p_tool += torch.softmax(logits[b, pos[0] - 1], -1)[tool_call_id].item()
    n = len(seqs)
    return (
        f"tool call exact {call_ok / n:.3f}  answer copied exact {answer_ok / n:.3f}  p(<tool_call>) {p_tool / n:.3f}"
    )


def checkpoint_models(run_dir: Path) -> list[tuple[str, Path]]:
    """``(label, HF dir)`` of each checkpoint of a ``slime train`` run, in step order."""
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    return [(f"step {int(p.name.split('_')[1])}", p / "model") for p in ckpts]


def compare_weights(mine: Path, shipped: Path) -> str:
    """Bit-identical, or the largest absolute difference, over every tensor of two ``model.safetensors``."""
    a, b = load_file(mine / "model.safetensors"), load_file(shipped / "model.safetensors")
    if a.keys() != b.keys():
        return f"different tensors: {sorted(a.keys() ^ b.keys())}"
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    same = all(torch.equal(a[k], b[k]) for k in a)
    return f"{'bit-identical' if same else 'not identical'} over {len(a)} tensors (max |difference| {diff:.3g})"


async def rollouts(
    model_dir: Path, rows: list[dict], *, temperature: float, num_samples: int, seed: int, threads: int
) -> list[list]:
    """Rollouts ``[len(rows)][num_samples]`` through the embedded engine and ``calculator_generate``, rewarded."""
    from transformers import AutoTokenizer

    from slime.config import RolloutConfig
    from slime.engines.pool import HttpEnginePool
    from slime.rollout.multiturn import calculator_generate
    from slime.servers.embedded import EngineServer
    from slime.types import Sample, Status

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sem = asyncio.Semaphore(128)
    async with EngineServer(model_dir, port=0, seed=seed, weight_version="0", num_threads=threads) as server:
        async with HttpEnginePool([server.url], config=RolloutConfig(request_timeout_s=600, max_retries=0)) as pool:

            async def one(g: int, i: int, row: dict) -> Sample:
                sample = Sample(prompt_ids=[], prompt=row["prompt"], label=row["label"], group_id=g, index=i)
                async with sem:
                    await calculator_generate(
                        sample,
                        {"temperature": temperature},
                        tokenizer=tokenizer,
                        pool=pool,
                        max_response_len=MAX_RESPONSE_LEN,
                        engine_version=0,
                    )
                sample.reward = 0.0 if sample.status is Status.FAILED else await calc.reward(sample)
                return sample

            flat = await asyncio.gather(*(one(g, i, row) for g, row in enumerate(rows) for i in range(num_samples)))
    return [flat[g * num_samples : (g + 1) * num_samples] for g in range(len(rows))]


def report(model_dir: Path, eval_rows: list[dict], seed: int, threads: int) -> None:
    """Print greedy and temperature-1 held-out accuracy, tool-call rates, pass@8 and mixed groups."""
    t0 = time.monotonic()
    greedy = [
        s[0]
        for s in asyncio.run(rollouts(model_dir, eval_rows, temperature=0.0, num_samples=1, seed=seed, threads=threads))
    ]
    sampled = asyncio.run(rollouts(model_dir, eval_rows, temperature=1.0, num_samples=8, seed=seed, threads=threads))
    n = len(eval_rows)

    def used_tool(s) -> bool:
        return bool(s.evidence.get("tool_calls"))

    tool = [s for s in greedy if used_tool(s)]
    direct = [s for s in greedy if not used_tool(s)]
    flat = [s for group in sampled for s in group]
    print(
        f"held-out ({n} eval problems): greedy {sum(s.reward for s in greedy) / n:.3f}  "
        f"sampled@T=1 {sum(s.reward for s in flat) / len(flat):.3f}  "
        f"pass@8 {sum(max(s.reward for s in g) for g in sampled) / n:.3f}  "
        f"mixed 8-sample groups {sum(0 < sum(s.reward for s in g) < 8 for g in sampled) / n:.3f}"
    )
    print(
        f"tool calls: greedy {len(tool) / n:.3f} (accuracy with the tool {_mean(tool):.3f}, direct {_mean(direct):.3f})  "
        f"sampled@T=1 {sum(map(used_tool, flat)) / len(flat):.3f} (accuracy with the tool "
        f"{_mean([s for s in flat if used_tool(s)]):.3f}, direct {_mean([s for s in flat if not used_tool(s)]):.3f})"
    )
    print(
        f"mean response tokens: greedy {sum(len(s.response_ids) for s in greedy) / n:.1f}  "
        f"statuses: {sorted({s.status.value for s in flat})}  eval wall time {time.monotonic() - t0:.1f}s"
    )


def _mean(samples: list) -> float:
    return sum(s.reward for s in samples) / len(samples) if samples else float("nan")


def main() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    args = parse_args()
    torch.set_num_threads(args.threads)
    run_dir = args.run_dir.resolve()
    data = run_dir / "data"
    stage1 = Stage("stage1", args.stage1_steps, args.stage1_lr, args.stage1_steps, 0.0, args.seed)
    stage2 = Stage("stage2", args.steps, args.lr, args.tool_only_steps, args.direct_fraction, args.seed + 1)
    start = time.monotonic()
    if not args.eval_only:
        if (run_dir / "stage2").exists():
            sys.exit(f"{run_dir / 'stage2'} exists; choose another --run-dir (or --eval-only)")
        data.mkdir(parents=True, exist_ok=True)
        write_eval(data / "eval.jsonl")
        init = args.init_from
        if init is None:
            write_init(run_dir / "init", args.seed)
            write_rows(data / "stage1.jsonl", stage1, args.batch_size)
            print(stage1, flush=True)
            run(
                sft_command(
                    args, stage1, run_dir / "init", data / "stage1.jsonl", data / "eval.jsonl", run_dir / "stage1"
                ),
                args.threads,
            )
            init = run_dir / "stage1" / "model"
        write_rows(data / "stage2.jsonl", stage2, args.batch_size)
        print(stage2, flush=True)
        run(
            sft_command(args, stage2, init, data / "stage2.jsonl", data / "eval.jsonl", run_dir / "stage2"),
            args.threads,
        )
        print(f"trained in {time.monotonic() - start:.1f}s", flush=True)
    rows = check_rows()
    for stage in ("stage1", "stage2"):
        for label, model_dir in checkpoint_models(run_dir / stage):
            print(f"{stage} {label}  teacher-forced on held-out: {teacher_forced_check(model_dir, rows)}", flush=True)
    model_dir = run_dir / "stage2" / "model"
    print(f"SFT model {model_dir}:", flush=True)
    report(
        model_dir, calc.generate_dataset(args.num_eval, seed=0, split="eval"), args.seed, args.threads
    )  # the set `slime train` evaluates on
    print(f"weights against the shipped {SHIPPED}: {compare_weights(model_dir, SHIPPED)}")
    print(f"total wall time {time.monotonic() - start:.1f}s")


if __name__ == "__main__":
    main()
