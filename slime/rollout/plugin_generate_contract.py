"""The generate contract of ``slime check-plugin --kind generate`` (``slime.rollout.plugin_check``'s docstring):
``generate_signature_problem`` reads the signature alone; ``check_generate`` calls the function on a fresh
probe sample, aborts a long call mid-generation and resumes it, checking after each call that the lists stay
aligned, that earlier tokens were only appended to, and ``Sample.generate_contract_problems``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slime.engines.interface import EnginePool
from slime.rollout.plugin_report import PROBE_PROMPT, Report, is_async
from slime.types import JsonObject, Sample, Status

__all__ = ["check_generate", "generate_signature_problem"]

_LISTS = ("rollout_logprobs", "versions", "loss_mask")


def _problems(s: Sample, where: str) -> list[str]:
    """Alignment, mask and logprob problems of one sample, each a full sentence."""
    n = len(s.response_ids)
    out = [
        f"{where}: response_ids has {n} tokens but {name} has {len(getattr(s, name))}"
        for name in _LISTS
        if len(getattr(s, name)) != n
    ]
    if out:
        return out
    bad_mask = [i for i, m in enumerate(s.loss_mask) if m not in (0, 1)]
    if bad_mask:
        out.append(f"{where}: loss_mask[{bad_mask[0]}] = {s.loss_mask[bad_mask[0]]!r}, expected 0 or 1")
    bad_lp = [i for i, lp in enumerate(s.rollout_logprobs) if not math.isfinite(lp) or lp > 1e-6]
    if bad_lp:
        out.append(
            f"{where}: rollout_logprobs[{bad_lp[0]}] = {s.rollout_logprobs[bad_lp[0]]!r}, expected a finite log-probability <= 0"
        )
    return out


def _snapshot(s: Sample) -> dict[str, list]:
    return {
        "prompt_ids": list(s.prompt_ids),
        "response_ids": list(s.response_ids),
        **{n: list(getattr(s, n)) for n in _LISTS},
    }


def _rewrites(before: dict[str, list], s: Sample, where: str) -> list[str]:
    """Lists whose first ``len(before)`` entries changed: generate functions may only append."""
    out = []
    if before["response_ids"] and before["prompt_ids"] != s.prompt_ids:
        out.append(f"{where}: prompt_ids changed while resuming a sample with response tokens")
    for name in ("response_ids", *_LISTS):
        old, new = before[name], getattr(s, name)
        if new[: len(old)] != old:
            i = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
            out.append(
                f"{where}: {name} was rewritten at position {i} (had {len(old)} entries before the call, "
                f"{len(new)} after); earlier tokens must stay as they were, only append"
            )
    return out


@dataclass(frozen=True)
class _Probe:
    """What every call of a generate function under check is given besides its sample."""

    pool: EnginePool
    decode: Callable[[list[int]], str]
    timeout_s: float


async def _call_generate(
    fn: Callable[..., Any], sample: Sample, params: JsonObject, ctx: _Probe, max_len: int, report: Report, what: str
) -> list[Sample] | None:
    """Call once and check the return value; None (after a FAIL) when nothing more can be checked."""
    before = _snapshot(sample)
    try:
        async with asyncio.timeout(ctx.timeout_s):
            out = await fn(
                sample, dict(params), pool=ctx.pool, max_response_len=max_len, engine_version=0, decode=ctx.decode
            )
    except TimeoutError:
        report.fail(f"{what}: did not return within {ctx.timeout_s}s")
        return None
    except Exception as exc:  # the plugin's bug, reported as data
        tail = "".join(traceback.format_exception(exc, limit=-2)).strip().splitlines()[-1]
        report.fail(f"{what}: raised {type(exc).__name__}: {exc} ({tail})")
        return None
    if out is None or out is sample:
        samples = [sample]
    elif isinstance(out, Sample):
        report.fail(f"{what}: returned a different Sample object; grow the sample it was given and return it")
        return None
    elif isinstance(out, list) and out and all(isinstance(s, Sample) for s in out):
        samples = out
        unfinished = [s.status.value for s in out if not s.status.is_finished]
        if unfinished:
            report.fail(
                f"{what}: returned a list with unfinished samples (status {unfinished[0]}); each must be finished"
            )
    else:
        kind = (
            "an empty list"
            if out == []
            else (f"list[{type(out[0]).__name__}]" if isinstance(out, list) else type(out).__name__)
        )
        report.fail(f"{what}: returned {kind}, expected Sample or list[Sample]")
        return None
    single = len(samples) == 1 and samples[0] is sample
    problems = [
        p for i, s in enumerate(samples) for p in _problems(s, what if single else f"{what}, returned sample {i}")
    ]
    if any(s is sample for s in samples):
        problems += _rewrites(before, sample, what)
    for i, s in enumerate(samples):
        label = what if single else f"{what}, returned sample {i}"
        problems += [
            f"{label}: {p.split(': ', 1)[1]}"
            for p in s.generate_contract_problems(max_response_len=max_len, engine_version=0)
        ]
    for p in problems:
        report.fail(p)
    return None if problems else samples


def _reward_like(fn: Callable[..., object]) -> str | None:
    """The hint for a function whose required positional parameters are a reward function's: ``(sample)``
    or THUDM/slime's ``(args, sample)``; None otherwise (or when it has no signature to inspect)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p.name for p in params if p.kind in positional and p.default is inspect.Parameter.empty]
    if len(required) == 1:
        return (
            f"; it takes one argument ({required[0]}), like a reward function `reward(sample)`: check it with --kind reward "
            "(a dynamic-sampling filter `keep(group)`: --kind filter)"
        )
    if len(required) == 2 and required[0] == "args":
        return (
            f"; it takes (args, {required[1]}), like THUDM/slime's reward functions: check it with --kind reward "
            "(slime calls a reward function with the sample alone: `reward(sample)`)"
        )
    return None


def generate_signature_problem(fn: Callable[..., object]) -> str | None:
    """Why ``fn`` cannot be a generate function by its signature alone (not async, or it cannot take
    ``(sample, sampling_params, pool=, max_response_len=, engine_version=, decode=)``), with a hint to
    ``--kind reward`` when it looks like a reward function; None when it fits (or has no signature)."""
    hint = _reward_like(fn) or ""
    if not is_async(fn):
        return f"is not async: write `async def generate(sample, sampling_params, **kwargs)`{hint}"
    if hint.startswith("; it takes (args,"):  # binds to (sample, sampling_params, **kwargs) by position, but is not one
        return f"takes args first; a generate function is `async def generate(sample, sampling_params, **kwargs)`{hint}"
    try:
        inspect.signature(fn).bind(
            Sample(prompt_ids=[0]), {}, pool=None, max_response_len=1, engine_version=0, decode=str
        )
    except TypeError as exc:
        return f"does not accept (sample, sampling_params, pool=, max_response_len=, engine_version=, decode=): {exc}{hint}"
    except ValueError:
        pass  # no signature to inspect (a C callable): let the call decide
    return None


async def check_generate(
    fn: Callable[..., object],
    *,
    pool: EnginePool,
    report: Report,
    decode: Callable[[list[int]], str],
    timeout_s: float = 60.0,
    max_response_len: int = 24,
) -> None:
    """Run the generate contract (module docstring) against ``pool``."""
    if (problem := generate_signature_problem(fn)) is not None:
        report.fail(problem)
        return
    report.ok("is async and accepts (sample, sampling_params, **kwargs)")
    ctx = _Probe(pool=pool, decode=decode, timeout_s=timeout_s)
    params: JsonObject = {"temperature": 1.0}
    fresh = Sample(prompt_ids=list(PROBE_PROMPT), prompt="w5 w9 w17 w3", label="w7")
    if await _call_generate(fn, fresh, params, ctx, max_response_len, report, "fresh sample") is None:
        return
    report.ok(
        f"fresh sample: aligned lists, only appended, status {fresh.status.value}, {len(fresh.response_ids)} tokens"
    )
    long_len = 200
    sample = Sample(prompt_ids=list(PROBE_PROMPT), prompt="w5 w9 w17 w3", label="w7", group_id=1)
    task = asyncio.ensure_future(
        _call_generate(fn, sample, {**params, "ignore_eos": True}, ctx, long_len, report, "aborted call")
    )
    while not task.done():
        await asyncio.sleep(0.005)
        with contextlib.suppress(Exception):
            await pool.abort_all()
    if await task is None:
        return
    if sample.status is not Status.PARTIAL:
        if sample.status.is_finished and len(sample.response_ids) >= long_len:
            report.warn("finished before the abort landed; abort and resume were not exercised")
        else:
            report.fail(
                f"aborted call: status is {sample.status.value} with {len(sample.response_ids)} tokens after "
                "/abort_request; an aborted request must come back as Status.PARTIAL with its tokens kept"
            )
        return
    report.ok(f"abort mid-generation: status partial with {len(sample.response_ids)} tokens kept")
    if await _call_generate(fn, sample, params, ctx, long_len, report, "resumed call") is None:
        return
    if not sample.status.is_finished:
        report.fail(f"resumed call: status is {sample.status.value}; a resume without an abort must finish the sample")
        return
    report.ok(f"resume: earlier tokens kept, status {sample.status.value}, {len(sample.response_ids)} tokens")
