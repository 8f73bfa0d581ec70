"""Build the padded tensors of one train step from rewarded groups.

Shape legend: B = samples in the batch (FAILED ones are not), T = longest prompt + response (right-padded), and
L = T - 1 next-token positions: position ``t`` predicts token ``t + 1``. Per-token tensors live on
the L axis so they line up with ``compute_token_logprobs`` output.

Example (prompt of 3 ``p0 p1 p2``, response of 4 ``r0 r1 r2 r3``, one pad, so T = 8, L = 7)::

    input_ids        p0  p1  p2  r0  r1  r2  r3  PAD
    position t        0   1   2   3   4   5   6
    predicts         p1  p2  r0  r1  r2  r3  PAD
    loss_mask         0   0   1   1   1   1   0        (sample.loss_mask [1,1,1,1] at t = 2..5)
    rollout_logprobs  0   0  lp0 lp1 lp2 lp3  0        (advantages: A at t = 2..5, 0 elsewhere)

Samples with status FAILED never train and cost the trainer nothing: they get no row (a prompt the
engine refused for its length would otherwise be a forward pass over all of it) and are left out of
their group's reward mean and std (their reward may be None); with ``loss_agg="seq_mean"`` they do
not count in the denominator either. A sample whose loss mask is all 0 (every token masked
off-policy) adds nothing to the loss. Padding is ``pad_token_id`` and never reaches the loss.

``mask_offpolicy_in_partial_rollout`` (slime's ``--mask-offpolicy-in-partial-rollout``): a sample
resumed from a partial rollout carries tokens of several policy versions; only the tokens of its
newest version train. Example: versions [4, 4, 4, 5, 5], loss_mask [1, 1, 1, 1, 1] -> [0, 0, 0, 1, 1].
slime implements it in the rollout: on every resume it zeroes the loss mask of all tokens generated
before that resume, whatever their version. The two agree whenever each resume follows a weight
update (APRIL, where aborts happen at the end of a rollout step). They differ when a sample is
resumed under the same version (we keep both segments: the same policy sampled them) and when
weights change inside one request (SGLang's per-token ``weight_versions``; we mask the older
tokens, slime keeps them). We key on versions because ``Sample`` records versions, not segment
boundaries, and the version is what makes a token off-policy. The loop applies the rule first (its metrics count what trains).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from slime.train.advantages import AdvantageEstimator, sample_scores
from slime.types import OFFLINE_VERSION, Group, Sample

__all__ = [
    "TrainBatch",
    "build_train_batch",
    "pack_by_token_budget",
    "plan_steps",
    "MicroBatch",
    "Step",
    "rl_batch_metrics",
]

MicroBatch = list[int]
"""Sample indices of one micro-batch, ascending."""
Step = list[MicroBatch]
"""The micro-batches of one optimizer step."""


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """The tensors of one train step (built on the CPU; ``to`` moves them). Legend in the module docstring.

    Attributes:
        input_ids: [B, T] int64, prompt + response, right-padded with ``pad_token_id``.
        attention_mask: [B, T] int64, 1 = real token, 0 = padding.
        loss_mask: [B, L] float32, 1 = position predicts a trainable response token; 0 elsewhere.
        rollout_logprobs: [B, L] float32, natural log, the engine's logprob of the predicted
            response token; 0.0 at prompt and padding positions.
        advantages: [B, L] float32, the sample's score (``sample_advantages``) at its response
            positions; 0.0 elsewhere. Final for GRPO/GSPO; other estimators replace it in the
            train step (``slime.train.advantages.token_advantages``).
        staleness: [B, L] int64, ``current_version - version`` of the predicted response token
            (policy versions behind); 0 at prompt and padding positions and at offline tokens
            (``OFFLINE_VERSION``, exempt from the staleness bound).
        sample_advantages: [B] float32, one score per sample from ``sample_scores``: the GRPO
            advantage (grpo/gspo), reward minus group mean (reinforce_plus_plus_baseline), or the
            raw reward (reinforce_plus_plus, ppo).
        rewards: [B] float32, the sample rewards.
        seq_lens: [B] int64, prompt + response tokens of each sample.
        response_mask: [B, L] float32, 1 = position predicts a response token (trainable or not).
        old_logprobs / ref_logprobs / old_values / returns: [B, L] float32 or None, filled by the
            trainer before the update: logprobs of the weights before the step, of the reference
            model (KL), critic values before the step, and GAE returns (critic targets).
        teacher_logprobs: [B, L] float32 or None (without ``use_opd``): natural log, the on-policy
            distillation teacher's logprob of the predicted response token (``Sample.teacher_logprobs``);
            0.0 at prompt and padding positions.
    """

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    rollout_logprobs: Tensor
    advantages: Tensor
    staleness: Tensor
    sample_advantages: Tensor
    rewards: Tensor
    seq_lens: Tensor
    response_mask: Tensor
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    old_values: Tensor | None = None
    returns: Tensor | None = None
    teacher_logprobs: Tensor | None = None
    routed_experts: Tensor | None = None  # [B, L, R] int32: the engine's MoE routes (slime.routed_experts.stack_routes)

    @property
    def num_samples(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_train_tokens(self) -> int:
        """Tokens that carry loss (sum of ``loss_mask``)."""
        return int(self.loss_mask.sum())

    def select(self, indices: Sequence[int]) -> TrainBatch:
        """Rows ``indices`` (any order), with T trimmed to their longest sequence (L = T - 1 with it)."""
        idx = torch.as_tensor(list(indices), dtype=torch.long, device=self.input_ids.device)
        # at least 2, so L = T - 1 keeps one next-token position
        t = max(int(self.seq_lens[idx].max()), 2) if len(idx) else 2
        fields: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            x = getattr(self, f.name)
            if x is not None:
                x = x.index_select(0, idx)
                if x.dim() == 2:
                    # [B, T] fields keep t columns, [B, L] fields t - 1
                    x = x[:, : t if x.shape[1] == self.input_ids.shape[1] else t - 1]
            fields[f.name] = x
        return TrainBatch(**fields)

    def to(self, device: torch.device | str) -> TrainBatch:
        """Every tensor on ``device`` (self when they already are); dtypes unchanged."""
        if self.input_ids.device == torch.device(device):
            return self
        fields: dict[str, Any] = {
            f.name: None if (x := getattr(self, f.name)) is None else x.to(device) for f in dataclasses.fields(self)
        }
        return TrainBatch(**fields)

    def slice(self, start: int, end: int) -> TrainBatch:
        """Samples ``start:end``, with T trimmed to their longest sequence (L = T - 1 with it)."""
        # at least 2, so L = T - 1 keeps one next-token position
        t = max(int(self.seq_lens[start:end].max()), 2) if end > start else 2
        fields: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            x = getattr(self, f.name)
            if x is None:
                fields[f.name] = None
                continue
            x = x[start:end]
            if x.dim() == 2:
                # [B, T] fields keep t columns, [B, L] fields t - 1
                x = x[:, : t if x.shape[1] == self.input_ids.shape[1] else t - 1]
            fields[f.name] = x
        return TrainBatch(**fields)


def build_train_batch(
    groups: Sequence[Group],
    *,
    pad_token_id: int,
    current_version: int,
    normalize_advantages_by_std: bool = True,
    max_staleness: int | None = None,
    advantage_estimator: AdvantageEstimator = "grpo",
    mask_offpolicy_in_partial_rollout: bool = False,
    use_opd: bool = False,
    use_task_reward: bool = True,
) -> TrainBatch:
    """Lay the samples of ``groups`` out as right-padded tensors with per-sample scores (GRPO by default).

    Args:
        groups: rewarded groups; every non-FAILED sample needs a reward and at least one prompt
            token, and its aligned per-token lists must have equal lengths.
        pad_token_id: the id that fills padding (never trained on).
        current_version: the policy version of the weights about to be trained.
        normalize_advantages_by_std: GRPO (True) or Dr. GRPO (False); see ``grpo_advantages``.
        max_staleness: None = no check; otherwise a trainable token more than this many versions
            behind ``current_version`` is a bug upstream (the loop must mask or drop it).
        advantage_estimator: picks ``sample_scores`` (see ``TrainBatch.sample_advantages``).
        mask_offpolicy_in_partial_rollout: train only the newest version's tokens of each sample
            (module docstring). Applied before the staleness check. Samples are not modified.
        use_opd: lay out ``Sample.teacher_logprobs`` as ``TrainBatch.teacher_logprobs``; every
            non-FAILED sample must have them.
        use_task_reward: False (``--opd-only``): the scores start from reward 0 for every sample, so
            the task reward does not train; ``TrainBatch.rewards`` still holds the real rewards.

    Returns:
        A ``TrainBatch`` with B = the samples not FAILED (0 if none), in group order then sample order.

    Raises:
        ValueError: a sample is misaligned, has no prompt, lacks a reward while not FAILED, or
            (``use_opd``) lacks teacher logprobs while not FAILED.
        RuntimeError: a trainable token is older than ``max_staleness`` versions, or newer than
            ``current_version``.
    """
    if not any(g.samples for g in groups):
        raise ValueError("build_train_batch: no samples in the given groups")
    scores = _group_scores(
        groups,
        use_opd=use_opd,
        use_task_reward=use_task_reward,
        estimator=advantage_estimator,
        normalize_by_std=normalize_advantages_by_std,
    )  # [G, n]
    # FAILED samples get no row: no forward pass over them (module doc)
    rows = [(gi, si, s) for gi, g in enumerate(groups) for si, s in enumerate(g.samples) if s.is_valid]
    batch = _empty_batch([s for _, _, s in rows], pad_token_id=pad_token_id, use_opd=use_opd)
    for b, (gi, si, s) in enumerate(rows):
        _fill_row(
            batch, b, s, scores[gi, si], current_version=current_version, newest_only=mask_offpolicy_in_partial_rollout
        )
    # after the newest-only mask: the check sees the tokens that will actually train
    _check_staleness(batch.staleness, batch.loss_mask, current_version, max_staleness)
    return batch


def _group_scores(
    groups: Sequence[Group],
    *,
    use_opd: bool,
    use_task_reward: bool,
    estimator: AdvantageEstimator,
    normalize_by_std: bool,
) -> Tensor:
    """Check every sample and score the valid ones within their group (``sample_scores``): [G, n], n the
    largest group; FAILED samples and the padding of smaller groups are NaN rewards out of the statistics."""
    num_groups, n_max = len(groups), max(len(g.samples) for g in groups)
    rewards = torch.full((num_groups, n_max), float("nan"))  # [G, n]
    valid = torch.zeros((num_groups, n_max), dtype=torch.bool)  # [G, n]
    for gi, g in enumerate(groups):
        for si, s in enumerate(g.samples):
            _check_sample(s, use_opd=use_opd)
            # FAILED: out of the group's statistics (Sample.is_valid); a valid sample has a reward (checked)
            if s.is_valid and s.reward is not None:
                rewards[gi, si], valid[gi, si] = float(s.reward), True
    scored = rewards if use_task_reward else torch.where(valid, 0.0, rewards)  # --opd-only: reward 0 for the estimator
    return sample_scores(scored, valid, estimator=estimator, normalize_by_std=normalize_by_std)


def _check_sample(s: Sample, *, use_opd: bool) -> None:
    """Raise ValueError for a misaligned sample, one without a prompt, or a valid one without a reward
    (or, with ``use_opd``, without teacher logprobs)."""
    s.check_aligned()
    if not s.prompt_ids:
        raise ValueError(f"Sample(group={s.group_id}, index={s.index}) has no prompt_ids")
    if not s.is_valid:
        return
    if s.reward is None:
        raise ValueError(f"Sample(group={s.group_id}, index={s.index}, status={s.status.value}) has no reward")
    if use_opd and s.teacher_logprobs is None:
        raise ValueError(
            f"Sample(group={s.group_id}, index={s.index}, status={s.status.value}) has no teacher_logprobs "
            "(--use-opd: every finished sample is scored by the teacher before it is rewarded)"
        )


def _empty_batch(samples: list[Sample], *, pad_token_id: int, use_opd: bool) -> TrainBatch:
    """The batch of ``samples`` with its per-sample fields set and its per-token tensors empty
    (padding, zeros): ``_fill_row`` writes each row."""
    seq_lens = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    num_samples, t_max = len(samples), max([*seq_lens, 2])  # at least 2, so L >= 1 even when every sample is empty
    return TrainBatch(
        input_ids=torch.full((num_samples, t_max), pad_token_id, dtype=torch.long),  # [B, T]
        attention_mask=torch.zeros((num_samples, t_max), dtype=torch.long),  # [B, T]
        loss_mask=torch.zeros((num_samples, t_max - 1)),  # [B, L]
        rollout_logprobs=torch.zeros((num_samples, t_max - 1)),  # [B, L]
        advantages=torch.zeros((num_samples, t_max - 1)),  # [B, L]
        staleness=torch.zeros((num_samples, t_max - 1), dtype=torch.long),  # [B, L]
        sample_advantages=torch.zeros(num_samples),  # [B]
        rewards=torch.tensor([float(s.reward) if s.reward is not None else float("nan") for s in samples]),  # [B]
        seq_lens=torch.tensor(seq_lens, dtype=torch.long),  # [B]
        response_mask=torch.zeros((num_samples, t_max - 1)),  # [B, L]
        teacher_logprobs=torch.zeros((num_samples, t_max - 1)) if use_opd else None,  # [B, L], 0.0 off the response
    )


def _fill_row(batch: TrainBatch, b: int, s: Sample, score: Tensor, *, current_version: int, newest_only: bool) -> None:
    """Write sample ``s`` into row ``b`` of ``batch`` (in place); ``score``: its ``sample_scores`` entry."""
    p, r = len(s.prompt_ids), len(s.response_ids)
    batch.input_ids[b, : p + r] = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
    batch.attention_mask[b, : p + r] = 1
    resp = slice(p - 1, p - 1 + r)  # next-token positions that predict the response
    versions = torch.tensor(s.versions, dtype=torch.long)  # [r]
    if batch.teacher_logprobs is not None:
        batch.teacher_logprobs[b, resp] = torch.tensor(s.teacher_logprobs, dtype=torch.float32)
    mask = torch.tensor(s.loss_mask, dtype=torch.float32)  # [r]
    if newest_only and r:  # --mask-offpolicy-in-partial-rollout (module docstring)
        mask = mask * (versions == versions.max()).float()
    batch.loss_mask[b, resp] = mask
    batch.response_mask[b, resp] = 1.0
    batch.rollout_logprobs[b, resp] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
    # an offline token (OFFLINE_VERSION, --offline-data) has no lag in this run: 0, so the check exempts it
    batch.staleness[b, resp] = torch.where(versions == OFFLINE_VERSION, 0, current_version - versions)
    batch.advantages[b, resp] = batch.sample_advantages[b] = score


def _check_staleness(staleness: Tensor, loss_mask: Tensor, current_version: int, max_staleness: int | None) -> None:
    """Raise RuntimeError, with the numbers, when a trainable token is too old or from the future."""
    # only trainable tokens: a stale token already masked out may be old
    trained = staleness[loss_mask > 0]  # [num_train_tokens]
    if trained.numel() == 0:
        return
    newest_lag, oldest_lag = int(trained.min()), int(trained.max())
    if newest_lag < 0:  # a token newer than the weights being trained: a version stamp went wrong upstream
        raise RuntimeError(
            f"train batch has a trainable token of version {current_version - newest_lag} > current_version {current_version}"
        )
    if max_staleness is not None and oldest_lag > max_staleness:
        num_stale = int((trained > max_staleness).sum())
        raise RuntimeError(
            f"train batch has {num_stale} trainable tokens older than max_staleness={max_staleness}: oldest is "
            f"{oldest_lag} versions behind current_version {current_version} (version {current_version - oldest_lag})"
        )


def pack_by_token_budget(seq_lens: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Split samples into padded micro-batches of at most ``max_tokens`` tokens each (``--max-tokens-per-gpu``).

    A padded micro-batch of b samples costs ``b * longest`` tokens (the [b, T] tensor the forward
    pass sees). Samples are taken longest first and each goes into the first micro-batch where it
    fits (first-fit decreasing); a sample longer than the budget gets a micro-batch of its own.
    Every index appears exactly once; each micro-batch lists its indices in ascending order.

    Example: lengths [10, 40, 12, 38, 9], budget 80 -> [[1, 3], [0, 2, 4]]
    (40 and 38 cost 2 x 40 = 80; 12, 10 and 9 cost 3 x 12 = 36).

    Raises:
        ValueError: ``max_tokens`` < 1.
    """
    if max_tokens < 1:
        raise ValueError(f"pack_by_token_budget: max_tokens={max_tokens}, expected >= 1")
    bins: list[list[int]] = []
    longest: list[int] = []
    # longest first, ties by index: the packing is deterministic
    for i in sorted(range(len(seq_lens)), key=lambda i: (-seq_lens[i], i)):
        for b, members in enumerate(bins):
            if (len(members) + 1) * longest[b] <= max_tokens:  # longest first: the bin's first sample is its longest
                members.append(i)
                break
        else:
            bins.append([i])
            longest.append(seq_lens[i])
    return [sorted(b) for b in bins]


def plan_steps(
    seq_lens: Sequence[int], *, global_batch_size: int, micro_batch_size: int, max_tokens_per_gpu: int | None = None
) -> list[Step]:
    """Optimizer steps of ``global_batch_size`` samples (in batch order), each a list of micro-batches.

    A micro-batch is ``micro_batch_size`` consecutive samples, or, with ``max_tokens_per_gpu``
    (``--use-dynamic-batch-size``), a padded pack of at most that many tokens (``pack_by_token_budget``).
    The last step takes the remainder. Example: 10 samples, global 4, micro 2 ->
    ``[[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9]]]``.
    """
    steps: list[Step] = []
    for start in range(0, len(seq_lens), global_batch_size):
        end = min(start + global_batch_size, len(seq_lens))
        if max_tokens_per_gpu is not None:
            steps.append(
                [[start + i for i in mb] for mb in pack_by_token_budget(seq_lens[start:end], max_tokens_per_gpu)]
            )
        else:
            steps.append([list(range(s, min(s + micro_batch_size, end))) for s in range(start, end, micro_batch_size)])
    return steps


def rl_batch_metrics(batch: TrainBatch, *, measured_mismatch: bool = True) -> dict[str, float]:
    """The train step's batch metrics, the same in both backends (``old_logprobs`` must be set).

    ``train_rollout_logprob_abs_diff`` / ``..._max``: mean and max over trained tokens of
    |old_logprob - rollout_logprob| (nats): the trainer's logprob of each sampled token under the
    weights that sampled it, against the engine's. On the same weights this is the train/inference
    mismatch (numerics, dtype, kernels: ~1e-6 with the embedded engine in fp32; 1.7e-3 mean / 6e-3
    max for fp32 trainer vs SGLang 0.5.17 serving bf16, docs/benchmarks.md); stale tokens add policy lag.
    Left out when ``measured_mismatch`` is False (``--use-rollout-logprobs``: the old logprobs are the
    engine's, so the difference would read 0 without measuring anything).
    ``reward_mean`` and ``advantage_abs_mean`` are over the samples that count (FAILED left out).
    """
    assert batch.old_logprobs is not None
    n = batch.num_train_tokens
    trained = batch.loss_mask > 0
    gap = (batch.old_logprobs - batch.rollout_logprobs).abs()[trained]  # [num_train_tokens]
    staleness = batch.staleness[trained].float()
    has_reward = ~batch.rewards.isnan()  # [B] (FAILED samples have no row; NaN = a sample without a reward)
    mismatch = {
        "train_rollout_logprob_abs_diff": float(gap.sum()) / max(n, 1),
        "train_rollout_logprob_abs_diff_max": float(gap.max()) if n else 0.0,
    }
    return (mismatch if measured_mismatch else {}) | {
        "reward_mean": float(batch.rewards[has_reward].mean()) if bool(has_reward.any()) else 0.0,
        "advantage_abs_mean": float(batch.sample_advantages.abs().mean()) if batch.num_samples else 0.0,
        "staleness_mean": float(staleness.mean()) if n else 0.0,
        "staleness_max": float(staleness.max()) if n else 0.0,
        "num_samples": float(batch.num_samples),
        "num_train_tokens": float(n),
    }
