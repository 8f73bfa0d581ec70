"""What this machine offers a launch plan: free ports, the visible GPUs, the trainer's GPUs and the
packages the plan's commands import.

``port_is_free`` is ``build_launch_plan``'s default port probe; ``visible_gpus`` reads
``CUDA_VISIBLE_DEVICES`` (or probes torch for a GPU trainer); ``trainer_gpus`` counts the GPUs the
run's trainer takes from the first visible one; ``check_launchable`` fails early, with the fix, when
this interpreter cannot import what the plan's SGLang servers and routers need.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys

from slime.config import TrainConfig
from slime.engines.fleet.plan_specs import LaunchPlan
from slime.errors import ConfigError

__all__ = ["port_is_free", "visible_gpus", "trainer_gpus", "check_launchable"]


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def check_launchable(plan: LaunchPlan) -> None:
    """The packages the plan's commands import are importable by this interpreter (the servers run
    ``sys.executable`` with our environment, ``PYTHONPATH`` included), checked before anything starts.

    Raises:
        ConfigError: one line naming the missing package and the fix.
    """
    if plan.backend != "sglang":
        return
    launched_routers = [r for r in plan.routers if r.argv is not None]
    saver = any("--enable-memory-saver" in s.argv for s in plan.servers)
    for module, needed, fix in (
        ("sglang", bool(plan.servers), 'pip install "sglang==0.5.17", or put its site-packages on PYTHONPATH'),
        (
            "sglang_router",
            bool(launched_routers),
            "pip install sglang-router (it needs no GPU), or give a running router with --sglang-router-ip/--sglang-router-port",
        ),
        (
            "torch_memory_saver",
            saver,
            "pip install torch_memory_saver (SGLang's --enable-memory-saver, which --colocate needs), or drop --colocate",
        ),
    ):
        if needed and importlib.util.find_spec(module) is None:
            what = {
                "sglang": "SGLang servers",
                "sglang_router": f"routers for {[r.model for r in launched_routers]}",
                "torch_memory_saver": "servers with --enable-memory-saver",
            }[module]
            raise ConfigError(
                f"this run launches {what}, but {sys.executable} cannot import {module}: {fix} (slime train --dry-run shows the commands)"
            )


def trainer_gpus(train: TrainConfig, *, rollout_only: bool = False) -> int:
    """GPUs the run's trainer uses on this machine, from the first visible one: the torchrun ranks
    here (``LOCAL_WORLD_SIZE``, else ``WORLD_SIZE``, else 1) for ``--train-backend megatron``; 0 for
    the torch backend (CPU) and for runs without a trainer (``rollout_only``: ``--debug-rollout-only``);
    ``--actor-num-gpus-per-node`` when given."""
    if train.train_backend != "megatron" or rollout_only:
        return 0
    if train.actor_num_gpus_per_node is not None:  # --actor-num-gpus-per-node (checked against torchrun's at start)
        return train.actor_num_gpus_per_node
    return int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)


def visible_gpus(*, probe: bool = False) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as a list; when unset and ``probe`` (a GPU trainer: CUDA is in use
    anyway), ``0..n-1`` for torch's device count; None = unknown (numbered from 0, unchecked)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [g.strip() for g in visible.split(",") if g.strip()]
    if probe:
        import torch

        if (count := torch.cuda.device_count()) > 0:
            return [str(n) for n in range(count)]
    return None
