"""``--rollout-function-path``: a user function makes each step's groups, in THUDM/slime's contract.

The contract, the ``args`` / ``data_buffer`` it gets and what it may return are in
``slime.rollout.slime_compat``. ``RolloutFunctionScheduler`` stands in for ``Scheduler`` in
``run_step``: each step's ``next_batch`` calls the function once and::

    groups  = to_groups(fn(args, rollout_id, data_buffer, evaluation=False))   # checked: aligned, finished, versions
    rewards = the run's reward function, for each sample whose reward is None  # a failure marks it FAILED
    buffer.push_ready(groups); buffer.take(len(groups))                        # the trained-once check holds

then the step trains and syncs weights as any other. Semantics are sync: the engines' weights do not
move during a call, so generated tokens are tagged with the engines' version then. Per-sample
generation, partial rollouts (APRIL), async mode, staleness control, the dynamic-sampling filter and
``--offline-data`` belong to the built-in scheduler, which the function replaces; those flags are
refused with it (``Config.check_rollout_function_modes``).

THUDM/slime's own rollout functions, named in its scripts, are not imported:
``slime.rollout.sglang_rollout.generate_rollout`` (slime's default) is the built-in scheduler, and
``fully_async_rollout.generate_rollout_fully_async`` (its fully-async example) is the built-in
scheduler in ``--rollout-mode async``; each logs one line saying so (``slime.config.rollout.builtin_rollout_note``).

Not covered: ``evaluation=True`` (eval runs on this project's evaluator); the function's groups
handed back with ``data_buffer.add_samples`` are not kept across a resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptSource, tokenize_row
from slime.engines.interface import WorkerPool
from slime.errors import PluginError
from slime.loop.buffer import DataBuffer
from slime.loop.counters import SchedulerCounters
from slime.loop.version import PolicyVersion
from slime.rollout.rewards import check_reward, score_sample
from slime.rollout.slime_compat import RolloutArgs, RolloutDataBuffer, to_groups
from slime.types import Group, RewardFn, Status

__all__ = ["RolloutFunctionScheduler"]

log = logging.getLogger(__name__)


class RolloutFunctionScheduler(SchedulerCounters):
    """The part of ``Scheduler`` that ``run_step`` and the driver use, fed by a rollout function.

    Args:
        config / rollout: the loop and rollout sections.
        fn: the rollout function ``(args, rollout_id, data_buffer, evaluation=False)``, sync or async.
        source: the prompt rows (``PromptSource``); ``data_buffer.get_samples`` draws from it.
        tokenize: the run's prompt tokenizer (``slime.loop.inputs.prompt_tokenizer``).
        reward_fn: per-sample reward for samples returned without one.
        args: the function's ``args`` (``slime.rollout.slime_compat.RolloutArgs``: slime's flag values,
            ``args.pool``, ``args.sglang_router_ip`` / ``port``); its ``engine_version`` is set before each call.
        pool: the engines; None without engines.
        version: the run's ``PolicyVersion`` (read only).
        fill_logprobs: whether the trainer can compute missing rollout logprobs (torch backend); when
            False a sample without ``rollout_log_probs`` is an error.
    """

    def __init__(
        self,
        config: LoopConfig,
        rollout: RolloutConfig,
        fn: Callable[..., Any],
        *,
        args: RolloutArgs,
        source: PromptSource,
        tokenize: Callable[..., list[int]],
        buffer: DataBuffer,
        reward_fn: RewardFn,
        pool: WorkerPool | None = None,
        version: PolicyVersion | None = None,
        fill_logprobs: bool = True,
    ):
        self.config, self.rollout = config, rollout
        self.path = rollout.rollout_function_path
        self.fn, self.buffer, self.reward_fn, self.pool = fn, buffer, reward_fn, pool
        super().__init__(version)
        self.fill_logprobs = fill_logprobs
        self.args = args
        self.data_buffer = RolloutDataBuffer(
            next_row=source.next,
            tokenize=lambda row: tokenize_row(tokenize, row),
            n_samples_per_prompt=rollout.n_samples_per_prompt,
            num_prompts=len(source.rows),
        )

    async def next_batch(self, n: int) -> list[Group]:
        """Call the function for the next step and return its groups, rewarded and checked.

        Raises:
            PluginError: the function raised, or returned something outside the contract (one line
                naming ``--rollout-function-path``, the group and sample).
        """
        self.rollout_id += 1
        where = f"--rollout-function-path={self.path} (step {self.rollout_id})"
        self.args.engine_version = self.engine_version
        call = (self.args, self.rollout_id - 1, self.data_buffer)  # slime's rollout_id is 0-based
        try:
            if inspect.iscoroutinefunction(self.fn):
                out = await self.fn(*call, evaluation=False)
            else:
                out = await asyncio.to_thread(self.fn, *call, evaluation=False)
            groups, metrics = to_groups(
                out,
                n_samples_per_prompt=self.rollout.n_samples_per_prompt,
                engine_version=self.engine_version,
                next_group_id=self.next_group_id,
                rollout_id=self.rollout_id,
                data_index=self.data_buffer.data_index,
            )
        except PluginError as exc:
            raise PluginError(f"{where}: {exc}") from None
        except Exception as exc:  # the plugin's bug: stop the run with its reason
            raise PluginError(f"{where}: raised {type(exc).__name__}: {exc}") from exc
        if not self.fill_logprobs and any(
            s.metadata.get("offline_logprobs") is False for g in groups for s in g.samples
        ):
            raise PluginError(
                f"{where}: a sample without rollout_log_probs; computing them is implemented for the torch backend only"
            )
        if len(groups) != n:
            log.warning(
                "%s returned %d groups, the batch size is %d: training on the returned ones", where, len(groups), n
            )
        if metrics:
            log.info("%s metrics: %s", where, metrics)
        for g in groups:
            for s in g.samples:
                if s.reward is None:
                    await score_sample(s, self.reward_fn, timeout_s=self.rollout.reward_timeout_s)
                else:  # the function's own reward: held to the reward function's range (FAILED if outside)
                    check_reward(s)
        self.next_group_id += len(groups)
        self.num_admitted += len(groups)
        st = self.stats
        st.started_groups += len(groups)
        st.finished_groups += len(groups)
        st.generated_tokens += sum(
            s.num_response_tokens for g in groups for s in g.samples if not s.metadata.get("offline")
        )
        st.failed_samples += sum(s.status is Status.FAILED for g in groups for s in g.samples)
        for g in groups:
            self.buffer.push_ready(g)
        return self.buffer.take(len(groups))

    def paused(self, mode: str = "abort") -> contextlib.AbstractAsyncContextManager[None]:
        """Nothing generates between calls: pausing is a no-op."""
        return contextlib.nullcontext()

    quiesced = paused

    async def shutdown(self) -> None:
        pass
