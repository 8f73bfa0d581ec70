"""A scripted stand-in for ``HttpEnginePool.generate``: predetermined replies, aborts where told."""

from __future__ import annotations

from slime.engines.protocol import FinishReason, GenerateResult


class ScriptedPool:
    """Each /generate gets the next reply ``(tokens, "stop" | "abort")``; records every ``input_ids``."""

    kv_cache_version = None

    def __init__(self, replies):
        self.replies, self.calls = list(replies), []

    async def generate(self, input_ids, sampling_params, *, rid=None, sticky_key=None, return_logprob=True):
        self.calls.append(list(input_ids))
        tokens, finish = self.replies.pop(0)
        if len(tokens) > sampling_params["max_new_tokens"]:
            tokens, finish = tokens[: sampling_params["max_new_tokens"]], "length"
        return GenerateResult(
            output_ids=tokens,
            output_logprobs=[-0.5] * len(tokens),
            finish_reason=FinishReason(type=finish),
            weight_version="3",
            token_weight_versions=["3"] * len(tokens),
            completion_tokens=len(tokens),
            rid=rid,
        )
