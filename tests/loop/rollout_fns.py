"""Rollout functions in THUDM/slime's signature ``(args, rollout_id, data_buffer, evaluation=False)``, for tests.

``generate_rollout`` is written the way slime's are: sync, it POSTs each sample to the SGLang
``/generate`` endpoint at ``args.sglang_router_ip:args.sglang_router_port`` and fills the slime
fields of the samples ``data_buffer.get_samples`` gave it. It leaves the reward of sample 0 of each
group unset (the run's reward function scores it) and sets the others itself.
"""

from __future__ import annotations

import json
import urllib.request

CALLS: list[dict] = []


def _post(args, payload: dict) -> dict:
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def generate_rollout(args, rollout_id, data_buffer, evaluation=False):
    assert not evaluation
    CALLS.append({"rollout_id": rollout_id, "engine_version": args.engine_version})
    groups = data_buffer.get_samples(args.rollout_batch_size)
    params = {"temperature": args.rollout_temperature, "max_new_tokens": args.rollout_max_response_len}
    for group in groups:
        for s in group:
            out = _post(args, {"input_ids": s.tokens, "sampling_params": params, "return_logprob": True})
            pairs = out["meta_info"]["output_token_logprobs"]
            s.tokens = s.tokens + [p[1] for p in pairs]
            s.rollout_log_probs = [p[0] for p in pairs]
            s.response_length = len(pairs)
            s.response = out.get("text", "")  # absent when the engine has no tokenizer
            s.status = (
                type(s).Status.TRUNCATED
                if out["meta_info"]["finish_reason"]["type"] == "length"
                else type(s).Status.COMPLETED
            )
            s.reward = None if s.index % len(group) == 0 else 0.5
    return groups


def sft_rollout(args, rollout_id, data_buffer, evaluation=False):
    """SFT-style: a fixed response per prompt, no logprobs, loss on the last two tokens only, rewarded."""
    groups = data_buffer.get_samples(args.rollout_batch_size)
    for group in groups:
        for s in group:
            s.tokens = s.tokens + [7, 7, 8, 9]
            s.response_length = 4
            s.loss_mask = [0, 0, 1, 1]
            s.reward = 1.0
            s.status = type(s).Status.COMPLETED
    return [s for g in groups for s in g]  # a flat list, as slime's SFT rollout returns


def left_pending(args, rollout_id, data_buffer, evaluation=False):
    """Broken: fills the tokens but never sets a status."""
    groups = data_buffer.get_samples(args.rollout_batch_size)
    for group in groups:
        for s in group:
            s.tokens = s.tokens + [7, 8]
            s.response_length = 2
    return groups


def wrong_signature(args, data_buffer):
    return []
