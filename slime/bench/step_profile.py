"""What an RL step's time is made of, for the trainer benchmarks (``slime.bench.trainer``).

- ``profile_summary`` / ``format_profile``: one call under ``torch.profiler``: kernel time by class, top
  kernels, GPU busy vs wall time, CUDA runtime calls (host syncs, kernel launches).
- ``GCPauses``: Python's garbage-collector pauses inside a block.
- ``host_events``: cumulative counters a step can hide (compiled graphs; allocator segments and retries).
- ``idle_gaps``: where the GPU waited between kernels (the kernel after each gap, summed).
- ``sync_sites``: the Python lines that made the host wait for the GPU (``torch.cuda.set_sync_debug_mode``).
"""

from __future__ import annotations

import gc
import re
import time
import traceback
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TextIO

import torch

from slime.types import JsonObject

if TYPE_CHECKING:
    from torch.autograd.profiler_util import FunctionEvent, FunctionEventAvg

__all__ = [
    "GCPauses",
    "format_profile",
    "host_events",
    "idle_gaps",
    "profile_summary",
    "sync",
    "sync_sites",
    "tally_events",
]


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
_SYNC_CALLS = re.compile(
    r"^(cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|cuStreamSynchronize|cuCtxSynchronize)$"
)
_LAUNCH_CALLS = re.compile(
    r"^(cudaLaunchKernel|cudaLaunchKernelExC|cuLaunchKernel|cuLaunchKernelEx|cudaLaunchCooperativeKernel)$"
)


def tally_events(events: Iterable[FunctionEventAvg], *, cuda: bool) -> tuple[dict[str, tuple[float, int]], int, int]:
    """``key_averages()`` rows -> ({name: (us, calls)}, host syncs, kernel launches).

    On CUDA only device-side rows count (kernels, memcpy, memset): an ATen op's row carries the device time
    of the kernels it launched, and a ``record_function`` range on the GPU timeline ("CompiledFunction",
    "Optimizer.step#...") spans them, so adding those counted kernels twice. On the CPU there are no kernels,
    and ATen ops' own CPU time stands in for them."""

    kernels: dict[str, tuple[float, int]] = {}
    syncs = launches = 0
    for evt in events:
        key = evt.key
        assert key is not None  # torch types it Optional; every row of key_averages() has its grouping key
        if _SYNC_CALLS.match(key):
            syncs += evt.count
        elif _LAUNCH_CALLS.match(key):
            launches += evt.count
        if cuda:
            us = (
                (getattr(evt, "self_device_time_total", 0.0) or getattr(evt, "device_time_total", 0.0))
                if _on_device(evt)
                else 0.0
            )
        else:
            us = evt.self_cpu_time_total if key.startswith("aten::") else 0.0
        if us > 0:
            kernels[key] = (kernels.get(key, (0.0, 0))[0] + us, evt.count)
    return kernels, syncs, launches


def idle_gaps(intervals: Iterable[tuple[float, float, str]], *, min_us: float = 20.0, top: int = 12) -> JsonObject:
    """Gaps on the GPU timeline of one profiled call. ``intervals``: (start us, end us, kernel name) of every
    device-side event (overlaps allowed: several streams). Returns ``idle_ms`` (the time between the first
    start and the last end that no event covers), ``gaps`` (how many gaps of at least ``min_us``) and
    ``before`` (the ``top`` kernels whose launch ended the most idle time: name, ms, gaps). A gap before a
    step's first GEMM after a host sync means the host ran ahead of nothing; many small gaps before short
    kernels mean the host launches slower than the GPU runs them."""
    idle_us, gaps, end = 0.0, 0, None
    before: dict[str, tuple[float, int]] = {}
    for start, stop, name in sorted(intervals):
        if end is not None and start > end:
            gap = start - end
            idle_us += gap
            if gap >= min_us:
                gaps += 1
                us, n = before.get(name, (0.0, 0))
                before[name] = (us + gap, n + 1)
        end = stop if end is None else max(end, stop)
    ranked = sorted(before.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "idle_ms": round(idle_us / 1e3, 2), "gaps": gaps,
        "before": [{"name": n[:160], "ms": round(us / 1e3, 3), "gaps": c} for n, (us, c) in ranked],
    }  # fmt: skip


def _on_device(evt: FunctionEvent | FunctionEventAvg) -> bool:
    """A kernel, copy or set on the GPU; not a ``record_function`` range drawn on the GPU timeline (it spans
    kernels that have rows of their own)."""
    from torch.autograd import DeviceType

    return getattr(evt, "device_type", None) == DeviceType.CUDA and not getattr(evt, "is_user_annotation", False)


def _device_intervals(events: Iterable[FunctionEvent]) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of the kernels, copies and sets among ``prof.events()``."""
    return [(float(e.time_range.start), float(e.time_range.end), e.name) for e in events if _on_device(e)]


_SYNC_WARNING = re.compile(r"synchroniz", re.I)


def sync_sites(fn: Callable[[], object], *, depth: int = 3, top: int = 15) -> list[JsonObject]:
    """Run ``fn()`` once with ``torch.cuda.set_sync_debug_mode("warn")`` and count where the host waited:
    each warning's innermost ``depth`` Python frames (outside torch), most frequent first, as
    [{"site": "file:line fn <- ...", "calls": n}]. A sync inside autograd's backward shows as the
    ``backward()`` call. On the CPU there are no syncs and the list is empty."""
    sites: dict[str, int] = {}

    def hook(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if not _SYNC_WARNING.search(str(message)):
            shown(message, category, filename, lineno, file, line)  # any other warning is shown as before
            return
        skip = {__file__, warnings.__file__}
        frames = [f for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename and f.filename not in skip]
        site = (
            " <- ".join(f"{_short(f.filename)}:{f.lineno} {f.name}" for f in reversed(frames[-depth:]))
            or f"{filename}:{lineno}"
        )
        sites[site] = sites.get(site, 0) + 1

    cuda = torch.cuda.is_available()
    with warnings.catch_warnings():
        shown = warnings.showwarning
        warnings.simplefilter("always")
        warnings.showwarning = hook
        previous = torch.cuda.get_sync_debug_mode() if cuda else 0
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(previous)
    ranked = sorted(sites.items(), key=lambda kv: -kv[1])[:top]
    return [{"site": s, "calls": n} for s, n in ranked]


def _short(path: str) -> str:
    """The path from its package root on (``slime/...``, ``megatron/...``), else the file name."""
    for root in ("/slime/", "/megatron/", "/scripts/", "/transformers/"):
        if root in path:
            return root[1:] + path.split(root, 1)[1]
    return path.rsplit("/", 1)[-1]


def profile_summary(fn: Callable[[], object], device: torch.device | str, *, top: int = 30) -> JsonObject:
    """Run ``fn()`` once under ``torch.profiler`` and summarise where the time went.

    Returns: ``wall_ms`` (under the profiler), ``gpu_busy_ms`` (sum of kernel times, each kernel once:
    ``tally_events``; on the CPU, of ATen ops' own times), ``gpu_idle_ms`` (wall - busy: host syncs, launch gaps), ``classes_ms`` /
    ``classes_pct`` (matmul, attention, compiled fusions, optimizer, memcpy, other), ``top_kernels``
    (name, ms, calls), ``host_syncs`` (CUDA stream/device/event synchronize calls, which block the
    host until the GPU drains), ``kernel_launches``, ``host_ops`` (the ops and CUDA runtime calls with the most
    host time of their own, profiler overhead included) and on CUDA ``idle_gaps`` (``idle_gaps``: the GPU's idle
    time between its first and last kernel, and which kernels' launches ended it).
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
    rows = prof.key_averages()
    kernels, syncs, launches = tally_events(rows, cuda=cuda)
    gaps = idle_gaps(_device_intervals(prof.events())) if cuda else None
    host = sorted(
        ((r.key, r.self_cpu_time_total, r.count) for r in rows if r.self_cpu_time_total > 0), key=lambda r: -r[1]
    )[:top]
    busy_ms = sum(us for us, _ in kernels.values()) / 1e3
    classes: dict[str, float] = {}
    for name, (us, _) in kernels.items():
        cls = next(
            (c for c, pattern in _KERNEL_CLASSES if pattern.search(name)),
            "other (eager elementwise, reductions, casts)",
        )
        classes[cls] = classes.get(cls, 0.0) + us / 1e3
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
    order = sorted(classes.items(), key=lambda kv: -kv[1])
    return {
        "wall_ms": round(wall_ms, 2), "gpu_busy_ms": round(busy_ms, 2), "gpu_idle_ms": round(max(wall_ms - busy_ms, 0.0), 2),
        "classes_ms": {k: round(v, 2) for k, v in order}, "classes_pct": {k: round(100 * v / max(busy_ms, 1e-9), 1) for k, v in order},
        "top_kernels": [{"name": n[:160], "ms": round(us / 1e3, 3), "calls": c} for n, (us, c) in ranked],
        "host_syncs": syncs, "kernel_launches": launches,
        "host_ops": [{"name": n[:160], "self_ms": round(us / 1e3, 3), "calls": c} for n, us, c in host],
    } | ({"idle_gaps": gaps} if gaps is not None else {})  # fmt: skip


def format_profile(name: str, summary: JsonObject, *, rows: int = 12) -> str:
    """A few lines of ``profile_summary`` for a log."""
    s = summary
    lines = [
        f"{name}: {s['gpu_busy_ms']:.1f} ms busy in {s['wall_ms']:.1f} ms wall (idle {s['gpu_idle_ms']:.1f} ms), "
        f"{s['host_syncs']} host syncs, {s['kernel_launches']} kernel launches"
    ]
    lines += [f"  {k:45s} {v:9.1f} ms {s['classes_pct'][k]:5.1f} %" for k, v in s["classes_ms"].items()]
    lines += [f"  {r['ms']:9.2f} ms {r['calls']:5d}x  {r['name'][:100]}" for r in s["top_kernels"][:rows]]
    if "idle_gaps" in s:
        g = s["idle_gaps"]
        lines.append(f"  GPU idle between kernels {g['idle_ms']:.1f} ms, {g['gaps']} gaps; idle ended by:")
        lines += [f"  {r['ms']:9.2f} ms {r['gaps']:5d}x  {r['name'][:100]}" for r in g["before"][:rows]]
    lines += [
        f"  host {r['self_ms']:9.2f} ms {r['calls']:5d}x  {r['name'][:100]}" for r in s.get("host_ops", [])[:rows]
    ]
    lines += [f"  sync {r['calls']:5d}x  {r['site'][:140]}" for r in s.get("sync_sites", [])[:rows]]
    return "\n".join(lines)
