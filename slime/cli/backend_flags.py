"""Megatron-only flags on the torch backend (``--train-backend torch``, the default): none is dropped in silence.

THUDM/slime's launch scripts set megatron's parallelism and memory flags (``--tensor-model-parallel-size 2``,
``--sequence-parallel``, ``--recompute-granularity full``, ...). The torch backend trains one whole HF model on
one device, so each of them changes nothing there but memory and speed: one INFO line names each flag given and
says so (``log_megatron_only_flags``). Where the value would change what is trained (a load-balancing loss
weight, token dropping at an expert capacity), the torch backend cannot honour it and the flag is an error
naming the value and what to do. The megatron backend applies them all (docs/slime_flags.md).
"""

from __future__ import annotations

import argparse
import logging

from slime.errors import ConfigError

__all__ = ["MEGATRON_ONLY", "log_megatron_only_flags"]

log = logging.getLogger(__name__)

_NOT_SPLIT = "the torch backend keeps the whole model on one device (nothing is split): the same training, more memory"
_MEMORY = "a megatron memory / speed setting; the torch backend trains the same without it"

MEGATRON_ONLY: dict[str, str] = {
    "--tensor-model-parallel-size": _NOT_SPLIT,
    "--pipeline-model-parallel-size": _NOT_SPLIT,
    "--context-parallel-size": _NOT_SPLIT,
    "--expert-model-parallel-size": _NOT_SPLIT,
    "--expert-tensor-parallel-size": _NOT_SPLIT,
    "--sequence-parallel": _MEMORY,
    "--recompute-granularity": _MEMORY,
    "--recompute-method": _MEMORY,
    "--recompute-num-layers": _MEMORY,
    "--use-distributed-optimizer": _MEMORY,
    "--overlap-grad-reduce": _MEMORY,
    "--distributed-timeout-minutes": "the torch backend runs no collectives between train ranks",
    "--logprob-impl": "the torch backend takes logprobs from its logits (slime's way)",
    "--moe-token-dispatcher-type": "the torch backend runs every expert on its one device (no token dispatch)",
    "--moe-router-load-balancing-type": "the torch backend trains no load-balancing loss",
    "--moe-aux-loss-coeff": "the torch backend trains no load-balancing loss; only 0 is accepted",
    "--moe-expert-capacity-factor": "the torch backend is dropless (every token reaches its experts)",
    "--moe-router-bias-update-rate": "the torch backend keeps the HF router's e_score_correction_bias as loaded (a rate of 0)",
}
"""Megatron backend flags the torch backend does not read, with what that means there."""


def _refusal(flag: str, value: object) -> str | None:
    """Why ``flag value`` cannot run on the torch backend (it would change what is trained), or None."""
    if flag == "--moe-aux-loss-coeff" and value != 0:
        return "the torch backend trains no load-balancing loss: pass --train-backend megatron, or leave it 0"
    if flag == "--moe-expert-capacity-factor":
        return "the torch backend is dropless (every token reaches its experts): pass --train-backend megatron, or leave it unset"
    return None


def log_megatron_only_flags(ns: argparse.Namespace, train_backend: str) -> None:
    """On the torch backend, one INFO line per megatron-only flag given (``MEGATRON_ONLY``): ``--flag value: megatron
    backend only (--train-backend megatron); here: why it changes nothing``. Nothing on the megatron backend.

    Raises:
        ConfigError: a flag whose value would change what is trained (``--moe-aux-loss-coeff`` > 0,
            ``--moe-expert-capacity-factor``), naming it, its value and what to pass instead.
    """
    if train_backend != "torch":
        return
    for flag, why in MEGATRON_ONLY.items():
        value = getattr(ns, flag[2:].replace("-", "_"), None)
        if value is None or value is False:
            continue
        shown = flag if value is True else f"{flag} {value}"
        problem = _refusal(flag, value)
        if problem is not None:
            raise ConfigError(f"{shown}: {problem}")
        log.info("%s: megatron backend only (--train-backend megatron); here: %s", shown, why)
