"""Scoring a finished sample or group for the scheduler: the teacher's logprobs (``--use-opd``) first,
then the reward (per sample, or per group with a group reward function), each call traced.

A FAILED sample gets reward 0.0 and no reward call; a teacher failure marks the sample FAILED
(``slime.rollout.opd``). Online and offline groups go through the same calls. A reward that was already
set (by a custom generate function, or in the offline file) meets the reward function's checks
(``slime.rollout.rewards.check_reward``): a non-finite or out-of-range one marks the sample FAILED.
"""

from __future__ import annotations

from typing import Any

from slime.config import RolloutConfig
from slime.rollout.opd import TeacherScorer
from slime.rollout.rewards import check_reward, score_group, score_sample
from slime.types import Group, GroupRewardFn, RewardFn, Sample, Status

__all__ = ["Scorer"]


class Scorer:
    """Args:
    rollout: the rollout section (``reward_timeout_s``, ``reward_key``).
    reward_fn / group_reward_fn: per-sample or per-group reward (one of them).
    teacher: a ``slime.rollout.opd.TeacherScorer``, or None.
    tracer: ``slime.obs.trace.Tracer`` (``reward``, ``group_reward``, ``teacher`` spans).
    """

    def __init__(
        self,
        rollout: RolloutConfig,
        *,
        reward_fn: RewardFn | None,
        group_reward_fn: GroupRewardFn | None,
        teacher: TeacherScorer | None,
        tracer: Any,
    ):
        if reward_fn is None and group_reward_fn is None:
            raise ValueError("Scorer needs reward_fn or group_reward_fn")
        self.rollout, self.reward_fn, self.group_reward_fn = rollout, reward_fn, group_reward_fn
        # the per-sample reward, None when a group reward function rewards every sample instead
        self.sample_reward_fn = reward_fn if group_reward_fn is None else None
        self.teacher, self.tracer = teacher, tracer

    async def sample(self, s: Sample) -> None:
        """A finished sample: the teacher (if any), then its own reward unless a group reward function rewards it."""
        if self.teacher is not None and s.status is not Status.FAILED and s.teacher_logprobs is None:
            await self._teacher(self.teacher, s)
        if s.status is Status.FAILED:
            s.reward = 0.0
        elif s.reward is not None:  # set by the generate function
            check_reward(s)
        elif self.sample_reward_fn is not None:
            span = self.tracer.begin("reward", "reward", lanes="reward")
            await score_sample(
                s, self.sample_reward_fn, timeout_s=self.rollout.reward_timeout_s, reward_key=self.rollout.reward_key
            )
            if span is not None:
                self.tracer.end(span, group_id=s.group_id, index=s.index, reward=s.reward, status=s.status.value)

    async def group(self, group: Group) -> None:
        """A finished group, with a group reward function: reward it once."""
        if self.group_reward_fn is None or group.is_rewarded:
            return
        span = self.tracer.begin("group_reward", "reward", lanes="group reward")
        await score_group(
            group.samples,
            self.group_reward_fn,
            timeout_s=self.rollout.reward_timeout_s,
            reward_key=self.rollout.reward_key,
        )
        if span is not None:
            self.tracer.end(span, group_id=group.group_id, rewards=[smp.reward for smp in group.samples])

    async def offline(self, group: Group) -> None:
        """A pre-generated group (``--offline-data``): the teacher, then the rewards its file did not have."""
        if self.teacher is not None:
            for s in group.samples:
                if s.status is not Status.FAILED and s.teacher_logprobs is None:
                    await self._teacher(self.teacher, s)
        for s in group.samples:  # the file's own rewards
            check_reward(s)
        if self.group_reward_fn is not None and not group.is_rewarded:
            await score_group(
                group.samples,
                self.group_reward_fn,
                timeout_s=self.rollout.reward_timeout_s,
                reward_key=self.rollout.reward_key,
            )
        elif self.sample_reward_fn is not None:
            for s in group.samples:
                if s.reward is None:
                    await score_sample(
                        s,
                        self.sample_reward_fn,
                        timeout_s=self.rollout.reward_timeout_s,
                        reward_key=self.rollout.reward_key,
                    )

    async def _teacher(self, teacher: TeacherScorer, sample: Sample) -> None:
        span = self.tracer.begin("teacher", "reward", lanes="teacher")
        await teacher.score(sample)
        if span is not None:
            self.tracer.end(span, group_id=sample.group_id, index=sample.index, status=sample.status.value)
