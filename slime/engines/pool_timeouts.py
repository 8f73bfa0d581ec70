"""The time bounds of ``HttpEnginePool``'s generate attempts, giving up on hung engines, and aborts.

``Attempts.run`` runs one generate attempt under ``request_timeout_s``: past it the request is
aborted by its ``rid`` (on every worker, behind a router) and SGLang answers with its tokens so far; an
engine that does not answer within ``control_timeout_s`` more is hung (``EngineTimeout``, counted on its
breaker by the caller). An attempt that got no answer is a failed attempt, retried against
``--max-retries`` by the caller, as is one the engine answered with no token at all (``NoTokenInTime``:
nothing to resume from, not counted on the breaker: the engine answered) and one still on an engine
when that engine left rotation (``end_attempts``: ``LeftRotation``; its breaker already knows).
``give_up_inflight`` ends the attempts still on engines at once (the scheduler's drain, whose
``abort_all`` went unheard) as aborts, so their samples resume, and takes those engines out of
rotation. ``AbortSignal`` is the pool's ``abort_all`` as seen by the calls between attempts or
waiting for a worker: they end at once with ``aborted_result``, the queued-abort result (docs/sglang.md#abort, case B).

Timeouts: at ``request_timeout_s`` the pool aborts the request by its ``rid`` (every worker, behind a
router) and SGLang answers it with its tokens so far (``finish_reason`` abort): the sample is PARTIAL
and resumes, nothing lost, the engine counted healthy. With no token in that answer it is a failed
attempt (nothing to resume from), not counted on the breaker. An engine that does not answer within
``control_timeout_s`` more is hung: a failed attempt, and a failure on its breaker, which opens after
``failure_threshold`` of them (``on_engine_down``: the supervisor restarts it). Example, defaults
(300 s, 60 s, K=3): a 400 s generation comes back PARTIAL at 300 s and resumes; a request on a wedged
engine is retried elsewhere at 360 s, and the engine is out after three (sooner by its health checks).
``give_up_inflight`` (the scheduler's drain, when ``abort_all`` went unheard) ends every call still on
an engine at once as an abort (the sample resumes) and takes that engine out of rotation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from slime.config import RolloutConfig
from slime.engines.client import EngineClient
from slime.engines.protocol import FinishReason, GenerateResult
from slime.errors import EngineTimeout, EngineUnavailable

__all__ = [
    "Attempts",
    "AbortSignal",
    "AbortWatch",
    "aborted_result",
    "LeftRotation",
    "NoTokenInTime",
    "counts_against_engine",
    "may_still_run",
]

log = logging.getLogger("slime.engines.pool")  # the pool's logger, as before the split


class NoTokenInTime(EngineTimeout):
    """The attempt ran past ``request_timeout_s`` and the engine answered its abort with no token."""


class LeftRotation(EngineUnavailable):
    """The attempt's engine left rotation (breaker open, process exited, taken out) while it ran."""


def counts_against_engine(exc: BaseException) -> bool:
    """Whether a failed attempt is a failure of its engine for the breaker (not already known, not answered)."""
    return not isinstance(exc, (NoTokenInTime, LeftRotation))


def may_still_run(exc: BaseException) -> bool:
    """Whether the failed attempt's request may still be held by its engine (so a retry needs a new rid)."""
    return isinstance(exc, (EngineTimeout, LeftRotation))


class AbortWatch:
    """What one generate call sees of ``AbortSignal``: whether an ``abort_all`` came since it started."""

    def __init__(self, signal: AbortSignal):
        self._signal = signal
        self._epoch = signal.epoch  # the epoch at the start: fired means an abort_all came after this call began
        self._event = signal.event  # this epoch's event: fire() sets it, waking this call's sleeps

    @property
    def fired(self) -> bool:
        """An ``abort_all`` came since this call started (the call then ends as an abort)."""
        return self._signal.epoch != self._epoch

    async def sleep(self, timeout_s: float, wake: asyncio.Event | None = None) -> None:
        """Sleep ``timeout_s`` seconds, less when ``wake`` is set or an ``abort_all`` comes."""
        waits = [asyncio.ensure_future(self._event.wait())]
        if wake is not None:
            waits.append(asyncio.ensure_future(wake.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()


class AbortSignal:
    """The pool's ``abort_all``, for the generate calls that are between attempts or waiting for a worker."""

    def __init__(self) -> None:
        self.epoch = 0
        self.event = asyncio.Event()

    def watch(self) -> AbortWatch:
        """A watch for one generate call, from now on."""
        return AbortWatch(self)

    def fire(self) -> None:
        """Wake every watch taken before now; later ones start clean."""
        self.epoch += 1
        # a fresh event before setting the old one: watches taken after this fire start clean
        event, self.event = self.event, asyncio.Event()
        event.set()


class Attempts:
    """The generate attempts in flight on the pool's engines, each bounded by ``request_timeout_s``.

    Args:
        config: ``request_timeout_s`` and ``control_timeout_s``.
        abort_rid: aborts a rid where an attempt on a client runs (the pool knows the workers behind a router).
    """

    def __init__(self, config: RolloutConfig, *, abort_rid: Callable[[EngineClient, str], Awaitable[None]]):
        self.config = config
        self._abort_rid = abort_rid
        self._inflight: dict[asyncio.Future[str], tuple[str, float]] = {}
        """Each attempt in flight: its give-up future (``give_up`` resolves it with the reason, ``end``
        fails it) -> (client url, loop time it started)."""

    async def run(
        self,
        client: EngineClient,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, object],
        *,
        rid: str | None,
        return_logprob: bool,
        headers: Mapping[str, str] | None,
        logprob_start_len: int | None,
    ) -> GenerateResult:
        """One attempt on ``client`` (arguments as ``EngineClient.generate``), bounded by ``request_timeout_s``.

        Raises:
            EngineTimeout: no answer within ``control_timeout_s`` of the abort (or no ``rid`` to abort by).
            NoTokenInTime: the engine answered the abort with no token.
            LeftRotation: the engine left rotation while the attempt ran (``end``).
            The client's other errors.
        """
        cfg, loop = self.config, asyncio.get_running_loop()
        give_up: asyncio.Future[str] = loop.create_future()
        # booked before the request goes out, so give_up and end can reach it at once
        self._inflight[give_up] = (client.url, loop.time())
        # the client's own deadline is only a backstop, past ours
        backstop_s = cfg.request_timeout_s + 2 * cfg.control_timeout_s
        call = asyncio.ensure_future(
            client.generate(
                input_ids,
                sampling_params,
                rid=rid,
                return_logprob=return_logprob,
                headers=headers,
                logprob_start_len=logprob_start_len,
                timeout_s=backstop_s,
            )
        )
        abort: asyncio.Future[None] | None = None
        racing: list[asyncio.Future[GenerateResult] | asyncio.Future[str]] = [call, give_up]
        try:
            # request_timeout_s first; past it an abort by rid makes SGLang answer with its tokens so far
            await asyncio.wait(racing, timeout=cfg.request_timeout_s, return_when=asyncio.FIRST_COMPLETED)
            # without a rid there is nothing to abort by: the attempt ends as hung (EngineTimeout)
            if not call.done() and not give_up.done() and rid:
                abort = asyncio.ensure_future(self._abort_rid(client, rid))
                # the abort's answer must come within control_timeout_s more, else the engine is hung
                await asyncio.wait(racing, timeout=cfg.control_timeout_s, return_when=asyncio.FIRST_COMPLETED)
            if call.done():
                # an answer to our abort must carry a token to resume from (_answered)
                return self._answered(client, rid, call.result(), aborted=abort is not None)
            if give_up.done():  # a drain gave up on it (an abort: the sample resumes), or LeftRotation is raised
                return aborted_result(rid, f"given up on {client.url}: {give_up.result()}")
            raise EngineTimeout(
                f"ran past request_timeout_s={cfg.request_timeout_s}s and no answer came within "
                f"control_timeout_s={cfg.control_timeout_s}s of /abort_request",
                url=client.url,
                endpoint="/generate",
            )
        finally:
            self._end_attempt(give_up, call, abort)

    def _end_attempt(
        self, give_up: asyncio.Future[str], call: asyncio.Future[GenerateResult], abort: asyncio.Future[None] | None
    ) -> None:
        """The attempt's bookkeeping, however it ended."""
        del self._inflight[give_up]  # off the books first: a later give_up or end cannot touch a finished attempt
        if give_up.done():
            give_up.exception()  # retrieved: the attempt ended first, or it is raised in run()
        # a hung request is dropped here only; its engine may still hold it (may_still_run: a retry gets a new rid)
        for task in (call, abort):
            if task is not None and not task.done():
                task.cancel()

    def _answered(
        self, client: EngineClient, rid: str | None, result: GenerateResult, *, aborted: bool
    ) -> GenerateResult:
        """The engine's answer; one it gave to our abort at ``request_timeout_s`` must hold a token."""
        if not aborted:
            return result
        if not result.output_ids:  # nothing to resume from: a failed attempt (retried), not a PARTIAL sample
            raise NoTokenInTime(
                f"ran past request_timeout_s={self.config.request_timeout_s}s without a token (aborted by rid, nothing generated)",
                url=client.url,
                endpoint="/generate",
            )
        log.warning(
            "generate %s on %s ran past request_timeout_s=%ss: aborted with %d tokens kept (the sample resumes)",
            rid,
            client.url,
            self.config.request_timeout_s,
            len(result.output_ids),
        )
        return result

    def give_up(self, reason: str, *, running_for_s: float = 0.0) -> list[str]:
        """End every attempt that has been on an engine for ``running_for_s`` seconds or more with an
        abort result with no tokens (its sample stays resumable); younger ones are left alone.
        Returns the urls they were on, each once, in the order the attempts started."""
        now = asyncio.get_running_loop().time()
        urls: list[str] = []
        for give_up, (url, started) in list(self._inflight.items()):
            # a younger attempt has not had the whole abort window (the drain's abort_timeout_s) yet: left alone
            if now - started >= running_for_s and not give_up.done():
                give_up.set_result(reason)
                urls += [] if url in urls else [url]
        return urls

    def end(self, url: str, reason: str) -> None:
        """End every attempt on ``url`` now with ``LeftRotation`` (the caller retries it elsewhere,
        counting it against ``--max-retries``): its engine left rotation for ``reason``."""
        for give_up, (where, _) in list(self._inflight.items()):
            if where == url and not give_up.done():
                give_up.set_exception(
                    LeftRotation(f"left rotation while the request ran: {reason}", url=url, endpoint="/generate")
                )


def aborted_result(rid: str | None, message: str) -> GenerateResult:
    """What SGLang answers for a request aborted in its waiting queue (docs/sglang.md#abort, case B): no tokens, abort."""
    return GenerateResult(
        output_ids=[],
        output_logprobs=[],
        finish_reason=FinishReason(type="abort", message=message),
        completion_tokens=0,
        rid=rid or "",
    )
