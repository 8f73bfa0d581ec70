"""The plugin checks of ``slime train`` before any engine starts (``--dry-run`` and the start of a real run).

Each plugin path given is imported (``slime.rollout.rewards.load_function``) and held to what ``slime
check-plugin`` (``slime.rollout.plugin_contracts``) knows without an engine:

- ``--custom-rm-path`` (a per-sample reward: the only kind ``slime train`` loads): ``check_reward`` on one synthetic finished
  sample, within ``PROBE_TIMEOUT_S``. A signature it cannot be called with (THUDM/slime's ``(args, sample,
  **kwargs)``, two required arguments, ...) or a value that is no finite float (a bool, None, a dict without
  ``--reward-key``) is a ``ConfigError`` naming the flag and the fix. A reward that raises or hangs on the
  synthetic sample is one warning only: the sample is not the user's data, so it may well not fit it.
- ``--custom-generate-function-path``: its signature (``generate_signature_problem``).
- ``--dynamic-sampling-filter-path``: ``check_filter`` on two synthetic groups (it must return a bool).

Each ConfigError ends with ``slime check-plugin PATH --kind KIND``, the full contract (with an engine).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import io
import logging
from collections.abc import Callable

from slime.config import LoopConfig, RolloutConfig
from slime.errors import ConfigError
from slime.rollout.plugin_contracts import Report, check_filter, check_reward, generate_signature_problem
from slime.rollout.rewards import load_function

__all__ = ["check_plugins", "PROBE_TIMEOUT_S"]

log = logging.getLogger("slime.cli")

PROBE_TIMEOUT_S = 10.0
"""Longest wait for the reward function's call on the synthetic sample (then: one warning, the run goes on)."""

_NOT_FATAL = ("raised ", "did not return within")
"""Report lines of a call that raised or hung on the synthetic sample: said, not refused (see the docstring)."""


def check_plugins(rollout: RolloutConfig, loop: LoopConfig, *, rollout_function: bool) -> None:
    """Import every plugin path given and hold the reward, generate and filter plugins to their contracts.

    ``rollout_function``: whether ``--rollout-function-path`` names a function slime calls (not THUDM/slime's own).

    Raises:
        ConfigError: a path that does not import to a callable, or a plugin that breaks its contract; names the
            flag, the problem and the fix.
    """
    for flag, value in (
        ("--buffer-filter-path", loop.buffer_filter_path),
        ("--rollout-function-path", rollout.rollout_function_path if rollout_function else None),
    ):
        if value:
            load_function(value, flag=flag)
    if rollout.custom_rm_path:
        fn = load_function(rollout.custom_rm_path, flag="--custom-rm-path")
        _check_reward(fn, rollout.custom_rm_path, reward_key=rollout.reward_key)
    if rollout.custom_generate_function_path:
        fn = load_function(rollout.custom_generate_function_path, flag="--custom-generate-function-path")
        _check_generate(fn, rollout.custom_generate_function_path)
    if loop.dynamic_sampling_filter_path:
        fn = load_function(loop.dynamic_sampling_filter_path, flag="--dynamic-sampling-filter-path")
        report = _report("filter")
        check_filter(fn, report=report)
        _raise_failures(report, "--dynamic-sampling-filter-path", loop.dynamic_sampling_filter_path)


def _report(kind: str) -> Report:
    """A ``Report`` that keeps its lines (``report.lines``) and prints none."""
    return Report(kind, out=io.StringIO())


def _check_reward(fn: Callable[..., object], spec: str, *, reward_key: str | None) -> None:
    """``check_reward`` on the synthetic sample: ConfigError on a contract failure, a warning when it raised or hung."""
    report = _report("reward")
    # the preflight runs before the run's event loop; a fresh one for this one call
    asyncio.run(check_reward(fn, report=report, timeout_s=PROBE_TIMEOUT_S, reward_key=reward_key))
    said = [line.removeprefix("FAIL reward: ") for line in report.lines if line.startswith("FAIL")]
    if said and all(text.startswith(_NOT_FATAL) for text in said):
        log.warning(
            "--custom-rm-path=%s on a synthetic sample (prompt 'What is 1+1?', label '2'): %s; the run goes on, "
            "a sample whose reward fails is marked FAILED (evidence in failed_samples.jsonl)",
            spec,
            "; ".join(said),
        )
        return
    _raise_failures(report, "--custom-rm-path", spec)


def _check_generate(fn: Callable[..., object], spec: str) -> None:
    """The generate function's signature (the run binds ``tokenizer=`` when it takes one)."""
    takes_tokenizer = "tokenizer" in _parameters(fn)
    problem = generate_signature_problem(functools.partial(fn, tokenizer=None) if takes_tokenizer else fn)
    if problem is not None:
        report = _report("generate")
        report.fail(problem)
        _raise_failures(report, "--custom-generate-function-path", spec)


def _parameters(fn: Callable[..., object]) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        return {}


def _raise_failures(report: Report, flag: str, spec: str) -> None:
    """ConfigError listing the report's FAIL lines, when there is one."""
    failures = [line.removeprefix(f"FAIL {report.kind}: ") for line in report.lines if line.startswith("FAIL")]
    if failures:
        raise ConfigError(
            f"{flag}={spec!r} {'; '.join(failures)} (the whole contract: slime check-plugin {spec} --kind {report.kind})"
        )
