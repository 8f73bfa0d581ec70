"""SFT rows: plain prompt/response and chat messages become ids + loss mask; bad rows are named by file:line."""

from __future__ import annotations

import json

import pytest

from slime.data.sft import SFTExample, load_sft_file, parse_sft_row, to_group
from slime.data.tokenizer import build_tokenizer
from slime.errors import DataError
from slime.types import Status
from tests.fixtures.chat_tokenizers import build_chat_tokenizer


@pytest.fixture(scope="module")
def arith_tok():
    return build_tokenizer()


def test_plain_row_trains_on_response_and_eos_only(arith_tok):
    ex = parse_sft_row({"prompt": "47+9=", "response": "#56"}, 0, tokenizer=arith_tok, input_key="prompt")
    bos, eos = arith_tok.bos_token_id, arith_tok.eos_token_id
    assert ex.input_ids == [bos] + arith_tok.encode("47+9=#56", add_special_tokens=False) + [eos]
    assert ex.loss_mask == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert ex.num_prompt_tokens == 6


def test_plain_row_does_not_double_an_eos_already_written(arith_tok):
    ex = parse_sft_row({"prompt": "1+1=", "response": "#2<eos>"}, 0, tokenizer=arith_tok, input_key="prompt")
    assert ex.input_ids.count(arith_tok.eos_token_id) == 1 and ex.input_ids[-1] == arith_tok.eos_token_id


@pytest.mark.parametrize(
    "bad, why",
    [
        ('{"prompt": "1+1=", "response": "#2"', "invalid JSON"),
        ('["1+1="]', "expected a JSON object"),
        ('{"response": "#2"}', "missing key 'prompt'"),
        ('{"prompt": "1+1="}', "needs a non-empty string under 'response'"),
        ('{"prompt": 7, "response": "#2"}', "must be a list of chat messages or a non-empty prompt string"),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path, arith_tok, bad, why):
    path = tmp_path / "sft.jsonl"
    path.write_text('{"prompt": "1+1=", "response": "#2"}\n\n' + bad + "\n")
    with pytest.raises(DataError, match=rf"{path}:3: .*{why}"):
        load_sft_file(path, tokenizer=arith_tok, input_key="prompt")
    rows, num_bad = load_sft_file(path, tokenizer=arith_tok, input_key="prompt", on_bad_data="skip")
    assert (len(rows), num_bad) == (1, 1)


def test_chat_row_without_assistant_turn_is_a_bad_row(tmp_path):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    tok = build_chat_tokenizer("qwen", [(messages, None)])
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n" + json.dumps({"messages": messages[:1]}) + "\n")
    with pytest.raises(DataError, match=rf"{path}:2: .*no assistant message"):
        load_sft_file(path, tokenizer=tok)


def test_group_holds_the_row_with_masked_out_turns_between_assistant_turns():
    messages = [
        {"role": "user", "content": "a b"},
        {"role": "assistant", "content": "c"},
        {"role": "user", "content": "d"},
        {"role": "assistant", "content": "e f"},
    ]
    tok = build_chat_tokenizer("qwen", [(messages, None)])
    ex = parse_sft_row({"messages": messages}, 4, tokenizer=tok)
    group = to_group(ex, group_id=9, policy_version=3)
    (s,) = group.samples
    assert s.prompt_ids + s.response_ids == ex.input_ids
    assert s.loss_mask == ex.loss_mask[ex.num_prompt_tokens :] and s.loss_mask[0] == 1 and 0 in s.loss_mask
    assert s.versions == [3] * len(s.response_ids) and s.rollout_logprobs == [0.0] * len(s.response_ids)
    assert (s.status, s.reward, group.group_id, group.data_index) == (Status.COMPLETED, 0.0, 9, 4)
    s.check_aligned()


def test_example_needs_a_prompt_token_before_the_first_trained_one():
    with pytest.raises(ValueError):
        SFTExample(index=0, input_ids=[1, 2], loss_mask=[0, 0]).num_prompt_tokens  # noqa: B018  # the property raises


def test_row_longer_than_the_model_context_is_a_bad_row_named_by_file_and_line(tmp_path, arith_tok):
    path = tmp_path / "sft.jsonl"
    short, long = (
        {"prompt": "1+1=", "response": "#2"},
        {"prompt": "1+1=", "response": "#" + "2" * 20},
    )  # 8 and 27 tokens
    path.write_text(json.dumps(short) + "\n" + json.dumps(long) + "\n")
    with pytest.raises(
        DataError, match=rf"{path}:2: the row renders to 27 tokens, more than the model's context of 26"
    ):
        load_sft_file(path, tokenizer=arith_tok, input_key="prompt", max_len=26)
    rows, num_bad = load_sft_file(path, tokenizer=arith_tok, input_key="prompt", max_len=26, on_bad_data="skip")
    assert ([r.input_ids for r in rows], num_bad) == (
        [[arith_tok.bos_token_id, *arith_tok.encode("1+1=#2", add_special_tokens=False), arith_tok.eos_token_id]],
        1,
    )
    assert (
        len(load_sft_file(path, tokenizer=arith_tok, input_key="prompt", max_len=27)[0]) == 2
    )  # exactly the context fits


def test_model_context_len_reads_the_hf_config_field():
    from transformers import GPT2Config, LlamaConfig

    from slime.data.sft import model_context_len

    assert model_context_len(LlamaConfig(max_position_embeddings=320)) == 320
    assert model_context_len(GPT2Config(n_positions=64)) == 64
    assert model_context_len(object()) is None


@pytest.mark.parametrize(
    "arguments, why",
    [
        ("{bad json", r"'arguments' is a string but not JSON"),
        ("[1, 2]", r"'arguments' must be a JSON object, got list"),
    ],
)
def test_a_tool_call_with_malformed_arguments_is_a_bad_row(tmp_path, arguments, why):
    good = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    bad = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": arguments}}],
        },
    ]
    tok = build_chat_tokenizer("qwen", [(good, None)])
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": good}) + "\n" + json.dumps({"messages": bad}) + "\n")
    with pytest.raises(DataError, match=rf"{path}:2: .*message 1 tool_calls\[0\]: {why}"):
        load_sft_file(path, tokenizer=tok)
