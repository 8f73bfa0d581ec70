"""Turn a ``/generate`` body into ``EngineRequest``s, with SGLang 0.5.23's checks and error shapes.

Two layers of errors, as in SGLang 0.5.23 (docs/sglang.md#errors):

* ``ContractError`` (body ``{"error": "<string>"}``, 400): wrong JSON types of known fields and the
  closed set of ``sampling_params`` keys, worded like SGLang's serde contract
  (``unknown field `foo`, expected one of `max_new_tokens`, ...``).
* ``ValueError`` (body ``{"error": {"message": "..."}}``, 400): values out of range, prompts too long,
  and features this engine does not have (streaming, top logprobs, penalties, grammars, ...).

Expansion: a batch of B prompts with ``n`` samples each becomes B x n requests, prompt-major
(p0s0, p0s1, ..., p1s0, ...). rids: batch + rid string ``r`` -> ``r_0``, ``r_1``, ...; ``n > 1`` ->
every sample gets a fresh ``uuid4().hex`` (as SGLang). Seeds: a sample's generator is seeded from
(``--seed``, its rid); with ``n > 1`` from (``--seed``, ``<sent rid>/<j>``) when a rid was sent, so
runs that send rids are reproducible; with ``sampling_params.sampling_seed`` = s, from (s, ``sample/<j>``),
whatever the rid.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from slime.servers.embedded.request import EngineRequest
from slime.servers.embedded.sampling import SamplingParams, seeded_generator
from slime.servers.http import per_item
from slime.types import JsonObject

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["ContractError", "ParsedGenerate", "parse_generate", "SAMPLING_FIELDS"]

SAMPLING_FIELDS: dict[str, str] = {
    "max_new_tokens": "i64",
    "stop": "strs",
    "stop_token_ids": "i64s",
    "stop_regex": "strs",
    "temperature": "f64",
    "top_p": "f64",
    "top_k": "i64",
    "min_p": "f64",
    "frequency_penalty": "f64",
    "presence_penalty": "f64",
    "repetition_penalty": "f64",
    "min_new_tokens": "i64",
    "n": "i64",
    "json_schema": "str",
    "regex": "str",
    "ebnf": "str",
    "structural_tag": "str",
    "ignore_eos": "bool",
    "skip_special_tokens": "bool",
    "spaces_between_special_tokens": "bool",
    "no_stop_trim": "bool",
    "custom_params": "map",
    "stream_interval": "i64",
    "logit_bias": "map",
    "sampling_seed": "i64",
    "beam_width": "i64",
}
"""SGLang 0.5.23's closed ``sampling_params`` key set and each key's JSON type."""

# Keys accepted only at their default value (None = absent/null is the default).
_UNSUPPORTED_DEFAULTS = {
    "stop_regex": None,
    "min_new_tokens": 0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "custom_params": None,
    "logit_bias": None,
    "beam_width": None,
}
_TOP_LEVEL = {
    "text": "strs",
    "input_ids": "ids",
    "rid": "strs",
    "return_logprob": "bools",
    "logprob_start_len": "i64s",
    "top_logprobs_num": "i64s",
    "return_text_in_logprobs": "bool",
    "return_routed_experts": "bool",
    "stream": "bool",
}
_UNSUPPORTED_TOP = (
    "input_embeds",
    "token_ids_logprob",
    "return_hidden_states",
    "lora_path",
    "custom_logit_processor",
    "image_data",
    "audio_data",
    "video_data",
    "session_params",
)


class ContractError(ValueError):
    """A JSON-contract violation; answered as ``{"error": "<message>"}``."""


@dataclass
class ParsedGenerate:
    requests: list[EngineRequest]
    """[B x n] prompt-major."""
    is_batch: bool
    """Answer with a JSON array (batch input or n > 1)."""
    return_text_in_logprobs: bool


def _describe(v: object) -> str:
    if isinstance(v, bool):
        return f"boolean `{str(v).lower()}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v!r}`"
    if isinstance(v, str):
        return f'string "{v}"'
    return {list: "sequence", dict: "map", type(None): "null"}.get(type(v), type(v).__name__)


def _check_type(v: object, kind: str) -> None:
    """Raise ContractError unless ``v`` (not None) matches ``kind``; lists are checked element-wise."""
    is_int = isinstance(v, int) and not isinstance(v, bool)
    ok = {
        "i64": is_int,
        "f64": is_int or (isinstance(v, float) and not isinstance(v, bool)),
        "bool": isinstance(v, bool),
        "str": isinstance(v, str),
        "map": isinstance(v, dict),
    }
    if kind in ok:
        if not ok[kind]:
            expected = {"bool": "a boolean", "str": "a string", "map": "a map"}.get(kind, kind)
            raise ContractError(f"invalid type: {_describe(v)}, expected {expected}")
        return
    scalar = {"strs": "str", "i64s": "i64", "bools": "bool", "ids": "i64"}[kind]
    if kind == "ids" and not isinstance(v, list):
        raise ContractError(f"invalid type: {_describe(v)}, expected a sequence")
    for item in v if isinstance(v, list) else [v]:
        if kind == "ids" and isinstance(item, list):
            for x in item:
                _check_type(x, "i64")
        else:
            _check_type(item, scalar)


def _check_sampling(sp: object) -> JsonObject:
    """One ``sampling_params`` object checked against the closed key set, its null values dropped."""
    if not isinstance(sp, dict):
        raise ContractError(f"invalid type: {_describe(sp)}, expected struct SamplingParams")
    for key, value in sp.items():
        if key not in SAMPLING_FIELDS:
            expected = ", ".join(f"`{k}`" for k in SAMPLING_FIELDS)
            raise ContractError(f"unknown field `{key}`, expected one of {expected}")
        if value is not None:
            kind = SAMPLING_FIELDS[key]
            if kind == "i64s" and not isinstance(value, list):
                raise ContractError(f"invalid type: {_describe(value)}, expected a sequence")
            _check_type(value, kind)
    return {k: v for k, v in sp.items() if v is not None}


def _sampling_params(sp: JsonObject, *, has_tokenizer: bool) -> tuple[SamplingParams, int, int | None]:
    """Build SamplingParams; returns (params, n, sampling_seed). Raises ValueError on bad values."""
    for key, default in _UNSUPPORTED_DEFAULTS.items():
        if key in sp and sp[key] != default and sp[key] not in ({}, []):
            raise ValueError(f"The slime embedded engine does not support sampling_params.{key} (got {sp[key]!r}).")
    stop = sp.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if stop and not has_tokenizer:
        raise ValueError("Stop strings need a tokenizer, but the model directory has none; use stop_token_ids.")
    params = SamplingParams(
        max_new_tokens=sp.get("max_new_tokens", 128),
        temperature=float(sp.get("temperature", 1.0)),
        top_p=float(sp.get("top_p", 1.0)),
        top_k=int(sp.get("top_k", -1)),
        min_p=float(sp.get("min_p", 0.0)),
        stop_token_ids=frozenset(sp.get("stop_token_ids", ())),
        stop=stop,
        ignore_eos=bool(sp.get("ignore_eos", False)),
        no_stop_trim=bool(sp.get("no_stop_trim", False)),
        skip_special_tokens=bool(sp.get("skip_special_tokens", True)),
    )
    n = sp.get("n", 1)
    checks = [
        (params.temperature >= 0, f"temperature must be non-negative, got {params.temperature}."),
        (0 < params.top_p <= 1, f"top_p must be in (0, 1], got {params.top_p}."),
        (0 <= params.min_p <= 1, f"min_p must be in [0, 1], got {params.min_p}."),
        (params.top_k >= 1 or params.top_k == -1, f"top_k must be -1 (disable), or at least 1, got {params.top_k}."),
        (
            params.max_new_tokens is None or params.max_new_tokens >= 0,
            f"max_new_tokens must be at least 0, got {params.max_new_tokens}.",
        ),
        (n >= 1, f"n must be at least 1, got {n}."),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    return params, n, sp.get("sampling_seed")


def parse_generate(
    body: JsonObject, *, tokenizer: PreTrainedTokenizerBase | None, vocab_size: int, context_length: int, seed: int
) -> ParsedGenerate:
    """Check and expand a ``/generate`` body (see the module docstring).

    The checks run in SGLang's order (the first failing one is the error answered): JSON types,
    unsupported features, the prompts, the sampling values, rids and per-item lists, then each
    prompt against the vocabulary and the context length.

    Raises:
        ContractError: type or closed-key violations (``{"error": str}``).
        ValueError: bad values or unsupported features (``{"error": {"message": str}}``).
    """
    raw_sp, sp_list = _check_contract(body)
    _refuse_unsupported(body)
    prompts, is_batch = _prompts(body, tokenizer)
    batch_size = len(prompts)
    if is_batch and len(sp_list) == 1 and not isinstance(raw_sp, list):  # one object for the whole batch
        sp_list = sp_list * batch_size
    if len(sp_list) != batch_size:
        raise ValueError(
            f"The length of sampling_params ({len(sp_list)}) does not match the batch size ({batch_size})."
        )
    parsed, n = _sampling_per_prompt(body, sp_list, has_tokenizer=tokenizer is not None)
    rids = _rids(body.get("rid"), batch_size, is_batch)
    return_logprob = per_item(body.get("return_logprob"), batch_size, "return_logprob", False)
    start_len = per_item(body.get("logprob_start_len"), batch_size, "logprob_start_len", -1)
    requests: list[EngineRequest] = []
    for i, prompt in enumerate(prompts):
        params, _, sampling_seed = parsed[i]
        _check_prompt(prompt, params, vocab_size=vocab_size, context_length=context_length)
        if return_logprob[i] and start_len[i] > len(prompt):
            raise ValueError(f"logprob_start_len ({start_len[i]}) is larger than the prompt ({len(prompt)} tokens).")
        for j in range(n):
            rid, generator = _sample_identity(rids[i], j, n, seed=seed, sampling_seed=sampling_seed)
            requests.append(
                EngineRequest(
                    rid=rid,
                    prompt_ids=list(prompt),
                    params=params,
                    generator=generator,
                    return_logprob=bool(return_logprob[i]),
                    logprob_start_len=int(start_len[i]),
                    return_routed_experts=bool(body.get("return_routed_experts", False)),
                )
            )
    return ParsedGenerate(requests, is_batch or n > 1, bool(body.get("return_text_in_logprobs", False)))


def _check_contract(body: JsonObject) -> tuple[object, list[JsonObject]]:
    """The JSON types of the known top-level fields and of ``sampling_params``; returns (raw, checked list)."""
    for key, kind in _TOP_LEVEL.items():
        if body.get(key) is not None:
            _check_type(body[key], kind)
    raw_sp = body.get("sampling_params") or {}
    return raw_sp, [_check_sampling(s) for s in raw_sp] if isinstance(raw_sp, list) else [_check_sampling(raw_sp)]


def _refuse_unsupported(body: JsonObject) -> None:
    """ValueError for streaming, the top-level features this engine lacks, and top logprobs."""
    if body.get("stream"):
        raise ValueError(
            'The slime embedded engine does not stream; send "stream": false (the response carries the same fields).'
        )
    for key in _UNSUPPORTED_TOP:
        if body.get(key) not in (None, False, [], {}):
            raise ValueError(f"The slime embedded engine does not support `{key}`.")
    top_logprobs_num = body.get("top_logprobs_num")
    if any(top_logprobs_num if isinstance(top_logprobs_num, list) else [top_logprobs_num]):
        raise ValueError("The slime embedded engine does not support top_logprobs_num > 0.")


def _prompts(body: JsonObject, tokenizer: PreTrainedTokenizerBase | None) -> tuple[list[list[int]], bool]:
    """(prompt token ids, is_batch) from ``input_ids``, else from ``text`` through the tokenizer."""
    input_ids, text = body.get("input_ids"), body.get("text")
    if input_ids is not None:
        is_batch = bool(input_ids) and isinstance(input_ids[0], list)
        prompts = input_ids if is_batch else [input_ids]
        if any(not isinstance(p, list) for p in prompts) or (
            not is_batch and any(isinstance(x, list) for x in input_ids)
        ):
            raise ContractError("invalid type: sequence, expected i64")
        return prompts, is_batch
    if text is None:
        raise ValueError("Either text, input_ids or input_embeds should be provided.")
    if tokenizer is None:
        raise ValueError("`text` needs a tokenizer, but the model directory has none; send input_ids instead.")
    is_batch = isinstance(text, list)
    return [tokenizer(t)["input_ids"] for t in (text if is_batch else [text])], is_batch


def _sampling_per_prompt(
    body: JsonObject, sp_list: list[JsonObject], *, has_tokenizer: bool
) -> tuple[list[tuple[SamplingParams, int, int | None]], int]:
    """Each prompt's (params, n, sampling_seed), and the batch's one ``n``."""
    parsed = [_sampling_params(s, has_tokenizer=has_tokenizer) for s in sp_list]
    n = parsed[0][1]
    if any(p[1] != n for p in parsed):
        raise ValueError("The n parameter must be the same for all items of a batch.")
    if n > 1 and any(
        isinstance(body.get(k), list) for k in ("return_logprob", "logprob_start_len", "top_logprobs_num")
    ):
        raise ValueError("Per-item lists of return_logprob / logprob_start_len cannot be combined with n > 1.")
    return parsed, n


def _rids(rid: str | list[str] | None, batch_size: int, is_batch: bool) -> list[str | None]:
    """The rid sent for each prompt: a list as is, one string suffixed ``_i`` in a batch, else None."""
    if isinstance(rid, list):
        if len(rid) != batch_size:
            raise ValueError(f"The rid list has {len(rid)} items but the batch has {batch_size}.")
        return list(rid)
    if rid is not None and is_batch:
        return [f"{rid}_{i}" for i in range(batch_size)]
    return [rid] * batch_size


def _check_prompt(prompt: list[int], params: SamplingParams, *, vocab_size: int, context_length: int) -> None:
    """ValueError for an empty prompt, an id outside the vocabulary, or a prompt (+ max_new_tokens) past the context."""
    if not prompt:
        raise ValueError("input_ids cannot be empty.")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"Token id {bad[0]} is out of range for vocab size {vocab_size}.")
    if len(prompt) >= context_length:
        raise ValueError(
            f"The input ({len(prompt)} tokens) is longer than the model's context length ({context_length} tokens)."
        )
    if params.max_new_tokens is not None and len(prompt) + params.max_new_tokens > context_length:
        raise ValueError(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {len(prompt) + params.max_new_tokens} tokens: {len(prompt)} tokens from "
            f"the input and {params.max_new_tokens} tokens for the completion."
        )


def _sample_identity(
    sent_rid: str | None, j: int, n: int, *, seed: int, sampling_seed: int | None
) -> tuple[str, torch.Generator]:
    """Sample ``j``'s rid (the sent one when n == 1, else a fresh uuid4) and its seeded generator."""
    rid = sent_rid if (n == 1 and sent_rid is not None) else uuid.uuid4().hex
    if sampling_seed is not None:
        return rid, seeded_generator(sampling_seed, f"sample/{j}")
    return rid, seeded_generator(seed, rid if n == 1 else f"{sent_rid or rid}/{j}")
