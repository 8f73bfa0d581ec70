"""The default generate function: one ``/generate`` call that grows a sample token-exactly.

A fresh sample sends ``prompt_ids``; a partial one (aborted earlier) sends ``prompt_ids +
response_ids`` as token ids, with ``max_new_tokens`` reduced by what it already has, so a resumed
sample's tokens are exactly the old ones followed by the new ones (no text is re-tokenized).

Example (resume token accounting): ``rollout_max_response_len=64``; a sample aborted after 20
tokens is re-sent with ``input_ids = prompt(9) + response(20)`` and ``max_new_tokens = 44``; the
engine returns 12 tokens and stops: the sample now holds 32 tokens, 20 tagged with the old
version and 12 with the new one.

Statuses: ``finish_reason`` stop -> COMPLETED, length -> TRUNCATED, abort -> PARTIAL (resumable).
An engine that refuses the request (HTTP 4xx) marks the sample FAILED with the engine's message as
evidence, and so does a request that got no answer in ``--max-retries`` + 1 attempts (``transport``:
true in the evidence; an abort from a weight update is not such a failure: the sample is PARTIAL and
resumes). ``EnginesGone`` (no engine left at all) propagates: the run cannot go on.

MoE routes (``--use-rollout-routing-replay``): a resumed request's routes cover prompt + earlier tokens again;
``keep_routes`` keeps each sampled token's from the request that sampled it (``slime.routed_experts``, why).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slime.engines.interface import GeneratePool
from slime.engines.protocol import GenerateResult
from slime.errors import EngineRequestError, EnginesGone, EngineTimeout, EngineUnavailable
from slime.routed_experts import merge_segment
from slime.types import Sample, Status

__all__ = [
    "generate",
    "status_from_finish_reason",
    "policy_version_of",
    "request_id",
    "request_stem",
    "kv_cache_version_of",
    "token_versions",
    "fail_unanswered",
    "keep_routes",
]


def status_from_finish_reason(finish_type: str) -> Status:
    """Map SGLang's ``finish_reason.type`` to our Status (the only place strings are compared)."""
    if finish_type == "stop":
        return Status.COMPLETED
    if finish_type == "length":
        return Status.TRUNCATED
    if finish_type == "abort":
        return Status.PARTIAL
    raise ValueError(f"unknown finish_reason type {finish_type!r}")


def policy_version_of(weight_version: str | None, default: int) -> int:
    """Our integer policy version from SGLang's ``weight_version`` string.

    We launch and update engines with ``weight_version=str(version)``; an engine that reports
    anything else (real SGLang's ``"default"`` before the first update) gets ``default``.
    """
    if weight_version is not None and weight_version.isdigit():
        return int(weight_version)
    return default


def kv_cache_version_of(pool: GeneratePool, default: int) -> int | None:
    """The pool's ``kv_cache_version`` as our integer version (read it when the request is SENT), or
    None when the pool does not know it (a pool without prefix-cache tracking, or an engine we never
    flushed)."""
    version = pool.kv_cache_version
    return None if version is None else policy_version_of(version, default)


def token_versions(result: GenerateResult, engine_version: int, kv_cache_version: int | None = None) -> int | list[int]:
    """The policy version of each token of ``result`` (an int for all of them, or one per token).

    - With SGLang 0.5.23's ``weight_versions`` spans: each token's own version.
    - Without them (0.5.17, verified on the H200): a request that straddled an in-place update
      cannot say which tokens came from which weights, so all carry the older of (reported
      ``weight_version``, ``engine_version`` at send): that over-states their lag, which is safe.
    - A request that reused prefix-cache KV (``cached_tokens`` > 0, or unknown) is tagged no newer
      than ``kv_cache_version``: the cache may hold KV computed by weights that old, since an
      in-place update does not flush it (docs/ARCHITECTURE.md, "In-place updates and the prefix cache").

    Example: spans ["3", "3", "4"], engine_version 4, cached_tokens 9, kv_cache_version 2 -> [2, 2, 2].
    """
    # the spans only when they cover every token; else one version for all of them
    if result.token_weight_versions is not None and len(result.token_weight_versions) == len(result.output_ids):
        versions: int | list[int] = [policy_version_of(v, engine_version) for v in result.token_weight_versions]
    else:
        # the older of the two: a request that straddled an in-place update over-states its lag, which is safe
        versions = min(policy_version_of(result.weight_version, engine_version), engine_version)
    # != 0, not > 0: an unknown count (None) is taken as a cache hit
    if kv_cache_version is not None and result.cached_tokens != 0:
        versions = (
            min(versions, kv_cache_version)
            if isinstance(versions, int)
            else [min(v, kv_cache_version) for v in versions]
        )
    return versions


def request_stem(sample: Sample) -> str:
    """The part of every ``request_id`` of ``sample`` that stays across its aborts and resumes."""
    return f"slime-g{sample.group_id}-s{sample.index}"


def request_id(sample: Sample) -> str:
    """A rid that is never a prefix of another (SGLang aborts by rid prefix, docs/sglang.md#abort)."""
    return f"{request_stem(sample)}-a{sample.num_aborts}-r{sample.num_resumes}-"


def keep_routes(sample: Sample, result: GenerateResult) -> None:
    """Merge ``result``'s MoE routes (``--use-rollout-routing-replay``) into ``sample.routed_experts``: each sampled
    token's from the request that sampled it (``slime.routed_experts.merge_segment``); nothing without routes.
    Call right after ``sample.append`` of ``result`` (the request sent every token before its output)."""
    num_new = len(result.output_ids)
    if result.routed_experts is None or not num_new:  # nothing sampled: no position to keep a route for
        return
    sample.routed_experts = merge_segment(
        sample.routed_experts, result.routed_experts, prompt_len=len(sample.prompt_ids),
        input_len=len(sample.prompt_ids) + len(sample.response_ids) - num_new, num_new=num_new,
    )  # fmt: skip


def fail_unanswered(sample: Sample, exc: EngineUnavailable | EngineTimeout, **where: Any) -> None:
    """Mark ``sample`` FAILED: its request got no answer in every attempt the pool made (a transport
    failure, not a wrong answer: it is never scored). ``where`` is added to the evidence (e.g. ``turn``)."""
    sample.status = Status.FAILED
    sample.evidence["generate_error"] = {"type": type(exc).__name__, "message": str(exc), "transport": True, **where}


async def generate(
    sample: Sample,
    sampling_params: dict[str, Any],
    *,
    pool: GeneratePool,
    max_response_len: int,
    engine_version: int,
    decode: Callable[[list[int]], str] | None = None,
) -> Sample:
    """Run one generate request for ``sample`` and append what comes back.

    Args:
        sample: a PENDING or PARTIAL sample; mutated in place through ``Sample.append``.
        sampling_params: SGLang ``sampling_params`` without ``max_new_tokens`` (set here).
        pool: a ``GeneratePool`` (``slime.engines.interface``; ``generate(input_ids, sampling_params, rid=, sticky_key=)``).
        max_response_len: cap on response tokens, counting tokens the sample already has.
        engine_version: the policy version the engines hold, used when the engine's
            ``weight_version`` is not one of ours.
        decode: token ids -> text, to refresh ``sample.response`` for reward functions.

    Returns:
        The same sample, with status COMPLETED, TRUNCATED, PARTIAL or FAILED.
    """
    remaining = max_response_len - len(sample.response_ids)
    if remaining <= 0:  # the cap counts earlier attempts' tokens: a resumed sample already at it ends TRUNCATED
        sample.status = Status.TRUNCATED
        return sample
    if sample.response_ids:
        sample.num_resumes += 1  # a fresh rid (request_id): a late abort of the old request never hits the resumed one
    # what is left under the cap, so a resumed sample never exceeds max_response_len
    params = dict(sampling_params, max_new_tokens=remaining)
    # read before sending: a flush during the request must not make the KV it reused look newer
    kv_version = kv_cache_version_of(pool, engine_version)
    try:
        result = await pool.generate(
            # prompt + the tokens so far: the resume continues token-exactly from what the sample holds
            sample.prompt_ids + sample.response_ids,
            params,
            rid=request_id(sample),
            sticky_key=f"g{sample.group_id}-s{sample.index}",
        )
    except EngineRequestError as exc:
        sample.status = Status.FAILED  # refused by the engine: FAILED without "transport" (the request itself was bad)
        sample.evidence["generate_error"] = {"type": type(exc).__name__, "message": str(exc)}
        return sample
    except EnginesGone:
        raise  # before the next clause (a subclass of EngineUnavailable): no engine left ends the run, not the sample
    except (EngineUnavailable, EngineTimeout) as exc:
        fail_unanswered(sample, exc)
        return sample
    sample.append(
        result.output_ids, result.output_logprobs, token_versions(result, engine_version, kv_version), trainable=True
    )
    keep_routes(sample, result)
    sample.status = status_from_finish_reason(result.finish_reason.type)
    if sample.status is Status.PARTIAL:
        sample.num_aborts += 1  # counted into the next request_id, so the resumed request gets a rid of its own
    if decode is not None:
        sample.response = decode(sample.response_ids)
    return sample
