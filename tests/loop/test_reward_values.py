"""Rewards checked at the door (issue 26 item 6): a reward function that raises any ``BaseException``
(``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit``, its own ``CancelledError``) or returns a value the
trainer's float32 statistics cannot hold (1e300, 1e30, NaN) marks that sample FAILED with the evidence, and the
step goes on to a train batch; only a cancellation of the scoring itself (the run stopping) goes through.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptRow, PromptSource
from slime.loop.buffer import DataBuffer
from slime.loop.scheduler import Scheduler
from slime.rollout.generate import generate as default_generate
from slime.rollout.rewards import score_group, score_sample
from slime.train.batch import build_train_batch
from slime.types import Sample, Status
from tests.fixtures.fake_pool import FakePool


def _exit(_):
    sys.exit(3)  # what the reward did: the run ended with rc 3 and no message


async def _exit_async(_):
    raise SystemExit(3)


def _interrupt(_):
    raise KeyboardInterrupt


async def _generator_exit(_):
    raise GeneratorExit


async def _own_cancel(_):
    raise asyncio.CancelledError  # the function's own, nobody cancelled the scoring


BASE_EXCEPTIONS = [
    ("sys.exit in a sync reward", _exit, "SystemExit"),
    ("SystemExit in an async reward", _exit_async, "SystemExit"),
    ("KeyboardInterrupt", _interrupt, "KeyboardInterrupt"),
    ("GeneratorExit", _generator_exit, "GeneratorExit"),
    ("its own CancelledError", _own_cancel, "CancelledError"),
]


def _sample() -> Sample:
    return Sample(prompt_ids=[1], group_id=7, index=3, status=Status.COMPLETED)


@pytest.mark.parametrize("fn, kind", [b[1:] for b in BASE_EXCEPTIONS], ids=[b[0] for b in BASE_EXCEPTIONS])
async def test_a_reward_raising_a_base_exception_fails_its_sample_with_the_evidence(fn, kind):
    sample = _sample()
    await score_sample(sample, fn, timeout_s=5)
    err = sample.evidence["reward_error"]
    assert sample.status is Status.FAILED and sample.reward == 0.0
    assert err["type"] == kind and err["where"] == "group 7 sample 3"
    assert "raised by the reward function; it does not end the run" in err["message"] and kind in err["traceback"]


@pytest.mark.parametrize("value", [1e300, -1e300, 1e30, float("inf"), float("nan")])
async def test_a_reward_outside_what_float32_statistics_hold_fails_its_sample(value):
    sample = _sample()
    await score_sample(sample, lambda s: value, timeout_s=5)
    assert sample.status is Status.FAILED and sample.reward == 0.0
    assert sample.evidence["reward_error"]["type"] == "PluginError"
    assert (
        repr(value) in sample.evidence["reward_error"]["message"]
        or "non-finite" in sample.evidence["reward_error"]["message"]
    )


async def test_rewards_up_to_the_bound_are_kept():
    for value in (1e15, -1e15, 0.5):
        sample = _sample()
        await score_sample(sample, lambda s, v=value: v, timeout_s=5)
        assert sample.status is Status.COMPLETED and sample.reward == value


async def test_a_group_reward_with_an_overflowing_value_or_a_system_exit_fails_the_group():
    for fn in (lambda samples: [1.0, 1e300], lambda samples: sys.exit(3)):
        samples = [Sample(prompt_ids=[1], group_id=1, index=i, status=Status.COMPLETED) for i in range(2)]
        await score_group(samples, fn, timeout_s=5)
        assert all(s.status is Status.FAILED and s.reward == 0.0 for s in samples)
        assert all("reward_error" in s.evidence for s in samples)


async def test_cancelling_the_scoring_itself_still_cancels_it():
    """The run stopping (SIGTERM, a step's end) is not a plugin failure: the cancellation goes through."""
    started = asyncio.Event()

    async def slow(_):
        started.set()
        await asyncio.sleep(60)

    sample = _sample()
    task = asyncio.ensure_future(score_sample(sample, slow, timeout_s=120))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sample.status is Status.COMPLETED and "reward_error" not in sample.evidence


def _bad_reward(sample):
    """Sample 0 of each group exits, sample 1 overflows float32, the rest are fine."""
    if sample.index == 0:
        sys.exit(3)
    if sample.index == 1:
        return 1e300
    return float(sample.index % 2)


async def _generate_with_a_reward(sample, sampling_params, **kw):
    """A custom generate function that sets an out-of-range reward itself (for sample 2)."""
    out = await default_generate(sample, sampling_params, **kw)
    if sample.index == 2:
        sample.reward = 1e300
    return out


async def test_a_step_with_such_rewards_goes_on_and_builds_its_train_batch():
    rows = [PromptRow(index=i, prompt=f"p{i}") for i in range(8)]
    async with asyncio.TaskGroup() as tg:
        sched = Scheduler(
            LoopConfig(mode="sync", rollout_batch_size=2, over_sampling_batch_size=2),
            RolloutConfig(n_samples_per_prompt=4, rollout_max_response_len=16, reward_timeout_s=5),
            source=PromptSource(rows, shuffle=False),
            tokenize=lambda t: [1] + [3 + ord(c) % 50 for c in t],
            decode=lambda ids: "",
            pool=FakePool(),
            buffer=DataBuffer(),
            reward_fn=_bad_reward,
            task_group=tg,
            generate_fn=_generate_with_a_reward,
        )
        async with asyncio.timeout(30):
            groups = await sched.next_batch(2)
        await sched.shutdown()
    assert len(groups) == 2
    for g in groups:
        failed = {s.index for s in g.samples if s.status is Status.FAILED}
        assert failed == {0, 1, 2} and g.samples[3].reward == 1.0
        assert g.samples[0].evidence["reward_error"]["type"] == "SystemExit"
        assert "1e+300" in g.samples[1].evidence["reward_error"]["message"]
        assert "a reward set outside the reward function" in g.samples[2].evidence["reward_error"]["message"]
    batch = build_train_batch(groups, pad_token_id=0, current_version=0)  # 1e300 was a traceback here
    assert batch.rewards.isfinite().all()
