"""The time bounds of ``HttpEnginePool``'s generate attempts, and giving up on hung engines.

``PoolTimeouts._bounded`` runs one generate attempt under ``request_timeout_s``: past it the request is
aborted by its ``rid`` (on every worker, behind a router) and SGLang answers with its tokens so far; an
engine that does not answer within ``control_timeout_s`` more is hung (``EngineTimeout``, counted on its
breaker by the caller). An attempt that got no answer is a failed attempt, retried against
``--max-retries`` by the caller, as is one the engine answered with no token at all (``NoTokenInTime``:
nothing to resume from, not counted on the breaker: the engine answered) and one still on an engine
when that engine left rotation (``end_attempts``: ``LeftRotation``; its breaker already knows).
``give_up_inflight`` ends the attempts still on engines at once (the scheduler's drain, whose
``abort_all`` went unheard) as aborts, so their samples resume, and takes those engines out of
rotation. ``aborted_result`` is the queued-abort result such a call returns (docs/sglang.md#abort,
case B). The rules and an example are in ``slime.engines.pool``'s docstring, "Timeouts".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from slime.config import RolloutConfig
from slime.engines.client import EngineClient
from slime.engines.protocol import FinishReason, GenerateResult
from slime.errors import EngineTimeout, EngineUnavailable

__all__ = ["PoolTimeouts", "aborted_result", "LeftRotation", "NoTokenInTime", "counts_against_engine", "may_still_run"]

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


class PoolTimeouts:
    """Mixin of ``HttpEnginePool`` (which provides ``config``, ``clients``, ``take_out``, its engines and router)."""

    if TYPE_CHECKING:  # provided by HttpEnginePool

        @property
        def clients(self) -> list[EngineClient]: ...

        def take_out(self, url: str, reason: str) -> bool: ...

    config: RolloutConfig
    _engines: dict[str, Any]
    _router: EngineClient | None
    _attempts: dict[asyncio.Future[str], tuple[str, float]]

    async def _bounded(
        self, client: EngineClient, input_ids: Sequence[int], sampling_params: Mapping[str, Any], *, rid: str | None, **kwargs: Any
    ) -> GenerateResult:
        """One attempt on ``client``, bounded by ``request_timeout_s`` (module docstring, "Timeouts").

        Raises:
            EngineTimeout: no answer within ``control_timeout_s`` of the abort (or no ``rid`` to abort by).
            NoTokenInTime: the engine answered the abort with no token.
            LeftRotation: the engine left rotation while the attempt ran (``end_attempts``).
            The client's other errors.
        """
        cfg, loop = self.config, asyncio.get_running_loop()
        give_up: asyncio.Future[str] = loop.create_future()
        self._attempts[give_up] = (client.url, loop.time())
        # the client's own deadline is only a backstop, past ours
        call = asyncio.ensure_future(
            client.generate(input_ids, sampling_params, rid=rid, **kwargs, timeout_s=cfg.request_timeout_s + 2 * cfg.control_timeout_s)
        )
        abort = None
        racing: list[asyncio.Future[Any]] = [call, give_up]
        try:
            await asyncio.wait(racing, timeout=cfg.request_timeout_s, return_when=asyncio.FIRST_COMPLETED)
            if not call.done() and not give_up.done() and rid:
                abort = asyncio.ensure_future(self._abort_rid(client, rid))
                await asyncio.wait(racing, timeout=cfg.control_timeout_s, return_when=asyncio.FIRST_COMPLETED)
            if call.done():
                result = call.result()
                if abort is not None and not result.output_ids:
                    raise NoTokenInTime(
                        f"ran past request_timeout_s={cfg.request_timeout_s}s without a token (aborted by rid, nothing generated)",
                        url=client.url,
                        endpoint="/generate",
                    )
                if abort is not None:
                    log.warning(
                        "generate %s on %s ran past request_timeout_s=%ss: aborted with %d tokens kept (the sample resumes)",
                        rid,
                        client.url,
                        cfg.request_timeout_s,
                        len(result.output_ids),
                    )
                return result
            if give_up.done():  # a drain gave up on it (an abort: the sample resumes), or LeftRotation is raised
                return aborted_result(rid, f"given up on {client.url}: {give_up.result()}")
            raise EngineTimeout(
                f"ran past request_timeout_s={cfg.request_timeout_s}s and no answer came within "
                f"control_timeout_s={cfg.control_timeout_s}s of /abort_request",
                url=client.url,
                endpoint="/generate",
            )
        finally:
            del self._attempts[give_up]
            if give_up.done():
                give_up.exception()  # retrieved: the attempt ended first, or it is raised above
            for task in (call, abort):
                if task is not None and not task.done():
                    task.cancel()

    async def _abort_rid(self, client: EngineClient, rid: str) -> None:
        """Abort ``rid`` where it runs: on ``client``, or behind a router on every worker (the router does
        not forward ``/abort_request``). Best effort: an engine that does not answer is found hung anyway."""
        targets = self.clients if client is self._router else [client]
        await asyncio.gather(*(c.abort(rid) for c in targets), return_exceptions=True)

    def give_up_inflight(self, reason: str, *, running_for_s: float = 0.0) -> list[str]:
        """End every generate attempt that has been on an engine for ``running_for_s`` seconds or more
        (the scheduler's drain: its ``abort_all`` went unheard, the engine is hung).

        Each ends with an abort result with no tokens (its sample stays resumable); each worker that
        held one is taken out of rotation (``on_engine_down``: the supervisor restarts or watches it).
        Younger attempts (sent after the drain began) are left alone. Returns the urls of those
        workers (and of the router, whose calls end the same way), in pool order.
        """
        now = asyncio.get_running_loop().time()
        urls: list[str] = []
        for give_up, (url, started) in list(self._attempts.items()):
            if now - started >= running_for_s and not give_up.done():
                give_up.set_result(reason)
                urls += [] if url in urls else [url]
        for url in urls:
            if url in self._engines:
                self.take_out(url, f"generate requests given up: {reason}")
        return urls

    def end_attempts(self, url: str, reason: str) -> None:
        """End every generate attempt on ``url`` now with ``LeftRotation`` (the caller retries it elsewhere,
        counting it against ``--max-retries``): its engine left rotation for ``reason``."""
        for give_up, (where, _) in list(self._attempts.items()):
            if where == url and not give_up.done():
                give_up.set_exception(LeftRotation(f"left rotation while the request ran: {reason}", url=url, endpoint="/generate"))


def aborted_result(rid: str | None, message: str) -> GenerateResult:
    """What SGLang answers for a request aborted in its waiting queue (docs/sglang.md#abort, case B): no tokens, abort."""
    return GenerateResult(
        output_ids=[], output_logprobs=[], finish_reason=FinishReason(type="abort", message=message), completion_tokens=0, rid=rid or ""
    )
