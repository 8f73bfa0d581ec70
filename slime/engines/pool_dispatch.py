"""``Dispatch``: one ``generate`` call of ``HttpEnginePool``, attempt by attempt.

Each attempt goes to the router (with the routing key) or to the worker ``Workers.pick_or_wait``
chooses, runs under ``Attempts.run``'s time bounds, and books its outcome: an answer closes the
worker's breaker, no answer counts on it (unless already known) and is retried after
``retry_backoff_s * 2**attempt`` seconds, at most ``max_retries`` times. An ``abort_all`` between
attempts, or while waiting for a worker, ends the call as an abort.

Retries (``RolloutConfig.max_retries``, ``retry_backoff_s``): an attempt that got no answer is
retried: a connection error or 5xx (``EngineUnavailable``), an engine that answered nothing within
``control_timeout_s`` of the abort at ``request_timeout_s``, or answered it with no token, or left
rotation meanwhile. The retry goes to a worker not yet tried in this call when there is one, after
``retry_backoff_s * 2**attempt`` seconds. Example, ``max_retries=2, retry_backoff_s=0.5``: try A,
fail, sleep 0.5, try B, fail, sleep 1.0, try A, fail -> ``EngineUnavailable("no answer after 3
attempts ... [A, B, A]")`` (``slime.rollout.generate`` marks the sample FAILED: it is not resumed for
ever). A resent request keeps its ``input_ids`` (prompt + partial response: the caller's sample only
changes on success) and its ``rid``, except after an attempt that may still be held by its engine (a
timeout): then ``<rid>t<n>-`` (SGLang refuses a duplicate rid; an abort of the rid still covers it).
With no worker in rotation a call waits up to ``rejoin_timeout_s`` for one (a restart), using no
attempt, then raises ``EnginesGone`` (one line naming each worker and why; at once when every worker
was given up on, ``retire``). ``abort_all`` ends calls that are between attempts or waiting: they
return a queued-abort result (no tokens, ``finish_reason`` abort, docs/sglang.md#abort, case B), so
the scheduler's drain never waits on a retry. An abort is never a failed attempt: a weight update's
abort resumes the sample token-exactly and costs it nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from slime.config import RolloutConfig
from slime.engines.client import EngineClient
from slime.engines.pool_timeouts import (
    AbortSignal,
    AbortWatch,
    Attempts,
    aborted_result,
    counts_against_engine,
    may_still_run,
)
from slime.engines.pool_workers import PoolEngine, Workers, failure_text
from slime.engines.protocol import GenerateResult
from slime.errors import EngineError, EngineTimeout, EngineUnavailable

__all__ = ["Dispatch", "ROUTING_KEY_HEADER"]

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"


@dataclasses.dataclass(frozen=True)
class _Target:
    """Where one attempt goes: a worker (``engine``), or the router (``engine`` None, routing ``headers``)."""

    client: EngineClient
    engine: PoolEngine | None = None
    headers: Mapping[str, str] | None = None


class Dispatch:
    """Runs ``generate`` calls over ``workers`` (or ``router``) with retries.

    Args:
        config: ``max_retries`` and ``retry_backoff_s``.
        workers / attempts / abort: the pool's parts (``pool.py``).
        router: every attempt goes there when given.
        note_cache_hit: called for each result that reused cached KV (``cached_tokens > 0``).
    """

    def __init__(
        self,
        config: RolloutConfig,
        workers: Workers,
        attempts: Attempts,
        *,
        abort: AbortSignal,
        router: EngineClient | None,
        note_cache_hit: Callable[[], None],
    ):
        self.config = config
        self.num_failovers = 0  # generate attempts that got no answer (a retry followed, unless it was the last)
        self._workers = workers
        self._attempts = attempts
        self._abort = abort
        self._router = router
        self._note_cache_hit = note_cache_hit

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, object],
        *,
        rid: str | None = None,
        return_logprob: bool = True,
        sticky_key: str | None = None,
        logprob_start_len: int | None = None,
    ) -> GenerateResult:
        """``HttpEnginePool.generate``: ``EngineClient.generate`` on a chosen worker (or the router), retrying.

        Returns the engine's result; an abort result (``finish_reason`` abort, maybe no tokens) when
        the request was aborted (``abort_all``, a weight update: not counted, the sample resumes), or ran
        past ``request_timeout_s`` and the engine answered the abort with tokens (module docstring).

        Raises:
            EngineUnavailable: all ``max_retries + 1`` attempts got no answer (the message lists the urls tried).
            EnginesGone: no worker came back into rotation within ``rejoin_timeout_s`` (one line naming each).
            EngineRequestError / ProtocolError / ValueError: from the attempt, not retried.
        """
        abort = self._abort.watch()  # taken at the call's start: an abort_all from then on ends this call as an abort
        tried: list[str] = []
        last: EngineError | None = None
        resend_as = (
            rid  # a retry after an attempt that may still run on its engine gets a new rid (SGLang refuses a duplicate)
        )
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                # doubling from retry_backoff_s (0.5, 1.0, ... as in the module doc); an abort_all cuts it short
                await abort.sleep(self.config.retry_backoff_s * 2 ** (attempt - 1))
                if abort.fired:  # aborted during the backoff: an abort (the sample resumes), not another attempt
                    return aborted_result(rid, f"aborted while retrying after: {last}")
            target = await self._target(sticky_key, tried, abort)
            if target is None:  # abort_all while waiting for a worker to rejoin: an abort too, no attempt used
                return aborted_result(rid, "aborted while waiting for an engine to rejoin")
            # booked before the attempt: a retry prefers a worker not yet tried in this call
            tried.append(target.client.url)
            try:
                result = await self._attempts.run(
                    target.client,
                    input_ids,
                    sampling_params,
                    rid=resend_as,
                    return_logprob=return_logprob,
                    headers=target.headers,
                    logprob_start_len=logprob_start_len,
                )
            except (EngineUnavailable, EngineTimeout) as exc:  # no answer: counts against --max-retries
                last = self._unanswered(target, exc)
                # a timeout or left rotation: the engine may still hold the old rid, so resend under a new one
                if rid and may_still_run(exc):
                    # ends in "-" (never a prefix of another rid) and starts with rid: an abort of rid still covers it
                    resend_as = f"{rid}t{attempt + 1}-"
                if abort.fired:  # an abort_all came during the failed attempt: end as an abort rather than retry
                    return aborted_result(rid, f"aborted after: {exc}")
                continue
            return self._answered(target, result)
        assert last is not None  # the loop ran at least once and every pass that did not return set it
        raise _no_answer(tried, last, self.config.max_retries)

    async def _target(self, sticky_key: str | None, tried: list[str], abort: AbortWatch) -> _Target | None:
        """The router, or the worker for the next attempt (counted as picked); None if aborted while waiting.

        Raises:
            EnginesGone: as ``Workers.pick_or_wait``.
        """
        if self._router is not None:
            return _Target(self._router, headers={ROUTING_KEY_HEADER: sticky_key} if sticky_key is not None else None)
        engine = await self._workers.pick_or_wait(sticky_key, set(tried), abort)
        if engine is None:
            return None
        engine.num_picks += 1
        engine.breaker.begin()
        if sticky_key is not None:  # bound now, so concurrent turns of one trajectory share an engine
            self._workers.bind_sticky(sticky_key, engine.client.url)
        return _Target(engine.client, engine)

    def _unanswered(self, target: _Target, exc: EngineUnavailable | EngineTimeout) -> EngineError:
        """Book an attempt that got no answer (on the worker's breaker unless already known); returns ``exc``."""
        # NoTokenInTime (the engine answered) and LeftRotation (already booked) are no new engine failures
        if target.engine is not None and counts_against_engine(exc):
            self._workers.record_failure(target.client.url, failure_text(exc))  # "/generate: <why>"
        self.num_failovers += 1
        return exc

    def _answered(self, target: _Target, result: GenerateResult) -> GenerateResult:
        """Book an answer: the worker is healthy; a reuse of cached KV is counted (``num_prefix_cache_hits``)."""
        if target.engine is not None:
            self._workers.record_success(target.client.url)
        # counted for pause_mode: once cached KV is reused, updates abort and flush instead of pausing in place
        if result.cached_tokens:
            self._note_cache_hit()
        return result


def _no_answer(tried: list[str], last: EngineError, max_retries: int) -> EngineUnavailable:
    """The error of a generate whose every attempt got no answer (the urls tried, in order)."""
    error = EngineUnavailable(
        f"no answer after {len(tried)} attempts (--max-retries {max_retries}) against {tried}; last error: {last}",
        url=last.url,
        endpoint="/generate",
        status=last.status,
        engine_message=last.engine_message,
    )
    error.__cause__ = last
    return error
