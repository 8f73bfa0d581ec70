"""The plugin contracts that ``slime check-plugin`` (``slime.rollout.plugin_check``) checks: one coroutine
or function per kind (``check_generate``, ``check_reward``, ``check_filter``, ``check_rollout``), each
calling the plugin the way a run calls it on probe inputs and writing one PASS/FAIL/WARN line per check to
a ``Report``. The contracts themselves are described in ``slime.rollout.plugin_check``'s docstring; that
module loads the plugin, starts the engine these checks need and re-exports every public name here.
The generate contract lives in ``plugin_generate_contract``, the ``Report`` and the plugin call under a
timeout in ``plugin_report``; both are re-exported here.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from slime.engines.interface import WorkerPool
from slime.rollout.plugin_generate_contract import check_generate, generate_signature_problem  # re-exported
from slime.rollout.plugin_report import PROBE_PROMPT, Report, call_plugin, is_async  # re-exported
from slime.types import Group, Sample, Status

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

_PROBE_BATCH = 2  # prompts of check_rollout's probe step (args.rollout_batch_size)


async def check_reward(
    fn: Callable[..., object], *, report: Report, timeout_s: float = 30.0, reward_key: str | None = None
) -> None:
    """Call a per-sample reward function on a finished probe sample; it must return a finite float, or
    a dict whose ``reward_key`` entry (slime train's ``--reward-key``) is one. The probe sample's
    ``metadata["plugin_probe"]`` is True (a reward with side effects can tell it from a run's samples)."""
    sample = Sample(
        prompt_ids=[0, 5, 9],
        prompt="What is 1+1?",
        label="2",
        response="1+1 = 2. #### 2",
        status=Status.COMPLETED,
        metadata={"plugin_probe": True},
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
    if not is_async(fn):
        report.warn(
            "is not async: slime runs it on a thread of its own, where a hang is abandoned at --reward-timeout-s, not stopped"
        )
    ok, value = await call_plugin(report, fn, (sample,), timeout_s)
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
    if is_async(fn):
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
        f"accepts (args, rollout_id, data_buffer, evaluation=False); {'async: awaited' if is_async(fn) else 'sync: run on a thread'}"
    )
    ok, out = await call_plugin(
        report, functools.partial(fn, evaluation=False), (args, 0, data_buffer), timeout_s, run_async=is_async(fn)
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
