"""slime/servers/embedded/server.py + routes.py: /generate shapes, ordering and error bodies over HTTP."""

from __future__ import annotations

import pytest

from slime.servers.embedded import EngineServer
from tests.fixtures.tiny_model import TINY_VOCAB_SIZE
from tests.servers.embedded.helpers import max_abs_diff, reference_logprobs

META_KEYS = {
    "id",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "num_retractions",
    "weight_version",
    "weight_versions",
    "e2e_latency",
    "response_sent_to_client_ts",
}


async def _post(session, engine, path, body):
    async with session.post(f"{engine.url}{path}", json=body) as resp:
        return resp.status, (await resp.json() if resp.content_type == "application/json" else await resp.text())


async def test_generate_returns_the_sglang_object_with_logprobs_from_a_full_forward(engine, session, hf_model):
    prompt = [5, 9, 14, 3]
    status, out = await _post(
        session,
        engine,
        "/generate",
        {
            "input_ids": prompt,
            "rid": "g1",
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 9, "temperature": 0.7, "ignore_eos": True},
        },
    )
    assert status == 200 and "text" not in out  # no tokenizer in the model dir
    meta = out["meta_info"]
    assert set(meta) == META_KEYS | {"input_token_logprobs", "output_token_logprobs", "output_token_logprobs_length"}
    assert meta["id"] == "g1" and meta["finish_reason"] == {"type": "length", "length": 9}
    assert meta["prompt_tokens"] == 4 and meta["completion_tokens"] == len(out["output_ids"]) == 9
    assert meta["cached_tokens"] == 0 and meta["input_token_logprobs"] == []
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 9}]
    entries = meta["output_token_logprobs"]
    assert [e[1] for e in entries] == out["output_ids"] and all(e[2] is None for e in entries)
    full = reference_logprobs(hf_model, prompt, out["output_ids"], 0.7)
    assert max_abs_diff([e[0] for e in entries], full) <= 1e-5


async def test_stop_token_finishes_with_the_token_in_output_ids_and_ignore_eos_disables_it(engine, session):
    body = {"input_ids": [8, 6, 4], "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
    free = (await _post(session, engine, "/generate", body))[1]["output_ids"]
    i = next(i for i in range(1, 6) if free[i] not in free[:i])  # first new token after the first one
    tok = free[i]
    body["sampling_params"] = {"max_new_tokens": 6, "temperature": 0, "stop_token_ids": [tok]}
    out = (await _post(session, engine, "/generate", body))[1]
    assert out["output_ids"] == free[: i + 1] and out["meta_info"]["finish_reason"] == {"type": "stop", "matched": tok}
    body["sampling_params"]["ignore_eos"] = True
    out = (await _post(session, engine, "/generate", body))[1]
    assert out["output_ids"] == free and out["meta_info"]["finish_reason"] == {"type": "length", "length": 6}


async def test_same_rid_and_seed_reproduce_the_same_sample(engine, session):
    body = {"input_ids": [1, 2, 3], "rid": "same", "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}}
    first = (await _post(session, engine, "/generate", body))[1]["output_ids"]
    again = (await _post(session, engine, "/generate", body))[1]["output_ids"]
    other = (await _post(session, engine, "/generate", {**body, "rid": "other"}))[1]["output_ids"]
    assert first == again and first != other


async def test_batch_and_n_return_arrays_in_prompt_major_order(engine, session):
    prompts = [[4, 5], [6, 7, 8], [9]]
    status, out = await _post(
        session,
        engine,
        "/generate",
        {"input_ids": prompts, "rid": "b", "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}},
    )
    assert status == 200 and [o["meta_info"]["id"] for o in out] == ["b_0", "b_1", "b_2"]
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [2, 3, 1]

    status, out = await _post(
        session,
        engine,
        "/generate",
        {"input_ids": prompts[:2], "rid": "n", "sampling_params": {"max_new_tokens": 3, "n": 2, "ignore_eos": True}},
    )
    assert status == 200 and [o["meta_info"]["prompt_tokens"] for o in out] == [2, 2, 3, 3]
    assert len({o["meta_info"]["id"] for o in out}) == 4  # fresh rids per sample, as SGLang
    status, single = await _post(
        session, engine, "/generate", {"input_ids": [4, 5], "sampling_params": {"n": 2, "max_new_tokens": 2}}
    )
    assert status == 200 and isinstance(single, list) and len(single) == 2


@pytest.mark.parametrize(
    "sampling_params, needle",
    [
        ({"foo": 1}, "unknown field `foo`, expected one of `max_new_tokens`"),
        ({"max_new_tokens": 8.0}, "invalid type: floating point `8.0`, expected i64"),
        ({"temperature": "hot"}, 'invalid type: string "hot", expected f64'),
    ],
)
async def test_contract_violations_answer_400_with_a_string_error(engine, session, sampling_params, needle):
    status, out = await _post(session, engine, "/generate", {"input_ids": [1, 2], "sampling_params": sampling_params})
    assert status == 400 and isinstance(out["error"], str) and out["error"].startswith(needle)


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"input_ids": [1], "sampling_params": {"temperature": -1}}, "temperature must be non-negative"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p must be in (0, 1]"),
        ({"input_ids": [TINY_VOCAB_SIZE]}, "out of range"),
        ({"input_ids": []}, "cannot be empty"),
        ({"sampling_params": {}}, "Either text, input_ids or input_embeds should be provided."),
        ({"text": "hello"}, "needs a tokenizer"),
        ({"input_ids": [1], "stream": True}, "does not stream"),
        (
            {"input_ids": [1], "sampling_params": {"repetition_penalty": 1.2}},
            "does not support sampling_params.repetition_penalty",
        ),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 1000}}, "maximum context length"),
    ],
)
async def test_bad_values_answer_400_with_an_error_message_object(engine, session, body, needle):
    status, out = await _post(session, engine, "/generate", body)
    assert status == 400 and needle in out["error"]["message"]


async def test_malformed_json_unknown_route_and_wrong_method_use_the_fastapi_shapes(engine, session):
    async with session.post(
        f"{engine.url}/generate", data=b"{not json", headers={"Content-Type": "application/json"}
    ) as resp:
        body = await resp.json()
        assert (
            resp.status == 400 and body["object"] == "error" and body["code"] == 400 and body["type"] == "Bad Request"
        )
    async with session.get(f"{engine.url}/no_such_route") as resp:
        assert resp.status == 404 and await resp.json() == {"detail": "Not Found"}
    async with session.get(f"{engine.url}/pause_generation") as resp:
        assert resp.status == 405
    status, out = await _post(session, engine, "/update_weights_from_disk", {})
    assert status == 400 and out["object"] == "error" and "model_path" in out["message"]


async def test_info_and_health_routes(engine, session):
    for path in ("/health", "/health_generate", "/ready"):
        async with session.get(f"{engine.url}{path}") as resp:
            assert resp.status == 200, path
    for path in ("/model_info", "/get_model_info"):
        async with session.get(f"{engine.url}{path}") as resp:
            info = await resp.json()
            assert info["model_path"] == str(engine.model_path) and info["weight_version"] == "default"
            assert info["architectures"] == ["LlamaForCausalLM"] and info["is_generation"] is True
    for path in ("/server_info", "/get_server_info"):
        async with session.get(f"{engine.url}{path}") as resp:
            info = await resp.json()
            assert (info["tp_size"], info["dp_size"], info["max_running_requests"]) == (1, 1, 256)
            assert {"model_path", "version", "max_total_num_tokens"} <= set(info)
    for path in ("/release_memory_occupation", "/resume_memory_occupation"):
        status, out = await _post(session, engine, path, {})
        assert status == 200 and out is None


async def test_text_prompts_and_stop_strings_need_and_use_a_tokenizer(tiny_tokenizer_model_path, session):
    async with EngineServer(tiny_tokenizer_model_path, port=0) as engine:
        status, free = await _post(
            session,
            engine,
            "/generate",
            {"text": "w5 w6 w7", "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}},
        )
        assert status == 200 and free["text"] == " ".join(f"w{t}" if t > 2 else "" for t in free["output_ids"]).strip()
        assert free["meta_info"]["prompt_tokens"] == 3
        stop = f"w{free['output_ids'][2]}"
        status, out = await _post(
            session,
            engine,
            "/generate",
            {
                "text": "w5 w6 w7",
                "sampling_params": {"max_new_tokens": 6, "temperature": 0, "stop": stop, "ignore_eos": True},
            },
        )
        assert status == 200 and out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert out["output_ids"] == free["output_ids"][: len(out["output_ids"])] and stop not in out["text"]


async def test_input_logprobs_match_a_full_forward_with_the_first_entry_null(engine, session, hf_model):
    """Prefill-only scoring (the OPD teacher request): several contexts of different lengths, batched in one
    prefill when they arrive together (left padding), each with its own logprob_start_len; every entry after the first equals an HF
    forward, the first is null as in SGLang (docs/sglang.md#generate-response)."""
    import asyncio

    import torch

    from slime.servers.embedded.sampling import token_logprobs

    contexts = [[0, 5, 9, 14, 3, 22, 7], [0, 40, 41], [0, 8, 6, 4, 2, 33, 31, 30, 29, 12], [0, 17]]
    starts = [3, 0, 8, 1]
    replies = await asyncio.gather(
        *(
            _post(
                session,
                engine,
                "/generate",
                {
                    "input_ids": ctx,
                    "return_logprob": True,
                    "logprob_start_len": start,
                    "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
                },
            )
            for ctx, start in zip(contexts, starts)
        )
    )
    for ctx, start, (status, out) in zip(contexts, starts, replies):
        assert (
            status == 200
            and out["output_ids"] == []
            and out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
        )
        entries = out["meta_info"]["input_token_logprobs"]
        assert [e[1] for e in entries] == ctx[start:] and entries[0][0] is None
        with torch.no_grad():
            logits = hf_model(torch.tensor([ctx])).logits[0]  # [P, V]
        full = token_logprobs(logits[:-1], torch.tensor(ctx[1:]), 1.0).tolist()  # full[k - 1] scores ctx[k]
        assert max_abs_diff([e[0] for e in entries[1:]], full[start:]) <= 1e-5


def test_the_model_and_runner_are_refused_by_name_before_start():
    """``require_loaded`` / ``require_runner`` before ``start()``: a RuntimeError saying so, not an AttributeError on None."""
    server = EngineServer("/nonexistent", warmup=False)
    with pytest.raises(RuntimeError, match="no model is loaded"):
        server.require_loaded()
    with pytest.raises(RuntimeError, match="runner is not started"):
        server.require_runner()
