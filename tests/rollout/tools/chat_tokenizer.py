"""A small byte-level tokenizer with a Qwen2.5-like chat template, for multi-turn tests.

Vocabulary: the 256 byte-level symbols (no merges, so every byte is one token and any text
round-trips), then ``<|im_start|>`` ``<|im_end|>`` ``<|endoftext|>`` (special) and ``<tool_call>``
``</tool_call>`` ``<tool_response>`` ``</tool_response>`` (added, not special), as Qwen2.5 has them.
The template is written here in the shape of Qwen2.5's: tools as JSON lines inside ``<tools>`` in the
system turn, tool calls as ``<tool_call>`` JSON, consecutive tool messages inside one ``user`` turn
as ``<tool_response>`` blocks.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

QWEN_LIKE_TEMPLATE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
    {{- '# Tools\n\nYou may call one or more functions. Their signatures are inside <tools></tools>:\n<tools>' }}
    {%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
    {{- '\n</tools>\n\nFor each call, write a JSON object inside <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or message.role == 'assistant' %}
        {{- '<|im_start|>' + message.role + '\n' + (message.content or '') }}
        {%- for call in message.tool_calls or [] %}
            {{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
    {%- elif message.role == 'system' and not loop.first %}
        {{- raise_exception('a system message must come first') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

# Like the above, but the system turn counts the assistant turns so far: every added assistant
# message re-renders the start of the conversation (a template that is not append-only).
COUNTING_TEMPLATE = QWEN_LIKE_TEMPLATE.replace(
    "{{- '<|im_start|>system\\n' }}",
    "{{- '<|im_start|>system\\nturns: ' + (messages | selectattr('role', 'equalto', 'assistant') | list | length | string) + '\\n' }}",
    1,
)

# Like Qwen3's handling of reasoning: an assistant message before the last assistant message is
# rendered without its ``<think>...</think>`` part, so adding a turn rewrites the one before it.
STRIP_THINK_TEMPLATE = (
    "{%- set ns = namespace(last=-1) %}{%- for m in messages %}{%- if m.role == 'assistant' %}"
    "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    + QWEN_LIKE_TEMPLATE.replace(
        "message.role + '\\n' + (message.content or '')",
        "message.role + '\\n' + ((message.content or '').split('</think>')[-1] if (message.role == 'assistant' "
        "and loop.index0 < ns.last) else (message.content or ''))",
    )
)
assert STRIP_THINK_TEMPLATE.count("split('</think>')") == 1


def build_chat_tokenizer(template: str = QWEN_LIKE_TEMPLATE) -> PreTrainedTokenizerFast:
    """The tokenizer (in memory); ``len(tok) == 263``, ``<|im_end|>`` is its eos token."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|endoftext|>"]})
    tok.add_tokens(ADDED)
    tok.chat_template = template
    return tok
