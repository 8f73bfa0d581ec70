"""The tool-calling demo's chat tokenizer with ``slime.rollout.multiturn``: the template renders a tool
conversation, and a rollout through ``calculator_generate`` reproduces it token for token, with the
loss mask on exactly the assistant tokens (each turn's ``<|im_end|>`` included)."""

from __future__ import annotations

import msgspec

from slime.data import calc
from slime.data.tokenizer import IM_END, build_chat_tokenizer
from slime.rollout import multiturn
from slime.rollout.multiturn import STATE_KEY, calculator_generate
from slime.rollout.tools.calculator import calculator_tool
from slime.types import Sample, Status
from tests.rollout.tools.scripted_pool import ScriptedPool

TOK = build_chat_tokenizer()
EOT = TOK.convert_tokens_to_ids(IM_END)
SCHEMAS = [calculator_tool().schema]
EXPR, VALUE = "347*82*19", "540626"


def turn(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False) + [EOT]


def render(messages, generation_prompt=False):
    return TOK.apply_chat_template(
        messages, tools=SCHEMAS, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
    )


def test_chat_template_renders_a_tool_conversation():
    text = TOK.apply_chat_template(calc.conversation(EXPR, VALUE, use_tool=True), tools=SCHEMAS, tokenize=False)
    assert text == (
        "<|im_start|>system\ntools: calculator<|im_end|>\n"
        f"<|im_start|>user\n{EXPR}<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "calculator", "arguments": {"expression": "347*82*19"}}</tool_call><|im_end|>\n'
        f"<|im_start|>tool\n<tool_response>{VALUE}</tool_response><|im_end|>\n"
        f"<|im_start|>assistant\n#{VALUE}<|im_end|>\n"
    )
    ids = TOK.encode(text)
    assert TOK.decode(ids) == text
    assert len(ids) == len(text) - sum(
        text.count(t) * (len(t) - 1)
        for t in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
    )
    # a system message and OpenAI-style tool_calls render too; no tools and no system: no system turn
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": EXPR}}}
    msgs = [
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": EXPR},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    assert TOK.apply_chat_template(msgs, tools=SCHEMAS, tokenize=False) == (
        "<|im_start|>system\nBe exact.\ntools: calculator<|im_end|>\n"
        f"<|im_start|>user\n{EXPR}<|im_end|>\n<|im_start|>assistant\n{calc.tool_call_text(EXPR)}<|im_end|>\n"
    )
    assert TOK.apply_chat_template(
        [{"role": "user", "content": "1+1"}], add_generation_prompt=True, tokenize=False
    ) == ("<|im_start|>user\n1+1<|im_end|>\n<|im_start|>assistant\n")


async def test_calculator_generate_round_trips_the_conversation_with_the_loss_on_assistant_tokens_only():
    t1, t2 = turn(calc.tool_call_text(EXPR)), turn(f"#{VALUE}")
    pool = ScriptedPool([(t1, "stop"), (t2, "stop")])
    sample = Sample(prompt_ids=[], prompt=EXPR, label=VALUE)
    sample = await calculator_generate(
        sample, {"temperature": 1.0}, tokenizer=TOK, pool=pool, max_response_len=160, engine_version=3
    )
    full = render(calc.conversation(EXPR, VALUE, use_tool=True))
    assert sample.status is Status.COMPLETED
    assert sample.prompt_ids == render([{"role": "user", "content": EXPR}], generation_prompt=True)
    assert sample.prompt_ids + sample.response_ids == full[:-1] and TOK.decode(full[-1:]) == "\n"
    n_tool = len(sample.response_ids) - len(t1) - len(t2)
    assert sample.loss_mask == [1] * len(t1) + [0] * n_tool + [1] * len(t2)
    assert sample.response_ids[len(t1) - 1] == EOT and sample.response_ids[-1] == EOT  # both turn ends train
    assert TOK.decode(sample.response_ids[len(t1) : len(t1) + n_tool]) == (
        f"\n<|im_start|>tool\n<tool_response>{VALUE}</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert sample.rollout_logprobs == [-0.5] * len(t1) + [0.0] * n_tool + [-0.5] * len(t2)
    sample.check_aligned()
    assert [c["content"] for c in sample.evidence["tool_calls"]] == [VALUE]
    assert await calc.reward(sample) == 1.0 and sample.evidence["calc"]["tool_calls"] == 1
    # the same score from the decoded response alone (as a JSON dump without the state would give)
    plain = msgspec.json.decode(msgspec.json.encode(sample), type=Sample)
    plain.metadata = {}
    assert await calc.reward(plain) == 1.0


async def test_direct_answers_and_aborted_turns_through_calculator_generate():
    direct = Sample(prompt_ids=[], prompt=EXPR, label=VALUE)
    await calculator_generate(
        direct,
        {},
        tokenizer=TOK,
        pool=ScriptedPool([(turn("#540625"), "stop")]),
        max_response_len=160,
        engine_version=0,
    )
    assert direct.status is Status.COMPLETED and direct.loss_mask == [1] * len(turn("#540625"))
    assert await calc.reward(direct) == 0.0 and "tool_calls" not in direct.evidence

    t1 = turn(calc.tool_call_text(EXPR))
    pool = ScriptedPool([(t1[:9], "abort"), (t1[9:], "stop"), (turn(f"#{VALUE}"), "stop")])
    sample = Sample(prompt_ids=[], prompt=EXPR, label=VALUE)
    await calculator_generate(sample, {}, tokenizer=TOK, pool=pool, max_response_len=160, engine_version=0)
    assert sample.status is Status.PARTIAL and sample.metadata[STATE_KEY]["turn"] == 0
    sample = msgspec.json.decode(msgspec.json.encode(sample), type=Sample)
    await calculator_generate(sample, {}, tokenizer=TOK, pool=pool, max_response_len=160, engine_version=0)
    assert sample.status is Status.COMPLETED and sample.num_resumes == 1 and await calc.reward(sample) == 1.0


async def test_calculator_generate_caches_one_multiturn_generate_per_tokenizer():
    other = build_chat_tokenizer()
    for tok in (TOK, other, TOK):
        s = Sample(prompt_ids=[], prompt=EXPR, label=VALUE)
        await calculator_generate(
            s, {}, tokenizer=tok, pool=ScriptedPool([(turn("#1"), "stop")]), max_response_len=160, engine_version=0
        )
    cached = multiturn._CALCULATOR_GENERATES
    assert cached[TOK] is not cached[other] and cached[TOK].tools.names == ["calculator"]
    assert cached[TOK].max_turns == multiturn.CALCULATOR_MAX_TURNS


async def test_evaluate_uses_the_runs_generate_function():
    from slime.data.dataset import PromptRow
    from slime.loop.evaluate import evaluate

    class Pool:
        kv_cache_version = None

        async def generate(self, input_ids, sampling_params, **kw):
            text = (
                f"#{VALUE}" if TOK.convert_tokens_to_ids("<tool_response>") in input_ids else calc.tool_call_text(EXPR)
            )
            return await ScriptedPool([(turn(text), "stop")]).generate(input_ids, sampling_params, **kw)

    rows = [PromptRow(index=0, prompt=EXPR, label=VALUE), PromptRow(index=1, prompt=EXPR, label="1")]
    gen = lambda sample, params, **kw: calculator_generate(sample, params, tokenizer=TOK, **kw)  # noqa: E731
    out = await evaluate(
        rows,
        pool=Pool(),
        tokenize=TOK.encode,
        decode=TOK.decode,
        reward_fn=calc.reward,
        max_response_len=160,
        engine_version=0,
        reward_timeout_s=5.0,
        generate_fn=gen,
    )
    assert out["accuracy"] == 0.5 and out["failed"] == 0.0
