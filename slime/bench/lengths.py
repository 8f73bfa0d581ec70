"""Response lengths of ``slime bench rollout``, drawn by the client and enforced per request.

A real engine with random weights stops nowhere in particular, so the benchmark decides each
sample's length itself and makes every engine generate exactly that: each request carries
``max_new_tokens`` = drawn length - tokens the sample already has (a resumed partial asks for the
rest of its draw only) and ``ignore_eos: true``. A real engine then ends every sample with
``finish_reason`` ``length`` at exactly the drawn length.

The draw is the simulated engine's own (``slime.servers.sim.trajectory``): log-normal of the
workload's median and p99, capped at ``max_len``, keyed on (seed, the sample's rid stem
``slime-g<group>-s<index>``, its prompt ids). So the simulated engine started with the workload's
seed would stop each sample at the same length by itself; in the benchmark it is started with every
trajectory ``max_len`` long (``Workload.sim_flags``) and is limited by ``max_new_tokens`` exactly
as the real engine is.

Example (the standard workload: seed 1234, median 1000, p99 10000): group 0's sample 3 draws 1,323
tokens; aborted after 600, it is resumed with ``input_ids = prompt + 600 ids`` and
``max_new_tokens = 723``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slime.engines.interface import GeneratePool
from slime.rollout.generate import generate as default_generate
from slime.rollout.generate import request_stem
from slime.servers.sim.config import SimConfig
from slime.servers.sim.lengths import LogNormalLengths
from slime.servers.sim.trajectory import TrajectoryTracker
from slime.types import Group, Sample

__all__ = ["DrawnLengths"]


class DrawnLengths:
    """The per-sample length draw and the generate function that enforces it.

    Args:
        median / p99: tokens of the log-normal (``Workload.median`` / ``Workload.p99``).
        max_len: cap on a draw, tokens (``Workload.max_len``).
        seed: the workload seed (the simulated engine's ``--seed``).
    """

    def __init__(self, *, median: float, p99: float, max_len: int, seed: int):
        config = SimConfig(response_len_median=median, response_len_p99=p99, max_response_len=max_len, seed=seed)
        self._tracker = TrajectoryTracker(config, LogNormalLengths(median, p99))
        self._totals: dict[tuple[int, int], int] = {}

    def total(self, sample: Sample) -> int:
        """Drawn response length of ``sample`` in tokens, in [1, max_len] (fixed per (group, index))."""
        key = (sample.group_id, sample.index)
        if key not in self._totals:
            # The stem of every rid ``request_id`` gives this sample: what the sim engine keys it on.
            self._totals[key] = self._tracker.resolve(
                list(sample.prompt_ids), sampling_seed=None, rid=request_stem(sample)
            ).total
        return self._totals[key]

    async def generate(
        self,
        sample: Sample,
        sampling_params: dict[str, Any],
        *,
        pool: GeneratePool,
        max_response_len: int,
        engine_version: int,
        decode: Callable[[list[int]], str] | None = None,
    ) -> Sample:
        """``slime.rollout.generate.generate`` with ``max_new_tokens`` = the rest of the draw and
        ``ignore_eos``; the scheduler's generate-function signature."""
        return await default_generate(
            sample,
            {**sampling_params, "ignore_eos": True},
            pool=pool,
            max_response_len=min(self.total(sample), max_response_len),
            engine_version=engine_version,
            decode=decode,
        )

    def mismatches(self, groups: list[Group]) -> int:
        """Samples of a finished batch whose response length differs from their draw (0 when enforced)."""
        return sum(len(s.response_ids) != self.total(s) for g in groups for s in g.samples)
