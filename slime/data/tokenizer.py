"""A character-level tokenizer for the built-in arithmetic task, built with the ``tokenizers`` library.

Every character of the task alphabet (digits, ``+ = ; #``) is one token; special tokens are
``<pad>`` (0), ``<bos>`` (1), ``<eos>`` (2) and ``<unk>`` (3). Encoding with special tokens
prepends ``<bos>`` and never appends ``<eos>`` (the model must learn to stop), so a prompt's ids are
exactly what the engine is sent. A ``Fuse`` decoder joins tokens without spaces, so
``decode(encode(text), skip_special_tokens=True) == text`` for any text over the alphabet.

Example::

    tok = build_tokenizer("/tmp/tok")
    tok("47+9=")["input_ids"]        # [1, 8, 11, 14, 13, 15]  (<bos> 4 7 + 9 =)
    tok.decode([8, 11, 14, 13, 2])   # "47+9<eos>"

Not covered: characters outside the alphabet map to ``<unk>`` and do not round-trip.

``build_chat_tokenizer`` is the second demo's tokenizer (tool calling, ``slime.data.calc``): one
token per printable ASCII character and newline, Qwen-style turn markers ``<|im_start|>`` and
``<|im_end|>`` (the end-of-turn and EOS token), the tool markers ``<tool_call>`` ``</tool_call>``
``<tool_response>`` ``</tool_response>`` as single added tokens, and a small chat template
(``CHAT_TEMPLATE``) that renders system, user, assistant and tool messages and the tools' names::

    <|im_start|>system
    tools: calculator<|im_end|>
    <|im_start|>user
    347*82*19<|im_end|>
    <|im_start|>assistant
    <tool_call>{"name": "calculator", "arguments": {"expression": "347*82*19"}}</tool_call><|im_end|>
    <|im_start|>tool
    <tool_response>540626</tool_response><|im_end|>
    <|im_start|>assistant
    #540626<|im_end|>

The template is append-only (adding messages never re-renders earlier ones), which is what
``slime.rollout.multiturn`` needs to append tool results as a token delta.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

__all__ = [
    "PAD_TOKEN",
    "BOS_TOKEN",
    "EOS_TOKEN",
    "UNK_TOKEN",
    "SPECIAL_TOKENS",
    "ALPHABET",
    "build_tokenizer",
    "IM_START",
    "IM_END",
    "CHAT_SPECIAL_TOKENS",
    "CHAT_TOOL_TOKENS",
    "CHAT_ALPHABET",
    "CHAT_TEMPLATE",
    "build_chat_tokenizer",
]

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
"""In id order: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<unk>`` = 3."""

ALPHABET = "0123456789+=;#"
"""The task's characters, one token each, ids 4.. in this order."""


def _vocab() -> dict[str, int]:
    tokens = list(SPECIAL_TOKENS) + list(ALPHABET)
    return {t: i for i, t in enumerate(tokens)}


def build_tokenizer(out_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer and, when ``out_dir`` is given, save it there.

    The saved directory loads with ``transformers.AutoTokenizer.from_pretrained(out_dir)`` as a
    ``PreTrainedTokenizerFast`` with the same special tokens and behaviour.

    Args:
        out_dir: where to write ``tokenizer.json``, ``tokenizer_config.json`` and
            ``special_tokens_map.json``; None builds it in memory only.

    Returns:
        The tokenizer (padding side left, as batched generation needs).
    """
    vocab = _vocab()
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # One token per character; special tokens are matched before this runs.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A $B",
        special_tokens=[(BOS_TOKEN, vocab[BOS_TOKEN])],
    )
    core.add_special_tokens(list(SPECIAL_TOKENS))

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=128,
    )
    if out_dir is not None:
        tokenizer.save_pretrained(str(out_dir))
    return tokenizer


# ---------------------------------------------------------------------------------------------
# The chat tokenizer of the tool-calling demo.
# ---------------------------------------------------------------------------------------------

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
"""Ends every turn; the chat tokenizer's EOS token, so the engine stops a model turn on it."""

CHAT_SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END, UNK_TOKEN)
"""Special tokens of the chat tokenizer, ids 0..3 in this order (dropped by ``skip_special_tokens``)."""

CHAT_TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Added but not special (as in Qwen2.5): ids 4..7; they survive ``skip_special_tokens``."""

CHAT_ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
"""Newline and printable ASCII, one token each, ids 8.. in this order."""

CHAT_TEMPLATE = (
    "{%- if tools or messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- if tools %}{{- '\\n' }}{%- endif %}{%- endif %}"
    "{%- if tools %}{{- 'tools:' }}"
    "{%- for tool in tools %}{{- ' ' + (tool.function.name if tool.function is defined else tool.name) }}{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- if not loop.first %}{{- raise_exception('a system message must come first') }}{%- endif %}"
    "{%- elif message.role == 'user' or message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set fn = call.function if call.function is defined else call %}"
    "{%- if fn.arguments is string %}"
    "{{- '<tool_call>{\"name\": ' + (fn.name | tojson) + ', \"arguments\": ' + fn.arguments + '}</tool_call>' }}"
    "{%- else %}{{- '<tool_call>' + ({'name': fn.name, 'arguments': fn.arguments} | tojson) + '</tool_call>' }}{%- endif %}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>tool\\n<tool_response>' + message.content + '</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- raise_exception('unknown role ' + message.role) }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Jinja chat template: an optional system turn (its text, then ``tools: NAME ...``), one turn per
message, ``tool_calls`` (OpenAI style) rendered as ``<tool_call>{json}</tool_call>``, each tool
message as its own ``tool`` turn wrapped in ``<tool_response>``; the generation prompt opens an
assistant turn. Only the tools' names are rendered (the demo model learns what they do)."""


def _chat_vocab() -> dict[str, int]:
    tokens = list(CHAT_SPECIAL_TOKENS) + list(CHAT_TOOL_TOKENS) + list(CHAT_ALPHABET)
    return {t: i for i, t in enumerate(tokens)}


def build_chat_tokenizer(out_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Build the character-level chat tokenizer (``CHAT_TEMPLATE`` set) and save it to ``out_dir`` if given.

    Encoding adds no special tokens (the template writes the turn markers), so
    ``encode(text, add_special_tokens=False) == encode(text)`` and ``decode(encode(text)) == text``
    for any text over ``CHAT_ALPHABET`` and the marker tokens. ``len(tok) == 8 + len(CHAT_ALPHABET)``
    (104); EOS is ``<|im_end|>``.

    Returns:
        The tokenizer (padding side left).
    """
    vocab = _chat_vocab()
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # One token per character (newline included); added tokens are matched before this runs.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(CHAT_SPECIAL_TOKENS))
    core.add_tokens(list(CHAT_TOOL_TOKENS))

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        extra_special_tokens=[IM_START],
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=512,
        chat_template=CHAT_TEMPLATE,
    )
    if out_dir is not None:
        tokenizer.save_pretrained(str(out_dir))
    return tokenizer
