"""The SFT loss mask is the assistant spans of one full chat-template render (Qwen2.5, Llama-3.1 and GLM-4 formats)."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from slime.data.chat_mask import TemplateError, assistant_char_spans, has_generation_blocks, render_with_assistant_mask
from slime.data.sft import load_sft_file
from slime.errors import DataError
from tests.fixtures.chat_tokenizers import build_chat_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def _call(city: str) -> dict:
    return {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}


def conversation(kind: str) -> list[dict]:
    """System, user, an assistant tool call, two consecutive tool results, an answer, a second user turn.

    Qwen2.5 and GLM-4 call both tools in one turn (parallel calls); Llama 3.1 allows one call per
    turn, so its turn calls once and two results come back (e.g. current and forecast)."""
    calls = [_call("Paris")] if kind == "llama" else [_call("Paris"), _call("Rome")]
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "Paris: 18C, sunny"},
        {"role": "tool", "content": "Rome: 24C, clear"},
        {"role": "assistant", "content": "Paris 18C sunny; Rome 24C clear."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You're welcome."},
    ]


# What the assistant wrote, as rendered, end-of-turn tokens included and role headers excluded.
EXPECTED_ASSISTANT_TEXT = {
    "qwen": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>'
        "Paris 18C sunny; Rome 24C clear.<|im_end|>You're welcome.<|im_end|>"
    ),
    "llama": (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'
        "Paris 18C sunny; Rome 24C clear.<|eot_id|>You're welcome.<|eot_id|>"
    ),
    # a turn ends at the next role tag, which the model emits to stop; the last turn has none to learn
    "glm": (
        "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
        "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n</tool_call><|observation|>"
        "Paris 18C sunny; Rome 24C clear.<|user|>You're welcome."
    ),
}


@pytest.fixture(scope="module", params=["qwen", "llama", "glm"])
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def tokenizers(kind):
    corpus = [(conversation(kind), TOOLS)]
    return build_chat_tokenizer(kind, corpus), build_chat_tokenizer(kind, corpus, generation=True)


def test_fixture_templates_render_the_same_text_with_and_without_generation_blocks(kind, tokenizers):
    plain, annotated = tokenizers
    assert not has_generation_blocks(plain.chat_template) and has_generation_blocks(annotated.chat_template)
    messages = conversation(kind)
    text = plain.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert text == annotated.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert text.count("Paris: 18C, sunny") == 1 and text.count("Rome: 24C, clear") == 1


def test_loss_mask_equals_the_assistant_spans_of_the_full_render(kind, tokenizers):
    plain, annotated = tokenizers
    messages = conversation(kind)
    ids, mask = render_with_assistant_mask(plain, messages, TOOLS)
    reference = annotated.apply_chat_template(
        messages, tools=TOOLS, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert ids == list(plain.apply_chat_template(messages, tools=TOOLS, tokenize=True, return_dict=True)["input_ids"])
    assert ids == list(reference["input_ids"])
    assert mask == list(reference["assistant_masks"])
    assert "".join(plain.decode([t]) for t, m in zip(ids, mask) if m) == EXPECTED_ASSISTANT_TEXT[kind]
    # multi-character tokens are in play (so the offsets mapping is exercised, not a char-level identity)
    assert len(ids) < len(plain.apply_chat_template(messages, tools=TOOLS, tokenize=False)) // 2


def test_generation_annotated_template_takes_transformers_mask(kind, tokenizers):
    plain, annotated = tokenizers
    messages = conversation(kind)
    assert render_with_assistant_mask(annotated, messages, TOOLS) == render_with_assistant_mask(plain, messages, TOOLS)


def test_masked_tokens_exclude_headers_tool_results_and_user_turns(kind, tokenizers):
    plain, _ = tokenizers
    ids, mask = render_with_assistant_mask(plain, conversation(kind), TOOLS)
    kept = "".join(plain.decode([t]) for t, m in zip(ids, mask) if m)
    dropped = "".join(plain.decode([t]) for t, m in zip(ids, mask) if not m)
    for text in ("assistant", "Thanks!", "18C, sunny", "You are terse."):
        assert text not in kept
    assert "Thanks!" in dropped and "Paris: 18C, sunny" in dropped


def _unstable_tokenizer() -> PreTrainedTokenizerFast:
    """Qwen3-style: an earlier assistant turn loses its <think> block once a later turn follows."""
    template = (
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
        "{%- if m.role == 'assistant' and not loop.last %}{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}"
        "<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    )
    core = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    core.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", chat_template=template)


def test_template_that_is_not_prefix_stable_is_refused_with_where_it_differs():
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "<think>x</think>b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    with pytest.raises(TemplateError, match=r"not prefix-stable: rendering messages\[:2\] .* differ at character \d+"):
        render_with_assistant_mask(_unstable_tokenizer(), messages)


def test_assistant_char_spans_end_at_the_end_of_turn_marker_not_the_trailing_newline():
    def render(msgs, add_generation_prompt):
        out = "".join(f"<{m['role']}>{m['content']}</s>\n" for m in msgs)
        return out + ("<assistant>" if add_generation_prompt else "")

    text, spans = assistant_char_spans(
        render, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo "}]
    )
    assert [text[a:b] for a, b in spans] == ["yo </s>"]


def test_a_turn_ends_at_its_closing_special_token_else_at_the_next_turns_tag():
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo "},
        {"role": "user", "content": "ok"},
        {"role": "assistant", "content": "bye"},
    ]

    def glm(msgs, add_generation_prompt):  # no end-of-turn token: a turn ends where the next role tag begins
        return "".join(f"<|{m['role']}|>\n{m['content']}" for m in msgs) + (
            "<|assistant|>\n" if add_generation_prompt else ""
        )

    def chatml(msgs, add_generation_prompt):
        return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs) + (
            "<|im_start|>assistant\n" if add_generation_prompt else ""
        )

    text, spans = assistant_char_spans(glm, messages, special_tokens={"<|user|>", "<|assistant|>"})
    assert [text[a:b] for a, b in spans] == ["yo <|user|>", "bye"]  # the last turn has no tag to learn
    text, spans = assistant_char_spans(chatml, messages, special_tokens={"<|im_start|>", "<|im_end|>"})
    assert [text[a:b] for a, b in spans] == ["yo <|im_end|>", "bye<|im_end|>"]  # not the next <|im_start|>


def test_glm4_tool_call_turn_trains_the_observation_tag_that_ends_it():
    """The tag the model emits to stop (<|observation|> after a tool call, <|user|> after an answer) is
    in the mask; the tool results after it, the assistant headers and the first user tag are not."""
    messages = conversation("glm")
    tok = build_chat_tokenizer("glm", [(messages, TOOLS)])
    ids, mask = render_with_assistant_mask(tok, messages, TOOLS)
    masks = {
        tag: [m for t, m in zip(ids, mask) if t == tok.convert_tokens_to_ids(tag)]
        for tag in ("<|observation|>", "<|user|>", "<|assistant|>", "<|system|>")
    }
    assert masks == {"<|observation|>": [1], "<|user|>": [0, 1], "<|assistant|>": [0, 0, 0], "<|system|>": [0, 0]}
    at = ids.index(tok.convert_tokens_to_ids("<|observation|>"))
    assert tok.decode(ids[at + 1 :]).startswith("\n<tool_response>\nParis: 18C, sunny") and not any(
        mask[at + 1 : at + 10]
    )


def test_tokenizer_without_chat_template_is_refused():
    core = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    with pytest.raises(TemplateError, match="no chat template"):
        render_with_assistant_mask(PreTrainedTokenizerFast(tokenizer_object=core), [{"role": "user", "content": "x"}])


def test_conversation_the_template_rejects_names_file_and_line(tmp_path):
    llama = build_chat_tokenizer("llama", [(conversation("llama"), TOOLS)])
    bad = conversation("llama")
    bad[2]["tool_calls"] = [_call("Paris"), _call("Rome")]  # Llama 3.1: "only supports single tool-calls at once"
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps({"messages": m, "tools": TOOLS}) for m in (conversation("llama"), bad)) + "\n")
    with pytest.raises(DataError, match=rf"{path}:2: chat template failed .*single tool-calls"):
        load_sft_file(path, tokenizer=llama, input_key="messages", tool_key="tools")
    rows, num_bad = load_sft_file(path, tokenizer=llama, input_key="messages", tool_key="tools", on_bad_data="skip")
    assert (len(rows), num_bad) == (1, 1)


def test_template_problem_stops_the_run_even_when_bad_rows_are_skipped(tmp_path):
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "<think>x</think>b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n")
    with pytest.raises(TemplateError, match="prefix-stable"):
        load_sft_file(path, tokenizer=_unstable_tokenizer(), input_key="messages", on_bad_data="skip")
