"""On-policy distillation (OPD): the per-token reverse KL to a teacher, as an advantage term.

The student samples ``y_t``; a teacher engine scores it (``slime.rollout.opd``). Per trained token::

    kl_t = logp_student(y_t) - logp_teacher(y_t)          single-sample estimate of KL(student || teacher)
    A_t  = A_t^task - opd_kl_coef * kl_t                  (trained tokens only; then whitening, if any)

Minimising the reverse KL with the policy gradient is exactly this: ``-kl_t`` is a per-token reward
whose expectation under the student is ``-KL(student || teacher)`` at that prefix, and it is dense
(every token), mode-seeking, and evaluated on the student's own samples, so the student learns to
recover from its own mistakes. Sources: Agarwal et al. 2024, "On-Policy Distillation of Language
Models: Learning from Self-Generated Mistakes" (GKD, arXiv 2306.13649), whose reverse-KL on-policy
case this is; Thinking Machines Lab 2025, "On-Policy Distillation" (the per-token reverse KL as the
advantage, no discounting); THUDM/slime ``--use-opd`` (the same additive term on any estimator).

Choices and departures:
- The student logprob is the trainer's ``old_logprobs``: the weights about to be updated, computed
  by both backends before the step. Under staleness (``april``/``async``) that is the policy the
  gradient improves, not an older one that sampled the token (slime does the same; the Tinker
  cookbook uses the sampler's logprobs, equal on-policy). On CPU fp32 the two agree to ~1e-5
  (ARCHITECTURE.md invariant 5), so the rollout-side metric ``opd/reverse_kl`` (engine logprobs,
  ``slime.loop.step``) and the trainer-side ``train/opd_reverse_kl`` agree on-policy.
- The term is added to the advantage, not folded into REINFORCE++/GAE per-token rewards: it is not
  discounted or bootstrapped (slime and Tinker do the same), and it is whitened along with the task
  advantage where the estimator whitens.
- Only the sampled token's KL (no top-k or full-vocabulary KL; the teacher returns one logprob per
  token). Tool tokens (loss_mask 0) get no term.

Example (one sample, GRPO advantage 0.5, ``opd_kl_coef`` 1, loss_mask [1, 1, 0])::

    old_logprobs     -0.1  -2.0  -0.5
    teacher_logprobs -0.3  -0.5  -0.5
    kl_t              0.2  -1.5   0.0    (masked position: 0)
    advantage         0.3   2.0   0.5    (the student under-rates token 2 vs the teacher: pushed up)
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["reverse_kl", "masked_mean"]


def reverse_kl(student_logprobs: Tensor, teacher_logprobs: Tensor, loss_mask: Tensor) -> Tensor:
    """Per-token reverse-KL estimate ``(student - teacher) * loss_mask``, no gradient.

    Args:
        student_logprobs / teacher_logprobs: [B, L] float32, natural log of the sampled token.
        loss_mask: [B, L] float, 1 = trained token.

    Returns:
        [B, L] float32 nats; 0.0 off the mask.

    Raises:
        ValueError: shapes differ.
    """
    if not (student_logprobs.shape == teacher_logprobs.shape == loss_mask.shape):
        raise ValueError(
            f"reverse_kl: shapes differ: student {tuple(student_logprobs.shape)}, "
            f"teacher {tuple(teacher_logprobs.shape)}, loss_mask {tuple(loss_mask.shape)}"
        )
    return (student_logprobs.detach().float() - teacher_logprobs.float()) * loss_mask.float()


def masked_mean(x: Tensor, mask: Tensor) -> float:
    """Mean of ``x`` over ``mask`` (0.0 when the mask is empty)."""
    mask = mask.float()
    return float((x * mask).sum() / mask.sum().clamp_min(1.0))
