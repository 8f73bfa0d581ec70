"""Rewards at the plugin boundary: timeouts, failures kept as evidence, never a crashed run.

A reward function is ``async def reward(sample) -> float`` (per sample) or, with ``--group-rm``,
``async def reward(samples) -> list[float]`` (per group). A plain (sync) function is run on a
daemon thread of its own (``slime.rollout.plugin_threads``): one that hangs is abandoned at the
timeout and blocks neither other rewards, nor the train step, nor exit. Whatever it does wrong
(raises, any ``BaseException`` included: ``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit``, its own
``CancelledError``; hangs past ``reward_timeout_s``; returns a non-number, NaN, an infinity or a value
beyond ``MAX_ABS_REWARD``; returns the wrong number of rewards) the sample is marked ``Status.FAILED``
with ``reward = 0.0`` and ``sample.evidence["reward_error"]`` holding the exception type, message and
elapsed seconds, and the run goes on. Failed samples do not train (see ``slime/train/batch.py``).
Only a cancellation of the scoring task itself (the run stopping) goes through. A reward set by
someone else (a generate or rollout function) is held to the same range by ``check_reward``.

Not covered: a hung sync reward function goes on running on its thread (Python threads cannot be
killed); the run goes on without it.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slime.errors import ConfigError, PluginError
from slime.rollout import plugin_threads
from slime.rollout.reward_clock import running_under
from slime.types import GroupRewardFn, RewardFn, Sample, Status

__all__ = ["load_function", "score_sample", "score_group", "check_reward", "MAX_ABS_REWARD", "FAILED_SAMPLE_FIELD"]

log = logging.getLogger(__name__)

FAILED_SAMPLE_FIELD = "failed_sample"
"""The ``extra=`` field of the warning of a failed reward that holds the sample's evidence, written to
``RUN_DIR/failed_samples.jsonl`` by ``slime.obs.run_log``."""

MAX_ABS_REWARD = 1e15
"""Largest reward magnitude taken. The trainer's group statistics are float32: 1e300 is no float32 at all (it
was a traceback in the batch builder) and rewards of 1e30 overflow their group's variance, which zeroes every
advantage of the group without a word; below 1e15 a group of ``MAX_SAMPLES_PER_PROMPT`` stays finite."""


def load_function(path: str, *, flag: str = "--custom-rm-path") -> Callable[..., Any]:
    """Import ``pkg.module.func``, ``pkg.module:func`` or ``path/to/file.py:func``; raise ConfigError naming ``flag``.

    A module is looked for on ``sys.path`` and then in the current directory (``my_reward.exact_answer`` run
    from the folder of ``my_reward.py``, as ``python -m`` finds it); a file path is loaded as it is.
    """
    file, sep, attr = path.rpartition(":")
    if sep and file.endswith(".py"):
        return _load_from_file(Path(file), attr, flag=flag, spec=path)
    mod_name, sep, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not mod_name or not attr:
        raise ConfigError(
            f"{flag}={path!r}: expected 'package.module.function', 'package.module:function' or 'path/to/file.py:function'"
        )
    _with_cwd_on_path()
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ConfigError(
            f"{flag}={path!r}: cannot import module {mod_name!r}: {exc}{_file_hint(mod_name, attr, exc)}"
        ) from exc
    except Exception as exc:  # the module itself is broken (SyntaxError, NameError at import, ...)
        raise ConfigError(f"{flag}={path!r}: importing module {mod_name!r} raised {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{flag}={path!r}: module {mod_name!r} has no callable {attr!r}")
    return fn


def _with_cwd_on_path() -> None:
    """The current directory last on ``sys.path`` (the ``slime`` console script, unlike ``python -m``, leaves it
    off): last, so a file there never shadows an installed package."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _file_hint(mod_name: str, attr: str, exc: ImportError) -> str:
    """When ``mod_name`` itself is not found (not a module it imports): how to name the function by its file instead
    (the ``file.py:function`` form)."""
    if not isinstance(exc, ModuleNotFoundError) or exc.name is None or not mod_name.startswith(exc.name):
        return ""
    guess = Path(*mod_name.split(".")).with_suffix(".py")
    return f"; a function in a file is named by its path: path/to/{guess}:{attr}"


def _load_from_file(file: Path, attr: str, *, flag: str, spec: str) -> Callable[..., Any]:
    if not file.is_file():
        raise ConfigError(f"{flag}={spec!r}: no file {file}")
    module_spec = importlib.util.spec_from_file_location(f"slime_plugin_{file.stem}", file)
    if module_spec is None or module_spec.loader is None:  # importlib has no loader for this file name
        raise ConfigError(f"{flag}={spec!r}: {file} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # the file itself is broken
        raise ConfigError(f"{flag}={spec!r}: running {file} raised {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{flag}={spec!r}: {file} has no callable {attr!r}")
    return fn


async def _call(fn: Callable[..., Any], arg: object) -> Any:
    """``fn(arg)``: awaited when async, else on a plugin thread (``plugin_threads``); the user's value, unchecked."""
    if inspect.iscoroutinefunction(fn):
        return await fn(arg)
    # on a thread of its own: a hung sync reward is abandoned at the timeout, the event loop never blocks
    result = await plugin_threads.run_sync(fn, arg)
    if inspect.isawaitable(result):  # a sync function may hand back an awaitable (a wrapped async one): awaited too
        result = await result
    return result


def _stuck() -> str:
    n = plugin_threads.num_running()
    return f"; {n} sync plugin calls still running (a sync reward that hangs is abandoned)" if n else ""


def _as_reward(value: object, reward_key: str | None = None, sample: Sample | None = None) -> float:
    """The float reward in ``value``; a dict (slime's reward functions may return one) gives its
    ``reward_key`` entry, and the whole dict is kept in ``sample.evidence["reward_fields"]``."""
    if isinstance(value, dict):
        if reward_key is None:
            raise PluginError(
                f"reward function returned a dict {value!r:.80}; --reward-key names which entry is the reward"
            )
        if reward_key not in value:
            raise PluginError(f"reward function returned a dict without --reward-key {reward_key!r}: {value!r:.80}")
        if sample is not None:  # evidence stays JSON: scalar entries only
            sample.evidence["reward_fields"] = {
                k: v for k, v in value.items() if isinstance(v, (str, int, float, bool, type(None)))
            }
        value = value[reward_key]
    # bool is an int subclass: True is refused rather than taken as 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PluginError(f"reward function returned {type(value).__name__} {value!r}, expected a float")
    value = float(value)
    if not math.isfinite(value):
        raise PluginError(f"reward function returned non-finite {value}")
    if abs(value) > MAX_ABS_REWARD:
        raise PluginError(
            f"reward function returned {value!r}, outside [-{MAX_ABS_REWARD:g}, {MAX_ABS_REWARD:g}] "
            "(the trainer's float32 group statistics overflow beyond it)"
        )
    return value


def check_reward(sample: Sample) -> None:
    """A reward someone else set (a generate function, a ``--rollout-function-path`` function): a non-number or
    a value ``_as_reward`` refuses marks the sample FAILED with the evidence, as from a reward function."""
    # None: not rewarded yet (the reward function sets it); a FAILED sample keeps its own evidence
    if sample.reward is None or sample.status is Status.FAILED:
        return
    try:
        sample.reward = _as_reward(sample.reward)
    except PluginError as exc:
        _mark_failed(sample, PluginError(f"a reward set outside the reward function: {exc}"), 0.0)


def _described(exc: BaseException) -> BaseException:
    """A ``BaseException`` that is not an ``Exception`` (``SystemExit(3)``, ...) as an error saying it did not end
    the run; others as they are."""
    if isinstance(exc, Exception):
        return exc
    return PluginError(
        f"{type(exc).__name__}({', '.join(map(repr, exc.args))}) raised by the reward function; it does not end the run"
    )


def _stopping() -> bool:
    """Whether the scoring task itself is being cancelled (the run stops): then nothing is caught."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _mark_failed(sample: Sample, exc: BaseException, elapsed_s: float) -> None:
    sample.status = Status.FAILED
    sample.reward = 0.0
    where = f"group {sample.group_id} sample {sample.index}"
    shown = _described(exc)
    error = {
        "where": where,
        "type": type(exc).__name__,
        "message": str(shown) or repr(exc),
        "elapsed_s": round(elapsed_s, 4),
        # the last frames only, capped: the evidence is kept per sample in the records
        "traceback": "".join(traceback.format_exception(exc, limit=-3))[-2000:],
    }
    sample.evidence["reward_error"] = error
    log.warning(
        "reward failed for %s after %.2fs, sample marked FAILED: %s: %s",
        where,
        elapsed_s,
        type(exc).__name__,
        shown,
        extra={FAILED_SAMPLE_FIELD: _failed_sample_row(sample, error)},
    )


def _failed_sample_row(sample: Sample, error: dict[str, object]) -> dict[str, object]:
    """The line of ``RUN_DIR/failed_samples.jsonl`` for ``sample`` (``slime.obs.run_log``): which sample, its text, why."""
    return {
        "group_id": sample.group_id,
        "index": sample.index,
        "prompt": sample.prompt,
        "label": sample.label,
        "response": sample.response,
        "error": error,
    }


async def score_sample(sample: Sample, reward_fn: RewardFn, *, timeout_s: float, reward_key: str | None = None) -> None:
    """Set ``sample.reward`` from ``reward_fn`` (a dict result: its ``reward_key`` entry); on any
    plugin failure mark the sample FAILED."""
    t0 = time.monotonic()
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            with running_under(deadline):  # a wait for a sandbox slot is not the reward's time (reward_clock.py)
                raw = await _call(reward_fn, sample)
        sample.reward = _as_reward(raw, reward_key, sample)  # outside the deadline: only the user's call is timed
    except BaseException as exc:  # plugin boundary: a user function's failure becomes data, SystemExit included
        if _stopping():  # the run is stopping: the cancellation of this task must go through
            raise
        if isinstance(exc, TimeoutError) and deadline.expired():  # our deadline, not a TimeoutError of the function
            exc = TimeoutError(f"reward timed out after {timeout_s}s (--reward-timeout-s){_stuck()}")
        _mark_failed(sample, exc, time.monotonic() - t0)


async def score_group(
    samples: list[Sample], group_reward_fn: GroupRewardFn, *, timeout_s: float, reward_key: str | None = None
) -> None:
    """Set every sample's reward from one call of a per-group reward function (dict entries: their ``reward_key``)."""
    t0 = time.monotonic()
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            with running_under(deadline):
                raw = await _call(group_reward_fn, samples)
        if not isinstance(raw, (list, tuple)):
            raise PluginError(
                f"group reward function returned {type(raw).__name__} {raw!r:.60}, expected a list of {len(samples)} rewards"
            )
        if len(raw) != len(samples):
            raise PluginError(f"group reward function returned {len(raw)} rewards for {len(samples)} samples")
        # every value checked before any is set: one bad value fails the whole group
        values = [_as_reward(v, reward_key, s) for v, s in zip(raw, samples)]
    except BaseException as exc:  # plugin boundary (TimeoutError and SystemExit included)
        if _stopping():
            raise
        if isinstance(exc, TimeoutError) and deadline.expired():
            exc = TimeoutError(f"group reward timed out after {timeout_s}s (--reward-timeout-s){_stuck()}")
        for s in samples:
            _mark_failed(s, exc, time.monotonic() - t0)
        return
    for s, v in zip(samples, values):
        s.reward = v
