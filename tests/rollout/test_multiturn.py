"""Multi-turn tool-calling generate: token-exact against the chat template, masks, aborts and resumes.

A scripted pool returns predetermined token sequences (and aborts where told), so the tests are
deterministic; one test runs turn 2 on the real embedded engine over HTTP.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from slime.rollout.multiturn import STATE_KEY, MultiTurnGenerate
from slime.rollout.tools.calculator import calculator_tool
from slime.rollout.tools.registry import Tool, ToolRegistry
from slime.types import Sample, Status
from tests.rollout.tools.chat_tokenizer import COUNTING_TEMPLATE, STRIP_THINK_TEMPLATE, build_chat_tokenizer
from tests.rollout.tools.scripted_pool import ScriptedPool

TOK = build_chat_tokenizer()
IM_END = TOK.convert_tokens_to_ids("<|im_end|>")
SYSTEM = "Be brief."
QUESTION = "What are 6*7 and 2+2?"
CALLS = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>'
)
ANSWER = "6*7 is 42 and 2+2 is 4."


def turn(text: str, end: int = IM_END, tok=TOK) -> list[int]:
    """What the model emits for one turn: the text's tokens and the end-of-turn token."""
    return tok.encode(text, add_special_tokens=False) + [end]


def conversation(*turns_and_tools):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    for item in turns_and_tools:
        msgs.append(
            {"role": "assistant", "content": item} if isinstance(item, str) else {"role": "tool", "content": item[0]}
        )
    return msgs


def template_ids(messages, tools, tok=TOK, generation_prompt=False):
    return tok.apply_chat_template(
        messages, tools=tools.schemas, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
    )


async def run(sample, pool, *, tools=None, tok=TOK, max_response_len=2000, **kw):
    gen = MultiTurnGenerate(tokenizer=tok, tools=tools or ToolRegistry([calculator_tool()]), system_prompt=SYSTEM, **kw)
    return await gen(sample, {"temperature": 1.0}, pool=pool, max_response_len=max_response_len, engine_version=3)


def fresh() -> Sample:
    return Sample(prompt_ids=[], prompt=QUESTION)


def roundtrip(sample: Sample) -> Sample:
    """The sample as a rollout dump or checkpoint would bring it back: JSON only."""
    return msgspec.json.decode(msgspec.json.encode(sample), type=Sample)


async def test_token_ids_equal_the_chat_template_over_the_whole_conversation():
    sample = await run(fresh(), ScriptedPool([(turn(CALLS), "stop"), (turn(ANSWER), "stop")]))
    tools = ToolRegistry([calculator_tool()])
    full = template_ids(conversation(CALLS, ("42",), ("4",), ANSWER), tools)
    assert sample.status is Status.COMPLETED
    assert sample.prompt_ids == template_ids(conversation(), tools, generation_prompt=True)
    # The model's last <|im_end|> ends the sample; the template's newline after it is not generated.
    assert sample.prompt_ids + sample.response_ids == full[:-1] and TOK.decode(full[-1:]) == "\n"
    assert [m["role"] for m in sample.metadata[STATE_KEY]["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert [(c["name"], c["content"]) for c in sample.evidence["tool_calls"]] == [
        ("calculator", "42"),
        ("calculator", "4"),
    ]


async def test_loss_mask_covers_exactly_the_model_tokens_with_each_end_of_turn_token():
    sample = await run(fresh(), ScriptedPool([(turn(CALLS), "stop"), (turn(ANSWER), "stop")]))
    t1, t2 = turn(CALLS), turn(ANSWER)
    n_tool = len(sample.response_ids) - len(t1) - len(t2)
    assert sample.response_ids[: len(t1)] == t1 and sample.response_ids[-len(t2) :] == t2
    assert sample.loss_mask == [1] * len(t1) + [0] * n_tool + [1] * len(t2)
    assert sample.rollout_logprobs == [-0.5] * len(t1) + [0.0] * n_tool + [-0.5] * len(t2)
    assert sample.versions == [3] * len(sample.response_ids)
    assert TOK.decode(sample.response_ids[len(t1) : len(t1) + n_tool]).startswith(
        "\n<|im_start|>user\n<tool_response>\n42\n"
    )
    sample.check_aligned()


async def test_abort_mid_turn_then_resume_from_json_gives_the_uninterrupted_conversation():
    t1 = turn(CALLS)
    reference = await run(fresh(), ScriptedPool([(t1, "stop"), (turn(ANSWER), "stop")]))
    pool = ScriptedPool([(t1[:7], "abort"), (t1[7:], "stop"), (turn(ANSWER), "stop")])
    sample = await run(fresh(), pool)
    assert sample.status is Status.PARTIAL and sample.response_ids == t1[:7] and sample.num_aborts == 1
    sample = await run(roundtrip(sample), pool)
    assert pool.calls[1] == sample.prompt_ids + t1[:7]  # the turn resumes from prompt + kept tokens
    assert sample.status is Status.COMPLETED and sample.num_resumes == 1
    assert sample.response_ids == reference.response_ids and sample.loss_mask == reference.loss_mask


async def test_abort_at_the_start_of_a_turn_resumes_exactly_there():
    reference = await run(fresh(), ScriptedPool([(turn(CALLS), "stop"), (turn(ANSWER), "stop")]))
    pool = ScriptedPool([(turn(CALLS), "stop"), ([], "abort"), (turn(ANSWER), "stop")])
    sample = await run(fresh(), pool)
    state = sample.metadata[STATE_KEY]
    assert sample.status is Status.PARTIAL and state["phase"] == "generate" and state["turn"] == 1
    assert (
        state["turn_start"] == len(sample.response_ids) and sample.loss_mask[-1] == 0
    )  # tool results in, turn 2 not begun
    sample = await run(roundtrip(sample), pool)
    assert pool.calls[2] == pool.calls[1] and sample.response_ids == reference.response_ids
    assert len(sample.evidence["tool_calls"]) == 2


async def test_cancel_while_tools_run_resumes_by_running_them_once_more():
    gate = asyncio.Event()

    async def slow_calc(args):
        await gate.wait()
        return "42" if args["expression"] == "6*7" else "4"

    slow = ToolRegistry([Tool("calculator", "d", {"type": "object"}, slow_calc)])
    reference = await run(fresh(), ScriptedPool([(turn(CALLS), "stop"), (turn(ANSWER), "stop")]))
    pool = ScriptedPool([(turn(CALLS), "stop"), (turn(ANSWER), "stop")])
    sample = fresh()
    task = asyncio.create_task(run(sample, pool, tools=slow))
    while not pool.calls:
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sample.status is Status.PARTIAL and sample.metadata[STATE_KEY]["phase"] == "tools"
    assert sample.response_ids == turn(CALLS)
    gate.set()
    sample = await run(roundtrip(sample), pool, tools=slow)
    assert sample.status is Status.COMPLETED and sample.response_ids == reference.response_ids
    assert len(pool.calls) == 2


async def test_bad_tool_call_json_becomes_a_tool_message_saying_so():
    bad = '<tool_call>{"name": "calculator", "arguments": {</tool_call>'
    sample = await run(fresh(), ScriptedPool([(turn(bad), "stop"), (turn(ANSWER), "stop")]))
    [record] = sample.evidence["tool_calls"]
    assert sample.status is Status.COMPLETED and "not valid JSON" in record["error"]
    assert "Error: tool call is not valid JSON" in sample.metadata[STATE_KEY]["messages"][3]["content"]


async def test_max_turns_stops_before_running_more_tools():
    sample = await run(fresh(), ScriptedPool([(turn(CALLS), "stop")]), max_turns=1)
    assert sample.status is Status.TRUNCATED and sample.response_ids == turn(CALLS)
    assert "max_turns=1" in sample.evidence["multiturn_stop"] and "tool_calls" not in sample.evidence


async def test_tool_results_that_do_not_fit_the_budget_are_not_appended():
    sample = await run(fresh(), ScriptedPool([(turn(CALLS), "stop")]), max_response_len=len(turn(CALLS)) + 5)
    assert sample.status is Status.TRUNCATED and sample.response_ids == turn(CALLS)
    assert "do not fit" in sample.evidence["multiturn_stop"]


async def test_template_that_rewrites_older_turns_falls_back_to_a_minimal_history():
    tok = build_chat_tokenizer(STRIP_THINK_TEMPLATE)
    t1 = "<think>use the tool</think>" + CALLS
    t2 = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
    pool = ScriptedPool([(turn(t1, tok=tok), "stop"), (turn(t2, tok=tok), "stop"), (turn(ANSWER, tok=tok), "stop")])
    sample = await run(fresh(), pool, tok=tok)
    assert sample.status is Status.COMPLETED and sample.metadata[STATE_KEY]["template"] == "minimal"
    insert2 = pool.calls[2][len(pool.calls[1]) + len(turn(t2, tok=tok)) :]  # what went in after turn 2
    assert (
        tok.decode(insert2)
        == "\n<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


async def test_template_that_is_not_append_only_fails_the_sample_with_the_reason():
    tok = build_chat_tokenizer(COUNTING_TEMPLATE)
    sample = await run(fresh(), ScriptedPool([(turn(CALLS, tok=tok), "stop")]), tok=tok)
    assert sample.status is Status.FAILED and "re-renders" in sample.evidence["generate_error"]["message"]


async def test_turn_ending_with_a_foreign_token_stops_without_running_tools():
    eot = TOK.convert_tokens_to_ids("<|endoftext|>")
    sample = await run(fresh(), ScriptedPool([(turn(CALLS, end=eot), "stop")]))
    assert sample.status is Status.COMPLETED and f"token {eot}" in sample.evidence["multiturn_stop"]
    assert sample.response_ids == turn(CALLS, end=eot)


class FirstTurnScripted:
    """Turn 1 (the tool call) is scripted; every later turn goes to the real engine behind ``pool``."""

    kv_cache_version = None

    def __init__(self, pool):
        self.pool, self.num_calls = pool, 0

    async def generate(self, input_ids, sampling_params, **kw):
        self.num_calls += 1
        if self.num_calls == 1:
            return await ScriptedPool([(turn(CALLS), "stop")]).generate(input_ids, sampling_params, **kw)
        return await self.pool.generate(input_ids, sampling_params, **kw)

    async def abort_all(self):
        await self.pool.abort_all()


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    from slime.servers.embedded.tiny import write_tiny_llama

    return write_tiny_llama(
        tmp_path_factory.mktemp("mt") / "tiny-chat",
        vocab_size=len(TOK),
        max_position_embeddings=2048,
        eos_token_id=IM_END,
    )


async def test_real_engine_abort_in_turn_two_then_resume_equals_the_uninterrupted_run(chat_model_dir):
    import torch

    from slime.config import RolloutConfig
    from slime.engines.pool import HttpEnginePool
    from slime.servers.embedded import EngineServer

    torch.set_num_threads(1)
    gen = MultiTurnGenerate(tokenizer=TOK, tools=ToolRegistry([calculator_tool()]), system_prompt=SYSTEM)
    greedy = {"temperature": 0.0, "ignore_eos": True}
    max_len = len(turn(CALLS)) + 150
    async with EngineServer(chat_model_dir, port=0, seed=0, weight_version="3") as server:
        async with HttpEnginePool([server.url], config=RolloutConfig(request_timeout_s=30, max_retries=0)) as real:
            reference = await gen(
                fresh(), greedy, pool=FirstTurnScripted(real), max_response_len=max_len, engine_version=3
            )
            pool = FirstTurnScripted(real)
            sample = fresh()
            task = asyncio.create_task(gen(sample, greedy, pool=pool, max_response_len=max_len, engine_version=3))
            while not task.done():
                await asyncio.sleep(0.005)
                if pool.num_calls >= 2:
                    await pool.abort_all()
            assert task.result().status is Status.PARTIAL and sample.metadata[STATE_KEY]["turn"] == 1
            kept = len(sample.response_ids)
            pool.num_calls = 1  # turn 1 is done; the resume goes to the engine
            await gen(sample, greedy, pool=pool, max_response_len=max_len, engine_version=3)
    assert reference.status is Status.TRUNCATED and len(reference.response_ids) == max_len
    assert sample.status is Status.TRUNCATED and sample.response_ids == reference.response_ids and kept < max_len
    assert sample.loss_mask == reference.loss_mask and sample.num_aborts == 1
    n_tool = reference.loss_mask.count(0)
    assert reference.loss_mask == [1] * len(turn(CALLS)) + [0] * n_tool + [1] * (max_len - len(turn(CALLS)) - n_tool)


class RulePool:
    """Any number of trajectories: a turn without tool results before it calls the tools, else answers."""

    kv_cache_version = None

    TOOL_RESPONSE = TOK.convert_tokens_to_ids("<tool_response>")

    async def generate(self, input_ids, sampling_params, **kw):
        text = ANSWER if self.TOOL_RESPONSE in input_ids else CALLS
        return await ScriptedPool([(turn(text), "stop")]).generate(input_ids, sampling_params, **kw)

    async def abort_all(self):
        pass


async def test_generate_returning_one_sample_per_turn_works_with_scheduler_rewards_and_filters():
    from slime.config import LoopConfig, RolloutConfig
    from slime.data.dataset import PromptRow, PromptSource
    from slime.loop.buffer import DataBuffer
    from slime.loop.scheduler import Scheduler
    from slime.loop.version import PolicyVersion

    multiturn = MultiTurnGenerate(tokenizer=TOK, tools=ToolRegistry([calculator_tool()]), system_prompt=SYSTEM)

    async def per_turn(sample, sampling_params, **kw):
        """One finished Sample per model turn: its prompt is everything before that turn."""
        await multiturn(sample, sampling_params, **kw)
        ids, mask, pieces, start = sample.response_ids, sample.loss_mask, [], 0
        while start < len(ids):
            end = next((i for i in range(start, len(ids)) if not mask[i]), len(ids))
            piece = Sample(
                prompt_ids=sample.prompt_ids + ids[:start],
                index=2 * sample.index + len(pieces),
                label=sample.label,
                status=sample.status,
                response=TOK.decode(ids[start:end]),
            )
            piece.append(ids[start:end], sample.rollout_logprobs[start:end], sample.versions[start:end])
            pieces.append(piece)
            start = next((i for i in range(end, len(ids)) if mask[i]), len(ids))
        return pieces

    async def reward(sample):
        return 1.0 if "42" in sample.response else 0.0

    seen_sizes = []

    def keep_mixed(group):
        seen_sizes.append(len(group.samples))
        return len({s.reward for s in group.samples}) > 1

    rows = [PromptRow(index=i, prompt=QUESTION) for i in range(4)]
    async with asyncio.TaskGroup() as tg:
        sched = Scheduler(
            LoopConfig(mode="sync", rollout_batch_size=2, over_sampling_batch_size=2),
            RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=2000),
            source=PromptSource(rows, shuffle=False),
            tokenize=lambda text: [0],
            decode=TOK.decode,
            pool=RulePool(),
            buffer=DataBuffer(),
            reward_fn=reward,
            task_group=tg,
            generate_fn=per_turn,
            group_filter=keep_mixed,
            version=PolicyVersion(3),  # the scripted engine serves weight version 3
        )
        batch = await sched.next_batch(2)
        await sched.shutdown()
    assert seen_sizes == [4, 4] and len(batch) == 2
    for group in batch:
        assert [s.reward for s in group.samples] == [0.0, 1.0, 0.0, 1.0]
        assert all(s.group_id == group.group_id and s.loss_mask == [1] * len(s.response_ids) for s in group.samples)
        assert TOK.decode(group.samples[1].prompt_ids).endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
