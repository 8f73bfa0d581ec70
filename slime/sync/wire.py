"""Tensor payloads shared by the trainer side (``slime/sync/``) and the embedded engine.

Nothing here does I/O. Four pieces:

* ``buckets``: split named tensors into groups of at most ``max_bytes`` (``--update-weight-buffer-size``);
* ``flatten`` / ``unflatten``: one uint8 buffer per bucket, byte-compatible with SGLang's
  ``FlattenedTensorBucket`` (``load_format="flattened_bucket"``): each tensor's bytes in list order;
* ``tensor_checksum``: sha256 of a tensor's raw bytes (the delta sync compares these);
* the ``/update_weights_from_tensor`` payload. Real SGLang (docs/sglang.md#update-weights-from-tensor) expects base64 of a torch
  ``ForkingPickler`` pickle of ``[(name, tensor), ...]``: for CUDA tensors that pickle carries CUDA
  IPC handles, so only a process on the same node with the GPU visible can open it
  (``serialize_cuda_ipc``, guarded to CUDA tensors). Unpickling runs code, so the embedded engine
  never unpickles: it takes base64 of a safetensors file instead (``serialize_safetensors``), which
  real SGLang would refuse.
"""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Iterable, Sequence

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

__all__ = [
    "NamedTensors",
    "buckets",
    "bucket_indices",
    "dtype_name",
    "dtype_from_name",
    "flatten",
    "unflatten",
    "tensor_checksum",
    "serialize_safetensors",
    "deserialize_safetensors",
    "serialize_cuda_ipc",
    "is_pickle",
]

NamedTensors = list[tuple[str, torch.Tensor]]


_MLA_Q_A, _MLA_KV_A = "self_attn.q_a_proj.weight", "self_attn.kv_a_proj_with_mqa.weight"


def buckets(named: Iterable[tuple[str, torch.Tensor]], max_bytes: int) -> list[NamedTensors]:
    """Consecutive groups of tensors of at most ``max_bytes`` each, order kept; a larger tensor goes alone.

    One exception: a layer's ``q_a_proj`` and the ``kv_a_proj_with_mqa`` after it stay in one bucket (the bucket
    grows past ``max_bytes`` by what lies between them). SGLang 0.5.17's MLA models (DeepSeek-V3, GLM-4.7-Flash)
    fuse the two into ``fused_qkv_a_proj_with_mqa`` only when both arrive in one ``load_weights`` call; apart,
    the layer keeps its old projection without an error.

    Example: sizes [4, 4, 4, 12, 2] bytes, ``max_bytes=8`` -> [[4, 4], [4], [12], [2]].
    """
    items = list(named)
    sizes = [(name, t.numel() * t.element_size()) for name, t in items]
    return [[items[i] for i in group] for group in bucket_indices(sizes, max_bytes)]


def bucket_indices(sizes: Sequence[tuple[str, int]], max_bytes: int) -> list[list[int]]:
    """``buckets``' rule over (name, bytes) pairs: the index groups, so any payload type can be split alike
    (the delta sync's encoded tensors too). Raises ``ValueError`` when ``max_bytes`` < 1."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    out: list[list[int]] = []
    current: list[int] = []
    size = 0
    open_q_a: set[str] = set()  # layers whose q_a_proj is in ``current``, their kv_a_proj_with_mqa not yet
    for i, (name, nbytes) in enumerate(sizes):
        if current and size + nbytes > max_bytes and not open_q_a:
            out.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
        if name.endswith(_MLA_Q_A):
            open_q_a.add(name[: -len(_MLA_Q_A)])
        elif name.endswith(_MLA_KV_A):
            open_q_a.discard(name[: -len(_MLA_KV_A)])
    if current:
        out.append(current)
    return out


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (SGLang's ``dtypes`` field spells torch attribute names)."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``. Raises ValueError for anything that is not a torch dtype."""
    dtype = getattr(torch, name, None) if name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} (expected a torch dtype name such as 'float32' or 'bfloat16')")
    return dtype


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """[sum of nbytes] uint8: every tensor's bytes, in order (SGLang's FlattenedTensorBucket layout)."""
    return torch.cat([_as_bytes(t) for t in tensors]) if tensors else torch.empty(0, dtype=torch.uint8)


def unflatten(flat: torch.Tensor, dtypes: Sequence[torch.dtype], shapes: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Tensors read from ``flat`` (uint8) for each (dtype, shape), in order: views where the offset is
    aligned to the element size, copies where it is not. Raises ValueError on a size mismatch."""
    itemsizes = [torch.empty((), dtype=dtype).element_size() for dtype in dtypes]
    sizes = [torch.Size(shape).numel() * size for shape, size in zip(shapes, itemsizes, strict=True)]
    if sum(sizes) != flat.numel():
        raise ValueError(f"flattened bucket holds {flat.numel()} bytes, the metadata describes {sum(sizes)}")
    out, start = [], 0
    for dtype, shape, itemsize, nbytes in zip(dtypes, shapes, itemsizes, sizes):
        piece = flat[start : start + nbytes]
        out.append((piece if start % itemsize == 0 else piece.clone()).view(dtype).reshape(shape))
        start += nbytes
    return out


def tensor_checksum(t: torch.Tensor) -> str:
    """sha256 hex of the tensor's bytes (C order); equal checksums mean bit-identical values."""
    return hashlib.sha256(_as_bytes(t.cpu()).numpy().data).hexdigest()


def serialize_safetensors(named: NamedTensors) -> str:
    """base64 of a safetensors file holding ``named`` (the embedded engine's safe payload)."""
    blob = st_save({name: t.detach().cpu().contiguous() for name, t in named})
    return base64.b64encode(blob).decode("ascii")


def deserialize_safetensors(blob: bytes) -> dict[str, torch.Tensor]:
    """Inverse of ``serialize_safetensors`` after base64 decoding. Raises ValueError on a bad file."""
    try:
        return st_load(blob)
    except Exception as exc:  # safetensors raises its own SafetensorError / OSError variants
        raise ValueError(f"not a safetensors payload ({len(blob)} bytes): {exc}") from None


def is_pickle(blob: bytes) -> bool:
    """Pickles of protocol >= 2 start with the PROTO opcode (0x80); safetensors starts with a length."""
    return blob[:1] == b"\x80"


def serialize_cuda_ipc(named: NamedTensors) -> str:
    """base64 of a ``ForkingPickler`` pickle of ``named`` as real SGLang's ``MultiprocessingSerializer``
    makes it (docs/sglang.md#update-weights-from-tensor). CUDA tensors only: the pickle holds IPC handles, so the caller must keep the
    tensors alive until the engine answered. If sglang is importable, its device-UUID reduction patch
    is applied (needed when trainer and engine see different ``CUDA_VISIBLE_DEVICES``).

    Raises:
        ValueError: a tensor is not on a CUDA device (a CPU tensor would pickle as a shared-memory
            file descriptor that cannot travel over HTTP).
    """
    not_cuda = [name for name, t in named if t.device.type != "cuda"]
    if not_cuda:
        raise ValueError(f"CUDA IPC payloads need CUDA tensors; {len(not_cuda)} are not (e.g. {not_cuda[0]!r})")
    from multiprocessing.reduction import ForkingPickler  # torch 2.11 no longer re-exports it

    import torch.multiprocessing as _torch_mp  # noqa: F401  (registers the CUDA tensor reductions; `as` keeps `torch` global)

    try:
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    except ImportError:  # sglang is not installed in the trainer's environment
        pass
    else:
        monkey_patch_torch_reductions()
    buf = io.BytesIO()
    ForkingPickler(buf).dump(named)
    return base64.b64encode(buf.getvalue()).decode("ascii")
