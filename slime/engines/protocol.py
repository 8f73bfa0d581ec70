"""SGLang native HTTP wire format: the ``/generate`` payload we send and the bodies we read back.

Protocol facts: docs/sglang.md (SGLang 0.5.2, 0.5.6.post2, 0.5.23; 0.4.6 where
cheap). Nothing here does I/O; ``slime/engines/client.py`` sends and receives, this module builds
and parses. ``Sample`` lives in ``slime/types.py``, apart from these wire structs.

What we tolerate (docs/sglang.md#client-tolerance): ``output_ids`` absent (0.4.6 text mode, 0.5.2 queued abort; derived from
``output_token_logprobs[i][1]``), ``prompt_tokens``/``cached_tokens``/``e2e_latency``/
``weight_version`` absent, a JSON array instead of one object. What we refuse with ``ProtocolError``:
a body that is not JSON of that shape, a logprob list not aligned with ``output_ids``, a ``null``
logprob (unless allowed), weight-version spans that do not tile the output, a null ``finish_reason``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import msgspec

from slime.errors import ProtocolError
from slime.types import JsonObject

__all__ = [
    "JsonObject",
    "SAMPLING_PARAM_KEYS",
    "FinishReason",
    "GenerateResult",
    "build_generate_payload",
    "parse_generate_response",
    "with_routed_experts",
    "error_message_from_body",
]


SAMPLING_PARAM_KEYS = frozenset(
    {
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "ignore_eos",
        "min_new_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "n",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "logit_bias",
        "sampling_seed",
        "stream_interval",
        "custom_params",
        "beam_width",
    }
)
"""The documented ``sampling_params`` keys (docs/sglang.md#generate-request). 0.5.23 answers 400 to any other key."""

_INT_SAMPLING_KEYS = ("max_new_tokens", "top_k", "min_new_tokens", "n")
_MISPLACED_HINTS = {
    "return_logprob": "it is a top-level /generate field, passed as return_logprob=",
    "max_tokens": "SGLang spells it max_new_tokens",
    "seed": "SGLang spells it sampling_seed",
}
_MAX_ERROR_TEXT = 2000


class FinishReason(msgspec.Struct, kw_only=True):
    """``meta_info.finish_reason`` (docs/sglang.md#finish-reason).

    Shapes: ``{"type":"stop","matched": <token id> | "<stop string or regex>" | [ids]}``,
    ``{"type":"length","length": <max_new_tokens>}``,
    ``{"type":"abort","message": "Aborted" | "Abort in waiting queue" | "Abort before prefill",
    "status_code": int|null, "err_type": str|null}`` (queued aborts omit the last two keys).
    """

    type: Literal["stop", "length", "abort"]
    matched: int | str | list[int] | None = None
    length: int | None = None
    message: str | None = None
    status_code: int | None = None
    err_type: str | None = None


class GenerateResult(msgspec.Struct, kw_only=True):
    """One finished (or aborted) ``/generate`` item, normalised across SGLang versions (docs/sglang.md#generate-response, #abort).

    Attributes:
        output_ids: [num_tokens] int, every sampled token, EOS/stop token included; for a running
            abort, through the token of the step the abort landed in; ``[]`` for a queued abort.
        output_logprobs: [num_tokens] float, natural log, temperature-scaled distribution (docs/sglang.md#generate-response),
            aligned with ``output_ids``; ``[]`` when logprobs were not asked for. A ``null`` from the
            server becomes NaN only when the caller allowed it.
        finish_reason: see ``FinishReason``; ``finish_reason.type == "abort"`` is data, not an error.
        weight_version: server weight version (``meta_info.weight_version``), None before 0.5.2 and
            on 0.5.2/0.5.6 queued aborts.
        token_weight_versions: [num_tokens] str, the weight version of each output token, expanded
            from 0.5.23 ``weight_versions`` spans ``[{version, start, end}]``; None when absent.
        prompt_tokens / cached_tokens: token counts; None when absent (queued aborts, docs/sglang.md#abort).
        completion_tokens: ``meta_info.completion_tokens`` (= num_tokens on every documented shape).
        e2e_latency: seconds from arrival to finish; None when absent.
        rid: ``meta_info.id`` (for ``n > 1``: the server-generated per-sample id).
        text: detokenised output; None with ``--skip-tokenizer-init``.
        input_token_ids / input_logprobs: [num_prompt_tokens - logprob_start_len] int / float,
            ``meta_info.input_token_logprobs`` (docs/sglang.md#generate-response) when the request set ``logprob_start_len``:
            the prompt tokens from ``logprob_start_len`` on, and the natural-log probability of each
            given the tokens before it; NaN where the server sent ``null`` (SGLang's first entry
            always, and any non-finite value). ``[]`` when not asked for.
        routed_experts: ``meta_info.routed_experts`` when the request set ``return_routed_experts``: base64
            of int32 [input + output tokens - 1, num_hidden_layers, top-k] (``slime.routed_experts``); None
            when absent.
    """

    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: FinishReason
    weight_version: str | None = None
    token_weight_versions: list[str] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    cached_tokens: int | None = None
    e2e_latency: float | None = None
    rid: str = ""
    text: str | None = None
    input_token_ids: list[int] = msgspec.field(default_factory=list)
    input_logprobs: list[float] = msgspec.field(default_factory=list)
    routed_experts: str | None = None

    @property
    def aborted(self) -> bool:
        return self.finish_reason.type == "abort"


class _LogprobEntry(msgspec.Struct, array_like=True):
    """``[logprob | null, token_id, text | null]`` (docs/sglang.md#generate-response)."""

    logprob: float | None
    token_id: int
    text: str | None = None


class _WeightSpan(msgspec.Struct):
    version: str
    start: int
    end: int


class _MetaInfo(msgspec.Struct):
    id: str = ""
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    weight_version: str | None = None
    weight_versions: list[_WeightSpan] | None = None
    e2e_latency: float | None = None
    output_token_logprobs: list[_LogprobEntry] | None = None
    input_token_logprobs: list[_LogprobEntry] | None = None
    routed_experts: str | None = None  # base64 int32 [T, L, k] (SGLang >= 0.5.17, return_routed_experts)


class _WireItem(msgspec.Struct):
    meta_info: _MetaInfo
    text: str | None = None
    output_ids: list[int] | None = None


_generate_decoder = msgspec.json.Decoder(_WireItem | list[_WireItem])


def build_generate_payload(
    input_ids: Sequence[int],
    sampling_params: Mapping[str, object],
    *,
    rid: str | None,
    return_logprob: bool,
    logprob_start_len: int | None = None,
    return_routed_experts: bool = False,
) -> JsonObject:
    """Build a single-prompt ``/generate`` body (docs/sglang.md#generate-request): ``{input_ids, sampling_params, return_logprob[, rid][, logprob_start_len][, return_routed_experts]}``.

    ``sampling_params`` is copied, never mutated, and limited to ``SAMPLING_PARAM_KEYS``;
    ``return_logprob`` always goes at the top level. ``logprob_start_len`` (first prompt position
    of ``input_token_logprobs``) is sent only when given, and needs ``return_logprob``.
    ``return_routed_experts`` (``--use-rollout-routing-replay``) is sent only when True.

    Raises:
        ValueError: empty or non-int ``input_ids``; an unknown sampling key (named, with a hint
            for the usual mistakes); a float where SGLang wants an int (0.5.23 answers 400).
    """
    ids = list(input_ids)
    if not ids:
        raise ValueError("input_ids is empty: SGLang answers 400 to an empty prompt (docs/sglang.md#generate-request)")
    bad = next((t for t in ids if type(t) is not int), None)
    if bad is not None:
        raise ValueError(f"input_ids must be ints, got {bad!r} ({type(bad).__name__})")
    unknown = sorted(set(sampling_params) - SAMPLING_PARAM_KEYS)
    if unknown:
        hints = "; ".join(f"{k}: {_MISPLACED_HINTS[k]}" for k in unknown if k in _MISPLACED_HINTS)
        raise ValueError(
            f"unknown sampling_params key(s) {unknown} (SGLang 0.5.23 rejects them with 400, docs/sglang.md#generate-request)"
            + (f"; {hints}" if hints else "")
        )
    for key in _INT_SAMPLING_KEYS:
        value = sampling_params.get(key)
        if value is not None and type(value) is not int:
            raise ValueError(f"sampling_params[{key!r}] must be an int, got {value!r}")
    payload = {"input_ids": ids, "sampling_params": dict(sampling_params), "return_logprob": bool(return_logprob)}
    if rid is not None:
        payload["rid"] = rid
    if logprob_start_len is not None:
        if not return_logprob or type(logprob_start_len) is not int or not 0 <= logprob_start_len < len(ids):
            raise ValueError(
                f"logprob_start_len={logprob_start_len!r} needs return_logprob=True and 0 <= it < len(input_ids)={len(ids)}"
            )
        payload["logprob_start_len"] = logprob_start_len
    if return_routed_experts:
        payload["return_routed_experts"] = True
    return payload


def with_routed_experts(result: GenerateResult, *, url: str) -> GenerateResult:
    """``result`` of a request that asked ``return_routed_experts``. Raises ProtocolError when it finished with
    tokens but no routes (a server without ``--enable-return-routed-experts``, or a dense model); an abort may
    come without them (its tokens then take the resumed request's routes)."""
    if result.output_ids and result.routed_experts is None and not result.aborted:
        raise ProtocolError(
            "--use-rollout-routing-replay: the server returned no meta_info.routed_experts (start SGLang with "
            "--enable-return-routed-experts, which slime adds to the servers it launches; and serve an MoE model)",
            url=url,
            endpoint="/generate",
            status=200,
        )
    return result


def parse_generate_response(
    body: bytes | str, *, url: str, return_logprob: bool = True, allow_null_logprobs: bool = False
) -> list[GenerateResult]:
    """Parse a non-streaming ``/generate`` 200 body (docs/sglang.md#generate-response, #abort) into one result per item.

    Args:
        body: the raw body: one JSON object (single prompt) or an array (batch or ``n > 1``, docs/sglang.md#generate-request).
        url: engine base URL, for error messages.
        return_logprob: whether the request asked for logprobs; then ``output_token_logprobs`` must
            be present and aligned with ``output_ids``, except on the 0.5.2 queued-abort shape
            (no ``output_ids``, no logprob keys, ``"Abort before prefill"``).
        allow_null_logprobs: map a ``null`` logprob (a non-finite value on the server) to NaN
            instead of raising.

    Returns:
        A list with one ``GenerateResult`` per item, in the server's order (always a list).

    Raises:
        ProtocolError: undecodable body, missing fields, misaligned lists, null logprob, bad spans.
    """
    try:
        decoded = _generate_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        raise ProtocolError(
            f"cannot parse /generate response ({exc}); body starts {text[:300]!r}",
            url=url,
            endpoint="/generate",
            status=200,
            engine_message=error_message_from_body(200, "", text),
        ) from exc
    items = decoded if isinstance(decoded, list) else [decoded]
    return [_to_result(item, i, url, return_logprob, allow_null_logprobs) for i, item in enumerate(items)]


def _to_result(item: _WireItem, index: int, url: str, return_logprob: bool, allow_null: bool) -> GenerateResult:
    meta = item.meta_info
    where = f"item {index} (rid={meta.id!r})"

    def fail(what: str) -> ProtocolError:
        return ProtocolError(f"/generate {where}: {what}", url=url, endpoint="/generate", status=200)

    if meta.finish_reason is None:
        raise fail("finish_reason is null (an unfinished stream chunk?)")
    entries, output_ids = meta.output_token_logprobs, item.output_ids
    if output_ids is None and entries is not None:
        output_ids = [e.token_id for e in entries]  # 0.4.6 text mode (docs/sglang.md#versions)
    if output_ids is None:
        if meta.finish_reason.type != "abort":
            raise fail(
                "no output_ids and no output_token_logprobs: cannot recover the tokens (0.4.6 text mode? ask with return_logprob=True)"
            )
        output_ids = []  # 0.5.2 "Abort before prefill" (docs/sglang.md#abort)
    logprobs: list[float] = []
    if entries is not None:
        if len(entries) != len(output_ids):
            raise fail(f"len(output_ids)={len(output_ids)} != len(output_token_logprobs)={len(entries)}")
        for i, entry in enumerate(entries):
            if entry.token_id != output_ids[i]:
                raise fail(f"output_token_logprobs[{i}] is for token {entry.token_id}, output_ids[{i}]={output_ids[i]}")
            if entry.logprob is None and not allow_null:
                raise fail(
                    f"output_token_logprobs[{i}] has a null logprob (token {entry.token_id}); "
                    "the server sends null for non-finite values (docs/sglang.md#generate-response)"
                )
            logprobs.append(math.nan if entry.logprob is None else entry.logprob)
    elif return_logprob and output_ids:
        raise fail(f"logprobs were asked for but output_token_logprobs is absent ({len(output_ids)} output_ids)")
    return GenerateResult(
        output_ids=output_ids,
        output_logprobs=logprobs,
        finish_reason=meta.finish_reason,
        weight_version=meta.weight_version,
        token_weight_versions=None
        if meta.weight_versions is None
        else _expand_spans(meta.weight_versions, len(output_ids), fail),
        prompt_tokens=meta.prompt_tokens,
        completion_tokens=len(output_ids) if meta.completion_tokens is None else meta.completion_tokens,
        cached_tokens=meta.cached_tokens,
        e2e_latency=meta.e2e_latency,
        rid=meta.id,
        text=item.text,
        input_token_ids=[e.token_id for e in meta.input_token_logprobs or ()],
        input_logprobs=[math.nan if e.logprob is None else e.logprob for e in meta.input_token_logprobs or ()],
        routed_experts=meta.routed_experts,
    )


def _expand_spans(spans: list[_WeightSpan], num_tokens: int, fail: Callable[[str], ProtocolError]) -> list[str]:
    """``[{"version":"v1","start":0,"end":2},{"version":"v2","start":2,"end":3}]``, 3 tokens -> ``["v1","v1","v2"]``.

    Spans must tile ``[0, num_tokens)`` in order; empty spans (``start == end``) are allowed.
    """
    versions: list[str] = []
    shown = [(s.version, s.start, s.end) for s in spans]
    for span in spans:
        if span.start != len(versions) or span.end < span.start or span.end > num_tokens:
            raise fail(f"weight_versions spans {shown} do not tile {num_tokens} output tokens")
        versions.extend([span.version] * (span.end - span.start))
    if len(versions) != num_tokens:
        raise fail(f"weight_versions spans {shown} cover {len(versions)} of {num_tokens} output tokens")
    return versions


def error_message_from_body(status: int, content_type: str, text: str) -> str:
    """The engine's own error text from any docs/sglang.md#errors error body, for ``EngineError.engine_message``.

    Understands ``{"error": "<str>"}`` (0.5.23 contract), ``{"error": {"message"}}`` (ValueError;
    also the stream error chunk, with or without a ``data: `` prefix), ``{"object": "error",
    "message"}`` (ErrorResponse), ``{"success": false, "message"}``, FastAPI ``{"detail": [...]}``
    (0.4.6 422) and ``{"detail": "Not Found"}``, plain text (``/flush_cache``), an empty body.
    Never raises; an unknown JSON shape comes back as compact JSON, long text is cut to 2000 chars.
    """
    text = text.strip()
    if text.startswith("data:"):
        chunks = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
        text = next((c for c in chunks if c and c != "[DONE]"), "")
    if not text:
        return f"(empty body, HTTP {status})"
    try:
        body = msgspec.json.decode(text)
    except msgspec.DecodeError:
        note = " (declared JSON but not decodable)" if "json" in content_type.lower() else ""
        return text[:_MAX_ERROR_TEXT] + note
    return _message_from_json(body)[:_MAX_ERROR_TEXT]


def _message_from_json(body: object) -> str:
    if isinstance(body, str):
        return body
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, str):
            return error
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(body.get("message"), str):
            return body["message"]
        detail = body.get("detail")
        if isinstance(detail, str):
            return detail
        if isinstance(detail, list):
            return "; ".join(_fastapi_detail(d) for d in detail)
    return msgspec.json.encode(body).decode()


def _fastapi_detail(item: object) -> str:
    """``{"loc": ["body", "input_ids"], "msg": "field required", ...}`` -> ``body.input_ids: field required``."""
    if isinstance(item, dict) and "msg" in item:
        loc = ".".join(str(p) for p in item.get("loc") or ())
        return f"{loc}: {item['msg']}" if loc else str(item["msg"])
    return msgspec.json.encode(item).decode()
