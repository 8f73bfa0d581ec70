"""The RL objective of one train step, assembled from config: advantages, off-policy weights, policy + KL loss.

This is the glue between ``TrainConfig`` and the pure functions of ``advantages``, ``offpolicy``,
``losses`` and ``kl``; ``TorchTrainer`` calls it and stays free of algorithm branches. Per step:

    batch (rollout tensors, GRPO-style sample scores)
      + old_logprobs / ref_logprobs / old_values from the weights before the update
      -> with_advantages: token advantages and critic returns for estimators that need them
      -> per micro-batch: micro_batch_loss = policy_loss(ratio level, clips, weights, entropy)
                                            + kl_loss_coef * agg(KL(policy || reference))

Defaults (GRPO, PPO clip, no correction, seq_mean, no KL, no entropy bonus) reduce to exactly the
loss slime's default recipe optimises and to what this trainer computed before these options.

Flags (``slime/cli/args.py``) and where each lands:

    --advantage-estimator {grpo,gspo,reinforce_plus_plus,       advantages.sample_scores / token_advantages;
        reinforce_plus_plus_baseline,ppo,gae}                     gspo: losses ratio_level="sequence"
    --disable-grpo-std-normalization, --normalize-advantages      advantages (Dr. GRPO; whitening)
    --gamma, --lambd, --kl-coef                                   advantages (REINFORCE++, GAE)
    --eps-clip, --eps-clip-high, --eps-clip-c, --entropy-coef     losses.policy_loss
    --calculate-per-token-loss                                    losses.aggregate (token_mean)
    --use-kl-loss, --kl-loss-coef, --kl-loss-type, --ref-load     kl.kl_estimate + a frozen reference model
    --value-clip, --critic-lr                                     critic (with ppo/gae)
    --use-tis, --tis-clip, --tis-clip-low                         offpolicy.tis_weights
    --mis-level, --mis-lower-bound, --mis-upper-bound             offpolicy.mis_weights; slime spells this
        ``--use-tis --custom-tis-function-path examples/train_infer_mismatch_helper/mis.py:...`` with
        ``mis_mode: mask`` and the same ``mis_level`` / ``mis_lower_bound`` / ``mis_upper_bound`` keys
    --use-decoupled-ppo, --behav-imp-weight-cap                   offpolicy.decoupled_weights (AReaL's
        ``use_decoupled_loss`` / ``behav_imp_weight_cap``; slime has no flag for it)
    --mask-offpolicy-in-partial-rollout                           batch.build_train_batch
    --use-opd, --opd-kl-coef                                      opd.reverse_kl, subtracted from the advantage
        (teacher logprobs from the rollout, slime.rollout.opd; student = old_logprobs)
    --loss-type sft_loss                                          losses.sft_loss (masked NLL; nothing above applies)
"""

from __future__ import annotations

import dataclasses

from torch import Tensor

from slime.config import TrainConfig
from slime.train.advantages import CRITIC_ESTIMATORS, GROUP_NORMALISED, token_advantages
from slime.train.batch import TrainBatch
from slime.train.kl import kl_estimate
from slime.train.losses import aggregate, policy_loss, sft_loss
from slime.train.offpolicy import decoupled_weights, mis_weights, tis_weights
from slime.train.opd import masked_mean, reverse_kl

__all__ = [
    "is_sft",
    "needs_reference",
    "needs_critic",
    "with_advantages",
    "opd_metrics",
    "correction_weights",
    "micro_batch_loss",
]


def is_sft(cfg: TrainConfig) -> bool:
    """``--loss-type sft_loss``: masked NLL only; no old logprobs, advantages, reference or critic."""
    return cfg.loss_type == "sft_loss"


def needs_reference(cfg: TrainConfig) -> bool:
    """A frozen reference model is needed: the KL loss, or a KL penalty in REINFORCE++/PPO rewards."""
    return not is_sft(cfg) and (
        # group-normalised scores take no KL penalty: there kl_coef alone needs no reference
        cfg.use_kl_loss or (cfg.kl_coef != 0.0 and cfg.advantage_estimator not in GROUP_NORMALISED)
    )


def needs_critic(cfg: TrainConfig) -> bool:
    return not is_sft(cfg) and cfg.advantage_estimator in CRITIC_ESTIMATORS


def with_advantages(cfg: TrainConfig, batch: TrainBatch) -> TrainBatch:
    """Replace ``batch.advantages`` (and set ``returns``) for estimators the batch builder cannot finish.

    Needs ``batch.old_logprobs`` (and ``ref_logprobs`` for a KL penalty, ``old_values`` for PPO,
    ``teacher_logprobs`` with ``use_opd``). GRPO/GSPO without ``normalize_advantages`` or OPD come
    back unchanged. With ``use_opd``, ``opd_kl_coef * (old_logprobs - teacher_logprobs)`` is taken
    off every trained token's advantage (``slime.train.opd``).
    """
    if is_sft(cfg) or (
        # GRPO/GSPO scores leave the batch builder final unless whitened or OPD-penalised
        cfg.advantage_estimator in GROUP_NORMALISED and not cfg.normalize_advantages and not cfg.use_opd
    ):
        return batch
    opd_penalty = None
    if cfg.use_opd:
        if batch.teacher_logprobs is None or batch.old_logprobs is None:
            raise ValueError(
                "--use-opd: the train batch has no teacher_logprobs / old_logprobs (build it with use_opd=True)"
            )
        # the student side is old_logprobs (no grad): the penalty shapes the advantage, not the gradient path
        opd_penalty = cfg.opd_kl_coef * reverse_kl(
            batch.old_logprobs, batch.teacher_logprobs, batch.loss_mask
        )  # [B, L]
    kl = None
    if cfg.kl_coef != 0.0 and batch.ref_logprobs is not None:
        assert batch.old_logprobs is not None
        # the weights before the update, not the current ones: a reward penalty fixed for the whole step
        kl = kl_estimate(batch.old_logprobs, batch.ref_logprobs, cfg.kl_loss_type)  # [B, L]
    advantages, returns = token_advantages(
        cfg.advantage_estimator,
        scores=batch.sample_advantages,
        loss_mask=batch.loss_mask,
        response_mask=batch.response_mask,
        kl=kl,
        kl_coef=cfg.kl_coef,
        values=batch.old_values,
        gamma=cfg.gamma,
        lambd=cfg.lambd,
        normalize_advantages=cfg.normalize_advantages,
        opd_penalty=opd_penalty,
    )
    return dataclasses.replace(batch, advantages=advantages, returns=returns)


def opd_metrics(batch: TrainBatch) -> dict[str, float]:
    """``opd_reverse_kl``: mean over trained tokens of ``old_logprobs - teacher_logprobs`` (nats), the
    trainer-side reverse KL the advantage used; {} without teacher logprobs."""
    if batch.teacher_logprobs is None or batch.old_logprobs is None:
        return {}
    return {
        "opd_reverse_kl": masked_mean(
            reverse_kl(batch.old_logprobs, batch.teacher_logprobs, batch.loss_mask), batch.loss_mask
        )
    }


def correction_weights(cfg: TrainConfig, mb: TrainBatch) -> tuple[Tensor | None, dict[str, float]]:
    """The active off-policy weights of a micro-batch (TIS, MIS or decoupled PPO), or None."""
    assert mb.old_logprobs is not None
    if cfg.use_tis:  # the first active correction wins: TIS, then MIS, then decoupled PPO
        return tis_weights(
            mb.old_logprobs,
            mb.rollout_logprobs,
            mb.loss_mask,
            tis_clip=cfg.tis_clip,
            tis_clip_low=cfg.tis_clip_low,
            level=cfg.tis_level,
        )
    if cfg.mis_level != "none":
        return mis_weights(
            mb.old_logprobs,
            mb.rollout_logprobs,
            mb.loss_mask,
            level=cfg.mis_level,
            lower_bound=cfg.mis_lower_bound,
            upper_bound=cfg.mis_upper_bound,
        )
    if cfg.use_decoupled_ppo:
        return decoupled_weights(
            mb.old_logprobs, mb.rollout_logprobs, mb.loss_mask, behav_imp_weight_cap=cfg.behav_imp_weight_cap
        )
    return None, {}


def micro_batch_loss(
    cfg: TrainConfig, mb: TrainBatch, logprobs: Tensor, entropy: Tensor | None, loss_denominator: float
) -> tuple[Tensor, dict[str, float]]:
    """Policy loss (+ KL loss) of one micro-batch; with ``--loss-type sft_loss``, ``losses.sft_loss``.

    Args:
        cfg: the train config.
        mb: a micro-batch slice with ``old_logprobs`` (and ``ref_logprobs`` with the KL loss).
        logprobs: [b, l] float32, current policy, carries gradient.
        entropy: [b, l] float32, nats; carries gradient when ``cfg.entropy_coef`` != 0; None: not
            computed (then ``cfg.entropy_coef`` must be 0, else ``losses.policy_loss`` raises ValueError).
        loss_denominator: the optimizer step's samples (``seq_mean``) or trained tokens (``token_mean``).

    Returns:
        loss (scalar tensor) and token-mean metrics: ``policy_loss``'s, the correction's, and
        ``kl_loss`` (token mean of the KL estimate, with ``use_kl_loss``).
    """
    if cfg.loss_type == "sft_loss":
        return sft_loss(logprobs, mb.loss_mask, loss_agg=cfg.loss_agg, loss_denominator=loss_denominator)
    assert mb.old_logprobs is not None
    weights, metrics = correction_weights(cfg, mb)
    loss, policy_metrics = policy_loss(
        logprobs,
        mb.old_logprobs,
        mb.advantages,
        mb.loss_mask,
        eps_clip=cfg.eps_clip,
        eps_clip_high=cfg.eps_clip_high,
        eps_clip_c=cfg.eps_clip_c,
        # GSPO: GRPO's scores with one length-normalised ratio per sample
        ratio_level="sequence" if cfg.advantage_estimator == "gspo" else "token",
        is_weights=weights,
        loss_agg=cfg.loss_agg,
        loss_denominator=loss_denominator,
        entropy=entropy,
        entropy_coef=cfg.entropy_coef,
    )
    metrics.update(policy_metrics)
    if cfg.use_kl_loss:
        assert mb.ref_logprobs is not None
        mask = mb.loss_mask
        # current logprobs, with gradient: the KL loss pulls the policy toward the reference
        kl = kl_estimate(logprobs, mb.ref_logprobs, cfg.kl_loss_type)  # [b, l]
        # reported even when kl_loss_coef is 0 and it does not train
        metrics["kl_loss"] = float((kl.detach() * mask).sum() / mask.sum().clamp_min(1.0))
        if cfg.kl_loss_coef != 0.0:
            # the step's denominator like the policy loss, so micro-batches sum to the step's KL loss
            loss = loss + cfg.kl_loss_coef * aggregate(
                kl, mask, loss_agg=cfg.loss_agg, loss_denominator=loss_denominator
            )
    return loss, metrics
