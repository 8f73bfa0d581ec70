"""Checks of a THUDM/slime-shaped sample's per-token lists and versions (``slime.rollout.slime_compat``)."""

from __future__ import annotations

import math

from slime.errors import PluginError
from slime.rollout.generate import policy_version_of

__all__ = ["checked_token_lists", "oldest_version"]


def checked_token_lists(s: object, n: int, where: str) -> tuple[list[int] | None, list[float] | None]:
    """``(loss_mask, rollout_log_probs)`` of a slime-shaped sample (None where unset), each of ``n`` entries, the mask
    0/1 and the logprobs finite and <= 0; else PluginError."""
    mask = getattr(s, "loss_mask", None)
    logprobs = getattr(s, "rollout_log_probs", None)
    for name, values in (("loss_mask", mask), ("rollout_log_probs", logprobs)):
        if values is not None and len(values) != n:
            raise PluginError(f"{where}: {name} has {len(values)} entries for response_length={n}")
    if mask is not None and any(m not in (0, 1) for m in mask):
        raise PluginError(f"{where}: loss_mask holds {next(m for m in mask if m not in (0, 1))!r}, expected 0 or 1")
    if logprobs is not None and any(not math.isfinite(x) or x > 1e-6 for x in logprobs):
        raise PluginError(
            f"{where}: rollout_log_probs holds {next(x for x in logprobs if not math.isfinite(x) or x > 1e-6)!r}, "
            "expected finite log-probabilities <= 0"
        )
    return mask, logprobs


def oldest_version(s: object, engine_version: int) -> int:
    """The version every response token of ``s`` is stamped with: the oldest of its ``weight_versions`` (slime
    appends the engine's version per generate call, so a sample kept in ``data_buffer`` across a weight update
    holds several) and ``engine_version`` (the engines' version now). Without per-token versions the oldest is
    the honest stamp: the staleness mask then errs toward masking. An entry that is no version of ours (SGLang's
    ``"default"``) counts as ``engine_version``, as ``policy_version_of`` reads it. Example: ["3", "4"] at 5 -> 3.
    """
    versions = getattr(s, "weight_versions", None) or []
    return min([engine_version, *(policy_version_of(str(v), engine_version) for v in versions)])
