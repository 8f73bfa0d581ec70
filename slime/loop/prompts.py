"""What the scheduler makes of a prompt row: its group of samples, and the sampling parameters every request carries.

``new_group`` turns one ``PromptRow`` into a ``Group`` of ``n_samples_per_prompt`` fresh samples (the
same prompt ids, label and metadata, indices 0..n-1); ``sampling_params`` is SGLang's JSON sampling
parameters from the rollout flags (docs/sglang.md#generate-request).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slime.config import RolloutConfig
from slime.data.dataset import PromptRow, row_metadata, tokenize_row
from slime.types import Group, Sample

__all__ = ["new_group", "sampling_params"]


def new_group(
    row: PromptRow, tokenize: Callable[[str], list[int]], *, group_id: int, num_samples: int, rollout_id: int
) -> Group:
    """Group ``group_id`` of ``num_samples`` pending samples of ``row`` (tokenised once), started at ``rollout_id``."""
    prompt_ids = tokenize_row(tokenize, row)
    samples = [
        Sample(
            prompt_ids=list(prompt_ids),
            group_id=group_id,
            index=i,
            label=row.label,
            prompt=row.prompt,
            metadata=row_metadata(row),
        )
        for i in range(num_samples)
    ]
    return Group(group_id=group_id, samples=samples, rollout_id=rollout_id, data_index=row.index)


def sampling_params(rollout: RolloutConfig) -> dict[str, Any]:
    """``temperature``, ``top_p``, ``top_k`` and, when given, ``stop_token_ids`` of the rollout flags."""
    params: dict[str, Any] = {
        "temperature": rollout.rollout_temperature,
        "top_p": rollout.rollout_top_p,
        "top_k": rollout.rollout_top_k,
    }
    if rollout.rollout_stop_token_ids:
        params["stop_token_ids"] = list(rollout.rollout_stop_token_ids)
    return params
