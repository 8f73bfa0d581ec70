"""The plugin contracts that ``slime check-plugin`` (``slime.rollout.plugin_check``) checks: one coroutine
or function per kind (``check_generate``, ``check_reward``, ``check_filter``, ``check_rollout``), each
calling the plugin the way a run calls it on probe inputs and writing one PASS/FAIL/WARN line per check to
a ``Report``. The contracts themselves are described in ``slime.rollout.plugin_check``'s docstring; that
module loads the plugin, starts the engine these checks need and re-exports every public name here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import math
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from slime.engines.interface import EnginePool, WorkerPool
from slime.rollout import plugin_threads
from slime.types import Group, JsonObject, Sample, Status

if TYPE_CHECKING:
    from slime.rollout.slime_compat import RolloutArgs, RolloutDataBuffer

__all__ = [
    "check_generate",
    "check_reward",
    "check_filter",
    "check_rollout",
    "generate_signature_problem",
    "Report",
    "PROBE_PROMPT",
]

PROBE_PROMPT = [0, 5, 9, 17, 3]
_LISTS = ("rollout_logprobs", "versions", "loss_mask")
_PROBE_BATCH = 2  # prompts of check_rollout's probe step (args.rollout_batch_size)


class Report:
    """Collects check lines; ``failed`` is True once any check failed."""

    def __init__(self, kind: str, out: TextIO | None = None):
        self.kind, self.out, self.failed = kind, out or sys.stdout, False
        self.lines: list[str] = []

    def _emit(self, tag: str, text: str) -> None:
        line = f"{tag} {self.kind}: {text}"
        self.lines.append(line)
        print(line, file=self.out, flush=True)

    def ok(self, text: str) -> None:
        self._emit("PASS", text)

    def fail(self, text: str) -> None:
        self.failed = True
        self._emit("FAIL", text)

    def warn(self, text: str) -> None:
        self._emit("WARN", text)


def _is_async(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004  # an async __call__, not a callable test


async def _call_plugin(
    report: Report, fn: Callable[..., Any], args: tuple[object, ...], timeout_s: float, *, is_async: bool | None = None
) -> tuple[bool, object]:
    """``fn(*args)`` within ``timeout_s`` (async: awaited; sync: on a daemon thread, abandoned at the timeout,
    ``plugin_threads``); returns ``(True, value)``, or ``(False, None)`` after reporting the timeout or exception.
    (``fn`` is the user's plugin: untyped, its value is checked by the caller.)"""
    try:
        async with asyncio.timeout(timeout_s):
            value = (
                await fn(*args)
                if (_is_async(fn) if is_async is None else is_async)
                else await plugin_threads.run_sync(fn, *args)
            )
            if inspect.isawaitable(value):
                value = await value
    except TimeoutError:
        report.fail(f"did not return within {timeout_s}s")
        return False, None
    except Exception as exc:  # the plugin's bug, reported as data
        report.fail(f"raised {type(exc).__name__}: {exc}")
        return False, None
    return True, value


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
    if not _is_async(fn):
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


async def check_reward(
    fn: Callable[..., object], *, report: Report, timeout_s: float = 30.0, reward_key: str | None = None
) -> None:
    """Call a per-sample reward function on a finished probe sample; it must return a finite float, or
    a dict whose ``reward_key`` entry (slime train's ``--reward-key``) is one."""
    sample = Sample(
        prompt_ids=[0, 5, 9], prompt="What is 1+1?", label="2", response="1+1 = 2. #### 2", status=Status.COMPLETED
    )
    sample.append([7, 8, 1], [-0.5, -0.25, -0.1], 0)
    try:
        inspect.signature(fn).bind(sample)
    except TypeError as exc:
        report.fail(
            f"does not accept (sample): {exc}; slime calls a reward function with the finished sample alone "
            "(THUDM/slime's (args, sample, **kwargs) form: drop args)"
        )
        return
    except ValueError:
        pass  # no signature to inspect: let the call decide
    if not _is_async(fn):
        report.warn(
            "is not async: slime runs it on a thread of its own, where a hang is abandoned at --reward-timeout-s, not stopped"
        )
    ok, value = await _call_plugin(report, fn, (sample,), timeout_s)
    if not ok:
        return
    if isinstance(value, dict):
        if reward_key is None:
            report.fail(
                f"returned a dict {value!r:.80}; pass --reward-key KEY naming the entry that is the reward (slime train needs it too)"
            )
            return
        if reward_key not in value:
            report.fail(f"returned a dict without --reward-key {reward_key!r} (keys: {', '.join(map(repr, value))})")
            return
        report.ok(f"returned a dict with --reward-key {reward_key!r}")
        value = value[reward_key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        report.fail(f"returned {type(value).__name__} {value!r}, expected a finite float")
    elif not math.isfinite(value):
        report.fail(f"returned {value}, expected a finite float")
    else:
        report.ok(f"returned {float(value)!r} for a finished sample")


def check_filter(fn: Callable[..., object], *, report: Report) -> None:
    """Call a dynamic-sampling filter ``(group) -> bool`` on a mixed-reward and a same-reward group."""
    if _is_async(fn):
        report.fail("is async; the dynamic-sampling filter is called synchronously: `def keep(group) -> bool`")
        return
    for name, rewards in (("mixed rewards", [1.0, 0.0, 1.0, 0.0]), ("equal rewards", [1.0] * 4)):
        samples = [
            Sample(prompt_ids=[0, 5], group_id=7, index=i, reward=r, status=Status.COMPLETED)
            for i, r in enumerate(rewards)
        ]
        try:
            keep = fn(Group(group_id=7, samples=samples))
        except Exception as exc:  # the plugin's bug, reported as data
            report.fail(f"group with {name}: raised {type(exc).__name__}: {exc}")
            continue
        if isinstance(keep, bool):
            report.ok(f"group with {name}: returned {keep}")
        else:
            report.fail(
                f"group with {name}: returned {type(keep).__module__}.{type(keep).__name__} {keep!r}, expected bool"
            )


async def check_rollout(
    fn: Callable[..., object],
    *,
    pool: WorkerPool,
    report: Report,
    model_dir: str = "",
    timeout_s: float = 60.0,
    max_response_len: int = 24,
) -> None:
    """Call a whole-step rollout function (``--rollout-function-path``) once, as a training step
    calls it (``slime.loop.rollout_function``), on two probe prompts, 2 samples each; check what
    it returns (``slime.rollout.slime_compat.to_groups``)."""
    from slime.errors import PluginError
    from slime.rollout.slime_compat import to_groups

    args, data_buffer = _probe_rollout_inputs(pool, model_dir=model_dir, max_response_len=max_response_len)
    try:
        inspect.signature(fn).bind(args, 0, data_buffer, evaluation=False)
    except TypeError as exc:
        report.fail(f"does not accept (args, rollout_id, data_buffer, evaluation=False): {exc}")
        return
    except ValueError:
        pass  # no signature to inspect: let the call decide
    report.ok(
        f"accepts (args, rollout_id, data_buffer, evaluation=False); {'async: awaited' if _is_async(fn) else 'sync: run on a thread'}"
    )
    ok, out = await _call_plugin(
        report, functools.partial(fn, evaluation=False), (args, 0, data_buffer), timeout_s, is_async=_is_async(fn)
    )
    if not ok:
        return
    try:
        groups, _ = to_groups(
            out, n_samples_per_prompt=2, engine_version=0, next_group_id=0, data_index=data_buffer.data_index
        )
    except PluginError as exc:
        report.fail(str(exc))
        return
    _report_groups(groups, report, rollout_batch_size=_PROBE_BATCH, max_response_len=max_response_len)


def _probe_rollout_inputs(
    pool: WorkerPool, *, model_dir: str, max_response_len: int
) -> tuple[RolloutArgs, RolloutDataBuffer]:
    """THUDM/slime's ``args`` and ``data_buffer`` for one probe step: two probe prompts, 2 samples each."""
    from slime.config import DataConfig, LoopConfig, RolloutConfig
    from slime.data.dataset import PromptRow, PromptSource
    from slime.rollout.slime_compat import RolloutArgs, RolloutDataBuffer

    rows = [PromptRow(index=i, prompt=" ".join(f"w{t}" for t in PROBE_PROMPT[1 + i :]), label="w7") for i in range(2)]
    source = PromptSource(rows, shuffle=False)
    data_buffer = RolloutDataBuffer(
        next_row=source.next,
        tokenize=lambda row: [0, *(int(w[1:]) for w in row.prompt.split())],
        n_samples_per_prompt=2,
        num_prompts=len(rows),
    )
    args = RolloutArgs(
        RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=max_response_len),
        LoopConfig(rollout_batch_size=_PROBE_BATCH),
        DataConfig(),
        hf_checkpoint=model_dir,
        pool=pool,
        engine_version=0,
    )
    return args, data_buffer


def _report_groups(groups: list[Group], report: Report, *, rollout_batch_size: int, max_response_len: int) -> None:
    """PASS for the groups a rollout function returned; WARN for what a run would treat otherwise than asked."""
    samples = [s for g in groups for s in g.samples]
    report.ok(
        f"returned {len(groups)} groups ({', '.join(str(len(g.samples)) for g in groups)} samples): aligned lists, finished, "
        f"{sum(s.num_response_tokens for s in samples)} response tokens"
    )
    if len(groups) != rollout_batch_size:
        report.warn(
            f"returned {len(groups)} groups for args.rollout_batch_size={rollout_batch_size}; a run trains on what is returned"
        )
    if (
        longest := max((s.num_response_tokens for s in samples if not s.metadata.get("offline")), default=0)
    ) > max_response_len:
        report.warn(f"a response of {longest} tokens, more than args.rollout_max_response_len={max_response_len}")
    if num := sum(s.reward is None for s in samples):
        report.warn(f"{num} of {len(samples)} samples have no reward: a run scores them with its reward function")
    if num := sum(bool(s.metadata.get("offline")) for s in samples):
        report.warn(
            f"{num} of {len(samples)} samples have no rollout_log_probs: the trainer computes them (torch backend only)"
        )
