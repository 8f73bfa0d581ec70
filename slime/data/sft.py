"""SFT datasets: JSONL / Parquet rows -> token ids and a loss mask, then one-sample groups for the trainer.

Two row shapes (``slime train --loss-type sft_loss``; the loader is ``read_rows``, so a malformed
row names ``path:line`` or ``path row i``, and ``--on-bad-data skip`` skips it):

- chat: a list of messages under ``--input-key`` (e.g. ``messages``; roles system / user /
  assistant / tool, assistant ``tool_calls`` optional) and optionally tools under ``--tool-key``.
  The whole conversation is rendered once by the tokenizer's chat template; the loss mask covers
  exactly the assistant tokens, end-of-turn tokens included (``slime.data.chat_mask``).
- plain: a prompt string under ``--input-key`` and the target under ``response``. Ids are
  ``encode(prompt)`` (the tokenizer's defaults, e.g. BOS, as RL prompts are tokenised) +
  ``encode(response, add_special_tokens=False)`` + EOS (unless the response already ends with it);
  the mask covers the response and EOS. Example (the arithmetic demo's character tokenizer)::

      {"prompt": "47+9=", "response": "#56"}
      ids   <bos> 4 7 + 9 = # 5 6 <eos>
      mask    0   0 0 0 0 0 1 1 1   1

An ``SFTExample`` becomes one ``Sample`` (``to_group``): ``prompt_ids`` are the tokens before the
first masked token, the rest is the response, written through ``Sample.append`` in runs of equal
mask value (masked-out runs, e.g. a user or tool turn between two assistant turns, with
``trainable=False``), the reward 0 and every token at the trainer's current version. This is
THUDM/slime's SFT layout (``sft_rollout``: tokens, ``response_length`` from the first loss-mask 1).

Not covered: truncation (a row longer than the model's context fails in the forward pass; filter
such rows beforehand); images and other non-text message parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import msgspec

from slime.data.chat_mask import render_with_assistant_mask
from slime.data.dataset import _messages, _tools, read_rows
from slime.types import Group, Sample, Status

__all__ = ["RESPONSE_KEY", "SFTExample", "parse_sft_row", "tokenize_plain", "load_sft_file", "to_group"]

RESPONSE_KEY = "response"
"""Key of the target text of a plain (prompt/response) SFT row."""


class SFTExample(msgspec.Struct, frozen=True):
    """One tokenised SFT row.

    Attributes:
        index: position among the good rows of its file (the data index logged per step).
        input_ids: [num_tokens] int, the whole rendered row.
        loss_mask: [num_tokens] int in {0, 1}; 1 = an assistant / response token that trains.
    """

    index: int
    input_ids: list[int]
    loss_mask: list[int]

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens before the first trained token (the ``Sample.prompt_ids``)."""
        return self.loss_mask.index(1)


def tokenize_plain(tokenizer: Any, prompt: str, response: str) -> tuple[list[int], list[int]]:
    """Ids and mask of a plain row (module docstring). Raises ValueError if the tokenizer has no EOS."""
    if tokenizer.eos_token_id is None:
        raise ValueError("plain prompt/response SFT rows need a tokenizer with an EOS token (appended to each response)")
    prompt_ids = list(tokenizer.encode(prompt))
    response_ids = list(tokenizer.encode(response, add_special_tokens=False))
    if not response_ids or response_ids[-1] != tokenizer.eos_token_id:
        response_ids.append(tokenizer.eos_token_id)
    return prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids)


def parse_sft_row(obj: Any, index: int, *, tokenizer: Any, input_key: str = "messages", tool_key: str | None = None) -> SFTExample:
    """One decoded row -> ``SFTExample``. Raises ValueError saying what is wrong (the caller adds where).

    Raises:
        ValueError: not an object, missing or wrong-typed keys, a conversation the chat template
            rejects, no token to train on, or nothing before the first trained token.
        TemplateError: the chat template cannot give an assistant mask (a ``ConfigError``).
    """
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if input_key not in obj:
        raise ValueError(f"missing key {input_key!r} (--input-key); keys present: {sorted(obj)}")
    value = obj[input_key]
    if isinstance(value, list):
        messages = _messages(value, input_key)
        if not any(m["role"] == "assistant" for m in messages):
            raise ValueError(f"key {input_key!r}: no assistant message to train on (roles: {[m['role'] for m in messages]})")
        tools = _tools(obj[tool_key], tool_key) if tool_key is not None and obj.get(tool_key) is not None else None
        ids, mask = render_with_assistant_mask(tokenizer, messages, tools)
    elif isinstance(value, str) and value:
        response = obj.get(RESPONSE_KEY)
        if not isinstance(response, str) or not response:
            raise ValueError(f"a plain SFT row (string under {input_key!r}) needs a non-empty string under {RESPONSE_KEY!r}, "
                             f"got {type(response).__name__}")
        ids, mask = tokenize_plain(tokenizer, value, response)
    else:
        raise ValueError(f"key {input_key!r} (--input-key) must be a list of chat messages or a non-empty prompt string, "
                         f"got {type(value).__name__}")
    if 1 not in mask:
        raise ValueError(f"no token to train on: the loss mask of the {len(ids)} rendered tokens is all 0")
    if mask[0] == 1:
        raise ValueError("the first rendered token is already trained; a row needs at least one prompt token before it")
    return SFTExample(index=index, input_ids=list(ids), loss_mask=list(mask))


def load_sft_file(
    path: str | Path, *, tokenizer: Any, input_key: str = "messages", tool_key: str | None = None,
    on_bad_data: Literal["skip", "fail"] = "fail", flag: str = "--prompt-data",
) -> tuple[list[SFTExample], int]:
    """Read and tokenise an SFT file (JSONL or Parquet by extension; see the module docstring).

    Returns:
        (examples, num_bad): the good rows in file order, and how many were skipped.

    Raises:
        DataError: missing / empty file, or a malformed row (``path:line``) with ``on_bad_data="fail"``.
        TemplateError: the chat template cannot give an assistant mask.
    """
    return read_rows(path, lambda obj, i: parse_sft_row(obj, i, tokenizer=tokenizer, input_key=input_key, tool_key=tool_key),
                     on_bad_data=on_bad_data, flag=flag)


def to_group(example: SFTExample, *, group_id: int, policy_version: int) -> Group:
    """One ``Group`` of one ``Sample`` holding ``example`` (module docstring), ready for ``train_step``."""
    p = example.num_prompt_tokens
    sample = Sample(prompt_ids=example.input_ids[:p], group_id=group_id, index=0, reward=0.0, metadata={"sft_index": example.index})
    ids, mask = example.input_ids[p:], example.loss_mask[p:]
    start = 0
    for k in range(1, len(ids) + 1):
        if k == len(ids) or mask[k] != mask[start]:
            sample.append(ids[start:k], [0.0] * (k - start), policy_version, trainable=bool(mask[start]))
            start = k
    sample.status = Status.COMPLETED
    return Group(group_id=group_id, samples=[sample], data_index=example.index)
