"""slime/engines/protocol.py against the response and error shapes of docs/sglang.md#protocol-reference.

Recorded bodies live in ``data/sglang_bodies.json`` (copied from the protocol notes, per version).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slime.engines.protocol import (
    SAMPLING_PARAM_KEYS,
    GenerateResult,
    build_generate_payload,
    error_message_from_body,
    parse_generate_response,
)
from slime.errors import ProtocolError

URL = "http://10.0.0.1:30000"
DATA = json.loads((Path(__file__).parent / "data" / "sglang_bodies.json").read_text())
GENERATE = DATA["generate"]


def _parse_one(body: object, return_logprob: bool = True, **kw: object) -> GenerateResult:
    results = parse_generate_response(msgspec.json.encode(body), url=URL, return_logprob=return_logprob, **kw)
    assert len(results) == 1
    return results[0]


@pytest.mark.parametrize("name", sorted(GENERATE))
def test_every_recorded_generate_body_parses_to_the_expected_result(name: str) -> None:
    case = GENERATE[name]
    result = _parse_one(case["body"], case["return_logprob"])
    expect = dict(case["expect"])
    assert result.finish_reason.type == expect.pop("finish_type")
    for key in ("matched", "length", "message"):
        if key in expect:
            assert getattr(result.finish_reason, key) == expect.pop(key)
    for key, value in expect.items():
        assert getattr(result, key) == value, key
    assert len(result.output_logprobs) in (0, len(result.output_ids))
    assert result.aborted == (result.finish_reason.type == "abort")


def test_running_abort_keeps_status_code_and_err_type_keys_as_none() -> None:
    result = _parse_one(GENERATE["0.5.23/running_abort"]["body"])
    assert (result.finish_reason.status_code, result.finish_reason.err_type) == (None, None)


def test_json_array_gives_one_result_per_item_in_order() -> None:
    items = [GENERATE["0.5.23/length"]["body"], GENERATE["0.5.23/running_abort"]["body"]]
    results = parse_generate_response(msgspec.json.encode(items), url=URL)
    assert [r.rid for r in results] == ["r-len", "grp3-s1"]
    assert [r.finish_reason.type for r in results] == ["length", "abort"]


def test_single_object_also_comes_back_as_a_list() -> None:
    body = msgspec.json.encode(GENERATE["0.5.23/length"]["body"])
    assert isinstance(parse_generate_response(body, url=URL), list)


def test_misaligned_logprobs_raise_naming_both_lengths_and_the_url() -> None:
    body = json.loads(json.dumps(GENERATE["0.5.23/length"]["body"]))
    body["meta_info"]["output_token_logprobs"].pop()
    body["meta_info"].pop("weight_versions")
    with pytest.raises(ProtocolError) as info:
        _parse_one(body)
    assert "len(output_ids)=2" in str(info.value) and "len(output_token_logprobs)=1" in str(info.value)
    assert URL in str(info.value) and info.value.endpoint == "/generate"


def test_logprob_entry_for_a_different_token_is_a_protocol_error() -> None:
    body = json.loads(json.dumps(GENERATE["0.5.2/finished_with_logprobs"]["body"]))
    body["meta_info"]["output_token_logprobs"][1][1] = 3
    with pytest.raises(ProtocolError, match=r"output_token_logprobs\[1\] is for token 3"):
        _parse_one(body)


def test_null_output_logprob_raises_unless_allowed() -> None:
    body = json.loads(json.dumps(GENERATE["0.5.2/finished_with_logprobs"]["body"]))
    body["meta_info"]["output_token_logprobs"][0][0] = None
    with pytest.raises(ProtocolError, match="null logprob"):
        _parse_one(body)
    result = _parse_one(body, allow_null_logprobs=True)
    assert math.isnan(result.output_logprobs[0]) and result.output_logprobs[1] == -0.0625


def test_null_first_input_logprob_is_not_an_error() -> None:
    result = _parse_one(GENERATE["0.5.6/finished_with_logprobs"]["body"])
    assert result.output_logprobs == [-0.9, -0.05]


def test_missing_logprobs_when_asked_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="output_token_logprobs is absent"):
        _parse_one(GENERATE["0.5.23/finished_no_logprobs"]["body"], return_logprob=True)


def test_no_output_ids_and_no_logprobs_on_a_finished_request_is_a_protocol_error() -> None:
    body = {"text": " ok", "meta_info": {"id": "r", "finish_reason": {"type": "stop", "matched": 2}}}
    with pytest.raises(ProtocolError, match="cannot recover the tokens"):
        _parse_one(body, return_logprob=False)


@pytest.mark.parametrize(
    "spans",
    [
        [{"version": "1", "start": 0, "end": 2}],
        [{"version": "1", "start": 0, "end": 2}, {"version": "2", "start": 2, "end": 4}],
        [{"version": "1", "start": 1, "end": 3}],
        [{"version": "1", "start": 0, "end": 2}, {"version": "2", "start": 1, "end": 3}],
    ],
)
def test_weight_version_spans_that_do_not_tile_the_output_are_rejected(spans: list) -> None:
    body = json.loads(json.dumps(GENERATE["0.5.23/weights_updated_mid_request"]["body"]))
    body["meta_info"]["weight_versions"] = spans
    with pytest.raises(ProtocolError, match="weight_versions spans"):
        _parse_one(body)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"{}",
        b'{"meta_info": {"id": "x", "finish_reason": {"type": "finished"}}}',
        b'{"meta_info": {"id": "x", "finish_reason": null}, "output_ids": []}',
        b'{"error": {"message": "boom"}}',
    ],
)
def test_undecodable_or_unfinished_bodies_are_protocol_errors(body: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_generate_response(body, url=URL)
    assert info.value.url == URL


def test_error_body_in_a_200_keeps_the_engine_message() -> None:
    with pytest.raises(ProtocolError) as info:
        parse_generate_response(b'{"error": {"message": "boom"}}', url=URL)
    assert info.value.engine_message == "boom"


@pytest.mark.parametrize("case", DATA["errors"], ids=[c["name"] for c in DATA["errors"]])
def test_error_message_from_every_documented_error_shape(case: dict) -> None:
    assert error_message_from_body(case["status"], case["content_type"], case["body"]) == case["message"]


def test_error_message_is_cut_to_a_readable_length() -> None:
    assert len(error_message_from_body(500, "text/plain", "x" * 10_000)) == 2000


def test_payload_keeps_return_logprob_and_rid_at_the_top_level() -> None:
    params = {"max_new_tokens": 8, "temperature": 1.0, "stop_token_ids": [2]}
    payload = build_generate_payload([1, 2, 3], params, rid="g0-s0-", return_logprob=True)
    assert payload == {"input_ids": [1, 2, 3], "sampling_params": params, "return_logprob": True, "rid": "g0-s0-"}
    assert payload["sampling_params"] is not params
    assert "rid" not in build_generate_payload([1], {}, rid=None, return_logprob=False)


@pytest.mark.parametrize("key", ["return_logprob", "max_tokens", "seed", "foo"])
def test_payload_rejects_unknown_sampling_keys_by_name(key: str) -> None:
    with pytest.raises(ValueError, match=key):
        build_generate_payload([1], {"temperature": 1.0, key: 1}, rid=None, return_logprob=True)


def test_every_documented_sampling_key_is_accepted() -> None:
    params = {key: None for key in SAMPLING_PARAM_KEYS}
    assert (
        set(build_generate_payload([1], params, rid=None, return_logprob=False)["sampling_params"])
        == SAMPLING_PARAM_KEYS
    )


@pytest.mark.parametrize(
    "input_ids, params",
    [([], {}), ([1, 2.0], {}), ([1, True], {}), ([1], {"max_new_tokens": 8.0}), ([1], {"n": "2"})],
)
def test_payload_rejects_what_sglang_would_answer_400_to(input_ids: list, params: dict) -> None:
    with pytest.raises(ValueError):
        build_generate_payload(input_ids, params, rid=None, return_logprob=True)


@given(st.dictionaries(st.sampled_from(sorted(SAMPLING_PARAM_KEYS)) | st.text(max_size=12), st.none() | st.integers()))
def test_payload_never_carries_an_unknown_sampling_key(params: dict) -> None:
    try:
        payload = build_generate_payload([1], params, rid=None, return_logprob=True)
    except ValueError:
        assert set(params) - SAMPLING_PARAM_KEYS
    else:
        assert (
            set(payload["sampling_params"]) <= SAMPLING_PARAM_KEYS
            and "return_logprob" not in payload["sampling_params"]
        )
