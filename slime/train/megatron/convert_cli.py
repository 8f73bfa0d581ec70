"""``slime convert``: HF directory <-> megatron-core distributed checkpoint.

    slime convert --hf-checkpoint HF_DIR --save MCORE_DIR --to megatron
    slime convert --load MCORE_DIR --save HF_DIR --to hf

``--to megatron`` builds the GPTModel of ``slime.train.megatron.model`` in one process (TP=1,
parameters on the CPU, in the checkpoint's dtype), loads the HF weights into it and saves
``model.sharded_state_dict()`` with ``megatron.core.dist_checkpointing``; megatron-core reshards
that format on load, so any TP size can read it. Next to the checkpoint, ``hf_config/`` keeps the
HF config, generation config and tokenizer files, and ``slime_megatron.json`` the dtype, which
``--to hf`` needs to rebuild the same model.

``--to hf`` rebuilds that model, loads the distributed checkpoint into it and writes an HF
directory (config, tokenizer files, safetensors shards; ``weights.write_hf_dir``).

megatron-core 0.16.1's checkpoint writer and reader call ``torch.cuda.synchronize`` and place a
flag tensor on ``torch.cuda.current_device()``, so both directions need a CUDA device (run them on
a GPU machine); the conversion itself is pure tensor code (``convert.py``) and runs anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import warnings
from collections.abc import Iterator, Sequence

import torch

from slime.config import MegatronConfig
from slime.errors import CheckpointError
from slime.hf_checkpoint import check_hf_dir
from slime.train.checkpoint import TOKENIZER_FILES
from slime.train.megatron._mcore import mcore
from slime.train.megatron.arch import ModelArch, load_hf_config
from slime.train.megatron.convert_state import iter_mcore_to_hf
from slime.train.megatron.deepseek_moe import named_weights
from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config
from slime.train.megatron.parallel import init_parallel
from slime.train.megatron.weights import CONFIG_FILES, write_hf_dir

__all__ = ["main", "build_parser", "hf_to_megatron", "megatron_to_hf"]

log = logging.getLogger(__name__)

HF_CONFIG_DIR = "hf_config"
META_FILE = "slime_megatron.json"


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="slime convert", description="HF <-> megatron-core distributed checkpoint"
    )
    parser.add_argument("--to", required=True, choices=["megatron", "hf"], help="target format")
    parser.add_argument("--hf-checkpoint", help="HF model directory (with --to megatron)")
    parser.add_argument("--load", help="megatron-core distributed checkpoint written by this command (with --to hf)")
    parser.add_argument("--save", required=True, help="output directory")
    return parser


def _model(arch: ModelArch, dtype: torch.dtype):
    # one process: no token dispatch between ranks; "allgather" is the dispatcher that builds without CUDA streams
    config = transformer_config(
        arch, MegatronConfig(moe_token_dispatcher_type="allgather"), use_cpu_initialization=True, params_dtype=dtype
    )
    return build_gpt_model(arch, config, tp_size=1)


@contextlib.contextmanager
def _quiet_torch_deprecations() -> Iterator[None]:
    """megatron-core's checkpoint I/O calls torch.distributed.checkpoint in ways newer torch warns
    about: deprecated APIs (``ShardedTensor``, ``dcp.load_state_dict``; 0.16), ``dcp.load`` with
    positional arguments (0.18) and with ``no_dist=True`` (0.19). Warnings about megatron's code,
    not ours, silenced for that call only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message=r"The argument order of \w+ has been changed", category=UserWarning)
        warnings.filterwarnings(
            "ignore", message=r"torch\.distributed is disabled, unavailable or uninitialized", category=UserWarning
        )
        yield


def _needs_cuda(exc: BaseException) -> bool:
    return "CUDA" in str(exc) or "cuda" in str(exc)


def hf_to_megatron(hf_dir: str, out_dir: str) -> str:
    """Write ``hf_dir``'s weights as a megatron-core distributed checkpoint at ``out_dir``; return it.

    Needs megatron's parallel state (``init_parallel``) with TP=1.
    """
    dist_ckpt = mcore("megatron.core.dist_checkpointing")
    arch = ModelArch.from_hf_config(load_hf_config(hf_dir))
    reader = HFCheckpointReader(hf_dir)
    dtype = reader[reader.keys()[0]].dtype
    model = _model(arch, dtype)
    load_hf_weights(model, reader, arch, tp_size=1, tp_rank=0)
    os.makedirs(out_dir, exist_ok=True)
    if os.listdir(out_dir):
        raise FileExistsError(f"--save {out_dir} is not empty; a distributed checkpoint needs an empty directory")
    try:
        with _quiet_torch_deprecations():
            dist_ckpt.save(model.sharded_state_dict(), out_dir)
    except (AssertionError, RuntimeError) as exc:
        for name in os.listdir(out_dir):  # it was empty: leave no half-written checkpoint behind
            path = os.path.join(out_dir, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        if _needs_cuda(exc):
            raise ConvertError(
                "megatron-core's dist_checkpointing needs a CUDA device to write; run slime convert on a GPU machine"
            ) from exc
        raise
    meta_dir = os.path.join(out_dir, HF_CONFIG_DIR)
    os.makedirs(meta_dir, exist_ok=True)
    for name in (*CONFIG_FILES, *TOKENIZER_FILES):
        if os.path.isfile(os.path.join(hf_dir, name)):
            shutil.copy2(os.path.join(hf_dir, name), os.path.join(meta_dir, name))
    with open(os.path.join(out_dir, META_FILE), "w") as f:
        json.dump(
            {
                "params_dtype": str(dtype).removeprefix("torch."),
                "format": "megatron-core dist_checkpointing",
                "source": os.path.abspath(hf_dir),
            },
            f,
            indent=2,
        )
    return out_dir


class ConvertError(RuntimeError):
    """A conversion this machine cannot do (e.g. no CUDA device for megatron's distributed checkpoints)."""


def megatron_to_hf(mcore_dir: str, out_dir: str) -> str:
    """Write the distributed checkpoint at ``mcore_dir`` (from ``hf_to_megatron``) as an HF directory."""
    dist_ckpt = mcore("megatron.core.dist_checkpointing")
    meta_dir = os.path.join(mcore_dir, HF_CONFIG_DIR)
    if not os.path.isfile(os.path.join(mcore_dir, META_FILE)):
        raise FileNotFoundError(
            f"{mcore_dir}: no {META_FILE}; expected a checkpoint written by `slime convert --to megatron`"
        )
    with open(os.path.join(mcore_dir, META_FILE)) as f:
        dtype = getattr(torch, json.load(f)["params_dtype"])
    arch = ModelArch.from_hf_config(load_hf_config(meta_dir))
    model = _model(arch, dtype)
    try:
        with _quiet_torch_deprecations():
            state = dist_ckpt.load(model.sharded_state_dict(), mcore_dir)
    except (AssertionError, RuntimeError) as exc:
        if _needs_cuda(exc):
            raise ConvertError(
                "megatron-core's dist_checkpointing needs a CUDA device to read; run slime convert on a GPU machine"
            ) from exc
        raise
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
    if missing:
        raise RuntimeError(f"{mcore_dir}: the checkpoint lacks {missing}")
    params = {name: t.detach() for name, t in named_weights(model).items()}  # with the routers' expert bias buffers
    return write_hf_dir(iter_mcore_to_hf([params], arch), out_dir, source_dir=meta_dir)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``slime convert``; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.to == "megatron" and not args.hf_checkpoint:
        raise SystemExit("slime convert --to megatron needs --hf-checkpoint HF_DIR")
    if args.to == "hf" and not args.load:
        raise SystemExit("slime convert --to hf needs --load MCORE_DIR (a checkpoint written by --to megatron)")
    try:  # the input's files before megatron's parallel state: a bad file is one line, at once
        if args.to == "megatron":
            check_hf_dir(args.hf_checkpoint, flag="--hf-checkpoint")
    except CheckpointError as exc:
        print(f"slime convert: error: {exc}", file=sys.stderr)
        return 2
    ctx = init_parallel(MegatronConfig(), seed=0)
    try:
        if ctx.world_size != 1:
            raise SystemExit(f"slime convert runs as one process; got world size {ctx.world_size}")
        out = (
            hf_to_megatron(args.hf_checkpoint, args.save)
            if args.to == "megatron"
            else megatron_to_hf(args.load, args.save)
        )
    except (ConvertError, CheckpointError, FileExistsError, FileNotFoundError) as exc:
        print(f"slime convert: error: {exc}", file=sys.stderr)
        return 2
    finally:
        ctx.close()
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
