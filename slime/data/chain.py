"""A built-in task with a long-tailed response length: addition chains of widely varying length.

The arithmetic task (``slime.data.arith``) sums 2 to 4 terms, so its worked solutions are short and
nearly uniform in length. Here the number of terms ``K`` follows a truncated power law,
``P(K) ∝ (K - 1) ** -alpha`` on ``[2, max_terms]``: most problems are two or three terms, a few
are ten. The worked solution has one step per added term, so response lengths run from a few
tokens to many (defaults: median 10 characters, p99 72, a p99/median ratio near 7), and a
batch of rollouts finishes at very different times::

    prompt    "3+4+8+1="
    solution  "3+4=7;7+8=15;15+1=16;#16"      (then <eos>)
    label     "16"

The format, the character vocabulary and the reward are the arithmetic task's (``arith.score``:
exact match of the answer after the single ``#``). Splits are fixed by a hash of the prompt
(``arith.split_of``), as in ``arith``.

Warm start: ``slime/data/assets/chain-warmstart`` (the default of ``--builtin-task chain``), made by
``scripts/make_warmstart.py --task chain --steps 1000 --threads 1`` (the arithmetic recipe: half the
SFT targets answer directly; 829 s of ``slime train --loss-type sft_loss`` on a shared 2-core CPU,
2026-12-01). On the 200 held-out problems: greedy 0.855, sampled at T=1 0.856, pass@8 1.000, mixed
8-sample groups 0.380; greedy by terms 2: 1.00, 3: 0.89, 4: 0.86, 5: 0.71, 6: 0.67, 7: 0.62, 8: 0.33,
9: 0.14, 10: 0.50; 71% of greedy answers are direct (``--steps 600``: greedy 0.825, T=1 0.761, pass@8
0.970, mixed groups 0.445, 25% direct). The long chains are where RL has room. The
arithmetic warm start (``--hf-checkpoint slime/data/assets/arith-warmstart``) also runs here but
never saw more than 4 terms: greedy 0.650; sampled at T=1, 0.02 or less from 5 terms on.

Sizes (``prompt + response`` must fit the model's context):

- CPU (the defaults, ``--builtin-task chain``): 1-digit terms, ``max_terms=10``, ``alpha=1.5``;
  at most 20 prompt + 74 response characters, within the 128 positions of the shipped warm start;
  run with ``--rollout-max-response-len 96``.
- GPU-sized (``GPU_SIZE``, issue 30): ``max_terms=128, max_digits=2, alpha=1.0``, written to JSONL
  by ``python -m slime.data.chain --out DIR --size gpu`` (with ``--sft``: also ``DIR/sft.jsonl``,
  ``{"prompt", "response"}`` rows of worked solutions for the warm start's SFT) and used with
  ``--prompt-data DIR/train.jsonl --eval-prompt-data DIR/eval.jsonl --custom-rm-path
  slime.data.chain.reward --rollout-max-response-len 1600`` on a model with 2,048 positions
  (``scripts/gpu/bench_learning_longtail.sh``). Worked solutions, in characters = tokens of the
  character tokenizer (20,000 draws): median 86, p75 348, p90 866, p99 1,443, max 1,551 (mean 264);
  prompts at most 335. A step's draws thus run from tens to ~1,500 tokens: the tail APRIL is for.
  (The earlier ``max_terms=64, alpha=1.2``: median 34, p90 320, max 748.)
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterable

from slime.data.arith import extract_answer, read_jsonl, reward, score, split_of, write_jsonl
from slime.data.split_stream import split_stream
from slime.stop import raise_if_stopped

__all__ = [
    "MIN_TERMS",
    "MAX_TERMS",
    "MAX_DIGITS",
    "ALPHA",
    "MAX_RESPONSE_CHARS",
    "GPU_SIZE",
    "sft_rows",
    "term_weights",
    "make_problem",
    "iter_problems",
    "generate_dataset",
    "extract_answer",
    "score",
    "reward",
    "read_jsonl",
    "write_jsonl",
    "main",
]

MIN_TERMS = 2
MAX_TERMS = 10
MAX_DIGITS = 1
ALPHA = 1.5
"""Power-law exponent of the number of terms: ``P(K) ∝ (K - 1) ** -ALPHA``."""
MAX_RESPONSE_CHARS = 74
"""Longest default solution: nine steps (``9+9=18;`` then ``18+9=27;`` ...) plus ``#90``; <eos> on top."""
GPU_SIZE: dict[str, float] = {"max_terms": 128, "max_digits": 2, "alpha": 1.0}
"""The GPU-sized task's ``make_problem`` keywords (module doc): responses of tens to ~1,550 tokens."""


def term_weights(max_terms: int = MAX_TERMS, alpha: float = ALPHA) -> list[float]:
    """Unnormalised ``P(K)`` for ``K = MIN_TERMS .. max_terms``.

    Raises:
        ValueError: ``max_terms < MIN_TERMS`` or ``alpha < 0``.
    """
    if max_terms < MIN_TERMS or alpha < 0:
        raise ValueError(f"max_terms must be >= {MIN_TERMS} and alpha >= 0, got max_terms={max_terms}, alpha={alpha}")
    return [(k - 1) ** -alpha for k in range(MIN_TERMS, max_terms + 1)]


def make_problem(
    rng: random.Random, *, max_terms: int = MAX_TERMS, max_digits: int = MAX_DIGITS, alpha: float = ALPHA
) -> tuple[str, str, str]:
    """Draw one problem: ``K`` terms (``term_weights``), each uniform with 1 to ``max_digits`` digits.

    Returns:
        ``(prompt, label, solution)``, e.g. ``("3+4+8=", "15", "3+4=7;7+8=15;#15")``.
    """
    num_terms = rng.choices(range(MIN_TERMS, max_terms + 1), weights=term_weights(max_terms, alpha))[0]
    terms = [
        rng.randint(0 if d == 1 else 10 ** (d - 1), 10**d - 1)
        for d in (rng.randint(1, max_digits) for _ in range(num_terms))
    ]
    steps, total = [], terms[0]
    for term in terms[1:]:
        steps.append(f"{total}+{term}={total + term};")
        total += term
    label = str(total)
    return "+".join(map(str, terms)) + "=", label, "".join(steps) + f"#{label}"


def iter_problems(seed: int, split: str, **kwargs: float) -> Iterable[tuple[str, str, str]]:
    """Endless stream of ``make_problem`` results of ``split`` ("train" or "eval"), seeded by ``(split, seed)``.

    Raises:
        ValueError: for an unknown split.
    """
    return split_stream("chain", make_problem, split_of, seed, split, **kwargs)


def generate_dataset(n: int, seed: int, split: str, **kwargs: float) -> list[dict[str, str]]:
    """``n`` rows ``{"prompt", "label"}`` of ``split``; deterministic in ``(n, seed, split, kwargs)``.

    Raises:
        ValueError: for an unknown split.
    """
    rows: list[dict[str, str]] = []
    for prompt, label, _ in iter_problems(seed, split, **kwargs):
        if len(rows) == n:
            break
        rows.append({"prompt": prompt, "label": label})
        if len(rows) % 1024 == 0:
            raise_if_stopped(f"building {len(rows)} of {n} rows of the built-in task")
    return rows


def sft_rows(n: int, seed: int, direct_fraction: float = 0.0, **kwargs: float) -> list[dict[str, str]]:
    """``n`` SFT rows ``{"prompt", "response"}`` of the train split: each response the worked solution, or
    with probability ``direct_fraction`` the direct answer ``#<label>`` (a seeded style stream, as
    ``scripts/make_warmstart.py``'s: a warm start that knows both styles leaves RL a strategy to learn)."""
    stream = iter(iter_problems(seed, "train", **kwargs))
    style = random.Random(f"style:{seed}")
    rows = []
    for prompt, label, solution in (next(stream) for _ in range(n)):
        rows.append({"prompt": prompt, "response": f"#{label}" if style.random() < direct_fraction else solution})
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python -m slime.data.chain --out DIR``: write ``DIR/train.jsonl`` and ``DIR/eval.jsonl`` (e.g. the GPU size)."""
    p = argparse.ArgumentParser(prog="python -m slime.data.chain", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--num-train", type=int, default=20000)
    p.add_argument("--num-eval", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-terms", type=int, default=MAX_TERMS)
    p.add_argument("--max-digits", type=int, default=MAX_DIGITS)
    p.add_argument("--alpha", type=float, default=ALPHA)
    p.add_argument("--size", choices=["cpu", "gpu"], default=None, help="gpu: GPU_SIZE, over the three above")
    p.add_argument("--sft", type=int, default=0, metavar="N", help="also N SFT rows in DIR/sft.jsonl (seed + 1)")
    p.add_argument("--direct-fraction", type=float, default=0.0, help="share of SFT rows answering directly")
    ns = p.parse_args(argv)
    kw = dict(max_terms=ns.max_terms, max_digits=ns.max_digits, alpha=ns.alpha) | (GPU_SIZE if ns.size == "gpu" else {})
    try:
        term_weights(ns.max_terms, ns.alpha)
    except ValueError as exc:
        p.error(str(exc))
    write_jsonl(generate_dataset(ns.num_train, ns.seed, "train", **kw), f"{ns.out}/train.jsonl")
    write_jsonl(generate_dataset(ns.num_eval, 0, "eval", **kw), f"{ns.out}/eval.jsonl")
    if ns.sft:  # another seed than the RL prompts': the warm start does not see them
        write_jsonl(sft_rows(ns.sft, ns.seed + 1, ns.direct_fraction, **kw), f"{ns.out}/sft.jsonl")
    print(f"wrote {ns.out}/train.jsonl ({ns.num_train} rows) and {ns.out}/eval.jsonl ({ns.num_eval} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
