"""``TrainConfig``: the trainer: optimizer, batch sizes, algorithm and off-policy corrections, backend (``slime.train``)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from slime.config._base import STRUCT, Range, check_ranges, require
from slime.config.megatron import MegatronConfig
from slime.errors import ConfigError

__all__ = ["TrainConfig"]


class TrainConfig(msgspec.Struct, **STRUCT):
    lr: Annotated[float, Range(gt=0)] = 1e-5
    """Learning rate of the policy's AdamW (``--lr``)."""
    global_batch_size: Annotated[int, Range(ge=1)] = 128
    """Samples per optimizer step (``--global-batch-size``)."""
    micro_batch_size: Annotated[int, Range(ge=1)] = 32
    """Samples per forward/backward pass (``--micro-batch-size``)."""
    weight_decay: Annotated[float, Range(ge=0)] = 0.0
    """AdamW's decoupled weight decay (``--weight-decay``)."""
    adam_beta1: Annotated[float, Range(ge=0, lt=1)] = 0.9
    adam_beta2: Annotated[float, Range(ge=0, lt=1)] = 0.999
    clip_grad: Annotated[float, Range(ge=0, note="(0 = no clipping)")] = 1.0
    """Clip the gradient's global norm to this (``--clip-grad``)."""
    eps_clip: Annotated[float, Range(gt=0)] = 0.2
    """PPO clip range: the ratio stays in [1 - eps_clip, 1 + eps_clip_high] (``--eps-clip``)."""
    eps_clip_high: Annotated[float, Range(ge=0)] | None = None
    """Upper clip (clip-higher, DAPO); None = eps_clip."""
    use_tis: bool = False
    """Token-level truncated importance sampling between trainer and rollout logprobs (``--use-tis``)."""
    tis_clip: Annotated[float, Range(gt=0)] = 2.0
    """Upper truncation of the TIS weight (``--tis-clip``)."""
    tis_clip_low: Annotated[float, Range(ge=0)] = 0.0
    """Lower truncation of the TIS weight (``--tis-clip-low``), <= ``tis_clip``."""
    deterministic_mode: bool = False
    """Deterministic trainer kernels and seed (``--deterministic-mode``, Megatron's;
    ``slime.train.determinism``). The engines are not covered: ``--sglang-enable-deterministic-inference``."""
    tis_level: Literal["token", "sequence", "geometric"] = "token"
    """Where the TIS ratio is taken (``--tis-level``, THUDM/slime's): per token, or one ratio per
    sample from its trained tokens' log ratios summed (``sequence``) or averaged (``geometric``),
    then truncated to [tis_clip_low, tis_clip] (``slime.train.offpolicy.tis_weights``)."""
    loss_agg: Literal["seq_mean", "token_mean"] = "seq_mean"
    """Loss aggregation: mean over each sample's tokens then over samples (slime's default), or
    one mean over every token of the step (``--calculate-per-token-loss``, DAPO)."""
    num_threads: Annotated[int, Range(ge=1, flag="--train-threads")] = 1
    """torch threads of the trainer (``--train-threads``)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the torch backend trains (``--train-device``): ``auto`` = the current CUDA device when
    torch sees one, else the CPU; ``cuda`` fails without one. The megatron backend always trains on
    CUDA (``cpu`` is refused with it)."""
    # Algorithm set and off-policy corrections (slime/train/; flag mapping in slime/cli/args.py).
    advantage_estimator: Literal[
        "grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo", "gae"
    ] = "grpo"
    """``--advantage-estimator``: GRPO, GSPO (sequence-level ratio and clip), REINFORCE++ (discounted
    return, batch-whitened), REINFORCE++-baseline (group mean baseline, batch-whitened), or PPO with a
    critic and GAE (``ppo``, slime's name; ``gae`` is the same). See slime/train/advantages.py."""
    disable_grpo_std_normalization: bool = False
    """GRPO/GSPO: only centre rewards on the group mean, no division by the group std (Dr. GRPO,
    arXiv 2503.20783) (``--disable-grpo-std-normalization``)."""
    normalize_advantages: bool = False
    """Whiten GRPO/GSPO/PPO advantages over the step's trained tokens (``--normalize-advantages``);
    REINFORCE++ and its baseline variant are always whitened."""
    gamma: Annotated[float, Range(ge=0, le=1)] = 1.0
    """Per-token discount of REINFORCE++ returns and GAE (``--gamma``), in [0, 1]."""
    lambd: Annotated[float, Range(ge=0, le=1)] = 1.0
    """GAE lambda (``--lambd``), in [0, 1]."""
    kl_coef: Annotated[float, Range(ge=0)] = 0.0
    """KL-to-reference penalty folded into the per-token rewards of REINFORCE++(-baseline) and PPO
    (``--kl-coef``), estimator ``kl_loss_type``; ignored by GRPO/GSPO, as in slime. >= 0."""
    use_kl_loss: bool = False
    """Add ``kl_loss_coef * KL(policy || reference)`` to the loss (``--use-kl-loss``)."""
    kl_loss_coef: Annotated[float, Range(ge=0)] = 0.0
    """Weight of the KL loss (``--kl-loss-coef``), >= 0; 0 with ``use_kl_loss`` reports it only."""
    kl_loss_type: Literal["k1", "k2", "k3", "low_var_kl"] = "k1"
    """Per-token KL estimator (``--kl-loss-type``); ``low_var_kl`` is k3 clamped to [-10, 10]."""
    ref_load: str | None = None
    """HF directory of the frozen reference model (``--ref-load``); None = the initial checkpoint."""
    entropy_coef: Annotated[float, Range(ge=0)] = 0.0
    """Entropy bonus: loss -= entropy_coef * mean entropy (``--entropy-coef``), >= 0."""
    eps_clip_c: Annotated[float, Range(gt=1, note="(dual clip), or unset")] | None = None
    """Dual-clip PPO constant c > 1: for A < 0 the loss is capped at -c * A (``--eps-clip-c``); None = off."""
    value_clip: Annotated[float, Range(gt=0)] = 0.2
    """PPO critic: new values stay within old +- value_clip in the clipped value loss (``--value-clip``), > 0."""
    critic_lr: Annotated[float, Range(gt=0, note=", or unset (= --lr)")] | None = None
    """PPO critic learning rate (``--critic-lr``); None = ``lr``."""
    mis_level: Literal["none", "token", "sequence", "geometric"] = "none"
    """Masked importance sampling of exp(old_logp - rollout_logp) (``--mis-level``): mask tokens
    (token) or whole samples (sequence: product of ratios; geometric: geometric mean) whose ratio
    is outside [mis_lower_bound, mis_upper_bound]; weight the rest by the ratio."""
    mis_lower_bound: Annotated[float, Range(ge=0)] = 0.5
    """MIS lower bound (``--mis-lower-bound``), in [0, mis_upper_bound]."""
    mis_upper_bound: Annotated[float, Range(gt=0)] = 2.0
    """MIS upper bound (``--mis-upper-bound``)."""
    use_decoupled_ppo: bool = False
    """Decoupled PPO (Hilton et al. 2021; AReaL): clip around the trainer's pre-step policy and weight
    each token by exp(old_logp - rollout_logp) (``--use-decoupled-ppo``)."""
    behav_imp_weight_cap: Annotated[float, Range(gt=1, note=", or unset")] | None = None
    """Decoupled PPO: drop tokens whose behaviour weight exceeds this cap, > 1 (``--behav-imp-weight-cap``)."""
    use_rollout_logprobs: bool = False
    """THUDM/slime's ``--use-rollout-logprobs``: the engine's logprobs of the sampled tokens are the old policy
    of the PPO ratio and the trainer's old-logprob forward pass is skipped (one forward pass less per step; the
    ratio then also carries the train/inference mismatch and the lag of stale or partial tokens). The
    off-policy corrections, whose weight old / rollout would be 1, are refused with it, and the
    ``train_rollout_logprob_abs_diff`` metrics are not reported (nothing measures them)."""
    mask_offpolicy_in_partial_rollout: bool = False
    """Train only the tokens of each sample's newest policy version (``--mask-offpolicy-in-partial-rollout``)."""
    use_opd: bool = False
    """On-policy distillation (``--use-opd``, THUDM/slime's flag): a teacher engine scores every finished
    sample (``slime.rollout.opd``; the teacher comes from ``--opd-teacher-load``, ``--opd-teacher-addrs``
    or a ``model: teacher`` group of ``--sglang-config``) and each trained token's advantage gets
    ``-opd_kl_coef * (old_logp - teacher_logp)`` on top of the estimator's (``slime.train.objective``)."""
    opd_kl_coef: Annotated[float, Range(ge=0)] = 1.0
    """Weight of the per-token reverse KL in the advantage (``--opd-kl-coef``, slime's default 1.0), >= 0;
    next to the task advantage it sets the mix."""
    opd_only: bool = False
    """Pure distillation (``--opd-only``, needs ``--use-opd``): the advantage is the reverse-KL term alone.
    The task reward is still computed, logged (``reward_mean``, ``accuracy``) and used by eval; it just
    does not train (every estimator sees reward 0). THUDM/slime gets the same with a reward function
    that returns 0, which also zeroes what its logs show."""
    custom_reward_post_process_path: str | None = None
    """THUDM/slime's ``--custom-reward-post-process-path``, accepted only with ``use_opd``, where it is a
    no-op: slime's on-policy-distillation example uses it to move the teacher's logprobs from the reward
    payload onto the samples, which ``slime.rollout.opd`` does here (``slime.cli.args.apply_slime_opd``)."""
    loss_type: Literal["policy_loss", "sft_loss"] = "policy_loss"
    """``--loss-type`` (THUDM/slime's flag): ``policy_loss`` (RL, the objective above) or ``sft_loss``
    (supervised fine-tuning: masked negative log-likelihood of the loss-mask tokens, aggregated by
    ``loss_agg``; no rollouts, rewards, advantages or reference model). ``sft_loss`` makes ``slime
    train`` an SFT run (``slime.loop.sft``)."""
    train_backend: Literal["torch", "megatron"] = "torch"
    """``torch``: one HF model in this process (CPU or one GPU, ``--train-device``). ``megatron``: megatron-core's GPTModel
    with TP/DP under torchrun, rank 0 hosting the loop (``--train-backend``; slime/train/megatron/)."""
    megatron: MegatronConfig = MegatronConfig()
    """The megatron-core backend's parallelism, precision, schedule and packing knobs."""
    actor_num_nodes: Annotated[int, Range(ge=1)] | None = None
    """Nodes of the trainer's torchrun job (``--actor-num-nodes``, THUDM/slime's flag; ``--nnodes``); None = 1.
    More than one needs ``--train-backend megatron``. See ``slime.engines.fleet.placement``."""
    actor_num_gpus_per_node: Annotated[int, Range(ge=1)] | None = None
    """Trainer ranks (GPUs) per node (``--actor-num-gpus-per-node``; torchrun's ``--nproc-per-node``, checked
    against ``LOCAL_WORLD_SIZE``); None = torchrun's own count. With ``--colocate`` it also sets the default
    ``--rollout-num-gpus`` (nodes x GPUs per node), as in THUDM/slime."""

    def validate(self) -> None:
        """Check this section's values, ``megatron``'s included.

        Raises:
            ConfigError: naming the flag.
        """
        t = self
        check_ranges(t)
        require(
            [
                (t.tis_clip_low <= t.tis_clip, "--tis-clip-low", t.tis_clip_low, f"in [0, --tis-clip={t.tis_clip}]"),
                (
                    t.tis_level == "token" or t.use_tis,
                    "--tis-level",
                    t.tis_level,
                    "used with --use-tis (without it there is no TIS weight)",
                ),
                (
                    not (t.train_backend == "megatron" and t.device == "cpu"),
                    "--train-device",
                    t.device,
                    "auto or cuda with --train-backend megatron (CUDA only)",
                ),
                (
                    t.micro_batch_size <= t.global_batch_size,
                    "--micro-batch-size",
                    t.micro_batch_size,
                    f"<= --global-batch-size ({t.global_batch_size})",
                ),
                (
                    t.mis_lower_bound <= t.mis_upper_bound,
                    "--mis-lower-bound",
                    t.mis_lower_bound,
                    f"in [0, --mis-upper-bound={t.mis_upper_bound}]",
                ),
                (
                    t.use_tis + (t.mis_level != "none") + t.use_decoupled_ppo <= 1,
                    "--use-tis / --mis-level / --use-decoupled-ppo",
                    f"use_tis={t.use_tis}, mis_level={t.mis_level}, use_decoupled_ppo={t.use_decoupled_ppo}",
                    "at most one off-policy correction",
                ),
            ]
        )
        if t.use_rollout_logprobs and (
            t.use_tis or t.mis_level != "none" or t.use_decoupled_ppo or t.loss_type == "sft_loss"
        ):
            raise ConfigError(
                "--use-rollout-logprobs makes the engine's logprobs the old policy, so the rollout/old weight of "
                "--use-tis / --mis-level / --use-decoupled-ppo would be 1: pick one (and it has no use with --loss-type sft_loss)"
            )
        if t.opd_only and not t.use_opd:
            raise ConfigError("--opd-only needs --use-opd (and a teacher)")
        if t.opd_only and t.opd_kl_coef == 0:
            raise ConfigError(
                "--opd-only with --opd-kl-coef 0: nothing would train (the task reward is off and the distillation term is zero)"
            )
        t.megatron.validate()
