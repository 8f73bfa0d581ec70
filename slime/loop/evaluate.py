"""Held-out evaluation through the engines: one greedy sample per prompt, scored by the reward.

Runs only while the scheduler's gate is closed (before training, between steps, after), so no
abort from the rollout side can hit an eval request.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from slime.data.dataset import PromptRow
from slime.rollout.generate import generate
from slime.rollout.rewards import score_sample
from slime.types import Sample, Status

__all__ = ["evaluate"]


async def evaluate(
    rows: list[PromptRow],
    *,
    pool: Any,
    tokenize: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    reward_fn: Callable[[Sample], Awaitable[float]],
    max_response_len: int,
    engine_version: int,
    reward_timeout_s: float,
    temperature: float = 0.0,
    max_concurrency: int = 64,
) -> dict[str, float]:
    """Return ``accuracy`` (mean reward), ``mean_response_len`` and ``failed`` over ``rows``."""
    sem = asyncio.Semaphore(max_concurrency)

    async def one(i: int, row: PromptRow) -> Sample:
        sample = Sample(prompt_ids=tokenize(row.prompt), group_id=-1 - i, label=row.label, prompt=row.prompt, metadata=dict(row.metadata))
        async with sem:
            await generate(
                sample,
                {"temperature": temperature},
                pool=pool,
                max_response_len=max_response_len,
                engine_version=engine_version,
                decode=decode,
            )
        if sample.status is Status.FAILED:
            sample.reward = 0.0
        else:
            await score_sample(sample, reward_fn, timeout_s=reward_timeout_s)
        return sample

    samples = await asyncio.gather(*(one(i, r) for i, r in enumerate(rows)))
    n = max(1, len(samples))
    return {
        "accuracy": sum(s.reward or 0.0 for s in samples) / n,
        "mean_response_len": sum(len(s.response_ids) for s in samples) / n,
        "failed": float(sum(s.status is Status.FAILED for s in samples)),
    }
