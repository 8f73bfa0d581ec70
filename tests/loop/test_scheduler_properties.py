"""Property tests (hypothesis) over random interleavings of completions, aborts, weight updates,
reward failures and resumes, in every mode, through the real ``run_step``.

Each example draws a mode, a staleness bound and policy, response lengths, how long the "train
step" lets generation run, how often an unsolicited abort hits the engine (as an engine-side
abort or retraction would) and which rewards fail. Invariants checked:

1. every group is trained at most once, and every started group is trained, dropped for
   staleness, or still pending (ready / partial) at the end: none is lost;
2. every sample's per-token lists keep equal length, and its tokens are exactly the ones an
   uninterrupted trajectory would have (token-exact resume);
3. no trainable token handed to the trainer is older than ``max_staleness`` versions.
"""

from __future__ import annotations

import asyncio
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptRow, PromptSource
from slime.loop.buffer import DataBuffer
from slime.loop.scheduler import Scheduler
from slime.loop.step import run_step
from slime.train_metrics import TrainMetrics
from slime.types import Status
from tests.fixtures.fake_pool import FakePool, expected_tokens

MAX_LEN = 32


class _Sync:
    def __init__(self, pool):
        self.pool = pool

    async def save(self, version):
        return "w"

    async def load(self, path, version, *, abort_all_requests=True):
        await self.pool.update_weights_from_disk(
            path, weight_version=str(version), abort_all_requests=abort_all_requests
        )


async def _run(mode, max_staleness, policy, steps, target, over, train_ticks, chaos_every, fail_salt, seed):
    pool = FakePool()
    buffer = DataBuffer()
    rows = [PromptRow(index=i, prompt=f"p{seed}-{i}") for i in range(5000)]
    trained: list[int] = []
    violations: list[str] = []
    state = {"version": 0}

    def train_step(groups):
        for g in groups:
            trained.append(g.group_id)
            for s in g.samples:
                s.check_aligned()
                if s.response_ids != expected_tokens(f"g{s.group_id}-s{s.index}", MAX_LEN):
                    violations.append(f"group {g.group_id} sample {s.index}: tokens differ from an uninterrupted run")
                for v, m in zip(s.versions, s.loss_mask):
                    if m and state["version"] - v > max_staleness:
                        violations.append(f"group {g.group_id}: token of v{v} trained at v{state['version']}")
        rng = random.Random(seed + len(trained))
        for _ in range(train_ticks * rng.randint(0, 2)):
            import time  # a tiny real pause lets the event loop run generation meanwhile

            time.sleep(0)
        return TrainMetrics()

    async def reward(sample):
        if (sample.group_id * 7 + sample.index + fail_salt) % 11 == 0:
            raise RuntimeError("reward failed")
        return float(len(sample.response_ids) % 2)

    async def chaos():
        rng = random.Random(seed)
        while chaos_every:
            for _ in range(rng.randint(1, chaos_every)):
                await asyncio.sleep(0)
            await pool.abort_all()

    async with asyncio.TaskGroup() as tg:
        sched = Scheduler(
            LoopConfig(
                mode=mode,
                rollout_batch_size=target,
                over_sampling_batch_size=over,
                max_staleness=max_staleness,
                staleness_policy=policy,
                overlap_train=bool(seed % 2),
            ),
            RolloutConfig(n_samples_per_prompt=3, rollout_max_response_len=MAX_LEN, reward_timeout_s=1.0),
            source=PromptSource(rows, shuffle=False),
            tokenize=lambda t: [1, 2 + len(t)],
            decode=lambda ids: "",
            pool=pool,
            buffer=buffer,
            reward_fn=reward,
            task_group=tg,
        )
        chaos_task = tg.create_task(chaos())
        for _ in range(steps):
            await run_step(sched, train_step=train_step, sync=_Sync(pool))
            state["version"] = sched.version.engines
        chaos_task.cancel()
        await sched.shutdown()
    return sched, buffer, trained, violations


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(["sync", "april", "async"]),
    max_staleness=st.integers(0, 3),
    policy=st.sampled_from(["mask", "drop"]),
    steps=st.integers(1, 5),
    target=st.integers(1, 4),
    extra=st.integers(0, 6),
    train_ticks=st.integers(0, 30),
    chaos_every=st.sampled_from([0, 3, 10, 40]),
    fail_salt=st.integers(0, 10),
    seed=st.integers(0, 10_000),
)
def test_no_group_lost_or_repeated_lists_aligned_and_staleness_bounded(
    mode, max_staleness, policy, steps, target, extra, train_ticks, chaos_every, fail_salt, seed
):
    sched, buffer, trained, violations = asyncio.run(
        _run(mode, max_staleness, policy, steps, target, target + extra, train_ticks, chaos_every, fail_salt, seed)
    )
    assert len(trained) == len(set(trained)) == steps * target, "a group was trained twice or a batch was short"
    pending = [g.group_id for g in [*buffer.ready, *buffer.partial_groups()]]
    assert len(pending) == len(set(pending)) and not set(pending) & set(trained)
    dropped = set(range(sched.next_group_id)) - set(trained) - set(pending)
    if policy == "mask" or mode == "sync":
        assert not dropped, f"groups lost: {sorted(dropped)}"
    assert not violations, violations[:3]
    for g in [*buffer.ready, *buffer.partial_groups()]:
        for s in g.samples:
            s.check_aligned()
            full = expected_tokens(f"g{s.group_id}-s{s.index}", MAX_LEN)
            assert s.response_ids == full[: len(s.response_ids)], "a resumed sample's tokens are not exact"
            assert s.status in (Status.PENDING, Status.PARTIAL) or s.reward is not None
