"""The eval never scores a sample the engines did not serve: a PARTIAL sample (its request ran past
``--request-timeout-s`` and kept its tokens) resumes until it finishes; one that got no answer, or no
new token, is FAILED, left out and counted in ``engine_failures``; with no engine left the eval fails
with ``EnginesGone`` and cancels the rest of its requests."""

from __future__ import annotations

import asyncio
import math

import pytest

from slime.data.dataset import PromptRow
from slime.engines.protocol import FinishReason, GenerateResult
from slime.errors import EngineUnavailable
from slime.loop.evaluate import evaluate
from slime.rollout.generate import generate

FULL = [5, 6, 7, 8]


def _result(ids: list[int], finish: str) -> GenerateResult:
    return GenerateResult(
        output_ids=ids,
        output_logprobs=[-0.1] * len(ids),
        finish_reason=FinishReason(type=finish),
        completion_tokens=len(ids),
    )


class SlowPool:
    """Each request is cut at 2 new tokens (an abort after ``request_timeout_s``, tokens kept); prompt
    "silent" is never served (abort with no token); prompt "down" has no engine that answers."""

    kv_cache_version = None

    def __init__(self) -> None:
        self.inputs: list[list[int]] = []

    async def generate(self, input_ids, sampling_params, *, rid=None, sticky_key=None):
        self.inputs.append(list(input_ids))
        if input_ids[0] == ord("s"):
            return _result([], "abort")
        if input_ids[0] == ord("d"):
            raise EngineUnavailable(
                "no answer after 2 attempts (--max-retries 1)", url="http://e:1", endpoint="/generate"
            )
        done = len(input_ids) - 1
        new = FULL[done : done + 2]
        return _result(new, "stop" if done + len(new) == len(FULL) else "abort")


async def _eval(pool, prompts: list[str], generate_fn=None) -> dict:
    async def exact(sample) -> float:
        return 1.0 if sample.response_ids == FULL else 0.0

    kw = {"generate_fn": generate_fn} if generate_fn else {}
    return await evaluate(
        [PromptRow(index=i, prompt=p) for i, p in enumerate(prompts)],
        pool=pool,
        tokenize=lambda t: [ord(t[0])],
        decode=lambda ids: "",
        reward_fn=exact,
        max_response_len=8,
        engine_version=0,
        reward_timeout_s=5,
        **kw,
    )


async def test_a_sample_cut_by_the_request_timeout_resumes_token_exactly_and_is_scored_whole():
    pool = SlowPool()
    out = await _eval(pool, ["a", "b"])
    assert (
        out["accuracy"] == 1.0 and out["failed"] == 0 and out["engine_failures"] == 0
    )  # before: the 2-token cut was scored 0
    assert [len(i) for i in pool.inputs if i[0] == ord("a")] == [1, 3]  # resent as prompt + the tokens it had


async def test_samples_the_engines_did_not_serve_are_left_out_and_counted_not_scored_as_wrong(caplog):
    out = await _eval(SlowPool(), ["a", "silent", "down", "b"])
    assert out["accuracy"] == 1.0 and out["failed"] == 2 and out["engine_failures"] == 2, out  # before: the eval failed
    assert "eval: 2 of 4 samples not scored: the engines did not answer them" in caplog.text


async def test_a_generate_plugin_that_lets_the_pools_error_through_fails_only_that_sample():
    async def plugin(sample, params, **kw):  # a custom generate function that does not catch the pool's errors
        if sample.prompt == "down":
            raise EngineUnavailable(
                "no answer after 2 attempts (--max-retries 1)", url="http://e:1", endpoint="/generate"
            )
        return await generate(sample, params, **kw)

    out = await _eval(SlowPool(), ["a", "down"], generate_fn=plugin)
    assert out["accuracy"] == 1.0 and out["failed"] == 1 and out["engine_failures"] == 1, out  # before: the eval failed


async def test_every_sample_unanswered_is_no_accuracy_at_all():
    out = await _eval(SlowPool(), ["silent", "silent"])
    assert math.isnan(out["accuracy"]) and out["engine_failures"] == 2  # before: accuracy 0.0


async def test_no_engine_left_fails_the_eval_and_cancels_its_other_requests():
    from slime.errors import EnginesGone

    started, cancelled = [], []

    class GonePool:
        kv_cache_version = None

        async def generate(self, input_ids, sampling_params, *, rid=None, sticky_key=None):
            if input_ids[0] == ord("x"):
                await asyncio.sleep(0.05)
                raise EnginesGone(
                    "no engine left to serve /generate: engine http://e:1: dead", reasons={"http://e:1": "dead"}
                )
            started.append(rid)
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.append(rid)
                raise

    with pytest.raises(EnginesGone):
        await _eval(GonePool(), ["x", "a", "b"])
    await asyncio.sleep(0)
    assert len(started) == 2 and sorted(cancelled) == sorted(started)  # before: left running after the eval failed
