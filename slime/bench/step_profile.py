"""What an RL step's time is made of, for the trainer benchmarks (``slime.bench.trainer``).

- ``profile_summary`` / ``format_profile``: one call under ``torch.profiler``: kernel time by class, top
  kernels, GPU busy vs wall time, CUDA runtime calls (host syncs, kernel launches).
- ``GCPauses``: Python's garbage-collector pauses inside a block.
- ``host_events``: cumulative counters a step can hide (compiled graphs; allocator segments and retries).
"""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["GCPauses", "format_profile", "host_events", "profile_summary", "sync", "tally_events"]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_events(dev: torch.device) -> dict[str, float]:
    """Cumulative counters a step's time can hide: graphs torch.compile has compiled, and on CUDA the caching
    allocator's new segments (cudaMalloc) and its retries (free everything cached, then cudaMalloc again)."""
    from torch._dynamo.utils import counters

    out = {"graphs_compiled": float(counters["stats"].get("unique_graphs", 0))}
    if dev.type == "cuda":
        stats = torch.cuda.memory_stats(dev)
        out["new_segments"] = float(stats.get("segment.all.allocated", 0))
        out["alloc_retries"] = float(stats.get("num_alloc_retries", 0))
    return out


class GCPauses:
    """Python's garbage-collector pauses inside a ``with`` block: ``ms`` (all collections, wall) and ``full``
    (generation-2 collections). A full collection walks every tracked object (~0.3 s for the ~470k objects of
    torch + transformers + megatron-core on a slow CPU), a host stall a GPU-bound step hides and a
    launch-bound one does not."""

    def __init__(self) -> None:
        self.ms, self.full, self._t0 = 0.0, 0, 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.ms += (time.perf_counter() - self._t0) * 1e3
            self.full += info["generation"] == 2

    def __enter__(self) -> GCPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


_KERNEL_CLASSES = (  # first match wins: flash kernels' names contain "cutlass", so attention goes first
    ("attention", re.compile(r"flash|fmha|attn|attention", re.I)),
    ("matmul", re.compile(r"gemm|nvjet|cutlass|xmma|cublas|sm90_|addmm|^aten::mm$|^aten::bmm$", re.I)),
    ("triton (torch.compile fusions)", re.compile(r"^triton_", re.I)),
    ("optimizer (fused adam / foreach / l2norm)", re.compile(r"adam|foreach|multi_tensor|l2norm", re.I)),
    ("memcpy / memset", re.compile(r"memcpy|memset", re.I)),
)
_SYNC_CALLS = re.compile(r"^(cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|cuStreamSynchronize|cuCtxSynchronize)$")
_LAUNCH_CALLS = re.compile(r"^(cudaLaunchKernel|cudaLaunchKernelExC|cuLaunchKernel|cuLaunchKernelEx|cudaLaunchCooperativeKernel)$")


def tally_events(events: Iterable[Any], *, cuda: bool) -> tuple[dict[str, tuple[float, int]], int, int]:
    """``key_averages()`` rows -> ({name: (us, calls)}, host syncs, kernel launches).

    On CUDA only device-side rows count (kernels, memcpy, memset): an ATen op's row carries the device time
    of the kernels it launched, and a ``record_function`` range on the GPU timeline ("CompiledFunction",
    "Optimizer.step#...") spans them, so adding those counted kernels twice. On the CPU there are no kernels,
    and ATen ops' own CPU time stands in for them."""
    from torch.autograd import DeviceType

    kernels: dict[str, tuple[float, int]] = {}
    syncs = launches = 0
    for evt in events:
        if _SYNC_CALLS.match(evt.key):
            syncs += evt.count
        elif _LAUNCH_CALLS.match(evt.key):
            launches += evt.count
        if cuda:
            # a record_function range drawn on the GPU timeline spans kernels that have rows of their own
            on_device = getattr(evt, "device_type", None) == DeviceType.CUDA and not getattr(evt, "is_user_annotation", False)
            us = (getattr(evt, "self_device_time_total", 0.0) or getattr(evt, "device_time_total", 0.0)) if on_device else 0.0
        else:
            us = evt.self_cpu_time_total if evt.key.startswith("aten::") else 0.0
        if us > 0:
            kernels[evt.key] = (kernels.get(evt.key, (0.0, 0))[0] + us, evt.count)
    return kernels, syncs, launches


def profile_summary(fn: Callable[[], Any], device: torch.device | str, *, top: int = 30) -> dict[str, Any]:
    """Run ``fn()`` once under ``torch.profiler`` and summarise where the time went.

    Returns: ``wall_ms`` (under the profiler), ``gpu_busy_ms`` (sum of kernel times, each kernel once:
    ``tally_events``; on the CPU, of ATen ops' own times), ``gpu_idle_ms`` (wall - busy: host syncs, launch gaps), ``classes_ms`` /
    ``classes_pct`` (matmul, attention, compiled fusions, optimizer, memcpy, other), ``top_kernels``
    (name, ms, calls), ``host_syncs`` (CUDA stream/device/event synchronize calls, which block the
    host until the GPU drains) and ``kernel_launches``.
    """
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    wall_ms = (time.perf_counter() - t0) * 1e3
    kernels, syncs, launches = tally_events(prof.key_averages(), cuda=cuda)
    busy_ms = sum(us for us, _ in kernels.values()) / 1e3
    classes: dict[str, float] = {}
    for name, (us, _) in kernels.items():
        cls = next((c for c, pattern in _KERNEL_CLASSES if pattern.search(name)), "other (eager elementwise, reductions, casts)")
        classes[cls] = classes.get(cls, 0.0) + us / 1e3
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
    order = sorted(classes.items(), key=lambda kv: -kv[1])
    return {
        "wall_ms": round(wall_ms, 2), "gpu_busy_ms": round(busy_ms, 2), "gpu_idle_ms": round(max(wall_ms - busy_ms, 0.0), 2),
        "classes_ms": {k: round(v, 2) for k, v in order}, "classes_pct": {k: round(100 * v / max(busy_ms, 1e-9), 1) for k, v in order},
        "top_kernels": [{"name": n[:160], "ms": round(us / 1e3, 3), "calls": c} for n, (us, c) in ranked],
        "host_syncs": syncs, "kernel_launches": launches,
    }  # fmt: skip


def format_profile(name: str, summary: dict[str, Any], *, rows: int = 12) -> str:
    """A few lines of ``profile_summary`` for a log."""
    s = summary
    lines = [
        f"{name}: {s['gpu_busy_ms']:.1f} ms busy in {s['wall_ms']:.1f} ms wall (idle {s['gpu_idle_ms']:.1f} ms), "
        f"{s['host_syncs']} host syncs, {s['kernel_launches']} kernel launches"
    ]
    lines += [f"  {k:45s} {v:9.1f} ms {s['classes_pct'][k]:5.1f} %" for k, v in s["classes_ms"].items()]
    lines += [f"  {r['ms']:9.2f} ms {r['calls']:5d}x  {r['name'][:100]}" for r in s["top_kernels"][:rows]]
    return "\n".join(lines)
