"""Process groups of a megatron training job, and the channel rank 0 drives the other ranks through.

Launch: ``torchrun --nproc-per-node N -m slime.cli train --train-backend megatron ...``. Every
rank builds the same ``MegatronTrainer`` (collectively); rank 0 also runs the event loop (the
driver) and the other ranks wait in ``MegatronTrainer.serve`` for commands. A command is one
``broadcast_object_list`` over a gloo group (``ControlChannel``): ("train", TrainBatch),
("save_hf", dir), ("gather", None), ("stop", None). The batch goes whole to every rank (token ids
and per-token floats: kilobytes to a few megabytes) and each data-parallel rank takes its share.
Between commands the workers block in that broadcast while rank 0 generates rollouts, for
minutes; the gloo group's timeout is therefore long (``CONTROL_TIMEOUT``), while the NCCL groups
keep ``--distributed-timeout-minutes``.

Without torchrun (``RANK`` unset) the job is one process: a single-rank group on a free local port.

``ParallelContext`` holds what the trainer reads; nothing here is a module global except
megatron-core's own ``parallel_state``, which its modules read.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
from types import ModuleType

import torch
import torch.distributed as dist

from slime.config import MegatronConfig
from slime.train.megatron._mcore import mcore

__all__ = ["ParallelContext", "init_parallel", "ControlChannel", "CONTROL_TIMEOUT"]

CONTROL_TIMEOUT = datetime.timedelta(days=7)
"""How long worker ranks wait for rank 0's next command (a rollout step can take long)."""


@dataclasses.dataclass
class ParallelContext:
    """Ranks and groups of this process. ``dp`` excludes TP, CP and PP (megatron's data-parallel group).

    megatron-core's rank order is "tp-cp-ep-dp-pp" (TP fastest): with 4 GPUs, TP=2, CP=2, ranks
    {0, 1} and {2, 3} are TP groups, {0, 2} and {1, 3} CP groups. Context-parallel ranks hold
    the same samples (each a share of every sequence) and replicated weights; pipeline stages
    hold consecutive layers, stage 0 (with global rank 0) the embedding, the last stage the
    output layer. Gradients are summed over data x context parallel ranks (megatron's DDP).

    Experts (MoE models) are laid out on a second grid of the same ranks, megatron-core's
    "tp-ep-dp" order: rank = etp_rank + etp_size * (ep_rank + ep_size * expert_dp_rank). Example:
    2 GPUs, TP=1, EP=2: dense DP=2 (each rank a full attention replica, its own samples), and
    each rank holds half of every MoE layer's experts (expert DP=1). ``expert_group`` is the
    ETP x EP group of one expert replica (megatron's expert-tensor-and-model-parallel group).
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    tp_size: int
    tp_rank: int
    tp_group: dist.ProcessGroup
    dp_size: int
    dp_rank: int
    dp_group: dist.ProcessGroup
    control_group: dist.ProcessGroup
    owns_process_group: bool
    cp_size: int = 1
    cp_rank: int = 0
    cp_group: dist.ProcessGroup | None = None
    pp_size: int = 1
    pp_rank: int = 0
    pp_group: dist.ProcessGroup | None = None
    ep_size: int = 1
    ep_rank: int = 0
    etp_size: int = 1
    etp_rank: int = 0
    expert_dp_rank: int = 0
    expert_group: dist.ProcessGroup | None = None

    @property
    def is_driver(self) -> bool:
        """Rank 0: hosts the event loop and holds the gathered HF weights."""
        return self.rank == 0

    @property
    def last_stage_rank(self) -> int:
        """Global rank of the last pipeline stage in this rank's pipeline group (this rank without PP)."""
        if self.pp_size == 1:
            return self.rank
        assert self.pp_group is not None, "pp_size > 1 without a pipeline group"  # init_parallel sets both
        return dist.get_global_rank(self.pp_group, self.pp_size - 1)

    def close(self) -> None:
        """Tear down megatron's parallel state, and the default group if this context created it."""
        mcore("megatron.core.parallel_state").destroy_model_parallel()
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_parallel(mcfg: MegatronConfig, *, seed: int) -> ParallelContext:
    """Join (or create) the default process group and build megatron's TP/CP/PP/DP (and expert) groups.

    NCCL on CUDA (device ``cuda:LOCAL_RANK``), gloo on CPU. Seeds megatron's CUDA RNG tracker on
    CUDA (the model's dropout-free forward does not draw from it on CPU).

    Raises:
        ValueError: the world size is not a multiple of TP x CP x PP, or of
            expert-parallel x expert-tensor-parallel size.
    """
    ps = mcore("megatron.core.parallel_state")
    cuda = torch.cuda.is_available()
    owns = _join_process_group(mcfg, cuda=cuda)
    world, rank = dist.get_world_size(), dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    tp, cp, pp = mcfg.tensor_model_parallel_size, mcfg.context_parallel_size, mcfg.pipeline_model_parallel_size
    ep, etp = mcfg.expert_model_parallel_size, mcfg.resolved_expert_tensor_parallel_size
    if world % (tp * cp * pp):
        raise ValueError(
            f"world size {world} is not a multiple of --tensor-model-parallel-size={tp} x --context-parallel-size={cp} x --pipeline-model-parallel-size={pp}"
        )
    if world % (ep * etp):
        raise ValueError(
            f"world size {world} is not a multiple of --expert-model-parallel-size={ep} x --expert-tensor-parallel-size={etp}"
        )
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            context_parallel_size=cp,
            expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp,
            distributed_timeout_minutes=mcfg.distributed_timeout_minutes,
            create_gloo_process_groups=True,
        )
    if cuda:
        mcore("megatron.core.tensor_parallel").model_parallel_cuda_manual_seed(seed)
    torch.manual_seed(seed)
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    return _context(ps, rank=rank, world=world, local_rank=local_rank, device=device, control=control, owns=owns)


def _join_process_group(mcfg: MegatronConfig, *, cuda: bool) -> bool:
    """Create the default process group unless one exists (one rank without torchrun: a world of 1);
    True when this call created it."""
    if dist.is_initialized():
        return False
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        timeout=datetime.timedelta(minutes=mcfg.distributed_timeout_minutes),
        device_id=torch.device("cuda", local_rank) if cuda else None,
    )
    return True


def _context(
    ps: ModuleType,
    *,
    rank: int,
    world: int,
    local_rank: int,
    device: torch.device,
    control: dist.ProcessGroup,
    owns: bool,
) -> ParallelContext:
    """The ``ParallelContext`` of megatron's initialised parallel state ``ps`` (``megatron.core.parallel_state``)."""
    return ParallelContext(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        device=device,
        tp_size=ps.get_tensor_model_parallel_world_size(),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        tp_group=ps.get_tensor_model_parallel_group(),
        dp_size=ps.get_data_parallel_world_size(),
        dp_rank=ps.get_data_parallel_rank(),
        dp_group=ps.get_data_parallel_group(),
        control_group=control,
        owns_process_group=owns,
        cp_size=ps.get_context_parallel_world_size(),
        cp_rank=ps.get_context_parallel_rank(),
        cp_group=ps.get_context_parallel_group(),
        pp_size=ps.get_pipeline_model_parallel_world_size(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        pp_group=ps.get_pipeline_model_parallel_group(),
        ep_size=ps.get_expert_model_parallel_world_size(),
        ep_rank=ps.get_expert_model_parallel_rank(),
        etp_size=ps.get_expert_tensor_parallel_world_size(),
        etp_rank=ps.get_expert_tensor_parallel_rank(),
        expert_dp_rank=ps.get_expert_data_parallel_rank(),
        expert_group=ps.get_expert_tensor_and_model_parallel_group(),
    )


class ControlChannel:
    """Rank 0 sends (command, payload); every other rank receives the same pair, in order."""

    def __init__(self, ctx: ParallelContext):
        self.ctx = ctx

    def send(self, command: str, payload: object = None) -> None:
        assert self.ctx.is_driver, "only rank 0 sends commands"
        if self.ctx.world_size > 1:
            dist.broadcast_object_list([command, payload], src=0, group=self.ctx.control_group)

    def recv(self) -> tuple[str, object]:
        box: list[object] = [None, None]
        dist.broadcast_object_list(box, src=0, group=self.ctx.control_group)
        return str(box[0]), box[1]
