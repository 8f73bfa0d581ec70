"""``EngineClient``: one SGLang worker (or the embedded engine) over the native HTTP API.

Protocol facts: docs/sglang.md. Every call has a deadline from
``RolloutConfig`` (``request_timeout_s`` for ``/generate``, ``control_timeout_s`` for the rest),
enforced by ``asyncio.timeout`` and mirrored in the per-request ``aiohttp.ClientTimeout``.

Errors are mapped once, here (``slime/errors.py``):

    connection refused / reset / ServerDisconnected / connect timeout / 5xx -> EngineUnavailable
    the call ran past its deadline                                          -> EngineTimeout
    4xx, or a 200 with ``"success": false``                                 -> EngineRequestError
    (except a ``/generate`` 499: SGLang 0.5.17's answer for a request aborted before scheduling,
    which is an abort result with no tokens, like a queued abort)
    a body we cannot decode                                                 -> ProtocolError

Each carries ``url``, ``endpoint``, ``status`` and the engine's own words (``engine_message``, via
``error_message_from_body``). The client owns no session: the ``HttpEnginePool`` (or the caller) does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import aiohttp
import msgspec

from slime.config import RolloutConfig
from slime.engines.client_weights import WeightSyncCalls
from slime.engines.protocol import FinishReason, GenerateResult, build_generate_payload, error_message_from_body, parse_generate_response
from slime.errors import EngineRequestError, EngineTimeout, EngineUnavailable, ProtocolError

__all__ = ["EngineClient", "CONNECT_TIMEOUT_S"]

ABORTED_BEFORE_SCHEDULING = 499
"""HTTP status of a ``/generate`` whose request was aborted before it reached SGLang's scheduler (held
by a pause, seen on 0.5.17 on the H200): mapped to an abort result with no tokens, so the sample stays
PARTIAL (resumable) instead of FAILED."""
CONNECT_TIMEOUT_S = 10.0
"""TCP connect bound inside every call; a connect timeout means the request was never sent, so it is
``EngineUnavailable`` (safe to retry elsewhere), unlike a read that runs past the call's deadline."""
_JSON_HEADERS = {"Content-Type": "application/json"}
_READY_POLL_MAX_S = 2.0  # sglang's own HttpServerEngineAdapter polls /health_generate every 2 s (docs/sglang.md#health)


class _Reply(msgspec.Struct):
    status: int
    content_type: str
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class EngineClient(WeightSyncCalls):
    """One engine at ``url`` (``http://host:port``), talking through a shared ``aiohttp.ClientSession``.

    ``num_inflight`` counts ``generate`` calls not yet returned (the pool's least-loaded signal).
    ``api_key``, when given, is sent as ``Authorization: Bearer <key>`` (docs/sglang.md#errors).
    """

    def __init__(self, url: str, *, session: aiohttp.ClientSession, config: RolloutConfig, api_key: str | None = None):
        self.url = url.rstrip("/")
        self.config = config
        self.num_inflight = 0
        self._session = session
        self._headers = dict(_JSON_HEADERS)
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    def __repr__(self) -> str:
        return f"EngineClient({self.url!r}, num_inflight={self.num_inflight})"

    # -- transport -------------------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        endpoint: str,
        *,
        body: Any = None,
        timeout_s: float,
        raw: bytes | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> _Reply:
        """One HTTP exchange; raises only EngineUnavailable / EngineTimeout (any status comes back).
        ``raw``: send these bytes as ``application/octet-stream`` instead of ``body`` as JSON.
        ``extra_headers``: added to this request only (e.g. the router's routing key)."""
        data = raw if raw is not None else None if body is None else msgspec.json.encode(body)
        headers = self._headers if raw is None else {**self._headers, "Content-Type": "application/octet-stream"}
        if extra_headers:
            headers = {**headers, **extra_headers}
        client_timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, CONNECT_TIMEOUT_S))
        err: dict[str, Any] = dict(url=self.url, endpoint=endpoint)
        try:
            async with asyncio.timeout(timeout_s):
                async with self._session.request(method, self.url + endpoint, data=data, headers=headers, timeout=client_timeout) as resp:
                    return _Reply(resp.status, resp.content_type, await resp.read())
        except aiohttp.ConnectionTimeoutError as exc:
            raise EngineUnavailable(f"connect timed out after {CONNECT_TIMEOUT_S}s", engine_message=str(exc), **err) from exc
        except TimeoutError as exc:
            raise EngineTimeout(f"{method} timed out after {timeout_s}s", **err) from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise EngineUnavailable(f"connection failed: {type(exc).__name__}: {exc}", engine_message=str(exc), **err) from exc
        except aiohttp.ClientResponseError as exc:  # malformed HTTP from the peer
            raise ProtocolError(f"bad HTTP response: {exc}", engine_message=str(exc), **err) from exc

    def _raise_for_status(self, reply: _Reply, endpoint: str) -> None:
        if reply.status < 400:
            return
        message = error_message_from_body(reply.status, reply.content_type, reply.text)
        cls = EngineUnavailable if reply.status >= 500 else EngineRequestError
        raise cls(message, url=self.url, endpoint=endpoint, status=reply.status, engine_message=message)

    def _decode_json(self, reply: _Reply, endpoint: str) -> Any:
        """A 2xx body as JSON; an empty body is None (``/abort_request`` answers 200 with nothing, docs/sglang.md#abort)."""
        if not reply.body.strip():
            return None
        try:
            return msgspec.json.decode(reply.body)
        except msgspec.DecodeError as exc:
            raise ProtocolError(
                f"undecodable JSON body ({exc}): {reply.text[:300]!r}", url=self.url, endpoint=endpoint, status=reply.status
            ) from exc

    async def _call(self, method: str, endpoint: str, body: Any = None, *, timeout_s: float | None = None, raw: bytes | None = None) -> Any:
        """Control call: JSON (or ``raw`` bytes) in, JSON out; 4xx/5xx and ``"success": false`` raise (docs/sglang.md#errors)."""
        reply = await self._send(method, endpoint, body=body, timeout_s=timeout_s or self.config.control_timeout_s, raw=raw)
        self._raise_for_status(reply, endpoint)
        result = self._decode_json(reply, endpoint)
        if isinstance(result, dict) and result.get("success") is False:
            message = error_message_from_body(reply.status, reply.content_type, reply.text)
            raise EngineRequestError(message, url=self.url, endpoint=endpoint, status=reply.status, engine_message=message)
        return result

    async def _get_with_fallback(self, endpoint: str, legacy: str) -> dict[str, Any]:
        try:
            result = await self._call("GET", endpoint)
        except EngineRequestError as exc:
            if exc.status != 404:
                raise
            result = await self._call("GET", legacy)
            endpoint = legacy
        if not isinstance(result, dict):
            raise ProtocolError(f"expected a JSON object, got {type(result).__name__}", url=self.url, endpoint=endpoint, status=200)
        return result

    # -- generation ------------------------------------------------------------------------------

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        rid: str | None = None,
        return_logprob: bool = True,
        headers: Mapping[str, str] | None = None,
        logprob_start_len: int | None = None,
        timeout_s: float | None = None,
    ) -> GenerateResult:
        """``POST /generate`` for one prompt, one sample (docs/sglang.md#generate-request). An abort is a normal result (docs/sglang.md#abort).

        Args:
            input_ids: [num_prompt_tokens] int, sent as-is (never re-tokenised).
            sampling_params: keys from ``SAMPLING_PARAM_KEYS`` (docs/sglang.md#generate-request); ``n`` must be 1 (with
                ``n > 1`` SGLang gives each sample a fresh rid that cannot be aborted by ours, docs/sglang.md#generate-request).
            rid: request id for ``abort``; pick ids that are not prefixes of one another (docs/sglang.md#abort).
            return_logprob: ask for ``output_token_logprobs``.
            headers: extra HTTP headers for this call (``X-SMG-Routing-Key`` through a router, docs/sglang.md#router).
            logprob_start_len: ask for ``input_token_logprobs`` from this prompt position on
                (``GenerateResult.input_logprobs``); None = not asked (SGLang's -1).
            timeout_s: the call's deadline in seconds; None = ``request_timeout_s`` (the pool passes
                a longer one: it aborts the request itself at ``request_timeout_s``).

        Raises:
            ValueError: bad input (see ``build_generate_payload``) or ``n != 1``.
            EngineUnavailable / EngineTimeout (``timeout_s``) / EngineRequestError / ProtocolError.
        """
        if sampling_params.get("n", 1) != 1:
            raise ValueError(f"sampling_params['n']={sampling_params['n']!r}: send one request per sample (n must be 1)")
        payload = build_generate_payload(
            input_ids, sampling_params, rid=rid, return_logprob=return_logprob, logprob_start_len=logprob_start_len
        )
        self.num_inflight += 1
        try:
            reply = await self._send(
                "POST", "/generate", body=payload, timeout_s=timeout_s or self.config.request_timeout_s, extra_headers=headers
            )
        finally:
            self.num_inflight -= 1
        if reply.status == ABORTED_BEFORE_SCHEDULING:
            # 0.5.17: a request held by a pause (or still in the tokenizer) when /abort_request came
            # answers 499 {"error": {"message": "Request <rid> was aborted"}}: an abort, not a failure
            message = error_message_from_body(reply.status, reply.content_type, reply.text)
            return GenerateResult(
                output_ids=[],
                output_logprobs=[],
                completion_tokens=0,
                rid=rid or "",
                finish_reason=FinishReason(type="abort", message=message, status_code=reply.status),
            )
        self._raise_for_status(reply, "/generate")
        results = parse_generate_response(reply.body, url=self.url, return_logprob=return_logprob)
        if len(results) != 1:
            raise ProtocolError(
                f"expected one result for one prompt, got {len(results)}", url=self.url, endpoint="/generate", status=reply.status
            )
        return results[0]

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """``POST /abort_request {"rid", "abort_all"}`` (docs/sglang.md#abort). SGLang aborts every rid *starting with* ``rid``.

        Raises:
            ValueError: neither ``rid`` nor ``abort_all`` given (the server would silently ignore it).
        """
        if not rid and not abort_all:
            raise ValueError("abort() needs a rid or abort_all=True")
        await self._call("POST", "/abort_request", {"rid": rid or "", "abort_all": abort_all})

    async def pause_generation(self, mode: Literal["abort", "retract", "in_place"] = "abort") -> None:
        """``POST /pause_generation {"mode"}`` (docs/sglang.md#pause); new generates are held, not refused, until continue."""
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"pause mode {mode!r}: expected 'abort', 'retract' or 'in_place'")
        await self._call("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self) -> None:
        """``POST /continue_generation {}`` (docs/sglang.md#pause)."""
        await self._call("POST", "/continue_generation", {})

    # -- weights and memory ----------------------------------------------------------------------

    async def update_weights_from_disk(
        self, model_path: str, *, weight_version: str, abort_all_requests: bool = False, flush_cache: bool = True
    ) -> dict[str, Any]:
        """``POST /update_weights_from_disk`` (docs/sglang.md#update-weights-from-disk) -> ``{"success": true, "message", "num_paused_requests"}``.

        Waits for in-flight generates unless paused or ``abort_all_requests``; bounded by ``control_timeout_s``.

        Raises:
            EngineRequestError: ``success: false`` (200 or 400), carrying the engine's message.
        """
        body = {
            "model_path": model_path,
            "weight_version": weight_version,
            "abort_all_requests": abort_all_requests,
            "flush_cache": flush_cache,
        }
        return await self._call("POST", "/update_weights_from_disk", body)

    async def update_weight_version(self, new_version: str, *, abort_all_requests: bool = False) -> dict[str, Any]:
        """``POST /update_weight_version`` (docs/sglang.md#weight-version) -> ``{"success", "message", "new_version"}``.

        SGLang's own default for ``abort_all_requests`` is True; we always send the value explicitly.
        """
        return await self._call("POST", "/update_weight_version", {"new_version": new_version, "abort_all_requests": abort_all_requests})

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """``POST /release_memory_occupation {"tags"}`` (docs/sglang.md#memory); tags None = all. The worker must be idle."""
        await self._call("POST", "/release_memory_occupation", {"tags": list(tags) if tags else None})

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """``POST /resume_memory_occupation {"tags"}`` (docs/sglang.md#memory); re-sync weights afterwards."""
        await self._call("POST", "/resume_memory_occupation", {"tags": list(tags) if tags else None})

    async def flush_cache(self) -> bool:
        """``POST /flush_cache`` (docs/sglang.md#flush-cache): True on 200, False on 400 (busy; the plain-text body is not
        trusted: 0.5.2/0.5.6 send the success text on refusal too). Other statuses raise as usual."""
        reply = await self._send("POST", "/flush_cache", timeout_s=self.config.control_timeout_s)
        if reply.status == 400:
            return False
        self._raise_for_status(reply, "/flush_cache")
        return True

    # -- health and info -------------------------------------------------------------------------

    async def health_generate(self, *, timeout_s: float | None = None) -> bool:
        """``GET /health_generate`` (docs/sglang.md#health): True on 200; False on 5xx, unreachable or timed out.

        Raises:
            EngineRequestError: a 4xx (wrong key, not an SGLang server): waiting will not fix it.
        """
        return await self.health_problem(timeout_s=timeout_s) is None

    async def health_problem(self, *, timeout_s: float | None = None) -> str | None:
        """``GET /health_generate``: None on 200, else what went wrong, one line without the url:
        ``no answer to /health_generate within 30s``, ``/health_generate unreachable: <why>`` or
        ``/health_generate answered HTTP 503``.

        Raises:
            EngineRequestError: a 4xx, as ``health_generate``.
        """
        timeout_s = timeout_s or self.config.control_timeout_s
        try:
            reply = await self._send("GET", "/health_generate", timeout_s=timeout_s)
        except EngineTimeout:
            return f"no answer to /health_generate within {timeout_s:g}s"
        except EngineUnavailable as exc:
            return f"/health_generate unreachable: {' '.join((exc.engine_message or str(exc)).split())}"
        if 400 <= reply.status < 500:
            self._raise_for_status(reply, "/health_generate")
        return None if reply.status == 200 else f"/health_generate answered HTTP {reply.status}"

    async def wait_ready(self, timeout_s: float) -> None:
        """Poll ``GET /health_generate`` until 200 (docs/sglang.md#health; ``/model_info`` answers before the engine is ready).

        Backoff starts at ``retry_backoff_s`` and doubles up to 2 s; each probe is bounded by the time left.

        Raises:
            EngineUnavailable: never reached the engine within ``timeout_s``.
            EngineTimeout: reached it, but it did not report ready within ``timeout_s``.
            EngineRequestError: a 4xx from ``/health_generate``.
        """
        deadline = time.monotonic() + timeout_s
        delay = min(self.config.retry_backoff_s, _READY_POLL_MAX_S) or 0.05
        num_probes, last = 0, "no probe sent"
        reached = False
        while (left := deadline - time.monotonic()) > 0:
            num_probes += 1
            try:
                reply = await self._send("GET", "/health_generate", timeout_s=min(left, self.config.control_timeout_s))
            except EngineUnavailable as exc:
                last = f"unreachable ({exc.engine_message})"
            except EngineTimeout:
                reached, last = True, "probe timed out"
            else:
                reached = True
                if reply.status == 200:
                    return
                if 400 <= reply.status < 500:
                    self._raise_for_status(reply, "/health_generate")
                last = f"HTTP {reply.status}"
            await asyncio.sleep(max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, _READY_POLL_MAX_S)
        cls = EngineTimeout if reached else EngineUnavailable
        raise cls(f"not ready after {timeout_s}s ({num_probes} probes; last: {last})", url=self.url, endpoint="/health_generate")

    async def model_info(self) -> dict[str, Any]:
        """``GET /model_info`` (0.5.6+), falling back to ``/get_model_info`` on 404 (docs/sglang.md#model-info).
        Keys include ``model_path``, ``weight_version`` (0.5.2+), ``is_generation``."""
        return await self._get_with_fallback("/model_info", "/get_model_info")

    async def server_info(self) -> dict[str, Any]:
        """``GET /server_info`` (0.5.6+), falling back to ``/get_server_info`` on 404 (docs/sglang.md#model-info)."""
        return await self._get_with_fallback("/server_info", "/get_server_info")
