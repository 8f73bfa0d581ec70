"""Fused GPU kernels for the megatron backend's elementwise work, through ``torch.compile``.

Without Transformer Engine or Apex, megatron's local spec runs RMSNorm, RoPE, SwiGLU and the
vocabulary log-softmax as chains of separate ATen kernels, each one a full pass over its tensor
(several in fp32). ``fused(fn)`` wraps a pure tensor function so that on CUDA it runs through
``torch.compile`` (Inductor: one Triton kernel per chain, forward and backward) and everywhere
else, or when compiling is off or fails, as the plain eager function: the same code, so the CPU
tests check the math the GPU kernels are generated from.

    SLIME_MEGATRON_COMPILE=0    run every wrapped function eagerly (no torch.compile)

Shapes that change between micro-batches (the packed token count) are marked dynamic on the
first call (``dynamic_args``), so a ragged run compiles once per function and mode instead of
once per micro-batch size. Every other size of a tensor argument is marked static at each call: with
dynamo's automatic dynamic shapes, a second hidden or FFN size in one process (a second model, a norm
over key heads after one over query heads) would recompile the function with that size symbolic, and
Inductor's kernels for a symbolic row width run 2-4x slower (SwiGLU at the Qwen2-1.5B shape on an
H200: 2.5 ms instead of 1.1 ms forward + backward; docs/benchmarks.md). Marking costs ~2 us a call.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Generic, ParamSpec, TypeVar

import torch
from torch import Tensor

__all__ = ["fused", "compile_enabled", "status"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

_REGISTRY: list[_Fused] = []
_BACKEND = "inductor"  # torch.compile backend (tests swap in a counting one)


def compile_enabled() -> bool:
    """Whether ``fused`` functions compile on CUDA (``SLIME_MEGATRON_COMPILE`` != "0")."""
    return os.environ.get("SLIME_MEGATRON_COMPILE", "1") != "0"


class _Fused(Generic[P, R]):
    def __init__(self, fn: Callable[P, R], dynamic_args: tuple[int, ...]):
        self.fn = fn
        self.dynamic_args = dynamic_args
        self._compiled: Callable[P, R] | None = None
        self._failed = False
        functools.update_wrapper(self, fn)
        _REGISTRY.append(self)

    def compiles_for(self, x: Tensor) -> bool:
        """Whether a call whose first argument is ``x`` runs compiled (CUDA, enabled, no earlier failure)."""
        return not self._failed and x.is_cuda and compile_enabled()

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        first = args[0]
        if isinstance(first, Tensor) and self.compiles_for(first):
            if self._compiled is None:
                _raise_recompile_limit()
                self._compiled = torch.compile(self.fn, fullgraph=True, backend=_BACKEND)
            for i, a in enumerate(args):
                if isinstance(a, Tensor):
                    dynamic = i in self.dynamic_args and a.dim() > 0
                    if dynamic:
                        torch._dynamo.maybe_mark_dynamic(a, 0)
                    for d in range(int(dynamic), a.dim()):  # every other size static (module docstring)
                        torch._dynamo.mark_static(a, d)
            try:
                return self._compiled(*args, **kwargs)
            except Exception as exc:  # compile errors surface on the call; run eagerly from now on
                self._failed = True
                log.warning(
                    "torch.compile of %s failed (%s: %s); running it eagerly", self.fn.__name__, type(exc).__name__, exc
                )
        return self.fn(*args, **kwargs)


def _raise_recompile_limit(at_least: int = 32) -> None:
    """Each wrapped function compiles once per dtype, grad mode, hidden size and epsilon (the token
    count is dynamic); dynamo's default limit of 8 graphs per function can be reached by a process
    that builds several models (the GPU parity check: bf16 and fp32), after which the call would
    fail over to eager."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if isinstance(getattr(cfg, name, None), int) and getattr(cfg, name) < at_least:
            setattr(cfg, name, at_least)
            return


def status() -> dict[str, str]:
    """Per wrapped function: "compiled" (ran through torch.compile), "failed" (fell back to eager) or "eager"."""
    return {
        f"{f.fn.__module__.rsplit('.', 1)[-1]}.{f.fn.__name__}": "failed"
        if f._failed
        else "compiled"
        if f._compiled is not None
        else "eager"
        for f in _REGISTRY
    }


def fused(*, dynamic_args: tuple[int, ...] = (0,)) -> Callable[[Callable[P, R]], _Fused[P, R]]:
    """Decorator: compile ``fn`` on CUDA (see the module docstring); ``dynamic_args`` index the
    tensor arguments whose first dimension is the packed token count."""

    def wrap(fn: Callable[P, R]) -> _Fused[P, R]:
        return _Fused(fn, dynamic_args)

    return wrap
