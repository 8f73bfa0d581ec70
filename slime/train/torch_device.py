"""Where the torch backend's models live and in what precision: ``--train-device`` and ``--bf16``.

``--train-device`` (``auto``: the current CUDA device when torch sees one, else the CPU) holds the
policy, reference and critic and every tensor of the step; logprobs, losses and metrics are computed
there. Parameters, gradients and AdamW state are always fp32 (they are the master weights);
``--bf16`` runs every forward and backward under ``torch.autocast(dtype=torch.bfloat16)`` (matmuls
and attention in bf16, softmax, norms and the logprob's ``log_softmax`` in fp32). Attention is
torch's scaled-dot-product attention (``attn_implementation="sdpa"``). What leaves the trainer does
not depend on either knob: weights for sync are fp32 CPU copies, ``save_hf`` writes fp32, and the
loop's checkpoint holds the AdamW state as it lives on the device (resume on a machine with that device).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from slime.config import TrainConfig

__all__ = ["resolve_device", "load_causal_lm", "adamw", "autocast"]


def resolve_device(device: str) -> torch.device:
    """``--train-device`` as a torch device: ``auto`` = the current CUDA device if torch sees one, else the CPU.

    Raises:
        RuntimeError: ``cuda`` where torch sees no CUDA device.
    """
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"--train-device {device}: torch sees no CUDA device (torch {torch.__version__}); use --train-device cpu or auto"
        )
    return torch.device("cuda", torch.cuda.current_device())


def load_causal_lm(model_dir: str, device: torch.device) -> PreTrainedModel:
    """fp32 weights on ``device``, torch SDPA attention."""
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").to(device)  # type: ignore[arg-type]  # transformers types .to() through a decorator that takes the model itself


def adamw(
    params: Iterable[torch.nn.Parameter], config: TrainConfig, lr: float, device: torch.device
) -> torch.optim.AdamW:
    """AdamW with the config's betas and weight decay; fused on CUDA (one kernel per step instead of
    a loop over tensors: the same update)."""
    return torch.optim.AdamW(
        params,
        lr=lr,
        betas=(config.adam_beta1, config.adam_beta2),
        weight_decay=config.weight_decay,
        fused=device.type == "cuda" or None,
    )


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` with ``--bf16``; nothing otherwise."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
