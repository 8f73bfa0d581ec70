"""The SFT loss mask of a chat conversation: which tokens of the rendered conversation are the assistant's.

The whole conversation is rendered once by the tokenizer's chat template
(``apply_chat_template(messages, tools=tools)``) and tokenised once; the mask marks the tokens the
assistant wrote. Turns are never rendered one at a time and concatenated: templates treat the first
and last turns, consecutive tool results, default system prompts and whitespace differently, so a
concatenation is not the text the model sees at inference.

What the mask covers, per assistant message: its content and its tool calls as the template writes
them, and the token that ends the turn, so the model learns to stop. That token is the special token
the turn closes with (``<|im_end|>`` in Qwen's format, ``<|eot_id|>`` in Llama 3's); a template whose
assistant turn closes with no special token ends it at the next turn's opening one (GLM-4:
``<|user|>``, or ``<|observation|>`` after a tool call; GLM-4 models stop generating at either), so
that one is the turn's end and is in the mask. Not the role header (``<|im_start|>assistant\\n``,
``<|start_header_id|>assistant<|end_header_id|>\\n\\n``: the generation prompt, which the engine
writes), not whitespace the template adds after the end-of-turn token, and nothing else of the
system, user or tool turns. Example (``[a]`` = in the mask), Qwen and GLM-4 formats::

    <|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n[hello<|im_end|>]\\n<|im_start|>user\\n...
    <|user|>\\nhi<|assistant|>\\n[hello<|user|>]\\n...

Two ways to find those tokens, chosen per template:

1. The template marks them with ``{% generation %}`` ... ``{% endgeneration %}`` blocks: transformers'
   ``apply_chat_template(..., return_assistant_tokens_mask=True)`` gives the mask. The template
   author decides what is in it; for the formats above, the blocks should wrap content + end-of-turn
   token, as ``tests/fixtures/chat_templates/*_generation.jinja`` do.
2. No such blocks (most shipped templates): the assistant spans are located in the one full render.
   For assistant message ``i``, ``render(messages[:i], add_generation_prompt=True)`` must be a string
   prefix of the full render; its length is where the span starts. ``render(messages[:i + 1])`` must
   be a prefix too; its length, less trailing whitespace, is where the span ends, unless that text
   does not end with a special token and the full render goes on (after whitespace) with one: then
   the span runs to that token's end (the next turn's opening tag ends the turn). Characters map to
   tokens through the fast tokenizer's offsets (``return_offsets_mapping``): a token is in the mask
   when it overlaps a span (so a token straddling a span's edge is in it, as transformers decides
   for ``{% generation %}`` blocks). A template that renders a turn differently once later
   turns follow (Qwen3 drops earlier turns' ``<think>`` blocks, for example) is not prefix-stable:
   ``TemplateError`` says which prefix differs and where, and the fix is a template with
   ``{% generation %}`` blocks.

Not covered: slow (non-``Fast``) tokenizers, which have no offsets, in way 2; an assistant turn that
ends with no special token and is followed by none (the last turn of a GLM-4 conversation: the
template writes no end tag, so there is none to learn; the span ends at the content, trailing
whitespace dropped).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from slime.errors import ConfigError
from slime.types import JsonObject

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "TemplateError",
    "has_generation_blocks",
    "assistant_char_spans",
    "special_token_texts",
    "render_with_assistant_mask",
]

_GENERATION_RE = re.compile(r"\{%-?\s*generation\s*-?%\}")


class TemplateError(ConfigError):
    """The chat template cannot give an assistant mask (not prefix-stable, or failed to render).

    A ``ConfigError``: the template, not one data row, is at fault, so the run stops at once."""


def has_generation_blocks(template: str | None) -> bool:
    """True when ``template`` has a ``{% generation %}`` block (transformers' assistant-mask marker)."""
    return template is not None and _GENERATION_RE.search(template) is not None


def assistant_char_spans(
    render: Callable[[list[JsonObject], bool], str], messages: list[JsonObject], *, special_tokens: Collection[str] = ()
) -> tuple[str, list[tuple[int, int]]]:
    """The full render of ``messages`` and the ``[start, end)`` character span of each assistant turn.

    Args:
        render: ``render(messages, add_generation_prompt) -> text``, the chat template.
        messages: the conversation (OpenAI chat format).
        special_tokens: the tokenizer's special tokens (text); a turn ends at one (module docstring).

    Returns:
        ``(text, spans)``: ``text = render(messages, False)``; one span per assistant message, in
        order, from the end of its generation prompt to the end of the token that ends the turn:
        the special token its render closes with, else the special token the full render goes on
        with (whitespace between included), else its last non-whitespace character. Example (Qwen
        format, user "hi", assistant "hello"): text ``"...<|im_start|>assistant\\nhello<|im_end|>\\n"``,
        span covers ``"hello<|im_end|>"``; GLM-4 format, a user turn follows: text
        ``"...<|assistant|>\\nhello<|user|>\\n..."``, span covers ``"hello<|user|>"``.

    Raises:
        TemplateError: a prefix render is not a prefix of ``text`` (names the message index and the
            first differing character), or an assistant turn renders as nothing.
    """
    text = render(messages, False)
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        head = render(messages[:i], True)
        turn = render(messages[: i + 1], False)
        for what, prefix in ((f"messages[:{i}] with add_generation_prompt=True", head), (f"messages[:{i + 1}]", turn)):
            if not text.startswith(prefix):
                at = next((k for k, (a, b) in enumerate(zip(prefix, text)) if a != b), min(len(prefix), len(text)))
                raise TemplateError(
                    f"chat template is not prefix-stable: rendering {what} is not a prefix of rendering the whole "
                    f"conversation ({len(messages)} messages); they differ at character {at}: prefix has "
                    f"{prefix[at : at + 40]!r}, full render has {text[at : at + 40]!r}. The SFT loss mask is located in the "
                    "full render, so the template must render earlier turns the same whatever follows them, or mark "
                    "assistant text with {% generation %} ... {% endgeneration %} blocks"
                )
        start, end = len(head), _turn_end(text, len(turn.rstrip()), special_tokens)
        if end <= start:
            raise TemplateError(
                f"chat template renders assistant message {i} as nothing after its generation prompt "
                f"(characters {start}..{len(turn)}); cannot build its loss mask"
            )
        spans.append((start, end))
    return text, spans


def _turn_end(text: str, end: int, special_tokens: Collection[str]) -> int:
    """Where the assistant turn whose render ends at ``text[:end]`` ends: ``end`` when that closes
    with a special token (or none follows), else the end of the special token that ``text`` goes on
    with after whitespace: the next turn's tag, which the model emits to end its turn (GLM-4)."""
    if any(text.endswith(token, 0, end) for token in special_tokens):
        return end
    after = end + len(text[end:]) - len(text[end:].lstrip())
    following = [token for token in special_tokens if text.startswith(token, after)]
    return after + max(map(len, following)) if following else end


def special_token_texts(tokenizer: PreTrainedTokenizerBase) -> set[str]:
    """The text of every special token of ``tokenizer``: named ones (EOS, PAD, ...) and added tokens marked special."""
    named = set(getattr(tokenizer, "all_special_tokens", ()))
    added = {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", False)}
    return {t for t in named | added if t}


def render_with_assistant_mask(
    tokenizer: PreTrainedTokenizerBase, messages: list[JsonObject], tools: list[JsonObject] | None = None
) -> tuple[list[int], list[int]]:
    """Token ids of the whole rendered conversation and its assistant mask (module docstring).

    Args:
        tokenizer: a transformers tokenizer with a chat template (a fast one without
            ``{% generation %}`` blocks).
        messages: the conversation; roles system / user / assistant / tool, assistant
            ``tool_calls`` optional.
        tools: OpenAI function schemas handed to the template, or None.

    Returns:
        ``(input_ids, mask)``, both ``[num_tokens]``: ``input_ids`` equal
        ``apply_chat_template(messages, tools=tools, tokenize=True)``; ``mask[i]`` is 1 for an
        assistant token (content, tool calls, the token that ends the turn), else 0.

    Raises:
        TemplateError: no chat template, a template that is not prefix-stable, or a tokenizer without
            offsets (slow) for a template without ``{% generation %}`` blocks.
        ValueError: the template raised on this conversation (``raise_exception``, a bad message);
            the caller adds the row's ``path:line``.
    """
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise TemplateError(
            f"the tokenizer ({type(tokenizer).__name__}, {getattr(tokenizer, 'name_or_path', '')!r}) has no chat "
            "template; chat-message rows need one (or use plain prompt/response rows)"
        )
    tools = tools or None
    if has_generation_blocks(template):
        out = _apply(
            tokenizer, messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        return list(out["input_ids"]), [int(m) for m in out["assistant_masks"]]
    if not getattr(tokenizer, "is_fast", False):
        raise TemplateError(
            f"{type(tokenizer).__name__} is not a fast tokenizer (no character offsets) and its chat template "
            "has no {% generation %} blocks: cannot locate assistant tokens"
        )

    def render(msgs: list[JsonObject], add_generation_prompt: bool) -> str:
        return _apply(tokenizer, msgs, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)

    text, spans = assistant_char_spans(render, messages, special_tokens=special_token_texts(tokenizer))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(start < b and end > a for a, b in spans)) for start, end in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


def _apply(tokenizer: PreTrainedTokenizerBase, messages: list[JsonObject], **kwargs: Any) -> Any:
    """``apply_chat_template`` (its keyword arguments and its str / ids / BatchEncoding result are transformers'); a Jinja error or ``raise_exception`` becomes ValueError with the template's words."""
    try:
        return tokenizer.apply_chat_template(messages, **kwargs)
    except (ValueError, TemplateError):
        raise
    except Exception as exc:  # jinja2.TemplateError and friends: the row does not fit the template
        raise ValueError(f"chat template failed on this conversation: {type(exc).__name__}: {exc}") from None
