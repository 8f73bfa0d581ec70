"""The seeded, split-filtered problem stream every built-in task draws its rows from.

A task draws problems from ``random.Random(f"{task}:{split}:{seed}")`` and keeps those whose prompt
``split_of`` assigns to ``split`` (a hash of the prompt text), so train and eval never share a prompt.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

__all__ = ["split_stream"]


def split_stream(
    task: str,
    make_problem: Callable[..., tuple],
    split_of: Callable[[str], str],
    seed: int,
    split: str,
    **kwargs: float,
) -> Iterator[tuple]:
    """Endless stream of ``make_problem(rng, **kwargs)`` results whose prompt (item 0) belongs to ``split``
    (``kwargs``: the task's numeric knobs, e.g. ``max_terms``, ``max_digits``, ``alpha``).

    Raises:
        ValueError: for a split other than "train" or "eval".
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    rng = random.Random(f"{task}:{split}:{seed}")
    while True:
        problem = make_problem(rng, **kwargs)
        if split_of(problem[0]) == split:
            yield problem
