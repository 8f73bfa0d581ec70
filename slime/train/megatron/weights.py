"""Live megatron weights -> HF tensors on rank 0, one parameter at a time; and writing an HF directory.

``iter_hf_weights`` walks the model's parameters in order. A tensor-parallel parameter is
gathered from the TP ranks of data-parallel replica 0 onto global rank 0 (``dist.gather``), turned
into its HF tensors (``convert.mcore_param_to_hf``) and moved to the CPU; then the next one. So
the full model exists once, on rank 0's CPU, and the GPUs only ever hold one gathered parameter
extra. Other data-parallel replicas hold the same weights and take no part. A routed expert's
parameter (MoE) is gathered the same way over the ETP x EP ranks of expert replica 0
(``ParallelContext.expert_group``, whose rank 0 is global rank 0): local expert j of EP rank r
becomes HF expert ``r * num_experts / EP + j``. Context-parallel ranks hold replicas too (only
CP rank 0 takes part). Under pipeline parallelism a parameter of stage s > 0 is gathered onto that
stage's TP rank 0, which sends the shards to rank 0 over the pipeline group (shape first, then
data); the tied output layer of the last stage is the embedding's copy and is not sent.

``write_hf_dir`` writes those tensors as safetensors shards of at most ``max_shard_bytes``, with
``model.safetensors.index.json`` when there is more than one, plus ``config.json`` and the
tokenizer files copied from the source HF directory, into a temporary sibling renamed into place
(readers never see a half-written directory, as in ``slime.train.checkpoint``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from slime.train.checkpoint import TOKENIZER_FILES, copy_source_files, swap_into_place
from slime.train.megatron.arch import ModelArch
from slime.train.megatron.convert import (
    is_expert,
    is_tensor_parallel,
    mcore_names,
    mcore_param_to_hf,
    pipeline_stage,
    stage_names,
)
from slime.train.megatron.deepseek_moe import named_weights
from slime.train.megatron.parallel import ParallelContext

__all__ = ["iter_hf_weights", "write_hf_dir", "unwrap"]

CONFIG_FILES = ("config.json", "generation_config.json")


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The ``GPTModel`` inside megatron's DDP / ``Float16Module`` wrappers."""
    while hasattr(model, "module"):
        model = getattr(model, "module")  # noqa: B009  # the wrappers' attribute (DDP, Float16Module)
    return model


def iter_hf_weights(
    model: torch.nn.Module, arch: ModelArch, ctx: ParallelContext, *, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, Tensor]]:
    """HF ``(name, tensor)`` pairs of ``model``'s current weights, yielded on rank 0 only.

    Every rank must iterate to the end (the gathers are collective: ranks of data-parallel
    replica 0 join the dense gathers, ranks of expert replica 0 the expert ones); only rank 0
    yields. Tensors are on the CPU, in ``dtype`` (default: the
    parameters' dtype).

    Args:
        model: the trained model (wrappers allowed).
        arch: its architecture.
        ctx: ``ParallelContext`` (rank, tp size/rank/group, dp rank, cp rank, pp size/rank/group;
            ep/etp sizes, expert dp rank and expert group for MoE models).
    """
    params = named_weights(unwrap(model))  # with the routers' expert bias, which the engine serves too
    ep_size = getattr(ctx, "ep_size", 1)
    pp_size, pp_rank = getattr(ctx, "pp_size", 1), getattr(ctx, "pp_rank", 0)
    local_name = {
        g: n
        for n, g in stage_names(arch, pp_size=pp_size, pp_rank=pp_rank, ep_size=ep_size).items()
        if pipeline_stage(g, arch, pp_size) == pp_rank
    }
    for name in mcore_names(arch, ep_size=ep_size):
        if is_expert(name):
            if ctx.expert_dp_rank != 0:
                continue
            yield from _gather_expert(name, params[name].detach(), arch, ctx, dtype)
            continue
        if ctx.dp_rank != 0 or getattr(ctx, "cp_rank", 0) != 0:
            continue
        stage = pipeline_stage(name, arch, pp_size)
        shards = None
        if stage == pp_rank:
            shards = _gather_tensor_parallel(name, params[local_name[name]].detach(), ctx)
            if stage != 0 and shards is not None:  # this stage's leader -> rank 0
                _send_shards(shards, ctx)
        elif ctx.is_driver:
            assert ctx.pp_group is not None, "a parameter of another stage without a pipeline group"  # pp_size > 1 here
            count = ctx.tp_size if ctx.tp_size > 1 and is_tensor_parallel(name) else 1
            first = next(iter(params.values()))
            shards = _recv_shards(
                count, dist.get_global_rank(ctx.pp_group, stage), ctx, dtype=first.dtype, device=first.device
            )
        if ctx.is_driver:
            if shards is None:  # rank 0 is TP rank 0 of stage 0, or received the shards above
                raise RuntimeError(
                    f"export of {name}: rank 0 holds no shards (expected it to be TP rank 0 of pipeline stage 0)"
                )
            for hf_name, tensor in mcore_param_to_hf(name, shards, arch).items():
                yield hf_name, tensor.to("cpu", dtype=dtype or tensor.dtype)


def _gather_tensor_parallel(name: str, local: Tensor, ctx: ParallelContext) -> list[Tensor] | None:
    """This stage's shards of parameter ``name`` on its TP rank 0 (the local tensor alone when it is not
    TP-sharded); None on the other TP ranks. Collective over the TP group for a sharded parameter."""
    if ctx.tp_size > 1 and is_tensor_parallel(name):
        leader = ctx.tp_rank == 0
        shards = [torch.empty_like(local) for _ in range(ctx.tp_size)] if leader else None
        dist.gather(local.contiguous(), shards, dst=dist.get_global_rank(ctx.tp_group, 0), group=ctx.tp_group)
        return shards
    return [local] if ctx.tp_rank == 0 else None


def _send_shards(shards: list[Tensor], ctx: ParallelContext) -> None:
    """A later stage's shards to rank 0 over the pipeline group: each one's shape (rank, then up to 3 sizes), then its data."""
    for shard in shards:
        shape = torch.tensor(
            [shard.dim(), *shard.shape] + [0] * (3 - shard.dim()), dtype=torch.int64, device=shard.device
        )
        dist.send(shape, dst=0, group=ctx.pp_group)
        dist.send(shard.contiguous(), dst=0, group=ctx.pp_group)


def _recv_shards(
    count: int, src: int, ctx: ParallelContext, *, dtype: torch.dtype, device: torch.device
) -> list[Tensor]:
    """Rank 0: the ``count`` shards ``_send_shards`` sends from global rank ``src``."""
    shards = []
    for _ in range(count):
        shape = torch.zeros(4, dtype=torch.int64, device=device)
        dist.recv(shape, src=src, group=ctx.pp_group)
        buf = torch.empty(shape[1 : 1 + int(shape[0])].tolist(), dtype=dtype, device=device)
        dist.recv(buf, src=src, group=ctx.pp_group)
        shards.append(buf)
    return shards


def _gather_expert(
    name: str, local: Tensor, arch: ModelArch, ctx: ParallelContext, dtype: torch.dtype | None
) -> Iterator[tuple[str, Tensor]]:
    """One routed-expert parameter from every ETP x EP rank of expert replica 0, as HF tensors on rank 0.

    The group's ranks are ordered etp fastest (megatron-core's "tp-ep-dp" expert grid), so
    gathered shard ``k`` is ETP rank ``k % etp_size`` of EP rank ``k // etp_size``.
    """
    ep, etp = ctx.ep_size, ctx.etp_size
    if ep * etp > 1:
        shards = [torch.empty_like(local) for _ in range(ep * etp)] if ctx.is_driver else None
        dist.gather(local.contiguous(), shards, dst=0, group=ctx.expert_group)
    else:
        shards = [local]
    if not ctx.is_driver:
        return
    assert shards is not None  # the driver allocated the gather's buffers above
    for ep_rank in range(ep):
        for hf_name, tensor in mcore_param_to_hf(
            name, shards[ep_rank * etp : (ep_rank + 1) * etp], arch, ep_size=ep, ep_rank=ep_rank
        ).items():
            yield hf_name, tensor.to("cpu", dtype=dtype or tensor.dtype)


def write_hf_dir(
    tensors: Iterable[tuple[str, Tensor]], out_dir: str, *, source_dir: str, max_shard_bytes: int = 2 << 30
) -> str:
    """Write ``tensors`` as an HF model directory at ``out_dir``, atomically; return its absolute path.

    Args:
        tensors: (HF name, CPU tensor) pairs, consumed once.
        out_dir: target directory; its parent is created, an existing one is replaced.
        source_dir: HF directory whose config.json, generation_config.json and tokenizer files
            are copied.
        max_shard_bytes: size bound of one safetensors file (a bigger single tensor gets its own).
    """
    out = os.path.abspath(out_dir)
    parent, name = os.path.split(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    try:
        os.chmod(tmp, 0o755)
        files, weight_map, total = _write_shards(tensors, tmp, max_shard_bytes)
        _name_shards(tmp, files, weight_map, total)
        copy_source_files(source_dir, tmp, (*CONFIG_FILES, *TOKENIZER_FILES))
        swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_shards(
    tensors: Iterable[tuple[str, Tensor]], tmp: str, max_shard_bytes: int
) -> tuple[list[str], dict[str, str], int]:
    """``tensors`` as safetensors files ``shard-NNNNN.safetensors`` in ``tmp``, each of at most
    ``max_shard_bytes`` (a bigger single tensor gets its own; one empty file when there is no tensor).

    Returns:
        the file names in order, HF name -> its file, and the total bytes of the tensors.
    """
    from safetensors.torch import save_file

    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    files: list[str] = []
    weight_map: dict[str, str] = {}
    total = 0

    def flush() -> None:
        fname = f"shard-{len(files):05d}.safetensors"
        save_file(shards[-1], os.path.join(tmp, fname), metadata={"format": "pt"})
        files.append(fname)
        weight_map.update({k: fname for k in shards[-1]})
        shards[-1] = {}

    for hf_name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            flush()
            size = 0
        shards[-1][hf_name] = tensor.contiguous()
        size += nbytes
        total += nbytes
    if shards[-1] or not files:
        flush()
    return files, weight_map, total


def _name_shards(tmp: str, files: list[str], weight_map: dict[str, str], total: int) -> None:
    """``_write_shards``'s files in ``tmp`` under their HF names: ``model.safetensors`` when there is one,
    else ``model-NNNNN-of-NNNNN.safetensors`` with ``model.safetensors.index.json`` (total size, weight map)."""
    if len(files) == 1:
        os.rename(os.path.join(tmp, files[0]), os.path.join(tmp, "model.safetensors"))
        return
    renamed = {f: f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i, f in enumerate(files)}
    for old, new in renamed.items():
        os.rename(os.path.join(tmp, old), os.path.join(tmp, new))
    index = {
        "metadata": {"total_size": total},
        "weight_map": {k: renamed[v] for k, v in sorted(weight_map.items())},
    }
    with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
