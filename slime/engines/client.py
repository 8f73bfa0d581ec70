"""``EngineClient``: one SGLang worker (or the embedded engine) over the native HTTP API.

Protocol facts: docs/sglang.md. Every call has a deadline from
``RolloutConfig`` (``request_timeout_s`` for ``/generate``, ``control_timeout_s`` for the rest),
enforced by ``asyncio.timeout`` and mirrored in the per-request ``aiohttp.ClientTimeout``.

Errors are mapped once, in ``EngineHttp`` (``client_http.py``, the transport this class is built on):
connection failures and 5xx are ``EngineUnavailable``, a call past its deadline ``EngineTimeout``, 4xx
and ``"success": false`` ``EngineRequestError``, an undecodable body ``ProtocolError`` (except a
``/generate`` 499: SGLang 0.5.17's answer for a request aborted before scheduling, which is an abort
result with no tokens, like a queued abort). The client owns no session: the ``HttpEnginePool`` (or
the caller) does. The weight-sync calls beyond ``/update_weights_from_disk`` are used by the
strategies in ``slime/sync/``; the embedded engine serves them in ``slime/servers/embedded/weights.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Literal

import aiohttp

from slime.config import RolloutConfig
from slime.engines.client_http import CONNECT_TIMEOUT_S, EngineHttp, Reply
from slime.engines.protocol import (
    FinishReason,
    GenerateResult,
    JsonObject,
    build_generate_payload,
    error_message_from_body,
    parse_generate_response,
    with_routed_experts,
)
from slime.errors import EngineRequestError, EngineTimeout, EngineUnavailable, ProtocolError

__all__ = ["EngineClient", "CONNECT_TIMEOUT_S"]

ABORTED_BEFORE_SCHEDULING = 499
"""HTTP status of a ``/generate`` whose request was aborted before it reached SGLang's scheduler (held
by a pause, seen on 0.5.17 on the H200): mapped to an abort result with no tokens, so the sample stays
PARTIAL (resumable) instead of FAILED."""
_READY_POLL_MAX_S = 2.0  # sglang's own HttpServerEngineAdapter polls /health_generate every 2 s (docs/sglang.md#health)


class EngineClient:
    """One engine at ``url`` (``http://host:port``), talking through a shared ``aiohttp.ClientSession``.

    ``num_inflight`` counts ``generate`` calls not yet returned (the pool's least-loaded signal).
    ``api_key``, when given, is sent as ``Authorization: Bearer <key>`` (docs/sglang.md#errors).
    """

    def __init__(self, url: str, *, session: aiohttp.ClientSession, config: RolloutConfig, api_key: str | None = None):
        self.url = url.rstrip("/")
        self.config = config
        self.num_inflight = 0
        self._http = EngineHttp(self.url, session=session, config=config, api_key=api_key)

    def __repr__(self) -> str:
        return f"EngineClient({self.url!r}, num_inflight={self.num_inflight})"

    # -- generation ------------------------------------------------------------------------------

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, object],
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
            raise ValueError(
                f"sampling_params['n']={sampling_params['n']!r}: send one request per sample (n must be 1)"
            )
        routes = self.config.use_rollout_routing_replay
        payload = build_generate_payload(
            input_ids, sampling_params, rid=rid, return_logprob=return_logprob, logprob_start_len=logprob_start_len,
            return_routed_experts=routes,
        )  # fmt: skip
        self.num_inflight += 1
        try:
            reply = await self._http.send(
                "POST",
                "/generate",
                body=payload,
                timeout_s=timeout_s or self.config.request_timeout_s,
                extra_headers=headers,
            )
        finally:
            self.num_inflight -= 1
        result = self._generate_result(reply, rid=rid, return_logprob=return_logprob)
        return with_routed_experts(result, url=self.url) if routes else result

    def _generate_result(self, reply: Reply, *, rid: str | None, return_logprob: bool) -> GenerateResult:
        """The one result of a ``/generate`` reply: a 499 is an abort with no tokens (``ABORTED_BEFORE_SCHEDULING``).

        Raises:
            EngineRequestError / EngineUnavailable (an error status) / ProtocolError (not exactly one result).
        """
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
        self._http.raise_for_status(reply, "/generate")
        results = parse_generate_response(reply.body, url=self.url, return_logprob=return_logprob)
        if len(results) != 1:
            raise ProtocolError(
                f"expected one result for one prompt, got {len(results)}",
                url=self.url,
                endpoint="/generate",
                status=reply.status,
            )
        return results[0]

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """``POST /abort_request {"rid", "abort_all"}`` (docs/sglang.md#abort). SGLang aborts every rid *starting with* ``rid``.

        Raises:
            ValueError: neither ``rid`` nor ``abort_all`` given (the server would silently ignore it).
        """
        if not rid and not abort_all:
            raise ValueError("abort() needs a rid or abort_all=True")
        await self._http.call("POST", "/abort_request", {"rid": rid or "", "abort_all": abort_all})

    async def pause_generation(self, mode: Literal["abort", "retract", "in_place"] = "abort") -> None:
        """``POST /pause_generation {"mode"}`` (docs/sglang.md#pause); new generates are held, not refused, until continue."""
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"pause mode {mode!r}: expected 'abort', 'retract' or 'in_place'")
        await self._http.call("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self) -> None:
        """``POST /continue_generation {}`` (docs/sglang.md#pause)."""
        await self._http.call("POST", "/continue_generation", {})

    # -- weights and memory ----------------------------------------------------------------------

    async def update_weights_from_disk(
        self, model_path: str, *, weight_version: str, abort_all_requests: bool = False, flush_cache: bool = True
    ) -> JsonObject:
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
        return await self._http.call("POST", "/update_weights_from_disk", body)

    async def update_weight_version(self, new_version: str, *, abort_all_requests: bool = False) -> JsonObject:
        """``POST /update_weight_version`` (docs/sglang.md#weight-version) -> ``{"success", "message", "new_version"}``.

        SGLang's own default for ``abort_all_requests`` is True; we always send the value explicitly.
        """
        return await self._http.call(
            "POST", "/update_weight_version", {"new_version": new_version, "abort_all_requests": abort_all_requests}
        )

    # -- weight sync beyond disk (the strategies in slime/sync/ use these; ``timeout_s`` None: ``control_timeout_s``)

    async def begin_weight_update(self, selector: str = "all") -> bool:
        """``POST /begin_weight_update {"selector"}`` (docs/sglang.md#update-weights-from-distributed, 0.5.23). True: a session is open; False:
        404, the engine has no sessions (SGLang before 0.5.23 needs none).

        Raises:
            EngineRequestError: 400, e.g. a session is already open (a second begin without end fails).
        """
        return await self._call_unless_404("/begin_weight_update", {"selector": selector})

    async def end_weight_update(self) -> bool:
        """``POST /end_weight_update {}`` (docs/sglang.md#update-weights-from-distributed, 0.5.23). True: the session is closed; False: 404 (no sessions)."""
        return await self._call_unless_404("/end_weight_update", {})

    async def _call_unless_404(self, endpoint: str, body: JsonObject) -> bool:
        try:
            await self._http.call("POST", endpoint, body)
        except EngineRequestError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float | None = None,
    ) -> JsonObject:
        """``POST /init_weights_update_group`` (docs/sglang.md#update-weights-from-distributed): the engine's TP ranks join as ``rank_offset + tp_rank``.
        Blocks until every rank (the trainer, rank 0, included) has joined: start the trainer's side first."""
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        return await self._http.call("POST", "/init_weights_update_group", body, timeout_s=timeout_s)

    async def destroy_weights_update_group(self, group_name: str, *, timeout_s: float | None = None) -> JsonObject:
        """``POST /destroy_weights_update_group {"group_name"}`` (docs/sglang.md#update-weights-from-distributed, 0.5.6+)."""
        return await self._http.call(
            "POST", "/destroy_weights_update_group", {"group_name": group_name}, timeout_s=timeout_s
        )

    async def update_weights_from_distributed(
        self,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        *,
        group_name: str,
        weight_version: str,
        abort_all_requests: bool = False,
        flush_cache: bool = True,
        load_format: str | None = None,
        timeout_s: float | None = None,
    ) -> JsonObject:
        """``POST /update_weights_from_distributed`` (docs/sglang.md#update-weights-from-distributed). The engine receives one ``broadcast(src=0)``
        per tensor in list order (one flat uint8 buffer with ``load_format="flattened_bucket"``) while
        this call is pending; the caller must broadcast the same tensors concurrently.
        ``dtypes`` are torch attribute names (``"float32"``)."""
        body = {
            "names": list(names),
            "dtypes": list(dtypes),
            "shapes": [list(s) for s in shapes],
            "group_name": group_name,
            "weight_version": weight_version,
            "abort_all_requests": abort_all_requests,
            "flush_cache": flush_cache,
            "load_format": load_format,
        }
        return await self._http.call("POST", "/update_weights_from_distributed", body, timeout_s=timeout_s)

    async def update_weights_from_tensor(
        self,
        serialized_named_tensors: Sequence[str],
        *,
        weight_version: str,
        load_format: str | None = None,
        abort_all_requests: bool = False,
        flush_cache: bool = True,
        timeout_s: float | None = None,
    ) -> JsonObject:
        """``POST /update_weights_from_tensor`` (docs/sglang.md#update-weights-from-tensor): one base64 payload per TP rank (see ``slime.sync.wire``)."""
        body = {
            "serialized_named_tensors": list(serialized_named_tensors),
            "load_format": load_format,
            "weight_version": weight_version,
            "abort_all_requests": abort_all_requests,
            "flush_cache": flush_cache,
        }
        return await self._http.call("POST", "/update_weights_from_tensor", body, timeout_s=timeout_s)

    async def update_weights_from_delta(self, payload: bytes, *, timeout_s: float | None = None) -> JsonObject:
        """``POST /update_weights_from_delta`` (slime's embedded engine only, not SGLang): ``payload`` is a
        safetensors file from ``slime.sync.codec.encode_payload``. Returns ``{"success", "message",
        "checksums": {name: sha256 hex}}`` of every tensor it wrote, read back from the live model."""
        return await self._http.call("POST", "/update_weights_from_delta", raw=payload, timeout_s=timeout_s)

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """``POST /release_memory_occupation {"tags"}`` (docs/sglang.md#memory); tags None = all. The worker must be idle."""
        await self._http.call("POST", "/release_memory_occupation", {"tags": list(tags) if tags else None})

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """``POST /resume_memory_occupation {"tags"}`` (docs/sglang.md#memory); re-sync weights afterwards."""
        await self._http.call("POST", "/resume_memory_occupation", {"tags": list(tags) if tags else None})

    async def flush_cache(self) -> bool:
        """``POST /flush_cache`` (docs/sglang.md#flush-cache): True on 200, False on 400 (busy; the plain-text body is not
        trusted: 0.5.2/0.5.6 send the success text on refusal too). Other statuses raise as usual."""
        reply = await self._http.send("POST", "/flush_cache", timeout_s=self.config.control_timeout_s)
        if reply.status == 400:
            return False
        self._http.raise_for_status(reply, "/flush_cache")
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
            reply = await self._http.send("GET", "/health_generate", timeout_s=timeout_s)
        except EngineTimeout:
            return f"no answer to /health_generate within {timeout_s:g}s"
        except EngineUnavailable as exc:
            return f"/health_generate unreachable: {' '.join((exc.engine_message or str(exc)).split())}"
        if 400 <= reply.status < 500:
            self._http.raise_for_status(reply, "/health_generate")
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
                reply = await self._http.send(
                    "GET", "/health_generate", timeout_s=min(left, self.config.control_timeout_s)
                )
            except EngineUnavailable as exc:
                last = f"unreachable ({exc.engine_message})"
            except EngineTimeout:
                reached, last = True, "probe timed out"
            else:
                reached = True
                if reply.status == 200:
                    return
                if 400 <= reply.status < 500:
                    self._http.raise_for_status(reply, "/health_generate")
                last = f"HTTP {reply.status}"
            await asyncio.sleep(max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, _READY_POLL_MAX_S)
        cls = EngineTimeout if reached else EngineUnavailable
        raise cls(
            f"not ready after {timeout_s}s ({num_probes} probes; last: {last})",
            url=self.url,
            endpoint="/health_generate",
        )

    async def model_info(self) -> JsonObject:
        """``GET /model_info`` (0.5.6+), falling back to ``/get_model_info`` on 404 (docs/sglang.md#model-info).
        Keys include ``model_path``, ``weight_version`` (0.5.2+), ``is_generation``."""
        return await self._http.get_with_fallback("/model_info", "/get_model_info")

    async def server_info(self) -> JsonObject:
        """``GET /server_info`` (0.5.6+), falling back to ``/get_server_info`` on 404 (docs/sglang.md#model-info)."""
        return await self._http.get_with_fallback("/server_info", "/get_server_info")
