"""The warm start of the GPU-sized addition-chain task (issue 30), made by SFT with ``slime train --loss-type sft_loss``.

Usage::

    python scripts/gpu/make_longtail_warmstart.py --out DIR [--steps 600] [--batch-size 64] [--micro-batch-size 16]
        [--hidden-size 512 --intermediate-size 1408 --num-layers 8 --num-heads 8 --num-kv-heads 4] [-- SFT FLAGS]

Writes ``DIR/data/{train,eval}.jsonl`` (the RL prompts and labels, ``slime.data.chain.GPU_SIZE``: responses
of tens to ~1,550 tokens; ``--max-terms`` shortens the chains) and ``DIR/data/sft.jsonl`` (``steps x
batch_size`` rows of another seed: the worked solution, or with probability ``--direct-fraction`` (0.5) the
direct answer ``#<sum>``),
``DIR/init`` (a random Llama of the character tokenizer with 2,048 positions; ~24M parameters by default) and
``DIR/sft/model`` (the warm start: ``scripts/make_warmstart.py``'s SFT recipe over ``sft.jsonl``, one pass in
order). On the H200 the SFT runs on the torch trainer's CUDA device; on the CPU, ``--steps 2 --hidden-size 32
--intermediate-size 64 --num-layers 1 --num-heads 2 --num-kv-heads 1`` checks the whole path in seconds
(``tests/data/test_chain_longtail.py``). Extra ``slime train`` flags after ``--`` go to the SFT run.

Why the direct answers: on the H200 (2026-12-04, docs/benchmarks.md "The long-tail chains on the H200,
second attempt"), a warm start of worked solutions only (greedy 0.51) did not improve under RL at any rate
or batch tried; its errors are slips of arithmetic spread over hundreds of tokens, which a group of 8
samples barely tells apart. ``scripts/make_warmstart.py`` measured the same on the CPU (all worked: 0.465 ->
0.55 in 90 steps; half direct: 0.49 -> 0.805 in 20): a warm start that knows both styles answers long chains
directly and wrongly half the time, and GRPO learns to work them out, a strategy, with longer answers as it
learns (the long tail grows during the run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))  # make_warmstart: the SFT recipe and the model writer

import make_warmstart  # noqa: E402  (a script beside this one, not a package)

from slime.data import chain  # noqa: E402

MAX_POSITIONS = 2048
"""Longest prompt (335) + solution (1,551) + <eos> of ``GPU_SIZE``, rounded up."""


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=600, help="optimizer steps = one pass over sft.jsonl")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--micro-batch-size", type=int, default=16, help="rows per forward (long rows: memory)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-train", type=int, default=20000, help="RL prompts in data/train.jsonl")
    p.add_argument(
        "--direct-fraction",
        type=float,
        default=0.5,
        help="share of SFT rows that answer directly ('#<answer>'): the strategy RL learns to drop (module doc)",
    )
    p.add_argument(
        "--max-terms", type=int, default=int(chain.GPU_SIZE["max_terms"]), help="longest chain (GPU_SIZE's 128)"
    )
    p.add_argument("--hidden-size", type=int, default=512)
    p.add_argument("--intermediate-size", type=int, default=1408)
    p.add_argument("--num-layers", type=int, default=8)
    p.add_argument("--num-heads", type=int, default=8)
    p.add_argument("--num-kv-heads", type=int, default=4)
    return p.parse_args(argv), extra


def sft_command(ns: argparse.Namespace, init: Path, data: Path, out: Path, extra: list[str]) -> list[str]:
    """``make_warmstart.sft_recipe`` over ``data/sft.jsonl`` from ``init`` into ``out`` (no eval set: no eval loss)."""
    recipe = make_warmstart.sft_recipe(
        batch_size=ns.batch_size,
        steps=ns.steps,
        lr=ns.lr,
        warmup_steps=min(ns.warmup_steps, max(ns.steps - 1, 0)),
        threads=ns.threads,
        seed=ns.seed,
        save=out,
        save_interval=ns.steps,
        eval_interval=0,
    )
    data_flags = ["--hf-checkpoint", str(init), "--prompt-data", str(data / "sft.jsonl"), "--input-key", "prompt"]
    return [*recipe, *data_flags, "--micro-batch-size", str(ns.micro_batch_size), *extra]


def task_size(ns: argparse.Namespace) -> dict[str, float]:
    """``chain.make_problem``'s keywords: ``GPU_SIZE`` with ``--max-terms`` (smaller for a check on the CPU)."""
    return {**chain.GPU_SIZE, "max_terms": ns.max_terms}


def _set_max_length(path: Path, n: int) -> None:
    """The character tokenizer is written for the CPU task's 128 positions: this model has ``n``."""
    config = json.loads(path.read_text())
    config["model_max_length"] = n
    path.write_text(json.dumps(config, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ns, extra = parse_args(list(sys.argv[1:] if argv is None else argv))
    start = time.monotonic()
    data, init, out = ns.out / "data", ns.out / "init", ns.out / "sft"
    size = task_size(ns)
    size_flags = [f"--{k.replace('_', '-')}={v}" for k, v in size.items()]
    chain.main(["--out", str(data), *size_flags, "--num-train", str(ns.num_train), "--seed", str(ns.seed)])
    rows = chain.sft_rows(ns.steps * ns.batch_size, ns.seed + 1, ns.direct_fraction, **size)
    chain.write_jsonl(rows, data / "sft.jsonl")
    dims = {
        **make_warmstart.MODEL_DIMS,
        "hidden_size": ns.hidden_size,
        "intermediate_size": ns.intermediate_size,
        "num_hidden_layers": ns.num_layers,
        "num_attention_heads": ns.num_heads,
        "num_key_value_heads": ns.num_kv_heads,
        "max_position_embeddings": MAX_POSITIONS,
    }
    make_warmstart.write_init(init, ns.seed, dims, max_new_tokens=MAX_POSITIONS - 340)
    _set_max_length(init / "tokenizer_config.json", MAX_POSITIONS)
    cmd = sft_command(ns, init, data, out, extra)
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": str(ns.threads)})
    print(f"warm start {out / 'model'} in {time.monotonic() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
