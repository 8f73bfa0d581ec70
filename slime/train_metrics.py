"""``TrainMetrics``: what one ``Trainer.train_step`` reports (both backends, every loss).

A base module (it imports nothing of ours) so that the trainer that writes it, the loop that records
it and the readers of ``metrics.jsonl`` can all name it. Every field is optional: a field is None
where the step's loss, correction or model has no such number (``nll`` only with ``sft_loss``, the
``value_*`` fields only with a critic, the ``moe_*`` fields only for an MoE model, ...), and
``to_dict`` leaves it out. ``to_dict`` gives the flat names runs have always written as
``train/<name>`` (``moe_expert_load`` as ``moe_expert_load_0``, ``moe_expert_load_1``, ...);
``from_dict`` reads them back. Units: ``*_s`` seconds, losses and KLs nats per token (or per sample
with ``seq_mean``), versions policy versions; the counts are floats, as they always were in the file.
"""

from __future__ import annotations

import re

import msgspec

__all__ = ["TrainMetrics"]

_EXPERT_LOAD = re.compile(r"moe_expert_load_(\d+)")


class TrainMetrics(msgspec.Struct, kw_only=True, omit_defaults=True, repr_omit_defaults=True):
    """One train step's metrics. The order of the fields is the order of the keys written.

    Token means are over the step's trained tokens (the loss mask), weighted by tokens across
    micro-batches; ``slime.train.torch_backend.TorchTrainer.train_step`` says what each one is.
    """

    # token means of the policy loss (slime.train.losses); the first four always with an RL loss
    pg_clipfrac: float | None = None
    approx_kl: float | None = None
    ratio_mean: float | None = None
    entropy: float | None = None
    # the active off-policy correction (slime.train.offpolicy), the dual clip, the KL loss
    tis_mean: float | None = None
    tis_clipfrac: float | None = None
    dual_clipfrac: float | None = None
    kl_loss: float | None = None
    mis_rho_mean: float | None = None
    mis_mask_frac_low: float | None = None
    mis_mask_frac_high: float | None = None
    mis_mean: float | None = None
    behav_imp_weight_mean: float | None = None
    behav_mask_frac: float | None = None
    value_clipfrac: float | None = None
    nll: float | None = None
    """``sft_loss`` only: the token-mean negative log-likelihood."""
    # the batch (slime.train.batch.rl_batch_metrics)
    train_rollout_logprob_abs_diff: float | None = None
    train_rollout_logprob_abs_diff_max: float | None = None
    reward_mean: float | None = None
    advantage_abs_mean: float | None = None
    staleness_mean: float | None = None
    staleness_max: float | None = None
    num_samples: float | None = None
    num_train_tokens: float | None = None
    num_tokens: float | None = None
    """Torch backend, ``sft_loss``: prompt and response tokens of the batch."""
    opd_reverse_kl: float | None = None
    # MoE routers (slime.train.router_metrics.RouterStats.collect)
    moe_expert_load: list[float] | None = None
    """Per expert (index = expert), written as ``moe_expert_load_<e>``."""
    moe_load_imbalance: float | None = None
    moe_load_balancing_loss: float | None = None
    moe_dropped_token_frac: float | None = None
    moe_routed_tokens: float | None = None
    attention_dense_fraction: float | None = None
    """Megatron backend on CUDA in half precision (``slime.train.megatron.layers.attention_path_metrics``)."""
    # the PPO critic (slime.train.critic)
    value_loss: float | None = None
    critic_grad_norm: float | None = None
    explained_variance: float | None = None
    # the optimizer steps
    loss: float | None = None
    grad_norm: float | None = None
    num_optimizer_steps: float | None = None
    lr: float | None = None
    num_skipped_steps: float | None = None
    policy_version: float | None = None
    """The trainer's version after the step."""
    train_time_s: float | None = None

    def to_dict(self) -> dict[str, float]:
        """The flat ``name -> value`` of the fields that are set (``train/<name>`` in ``metrics.jsonl``)."""
        out: dict[str, float] = {}
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if value is None:
                continue
            if name == "moe_expert_load":
                out.update({f"moe_expert_load_{e}": v for e, v in enumerate(value)})
            else:
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, flat: dict[str, float], *, strict: bool = True) -> TrainMetrics:
        """The inverse of ``to_dict``.

        Raises:
            ValueError: with ``strict``, a name that is no field (a metric the struct would drop);
                without it such names are ignored (an old run's file).
        """
        fields: dict[str, object] = {}
        loads: dict[int, float] = {}
        for name, value in flat.items():
            if m := _EXPERT_LOAD.fullmatch(name):
                loads[int(m.group(1))] = value
            elif name in cls.__struct_fields__ and name != "moe_expert_load":
                fields[name] = value
            elif strict:
                raise ValueError(f"train metric {name!r} is not a field of TrainMetrics")
        if loads:
            fields["moe_expert_load"] = [loads[e] for e in sorted(loads)]
        return msgspec.convert(fields, cls)
