"""``--deterministic-mode`` (Megatron-LM's flag, used by THUDM/slime's reproducibility example): the
trainer's kernels are made deterministic, so the same inputs give bit-identical train steps.

What it sets, in the trainer process (and each torchrun rank): ``torch.use_deterministic_algorithms``
(an op without a deterministic kernel raises instead of running), cuDNN deterministic without
autotuning, the ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` that cuBLAS needs for it and
``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` (Transformer Engine), unless already set, and the torch seed.

Not covered: the engines (SGLang's own flag: ``--sglang-enable-deterministic-inference``), NCCL's
reduction order across ranks (``NCCL_ALGO``), and megatron-core's own ``deterministic_mode`` kernels.
"""

from __future__ import annotations

import logging
import os

import torch

__all__ = ["DETERMINISTIC_ENV", "enable_deterministic_mode"]

log = logging.getLogger(__name__)

DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}
"""Environment the deterministic kernels need; a value the user set is kept."""


def enable_deterministic_mode(seed: int) -> None:
    """Make this process's torch kernels deterministic and seed it (module docstring); logs one line.

    Must run before the first CUDA matmul (cuBLAS reads its workspace setting once).
    """
    for key, value in DETERMINISTIC_ENV.items():
        os.environ.setdefault(key, value)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(seed)
    log.info(
        "--deterministic-mode: deterministic torch kernels, seed %d; not covered: the engines "
        "(--sglang-enable-deterministic-inference) and NCCL's reduction order",
        seed,
    )
