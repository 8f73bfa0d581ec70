"""Built-in group filters: dynamic sampling and the partial-rollout queue order.

- Dynamic sampling (DAPO, arXiv 2503.14476, "dynamic sampling"): a group whose rewards are all
  equal has zero GRPO advantage everywhere and teaches nothing; ``nonzero_reward_std`` rejects it.
  The scheduler replaces a rejected group one for one (its slot frees and ``_fill`` starts one new
  group), never by a whole new wave. Signature of any such filter: ``(group: Group) -> bool``.
- Partial-rollout order (``--buffer-filter-path``, slime's flag): ``(rollout_id, groups, num) ->
  list[Group]`` picks up to ``num`` of the queued partial groups to resume now; ``rollout_id`` is
  the real id of the rollout step being filled. Without one the order is ``DataBuffer``'s own
  (``slime.loop.buffer``): the group whose oldest token is oldest goes first (ties: lowest group
  id), so stale tokens are trained or expire early.
"""

from __future__ import annotations

from slime.types import Group

__all__ = ["nonzero_reward_std"]


def nonzero_reward_std(group: Group) -> bool:
    """Keep a group unless every sample that counts (``Sample.is_valid``, the samples GRPO normalises
    over) got the same reward: exactly the groups with some non-zero GRPO advantage.
    Example: [1, 1, 1, 1] -> False; [1, 1, 1, FAILED] -> False; [1, 0, FAILED, FAILED] -> True."""
    rewards = [s.reward for s in group.valid_samples]
    return len(set(rewards)) > 1
