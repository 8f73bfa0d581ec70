"""``--reward-key``: a reward function may return a dict (as slime's do); the named entry is the reward."""

from __future__ import annotations

from slime.rollout.rewards import score_group, score_sample
from slime.types import Sample, Status


def _sample(i: int = 0) -> Sample:
    return Sample(prompt_ids=[1], group_id=2, index=i, status=Status.COMPLETED)


async def test_the_reward_key_entry_of_a_dict_is_the_reward_and_the_dict_is_kept():
    sample = _sample()
    await score_sample(
        sample,
        lambda s: {"score": -1.0, "acc": False, "pred": "42", "raw": object()},
        timeout_s=1.0,
        reward_key="score",
    )
    assert sample.status is Status.COMPLETED and sample.reward == -1.0
    assert sample.evidence["reward_fields"] == {"score": -1.0, "acc": False, "pred": "42"}  # JSON entries only


async def test_a_float_reward_is_used_as_it_is_with_a_reward_key():
    sample = _sample()
    await score_sample(sample, lambda s: 0.5, timeout_s=1.0, reward_key="score")
    assert sample.reward == 0.5 and "reward_fields" not in sample.evidence


async def test_a_dict_without_the_key_or_without_reward_key_fails_the_sample_naming_the_flag():
    missing, unkeyed = _sample(0), _sample(1)
    await score_sample(missing, lambda s: {"acc": 1.0}, timeout_s=1.0, reward_key="score")
    await score_sample(unkeyed, lambda s: {"score": 1.0}, timeout_s=1.0)
    assert (
        missing.status is Status.FAILED
        and "without --reward-key 'score'" in missing.evidence["reward_error"]["message"]
    )
    assert (
        unkeyed.status is Status.FAILED
        and "--reward-key names which entry" in unkeyed.evidence["reward_error"]["message"]
    )


async def test_a_group_reward_of_dicts_takes_each_reward_key_entry():
    samples = [_sample(i) for i in range(2)]
    await score_group(samples, lambda ss: [{"score": 1.0}, {"score": 0.0}], timeout_s=1.0, reward_key="score")
    assert [s.reward for s in samples] == [1.0, 0.0]
