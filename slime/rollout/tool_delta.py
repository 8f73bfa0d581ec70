"""The template delta of a multi-turn rollout: the tokens to append after the model's turn so that the sample
reads as the chat template renders the conversation with the tool messages added (``slime.rollout.multiturn``'s
docstring, "Template delta", says how it is found and when the minimal history is used).

``tool_delta`` renders through ``render`` (the tokenizer's chat template, ``ChatTokenizer``); ``assistant_text``
is the model's turn as an assistant message and ``clip_tool_output`` cuts a tool message to its token budget.
``TemplateError`` (the template cannot give an append-only delta) and its ``TurnEndError`` (the turn did not end
with a token the template ends assistant turns with) say why there is none.
"""

from __future__ import annotations

from slime.rollout.chat_tokenizer import ChatTokenizer
from slime.types import JsonObject

__all__ = ["TemplateError", "TurnEndError", "render", "tool_delta", "assistant_text", "clip_tool_output"]


class TemplateError(ValueError):
    """The chat template cannot give the tool messages as an append-only delta."""


class TurnEndError(TemplateError):
    """The model's turn ended with a token that the template does not end assistant turns with."""


def render(
    tokenizer: ChatTokenizer, messages: list[JsonObject], tools: list[JsonObject] | None, *, generation_prompt: bool
) -> list[int]:
    """``apply_chat_template(..., tokenize=True)`` as a flat ``[num_tokens]`` id list."""
    out = tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
    )
    return list(out if isinstance(out, list) else out["input_ids"])


def assistant_text(tokenizer: ChatTokenizer, turn_ids: list[int]) -> str:
    """The turn's text without its trailing special tokens (``<|im_end|>``); added tokens such as
    ``<tool_call>`` are kept even when a tokenizer marks them special."""
    special = set(tokenizer.all_special_ids)
    end = len(turn_ids)
    while end and turn_ids[end - 1] in special:
        end -= 1
    return tokenizer.decode(turn_ids[:end], skip_special_tokens=False)


def clip_tool_output(tokenizer: ChatTokenizer, text: str, max_tokens: int) -> str:
    """``text`` cut to ``max_tokens`` tokens, with a note of how many were cut; unchanged when it fits."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text
    return (
        tokenizer.decode(ids[:max_tokens], skip_special_tokens=False)
        + f"\n...[truncated {len(ids) - max_tokens} tokens]"
    )


def tool_delta(
    tokenizer: ChatTokenizer,
    schemas: list[JsonObject],
    history: list[JsonObject],
    assistant: JsonObject,
    tool_msgs: list[JsonObject],
    turn_ids: list[int],
) -> tuple[list[int], str]:
    """Tokens to append after the model's turn (``slime.rollout.multiturn``'s docstring).

    Returns (ids, "full" | "minimal"): the delta, and the history it was taken over.
    """
    first_user = next((i for i, m in enumerate(history) if m.get("role") == "user"), len(history) - 1)
    for how, hist in (("full", history), ("minimal", history[: first_user + 1])):  # noqa: B007  # `how` is returned after the break
        x = render(tokenizer, hist, schemas, generation_prompt=False)
        b = render(tokenizer, hist + [assistant] + tool_msgs, schemas, generation_prompt=True)
        if b[: len(x)] == x:
            break
    else:
        raise TemplateError(
            "chat template re-renders the conversation when tool messages are added, even over a minimal history"
        )
    end_token, k = turn_ids[-1], turn_ids.count(turn_ids[-1])
    ends = [i for i in range(len(x), len(b)) if b[i] == end_token]
    if len(ends) < k:
        raise TurnEndError(
            f"turn ended with token {end_token}, which the chat template does not end an assistant turn with; tool calls not run"
        )
    return b[ends[k - 1] + 1 :], how
