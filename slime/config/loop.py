"""``LoopConfig``: the rollout loop: mode, batch and step counts, staleness bound, buffer, eval cadence (``slime.loop``)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec

from slime.config._base import STRUCT, Range, check_ranges

__all__ = ["LoopConfig"]


OVER_SAMPLING_BATCH_SIZE = 32
"""The field's default; a run's flags resolve it with ``LoopConfig.default_over_sampling``."""

MAX_STALENESS = 4
"""``max_staleness``'s field default (AReaL's eta); a run's flags resolve it with ``LoopConfig.default_max_staleness``."""

ASYNC_MAX_STALENESS = 1
"""``--max-staleness`` of an ``async`` run that does not give it: one version, as THUDM/slime's ``train_async.py``
(the next batch is generated while this one trains). At 4, ~85 % of async's trained tokens were 4 versions old
and it needed 1.27x sync's tokens to reach the bench's target; at 1, 1.21x (docs/benchmarks.md, issue 30)."""


class LoopConfig(msgspec.Struct, **STRUCT):
    mode: Literal["sync", "april", "async"] = "sync"
    """``sync``: wait for every sample (baseline). ``april``: over-provision, abort at target,
    recycle partials (``--partial-rollout`` selects it). ``async``: generation never stops; weights
    are updated in flight (pause in place, update, continue)."""
    rollout_batch_size: Annotated[int, Range(ge=1)] = 16
    """Groups per training batch (``--rollout-batch-size``)."""
    over_sampling_batch_size: Annotated[int, Range(ge=1)] = OVER_SAMPLING_BATCH_SIZE
    """Groups in flight in ``april`` and ``async`` modes (``--over-sampling-batch-size``); >= rollout_batch_size.
    Unset on the command line: 2 x rollout_batch_size in ``april`` (APRIL's over-provisioning; 4x trains a
    shorter, staler tail and learns less: docs/benchmarks.md, issue 30), else max(32, rollout_batch_size)."""
    num_rollout: Annotated[int, Range(ge=0)] = 50
    """Rollout steps (= policy updates of the version counter) (``--num-rollout``)."""
    max_staleness: Annotated[int, Range(ge=0)] = MAX_STALENESS
    """Bound on version lag (AReaL's eta, ``--max-staleness``): admission control starts no group
    that could only be trained more than this many versions after its first token, and tokens
    older than this at consumption are handled by ``staleness_policy``. Unset on the command line:
    1 in ``async`` (``ASYNC_MAX_STALENESS``), else 4 (``default_max_staleness``)."""
    staleness_policy: Literal["mask", "drop"] = "mask"
    """Over-stale tokens at consumption: mask them out of the loss, or drop their whole group
    (``--staleness-policy``)."""
    dynamic_sampling_filter_path: str | None = None
    """``pkg.module.func(group) -> bool`` keeping a finished group, or
    ``slime.loop.filters.nonzero_reward_std`` (``--dynamic-sampling-filter-path``)."""
    buffer_filter_path: str | None = None
    """``pkg.module.func(rollout_id, partial_groups, num) -> list[Group]`` choosing which partial
    groups resume next; default: oldest version first (``--buffer-filter-path``)."""
    abort_timeout_s: Annotated[float, Range(gt=0, flag="abort_timeout_s")] = 30.0
    """How long stopping a step may wait for aborted requests to come back."""
    overlap_train: bool = False
    """April mode: after aborting the stragglers at the target, keep generating (partials first)
    while the trainer works (``--overlap-train``). Off by default: classic APRIL, where the
    engines idle during the train step and every token trained is at most one update old at its
    first token's abort."""
    eval_interval: Annotated[int, Range(ge=0, note="(0 = only before and after)")] = 0
    """Evaluate every N rollout steps; 0 = only before and after (``--eval-interval``)."""
    skip_eval_before_train: bool = False
    """No eval before the first step (``--skip-eval-before-train``, THUDM/slime's); the later ones stay."""
    num_epoch: Annotated[int, Range(ge=1, note=", or unset")] | None = None
    """SFT: train this many passes over ``--prompt-data`` (``--num-epoch``, THUDM/slime's flag):
    ``num_rollout = num_epoch * rows // rollout_batch_size``, replacing ``--num-rollout``. None = use
    ``--num-rollout``. RL runs refuse it."""
    buffer_capacity: Annotated[int, Range(ge=1, note=", or unset")] | None = None
    """Ready + partial groups the data buffer holds (``--buffer-capacity``); beyond it the oldest
    partial groups are evicted, counted and lost on purpose. None = no bound."""
    offline_ratio: Annotated[float, Range(ge=0, lt=1)] = 0.0
    """Fraction of each batch's groups taken from ``--offline-data`` (``--offline-ratio``), in [0, 1);
    exact over batches (after k batches, floor(k * rollout_batch_size * ratio) offline groups)."""

    def default_over_sampling(self) -> int:
        """``--over-sampling-batch-size`` when it is not given: 2x the batch for APRIL (the paper's; 4x trains a
        shorter, staler tail, issue 30), else at least one batch (slime's: the batch). Example: april, batch 16 -> 32."""
        if self.mode == "april":
            return 2 * self.rollout_batch_size
        return max(OVER_SAMPLING_BATCH_SIZE, self.rollout_batch_size)

    def default_max_staleness(self) -> int:
        """``--max-staleness`` when it is not given: ``ASYNC_MAX_STALENESS`` (1) in ``async``, else 4.

        Async generation runs as far ahead as the bound lets it, so the bound is the lag of nearly every
        token it trains; one version keeps the overlap of generating the next batch during this train step.
        Example: async -> 1; april -> 4 (its lag comes from resumed partials, the mask bounds it)."""
        return ASYNC_MAX_STALENESS if self.mode == "async" else MAX_STALENESS

    @property
    def online_groups_per_batch(self) -> int:
        """Fewest online groups a batch takes: rollout_batch_size - ceil(rollout_batch_size * offline_ratio),
        at least 1 (the B of admission control). Example: 4 groups, ratio 0.3 -> 4 - ceil(1.2) = 2."""
        return max(1, self.rollout_batch_size - math.ceil(self.rollout_batch_size * self.offline_ratio - 1e-9))

    def validate(self) -> None:
        """Check this section's values.

        Raises:
            ConfigError: naming the flag.
        """
        check_ranges(self)
