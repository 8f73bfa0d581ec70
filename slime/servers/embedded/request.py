"""One generation request inside the embedded engine, and the SGLang response object built from it.

The runner thread owns an ``EngineRequest`` from ``submit`` until it sets ``done``; after that only
the HTTP handler reads it. ``output_ids``, ``output_logprobs`` and ``output_versions`` grow together
through ``append`` (one entry per generated token, stop/EOS token included).

finish_reason objects (docs/sglang.md#finish-reason), built by the ``finish_*`` helpers::

    {"type": "stop", "matched": 1}                 EOS / stop_token_ids hit (token id)
    {"type": "stop", "matched": "</s>"}            stop string hit
    {"type": "length", "length": 128}              max_new_tokens (or the context) reached
    {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}   running abort
    {"type": "abort", "message": "Abort in waiting queue"}                          queued abort (docs/sglang.md#abort, case B)
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from slime.routed_experts import encode_rows
from slime.servers.embedded.sampling import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "EngineRequest",
    "resolve",
    "finish_length",
    "finish_stop",
    "finish_reason_after",
    "weight_version_spans",
    "build_response",
]

QUEUED_ABORT_MESSAGE = "Abort in waiting queue"


@dataclass(eq=False)
class EngineRequest:
    """State of one sequence (one sample; ``n > 1`` makes one request per sample).

    Attributes:
        rid: request id (``meta_info.id``).
        prompt_ids: [P] prompt token ids.
        params: sampling parameters.
        generator: this request's RNG (seeded from ``--seed`` and the rid).
        return_logprob: attach logprob lists to the response.
        logprob_start_len: first prompt position for input logprobs; -1 = none.
        output_ids: [N] generated ids so far.
        output_logprobs: [N] float natural-log logprob of each output id (see sampling.py).
        output_versions: [N] weight version that produced each output id.
        input_logprobs: [P - logprob_start_len] floats, filled at first prefill; the first entry is None
            (as in SGLang, docs/sglang.md#generate-response), so ask from P - 1 to score token P onwards.
        finish_reason: None while running; the docs/sglang.md#finish-reason object once finished.
        queued: True while the request has no KV (never prefilled, or retracted).
        num_retractions: times a ``retract`` pause evicted it back to the waiting queue.
        seq: submission order, used for the weight-update barrier.
        created_s: ``time.perf_counter()`` at arrival, for ``e2e_latency``.
        done: resolved by the runner thread (result: this request) when it finishes.
        return_routed_experts / routes: whether to answer ``meta_info.routed_experts``, and the int32 [rows,
            num_hidden_layers, k] pieces captured so far (``route_capture.RouteCapture``).
    """

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    return_logprob: bool = False
    logprob_start_len: int = -1
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[str] = field(default_factory=list)
    input_logprobs: list[float | None] | None = None
    finish_reason: dict[str, object] | None = None
    queued: bool = True
    num_retractions: int = 0
    seq: int = 0
    created_s: float = field(default_factory=time.perf_counter)
    finished_s: float = 0.0
    done: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    return_routed_experts: bool = False
    routes: list[torch.Tensor] = field(default_factory=list)

    @property
    def context_ids(self) -> list[int]:
        """Prompt followed by the output so far: what a (re-)prefill feeds the model."""
        return self.prompt_ids + self.output_ids

    def append(self, token_id: int, logprob: float, version: str) -> None:
        self.output_ids.append(token_id)
        self.output_logprobs.append(logprob)
        self.output_versions.append(version)

    def finish(self, reason: dict[str, object]) -> None:
        """Record the finish reason and resolve ``done`` (first call wins; safe from the runner thread)."""
        if self.finish_reason is not None:
            return
        self.finish_reason = reason
        self.finished_s = time.perf_counter()
        resolve(self.done, self)

    def abort(self, message: str = "Aborted") -> None:
        """Finish as aborted: the docs/sglang.md#abort, case A shape if it holds KV, the smaller B shape if still queued."""
        if self.queued:
            self.finish({"type": "abort", "message": QUEUED_ABORT_MESSAGE if message == "Aborted" else message})
        else:
            self.finish({"type": "abort", "message": message, "status_code": None, "err_type": None})


def resolve(future: concurrent.futures.Future, result: object = None, exc: BaseException | None = None) -> None:
    """Set a future from the runner thread unless the waiter already gave up (cancelled it)."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


def finish_stop(matched: int | str) -> dict[str, object]:
    return {"type": "stop", "matched": matched}


def finish_length(length: int) -> dict[str, object]:
    return {"type": "length", "length": length}


def finish_reason_after(
    req: EngineRequest, *, eos_token_ids: frozenset[int], tokenizer: PreTrainedTokenizerBase | None, context_length: int
) -> dict[str, object] | None:
    """The finish reason once ``req``'s newest token is appended, or None to keep going.

    0.5.23 order: stop string > stop token / EOS > length, so an EOS sampled exactly at
    ``max_new_tokens`` is ``stop``. ``ignore_eos`` skips the token check (EOS and ``stop_token_ids``).
    Stop strings are looked for in the decoded tail of the output (needs ``tokenizer``).
    """
    params, tok, num_out = req.params, req.output_ids[-1], len(req.output_ids)
    if params.stop and tokenizer is not None:
        window = max(len(s) for s in params.stop) + 4  # tokens; every token decodes to >= 1 char or none
        tail = tokenizer.decode(req.output_ids[-window:], skip_special_tokens=params.skip_special_tokens)
        for s in params.stop:
            if s in tail:
                return finish_stop(s)
    if not params.ignore_eos and (tok in eos_token_ids or tok in params.stop_token_ids):
        return finish_stop(tok)
    if params.max_new_tokens is not None and num_out >= params.max_new_tokens:
        return finish_length(params.max_new_tokens)
    if len(req.prompt_ids) + num_out >= context_length:
        return finish_length(num_out)
    return None


def weight_version_spans(versions: list[str], current: str) -> list[dict[str, object]]:
    """Compress per-token versions into SGLang's ``weight_versions`` spans ``[start, end)``.

    Example: ["v1", "v1", "v2"] -> [{"version": "v1", "start": 0, "end": 2}, {"version": "v2", "start": 2, "end": 3}];
    no tokens -> [{"version": current, "start": 0, "end": 0}].
    """
    if not versions:
        return [{"version": current, "start": 0, "end": 0}]
    spans: list[dict[str, object]] = []
    for i, v in enumerate(versions):
        if spans and spans[-1]["version"] == v:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": v, "start": i, "end": i + 1})
    return spans


def build_response(
    req: EngineRequest,
    *,
    weight_version: str,
    tokenizer: PreTrainedTokenizerBase | None = None,
    return_text_in_logprobs: bool = False,
) -> dict[str, object]:
    """The docs/sglang.md#generate-response response object for a finished request (docs/sglang.md#abort, case B layout for a queued abort).

    Args:
        req: a finished request.
        weight_version: the server's current version (used when no token was generated).
        tokenizer: when given, ``text`` is included (special tokens skipped per ``skip_special_tokens``,
            a matched stop string trimmed unless ``no_stop_trim``).
        return_text_in_logprobs: fill the third slot of each logprob entry with the token's text.
    """
    assert req.finish_reason is not None, f"request {req.rid} is not finished"
    spans = weight_version_spans(req.output_versions, weight_version)
    queued_abort = req.finish_reason.get("type") == "abort" and "status_code" not in req.finish_reason
    meta: dict[str, object] = {"id": req.rid, "finish_reason": req.finish_reason}
    if not queued_abort:
        meta["prompt_tokens"] = len(req.prompt_ids)
    meta["completion_tokens"] = len(req.output_ids)
    if not queued_abort:
        meta.update(cached_tokens=0, reasoning_tokens=0, num_retractions=req.num_retractions)
    meta["weight_version"] = spans[-1]["version"]
    meta["weight_versions"] = spans
    meta["e2e_latency"] = round((req.finished_s or time.perf_counter()) - req.created_s, 6)
    if req.return_logprob:
        text_of = (
            (lambda t: tokenizer.decode([t]))
            if (tokenizer is not None and return_text_in_logprobs)
            else (lambda t: None)
        )
        start = max(req.logprob_start_len, 0)
        inputs = req.input_logprobs or []
        meta["input_token_logprobs"] = [
            [_finite(lp), tid, text_of(tid)] for lp, tid in zip(inputs, req.prompt_ids[start:])
        ]
        meta["output_token_logprobs"] = [
            [_finite(lp), tid, text_of(tid)] for lp, tid in zip(req.output_logprobs, req.output_ids)
        ]
        meta["output_token_logprobs_length"] = len(req.output_ids)
    if req.return_routed_experts and req.routes:  # input + output - 1 rows: the last sampled token was never fed
        rows = torch.cat(req.routes)[: len(req.prompt_ids) + len(req.output_ids) - 1]
        meta["routed_experts"] = encode_rows(rows.numpy())
    if not queued_abort:
        meta["response_sent_to_client_ts"] = time.time()
    out: dict[str, object] = {}
    if tokenizer is not None:
        out["text"] = _decode_text(req, tokenizer)
    out["output_ids"] = list(req.output_ids)
    out["meta_info"] = meta
    return out


def _finite(x: float | None) -> float | None:
    """SGLang serialises NaN / +-inf logprobs as null."""
    return x if x is not None and math.isfinite(x) else None


def _decode_text(req: EngineRequest, tokenizer: PreTrainedTokenizerBase) -> str:
    ids = req.output_ids
    matched = req.finish_reason.get("matched") if req.finish_reason else None
    if isinstance(matched, int) and not req.params.no_stop_trim and ids and ids[-1] == matched:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=req.params.skip_special_tokens)
    assert isinstance(text, str), "one sequence of ids decodes to one string"
    if isinstance(matched, str) and not req.params.no_stop_trim:
        cut = text.find(matched)
        if cut >= 0:
            text = text[:cut]
    return text
