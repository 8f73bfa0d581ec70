"""The cross-section check of ``--use-rollout-routing-replay`` (``Config.validate``): what it needs of the rest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from slime.errors import ConfigError

if TYPE_CHECKING:
    from slime.config.data import DataConfig
    from slime.config.rollout import RolloutConfig
    from slime.config.train import TrainConfig

__all__ = ["check_routing_replay", "check_routing_replay_model"]

_EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")  # DeepSeek/GLM, Qwen-MoE, Mixtral


def check_routing_replay(rollout: RolloutConfig, t: TrainConfig, data: DataConfig) -> None:
    """``--use-rollout-routing-replay`` replays the engine's MoE routes in the megatron trainer: refuse what it
    cannot run with (the MoE model itself is checked where the HF config is read: ``slime.cli.compat_moe``).

    Raises:
        ConfigError: the torch backend, sequence / context / pipeline parallelism (each router must see all of a
            micro-batch's tokens), ``--offline-data`` (its samples carry no routes) or ``--loss-type sft_loss``.
    """
    if not rollout.use_rollout_routing_replay:
        return
    m = t.megatron
    problems = [
        (t.train_backend != "megatron", f"--train-backend {t.train_backend}", "pass --train-backend megatron"),
        (m.sequence_parallel, "--sequence-parallel", "leave it off"),
        (m.context_parallel_size > 1, f"--context-parallel-size {m.context_parallel_size}", "use 1"),
        (
            m.pipeline_model_parallel_size > 1,
            f"--pipeline-model-parallel-size {m.pipeline_model_parallel_size}",
            "use 1",
        ),
        (data.offline_data is not None, "--offline-data", "its samples carry no routes"),
        (t.loss_type == "sft_loss", "--loss-type sft_loss", "SFT samples come from no engine"),
    ]
    for bad, given, fix in problems:
        if bad:
            raise ConfigError(
                f"--use-rollout-routing-replay with {given}: the megatron trainer replays the engine's MoE routes "
                f"on one pipeline stage without sequence or context parallelism; {fix}"
            )


def check_routing_replay_model(rollout: RolloutConfig, hf_checkpoint: str | None) -> None:
    """``--use-rollout-routing-replay`` on a dense ``--hf-checkpoint`` is an error (nothing to replay); a directory
    without a readable ``config.json`` is left to the checkpoint checks.

    Raises:
        ConfigError: the HF config names no routed experts.
    """
    path = Path(hf_checkpoint or "", "config.json")
    if not rollout.use_rollout_routing_replay or not hf_checkpoint or not path.is_file():
        return
    hf = json.loads(path.read_text())
    hf = hf.get("text_config", hf)  # a multimodal wrapper's language model
    if not any(int(hf.get(k) or 0) > 0 for k in _EXPERT_KEYS):
        raise ConfigError(
            f"--use-rollout-routing-replay needs an MoE model: --hf-checkpoint {hf_checkpoint} "
            f"({hf.get('model_type')}) has no routed experts ({' / '.join(_EXPERT_KEYS)})"
        )
