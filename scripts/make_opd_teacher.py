"""Train the on-policy-distillation demo's teacher: a larger Llama than the warm start, same char tokenizer.

Usage::

    python scripts/make_opd_teacher.py [--out DIR] [any scripts/make_warmstart.py flag]

It is ``scripts/make_warmstart.py`` (``slime train --loss-type sft_loss`` into ``runs/arith-opd-teacher``,
then a ``--save-dtype bfloat16`` copy in ``--out``) with the teacher's size and recipe (later flags
override them):

- 4.7M parameters (hidden 256, MLP 768, 6 layers, 4 heads, 2 KV heads): 2.9x the 1.6M student
  (``slime/data/assets/arith-warmstart``), with the same 18-token character tokenizer, so the
  teacher scores the student's token ids as they are;
- SFT on worked solutions only (``--direct-fraction 0``): the student answers directly (``#441``)
  about half the time and those answers are mostly wrong on 3- and 4-term sums; the teacher never
  does, which is what on-policy distillation can pass on;
- 900 steps at lr 2e-3, weights saved as bfloat16 (9.5 MB, so it ships in the repository under
  ``slime/data/assets/arith-opd-teacher``; engines and trainers load it as float32). The held-out
  numbers printed at the end are measured on the saved (rounded) weights.

Measured: see the "On-policy distillation" section of docs/benchmarks.md (command, machine, time,
greedy / sampled held-out accuracy of the shipped teacher).
"""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
DEFAULT_OUT = SCRIPTS.parent / "slime" / "data" / "assets" / "arith-opd-teacher"
TEACHER_FLAGS = [
    "--out",
    str(SCRIPTS.parent / "runs" / "arith-opd-teacher" / "bf16"),  # copy it to DEFAULT_OUT to ship it
    "--hidden-size",
    "256",
    "--intermediate-size",
    "768",
    "--num-layers",
    "6",
    "--num-heads",
    "4",
    "--num-kv-heads",
    "2",
    "--direct-fraction",
    "0",
    "--steps",
    "900",
    "--lr",
    "2e-3",
    "--save-dtype",
    "bfloat16",
    "--threads",
    "1",
    "--eval-interval",
    "300",
    "--run-dir",
    str(SCRIPTS.parent / "runs" / "arith-opd-teacher"),
    "--compare-with",
    str(DEFAULT_OUT),
]


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(SCRIPTS))
    import make_warmstart

    sys.argv = [str(SCRIPTS / "make_warmstart.py"), *TEACHER_FLAGS, *(sys.argv[1:] if argv is None else argv)]
    make_warmstart.main()  # argparse: a flag given twice keeps its last value, so the caller's win


if __name__ == "__main__":
    main()
