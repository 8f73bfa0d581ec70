"""Multi-turn tool-calling rollouts: the model talks, tools answer, token in and token out.

One call of ``generate`` (or of a ``MultiTurnGenerate`` instance, the scheduler's ``generate_fn``)
runs turns until the model answers without a tool call, ``max_turns`` model turns are done, the
length budget is spent, or the engine aborts the request::

    prompt_ids = chat_template(messages, tools=schemas, add_generation_prompt=True)   (fresh sample)
    loop:  /generate(prompt_ids + response_ids)   -> model tokens, appended trainable (end-of-turn
                                                     token included: the model generated it)
           <tool_call>{...}</tool_call> in the turn? no -> COMPLETED
           run the tools (registry: failures and timeouts become error text)
           template delta (below)                  -> appended trainable=False, logprob 0.0, version
                                                     of the calling turn

Template delta: with ``H`` the messages before the turn, ``a`` the turn as an assistant message
(its decoded text) and ``T`` the tool messages, render ``X = tpl(H)`` and ``B = tpl(H + [a] + T,
gen=True)``, check that ``X`` is a prefix of ``B``, and find the end of the turn in ``B``: the k-th
occurrence after ``len(X)`` of the model's last token, where k counts that token in the model's
turn. Everything in ``B`` after it is appended. The model's own tokens are never replaced by a
re-tokenisation of its text, and how the template renders the turn itself (Qwen3 renders an empty
``<think>`` block only when the assistant message is last) does not matter. Example (Qwen2.5): the
model emits ``...</tool_call><|im_end|>``; we append ``\n<|im_start|>user\n<tool_response>\n42\n
</tool_response><|im_end|>\n<|im_start|>assistant\n``.

Templates that re-render earlier turns when messages are added (older assistant turns rewritten
once a later one exists): the prefix check fails on the full history, so the delta is taken over a
minimal history (the messages through the first user message), which holds for templates whose
rendering of the new messages depends only on the turn before them;
``metadata["multiturn"]["template"]`` says ``"minimal"`` then. The sample stays what the model saw
(its training tokens equal its generation tokens), which can then differ from a fresh rendering of
the whole conversation. If even that check fails the sample is FAILED; if the turn did not end with
a token that the template ends turns with, the rollout stops COMPLETED without running the tools;
either way the reason is in ``evidence``.

Resume state (``sample.metadata["multiturn"]``, JSON): ``messages`` (the conversation so far),
``turn`` (model turns finished), ``turn_start`` (index in ``response_ids`` where the unfinished
turn starts), ``phase`` (``"generate"``: the next step asks the model; ``"tools"``: the last turn's
tool calls, in ``pending``, have no results appended yet, and the turn waits in
``pending_assistant``; ``"done"``) and ``template``. An abort in the middle of
a turn returns PARTIAL and the next call resumes that turn with prompt + response ids; an abort
at the start of a turn resumes right there; a call cancelled while tools run leaves ``phase ==
"tools"`` and status PARTIAL, and the next call runs those tools again (so tools must be idempotent)
before generating. Every record of a tool call goes to ``sample.evidence["tool_calls"]``.

Budget: ``max_response_len`` counts model and tool tokens; tool results that would leave no room
for one more model token are not appended and the sample ends TRUNCATED. Status at return:
COMPLETED, TRUNCATED (length, budget or ``max_turns``), PARTIAL (aborted) or FAILED.
"""

from __future__ import annotations

import asyncio
import copy
import weakref
from collections.abc import Callable
from typing import Any

from slime.engines.interface import GeneratePool
from slime.errors import EngineRequestError, EnginesGone, EngineTimeout, EngineUnavailable
from slime.rollout.chat_tokenizer import ChatTokenizer
from slime.rollout.generate import (
    fail_unanswered,
    keep_routes,
    kv_cache_version_of,
    status_from_finish_reason,
    token_versions,
)
from slime.rollout.tool_delta import (  # render and TemplateError re-exported
    TemplateError,
    TurnEndError,
    assistant_text,
    clip_tool_output,
    render,
    tool_delta,
)
from slime.rollout.tools.calculator import calculator_tool
from slime.rollout.tools.parse import ToolCall, parse_tool_calls
from slime.rollout.tools.registry import ToolRegistry, ToolResult
from slime.types import JsonObject, Sample, Status

__all__ = ["MultiTurnGenerate", "generate", "calculator_generate", "render", "TemplateError", "STATE_KEY"]

STATE_KEY = "multiturn"


class MultiTurnGenerate:
    """``generate`` with its tokenizer and tools bound: pass an instance as the scheduler's ``generate_fn``.

    Args:
        tokenizer: a HF tokenizer with a chat template that renders ``tools=`` and ``role: tool``.
        tools: the tool registry.
        max_turns: model turns per trajectory (a turn is one /generate answer).
        max_tool_output_tokens: a tool message's content is cut to this many tokens.
        system_prompt: prepended as a system message when the sample brings none.

    The conversation starts from ``sample.metadata["messages"]`` (chat messages from the dataset,
    e.g. through ``--metadata-key``) when present, else from ``sample.prompt`` as one user message;
    ``prompt_ids`` of a fresh sample are replaced by the template's rendering of it.
    """

    def __init__(
        self,
        *,
        tokenizer: ChatTokenizer,
        tools: ToolRegistry,
        max_turns: int = 8,
        max_tool_output_tokens: int = 512,
        system_prompt: str | None = None,
    ):
        if max_turns < 1 or max_tool_output_tokens < 1:
            raise ValueError(f"max_turns={max_turns} and max_tool_output_tokens={max_tool_output_tokens} must be >= 1")
        self.tokenizer, self.tools = tokenizer, tools
        self.max_turns, self.max_tool_output_tokens, self.system_prompt = (
            max_turns,
            max_tool_output_tokens,
            system_prompt,
        )

    async def __call__(
        self,
        sample: Sample,
        sampling_params: JsonObject,
        *,
        pool: GeneratePool,
        max_response_len: int,
        engine_version: int,
        decode: Callable[[list[int]], str] | None = None,
    ) -> Sample:
        return await generate(
            sample,
            sampling_params,
            pool=pool,
            max_response_len=max_response_len,
            engine_version=engine_version,
            decode=decode,
            tokenizer=self.tokenizer,
            tools=self.tools,
            max_turns=self.max_turns,
            max_tool_output_tokens=self.max_tool_output_tokens,
            system_prompt=self.system_prompt,
        )


_CALCULATOR_GENERATES: weakref.WeakKeyDictionary[Any, MultiTurnGenerate] = weakref.WeakKeyDictionary()
CALCULATOR_MAX_TURNS = 4
"""Model turns per trajectory for ``calculator_generate`` (a call and an answer need 2)."""


async def calculator_generate(
    sample: Sample,
    sampling_params: JsonObject,
    *,
    tokenizer: ChatTokenizer,
    pool: GeneratePool,
    max_response_len: int,
    engine_version: int,
    decode: Callable[[list[int]], str] | None = None,
) -> Sample:
    """Multi-turn generate with the ``calculator`` tool, for the CLI (the tool-calling demo)::

        slime train --custom-generate-function-path slime.rollout.multiturn.calculator_generate ...

    The driver binds the run's ``tokenizer``; one ``MultiTurnGenerate`` (calculator registry,
    ``CALCULATOR_MAX_TURNS`` turns, no system prompt: the chat template writes the tools' system
    turn) is built per tokenizer and cached.
    """
    gen = _CALCULATOR_GENERATES.get(tokenizer)
    if gen is None:
        gen = MultiTurnGenerate(
            tokenizer=tokenizer, tools=ToolRegistry([calculator_tool()]), max_turns=CALCULATOR_MAX_TURNS
        )
        _CALCULATOR_GENERATES[tokenizer] = gen
    return await gen(
        sample,
        sampling_params,
        pool=pool,
        max_response_len=max_response_len,
        engine_version=engine_version,
        decode=decode,
    )


async def generate(
    sample: Sample,
    sampling_params: JsonObject,
    *,
    pool: GeneratePool,
    max_response_len: int,
    engine_version: int,
    decode: Callable[[list[int]], str] | None = None,
    tokenizer: ChatTokenizer,
    tools: ToolRegistry,
    max_turns: int = 8,
    max_tool_output_tokens: int = 512,
    system_prompt: str | None = None,
) -> Sample:
    """Run turns for ``sample`` (fresh, or partial with its state); mutates it through ``Sample.append``.

    Returns the same sample with status COMPLETED, TRUNCATED, PARTIAL or FAILED (module docstring).
    """
    schemas = tools.schemas
    state = sample.metadata.get(STATE_KEY)
    if state is None:
        if sample.response_ids:
            return _fail(
                sample,
                "StateError",
                "sample has response tokens but no multi-turn state; it was not started by this generate function",
            )
        state = _new_state(sample, system_prompt)
        sample.prompt_ids = await asyncio.to_thread(
            render, tokenizer, state["messages"], schemas, generation_prompt=True
        )
        sample.metadata = {**sample.metadata, STATE_KEY: state}
    elif sample.status is Status.PARTIAL:
        sample.num_resumes += 1
    while state["phase"] != "done":
        if state["phase"] == "tools":
            if not await _tool_step(sample, state, tokenizer, tools, max_response_len, max_tool_output_tokens):
                break
            continue
        if state["turn"] >= max_turns or len(sample.response_ids) >= max_response_len:
            sample.status = Status.TRUNCATED
            state["phase"] = "done"
            break
        if not await _model_step(
            sample, state, sampling_params, pool, max_response_len, engine_version, tokenizer, max_turns
        ):
            break
    sample.response = (
        decode(sample.response_ids) if decode else tokenizer.decode(sample.response_ids, skip_special_tokens=True)
    )
    return sample


def _new_state(sample: Sample, system_prompt: str | None) -> JsonObject:
    given = sample.metadata.get("messages")
    messages = (
        copy.deepcopy(given) if isinstance(given, list) and given else [{"role": "user", "content": sample.prompt}]
    )
    if system_prompt is not None and messages[0].get("role") != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return {"messages": messages, "turn": 0, "turn_start": 0, "phase": "generate", "pending": [], "template": "full"}


async def _model_step(
    sample: Sample,
    state: JsonObject,
    sampling_params: JsonObject,
    pool: GeneratePool,
    max_response_len: int,
    engine_version: int,
    tokenizer: ChatTokenizer,
    max_turns: int,
) -> bool:
    """One /generate for the current turn. Returns True when the loop goes on (tools to run)."""
    params = dict(sampling_params, max_new_tokens=max_response_len - len(sample.response_ids))
    kv_version = kv_cache_version_of(pool, engine_version)
    rid = f"slime-mt-g{sample.group_id}-s{sample.index}-a{sample.num_aborts}-r{sample.num_resumes}-t{state['turn']}-"
    try:
        result = await pool.generate(
            sample.prompt_ids + sample.response_ids, params, rid=rid, sticky_key=f"g{sample.group_id}-s{sample.index}"
        )
    except EngineRequestError as exc:
        sample.status = Status.FAILED
        sample.evidence["generate_error"] = {"type": type(exc).__name__, "message": str(exc), "turn": state["turn"]}
        return False
    except EnginesGone:
        raise
    except (EngineUnavailable, EngineTimeout) as exc:  # no answer in any attempt: a transport failure, never scored
        fail_unanswered(sample, exc, turn=state["turn"])
        return False
    sample.append(
        result.output_ids, result.output_logprobs, token_versions(result, engine_version, kv_version), trainable=True
    )
    keep_routes(sample, result)  # --use-rollout-routing-replay; tool tokens: the next turn's
    sample.status = status_from_finish_reason(result.finish_reason.type)
    if sample.status is Status.PARTIAL:
        sample.num_aborts += 1
        return False
    if sample.status is not Status.COMPLETED:
        state["phase"] = "done"
        return False
    turn_ids = sample.response_ids[state["turn_start"] :]
    assistant = {"role": "assistant", "content": assistant_text(tokenizer, turn_ids)}
    calls = parse_tool_calls(assistant["content"])
    state["turn"] += 1
    if not calls:
        state["messages"].append(assistant)
        state["phase"] = "done"
        return False
    if state["turn"] >= max_turns:
        state["messages"].append(assistant)
        state["phase"] = "done"
        sample.status = Status.TRUNCATED
        sample.evidence["multiturn_stop"] = f"max_turns={max_turns} reached with {len(calls)} tool call(s) not run"
        return False
    state["pending"] = [c.to_json() for c in calls]
    state["pending_assistant"] = assistant
    state["phase"] = "tools"
    sample.status = Status.PARTIAL  # resumable until the tool results are appended
    return True


async def _tool_step(
    sample: Sample,
    state: JsonObject,
    tokenizer: ChatTokenizer,
    tools: ToolRegistry,
    max_response_len: int,
    max_tool_output_tokens: int,
) -> bool:
    """Run the pending tool calls and append the template delta. Returns True when the loop goes on."""
    tool_msgs, records = await _run_tools(state, tokenizer, tools, max_tool_output_tokens)
    history, assistant = state["messages"], state["pending_assistant"]
    turn_ids = sample.response_ids[state["turn_start"] :]
    try:
        insert, how = await asyncio.to_thread(
            tool_delta, tokenizer, tools.schemas, history, assistant, tool_msgs, turn_ids
        )
    except TemplateError as exc:
        sample.evidence.setdefault("tool_calls", []).extend(records)
        state["messages"].append(assistant)
        state["phase"] = "done"
        if isinstance(exc, TurnEndError):
            sample.status = Status.COMPLETED
            sample.evidence["multiturn_stop"] = str(exc)
        else:
            _fail(sample, "TemplateError", str(exc))
        return False
    sample.evidence.setdefault("tool_calls", []).extend(records)
    state["messages"].append(assistant)
    if len(sample.response_ids) + len(insert) >= max_response_len:
        state["phase"] = "done"
        sample.status = Status.TRUNCATED
        sample.evidence["multiturn_stop"] = (
            f"tool results ({len(insert)} tokens) do not fit: {len(sample.response_ids)} of {max_response_len} tokens used"
        )
        return False
    version = sample.versions[-1] if sample.versions else 0
    sample.append(insert, [0.0] * len(insert), version, trainable=False)
    state["messages"].extend(tool_msgs)
    state.update(phase="generate", pending=[], turn_start=len(sample.response_ids), template=how)
    state.pop("pending_assistant", None)
    return True


async def _run_tools(
    state: JsonObject, tokenizer: ChatTokenizer, tools: ToolRegistry, max_tool_output_tokens: int
) -> tuple[list[JsonObject], list[JsonObject]]:
    """Run the turn's pending tool calls at once. Returns (tool messages, each clipped to
    ``max_tool_output_tokens``; their records for ``evidence["tool_calls"]``)."""
    calls = [ToolCall(c["name"], c["arguments"], c["error"], c.get("raw", "")) for c in state["pending"]]
    results = await asyncio.gather(*(_call(tools, c) for c in calls))
    tool_msgs = [
        {
            "role": "tool",
            "name": c.name or "",
            "content": clip_tool_output(tokenizer, r.content, max_tool_output_tokens),
        }
        for c, r in zip(calls, results)
    ]
    records = [
        {
            "turn": state["turn"],
            "name": c.name,
            "arguments": c.arguments,
            "error": r.error,
            "content": m["content"][:2000],
            "elapsed_s": round(r.elapsed_s, 4),
        }
        for c, r, m in zip(calls, results, tool_msgs)
    ]
    return tool_msgs, records


async def _call(tools: ToolRegistry, call: ToolCall) -> ToolResult:
    if call.error is not None:  # unparseable block: the model is told what was wrong
        return ToolResult(name=call.name or "", content=f"Error: {call.error}", error=call.error)
    return await tools.call(call.name or "", call.arguments)


def _fail(sample: Sample, kind: str, message: str) -> Sample:
    sample.status = Status.FAILED
    sample.evidence["generate_error"] = {"type": kind, "message": message}
    return sample
