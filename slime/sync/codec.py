"""Delta encoding of weights: only what changed since the version the engine holds, bit-exact.

Per tensor, ``old`` (what the engine holds) and ``new`` (the trainer's), in the engine's dtype:

| encoding | payload | wins when |
| --- | --- | --- |
| (absent) | nothing | the tensor is bit-identical |
| ``sparse`` | zlib(byte planes of uint32 index gaps) + zlib(byte planes of each changed element's bit-pattern step ``new_bits - old_bits`` mod 2^k) | few elements changed (frozen rows, small steps on a bf16 engine: mostly steps of +-1 ulp) |
| ``diff`` | zlib(byte planes of ``new - old``) + exceptions (int64 index, raw value) | every element moved a little (an AdamW step) |
| ``raw`` | the tensor itself | nothing smaller (and every tensor of a full sync) |

The encoder tries the encodings that apply and keeps the smallest. Why ``diff`` of the values and
not XOR of the bits: after one Adam step every element moves by about ``lr`` (Adam's first update is
``lr * m/sqrt(v) ~ lr * sign(g)``), so ``new - old`` (exact in floating point when the two are within
a factor of 2, Sterbenz) has nearly one exponent and few significant bits, while XOR and integer
differences depend on each weight's own exponent. Byte planes (all first bytes, then all second
bytes, ...) put the predictable sign/exponent bytes together for zlib. Measured numbers are in
``docs/benchmarks.md``; in short, a full-parameter fp32 AdamW step does not compress to 5 %.

Exactness: the decoder computes ``old + d`` in the tensor's dtype (IEEE addition, the same on both
sides); the encoder runs that same addition, and every element it does not reproduce bit for bit
(large relative steps, -0.0, whatever else the addition rounds) goes into the exceptions. Each tensor also
carries the sha256 of ``new`` (``wire.tensor_checksum``) for the receiver to verify.

Payload: one safetensors file; part tensors are named ``"<name>::<part>"`` (raw tensors keep their
own name), and ``__metadata__["slime_delta"]`` is JSON ``{"format": 1, "control": {...}, "tensors":
{name: {"encoding", "dtype", "shape", "sha256", "num_changed"}}}``. ``control`` holds the update's
``weight_version``, ``base_weight_version`` (null = no check), ``abort_all_requests``, ``flush_cache``.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from slime.sync.wire import dtype_from_name, dtype_name, tensor_checksum

__all__ = ["EncodedTensor", "encode_tensor", "decode_tensor", "encode_payload", "decode_payload", "ZLIB_LEVEL"]

ZLIB_LEVEL = 1
"""zlib level of the delta parts. On the 1.6M-parameter warm-start model after one AdamW step:
level 1 gives 20.0 % of fp32 in 0.08 s, level 6 gives 16.8 % in 0.53 s (docs/benchmarks.md)."""
_FORMAT = 1
_SPARSE_MAX_FRACTION = 0.5  # past this, sparse (index + value per element) cannot beat raw
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class EncodedTensor:
    """One tensor of a delta payload: ``parts`` are the safetensors entries, ``meta`` its metadata."""

    name: str
    encoding: str
    meta: dict[str, Any]
    parts: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.parts.values())


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(_INT_VIEW[t.element_size()])


def _pack(arr: np.ndarray, level: int) -> torch.Tensor:
    """zlib of the byte planes of a 1-D array, as a uint8 tensor."""
    k = arr.dtype.itemsize
    planes = np.ascontiguousarray(arr.view(np.uint8).reshape(-1, k).T)
    return torch.frombuffer(
        bytearray(
            zlib.compress(planes, level)  # type: ignore[arg-type]  # a contiguous ndarray is a buffer; numpy's stubs do not say so
        ),
        dtype=torch.uint8,
    )


def _unpack(blob: torch.Tensor, dtype: np.typing.DTypeLike, n: int) -> np.ndarray:
    k = np.dtype(dtype).itemsize
    planes = np.frombuffer(zlib.decompress(blob.numpy().tobytes()), dtype=np.uint8)
    if planes.size != n * k:
        raise ValueError(f"delta part decodes to {planes.size} bytes, expected {n} x {k}")
    return np.ascontiguousarray(planes.reshape(k, n).T).view(dtype).reshape(n)


def _np(t: torch.Tensor) -> np.ndarray:
    return _bits(t.contiguous()).numpy()  # bit patterns: numpy has no bfloat16


def _unsigned(t: torch.Tensor) -> np.ndarray:
    a = _np(t)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def encode_tensor(
    name: str, old: torch.Tensor | None, new: torch.Tensor, *, level: int = ZLIB_LEVEL, full: bool = False
) -> EncodedTensor | None:
    """The smallest bit-exact encoding of ``new`` given ``old`` (same dtype and shape); None when
    unchanged. ``old=None`` or ``full=True``: ``raw``.

    Raises:
        ValueError: ``old`` and ``new`` differ in dtype or shape.
    """
    new = new.detach().cpu().contiguous()
    meta = {
        "dtype": dtype_name(new.dtype),
        "shape": list(new.shape),
        "sha256": tensor_checksum(new),
        "num_changed": new.numel(),
    }
    raw = EncodedTensor(name, "raw", {**meta, "encoding": "raw"}, {name: new})
    if old is None or full:
        return raw
    old = old.detach().cpu().contiguous()
    if old.dtype != new.dtype or old.shape != new.shape:
        raise ValueError(f"{name}: old {old.dtype} {tuple(old.shape)} vs new {new.dtype} {tuple(new.shape)}")
    changed = _bits(old) != _bits(new)
    num_changed = int(changed.sum())
    if num_changed == 0:
        return None
    meta["num_changed"] = num_changed
    candidates = [raw]
    if num_changed <= _SPARSE_MAX_FRACTION * new.numel() and new.numel() < 2**32:  # gaps are uint32
        idx = changed.nonzero().reshape(-1)
        gaps = torch.diff(idx, prepend=torch.tensor([-1])).to(torch.int64).numpy().astype(np.uint32)
        steps = _unsigned(new.reshape(-1)[idx]) - _unsigned(old.reshape(-1)[idx])  # modular: always exact
        parts = {f"{name}::idx": _pack(gaps, level), f"{name}::step": _pack(steps, level)}
        candidates.append(EncodedTensor(name, "sparse", {**meta, "encoding": "sparse"}, parts))
    if new.is_floating_point():
        d = new - old
        miss = (_bits(old + d) != _bits(new)).nonzero().reshape(-1)
        parts = {f"{name}::diff": _pack(_np(d), level)}
        if miss.numel():
            parts[f"{name}::xidx"] = miss.to(torch.int64)
            parts[f"{name}::xval"] = new.reshape(-1)[miss].contiguous()
        candidates.append(
            EncodedTensor(name, "diff", {**meta, "encoding": "diff", "num_exceptions": miss.numel()}, parts)
        )
    return min(candidates, key=lambda e: e.nbytes)


def decode_tensor(
    name: str, meta: dict[str, Any], parts: dict[str, torch.Tensor], old: torch.Tensor | None
) -> torch.Tensor:
    """Rebuild ``new`` from its encoding and ``old`` (the receiver's current tensor).

    Raises:
        ValueError: unknown encoding, missing parts, or ``old`` of another dtype / shape.
    """
    encoding, dtype, shape = meta["encoding"], dtype_from_name(meta["dtype"]), torch.Size(meta["shape"])
    if encoding == "raw":
        return parts[name]
    if encoding not in ("sparse", "diff"):
        raise ValueError(f"{name}: unknown delta encoding {encoding!r}")
    if old is None or old.dtype != dtype or old.shape != shape:
        have = "nothing" if old is None else f"{old.dtype} {tuple(old.shape)}"
        raise ValueError(
            f"{name}: a {encoding} delta needs the old {dtype} {tuple(shape)} tensor, the engine has {have}"
        )
    old = old.detach().cpu().contiguous()
    view_np = _np(old).dtype
    try:
        if encoding == "sparse":
            k = meta["num_changed"]
            idx = torch.from_numpy(np.cumsum(_unpack(parts[f"{name}::idx"], np.uint32, k).astype(np.int64)) - 1)
            base = _unsigned(old.reshape(-1)[idx])
            bits = base + _unpack(parts[f"{name}::step"], base.dtype, k)
            new = old.clone().reshape(-1)
            new[idx] = torch.from_numpy(bits.view(view_np)).view(dtype)
            return new.reshape(shape)
        d = torch.from_numpy(_unpack(parts[f"{name}::diff"], view_np, old.numel())).view(dtype).reshape(shape)
        new = (old + d).reshape(-1)
        if f"{name}::xidx" in parts:
            new[parts[f"{name}::xidx"]] = parts[f"{name}::xval"]
        return new.reshape(shape)
    except KeyError as exc:
        raise ValueError(f"{name}: the {encoding} delta lacks its part {exc.args[0]!r}") from None


def encode_payload(tensors: list[EncodedTensor], control: dict[str, Any]) -> bytes:
    """One safetensors file holding every part, the per-tensor metadata and ``control``."""
    header = {"format": _FORMAT, "control": control, "tensors": {e.name: e.meta for e in tensors}}
    parts = {k: v for e in tensors for k, v in e.parts.items()}
    return st_save(parts, metadata={"slime_delta": json.dumps(header)})


def decode_payload(blob: bytes) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, torch.Tensor]]:
    """``(control, {name: meta}, parts)`` of a payload. Raises ValueError if it is not one."""
    try:
        n = int.from_bytes(blob[:8], "little")
        header = json.loads(json.loads(blob[8 : 8 + n])["__metadata__"]["slime_delta"])
        parts = st_load(blob)
    except Exception as exc:  # any malformed input: bad length, JSON, missing key, safetensors error
        raise ValueError(f"not a slime delta payload ({len(blob)} bytes): {type(exc).__name__}: {exc}") from None
    if header.get("format") != _FORMAT:
        raise ValueError(f"delta payload format {header.get('format')!r}, expected {_FORMAT}")
    return header["control"], header["tensors"], parts
