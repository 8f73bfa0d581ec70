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

Length: a row with more tokens than the model's context (``max_len``: ``max_position_embeddings`` of
the ``--hf-checkpoint`` config, ``model_context_len``) is a bad row, named by ``path:line`` with both
numbers; ``--on-bad-data skip`` drops such rows (as THUDM/slime's ``--rollout-max-prompt-len`` drops
long prompts). Rows are never truncated: a cut conversation trains the model on a turn it never
sees finish, and RoPE models would otherwise run past the positions they were trained on without
any error. THUDM/slime has no SFT truncation flag (``--rollout-max-context-len`` caps what the
engine generates), so none is added here.

Not covered: images and other non-text message parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from slime.data.chat_mask import render_with_assistant_mask
from slime.data.dataset import read_rows
from slime.data.prompt_fields import messages_of, tools_of
from slime.types import Group, Sample, Status

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "RESPONSE_KEY",
    "SFTExample",
    "model_context_len",
    "parse_sft_row",
    "tokenize_plain",
    "load_sft_file",
    "to_group",
]

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


def tokenize_plain(tokenizer: PreTrainedTokenizerBase, prompt: str, response: str) -> tuple[list[int], list[int]]:
    """Ids and mask of a plain row (module docstring). Raises ValueError if the tokenizer has no EOS."""
    if tokenizer.eos_token_id is None:
        raise ValueError(
            "plain prompt/response SFT rows need a tokenizer with an EOS token (appended to each response)"
        )
    prompt_ids = list(tokenizer.encode(prompt))
    response_ids = list(tokenizer.encode(response, add_special_tokens=False))
    if not response_ids or response_ids[-1] != tokenizer.eos_token_id:
        response_ids.append(tokenizer.eos_token_id)
    return prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids)


def model_context_len(config: object) -> int | None:
    """The longest sequence a model takes, from its HF config: ``max_position_embeddings`` (Llama,
    Qwen, ...), else ``n_positions`` (GPT-2) or ``max_sequence_length``; None when it names none."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def parse_sft_row(
    obj: Any,
    index: int,
    *,
    tokenizer: PreTrainedTokenizerBase,
    input_key: str = "messages",
    tool_key: str | None = None,
    max_len: int | None = None,
) -> SFTExample:
    """One decoded row -> ``SFTExample``. Raises ValueError saying what is wrong (the caller adds where).

    Args:
        max_len: the model's context in tokens (``model_context_len``); a longer row is refused. None: no check.

    Raises:
        ValueError: not an object, missing or wrong-typed keys, a conversation the chat template
            rejects, more than ``max_len`` tokens, no token to train on, or nothing before the first
            trained token.
        TemplateError: the chat template cannot give an assistant mask (a ``ConfigError``).
    """
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if input_key not in obj:
        raise ValueError(f"missing key {input_key!r} (--input-key); keys present: {sorted(obj)}")
    value = obj[input_key]
    if isinstance(value, list):
        messages = messages_of(value, input_key)
        if not any(m["role"] == "assistant" for m in messages):
            raise ValueError(
                f"key {input_key!r}: no assistant message to train on (roles: {[m['role'] for m in messages]})"
            )
        tools = tools_of(obj[tool_key], tool_key) if tool_key is not None and obj.get(tool_key) is not None else None
        ids, mask = render_with_assistant_mask(tokenizer, messages, tools)
    elif isinstance(value, str) and value:
        response = obj.get(RESPONSE_KEY)
        if not isinstance(response, str) or not response:
            raise ValueError(
                f"a plain SFT row (string under {input_key!r}) needs a non-empty string under {RESPONSE_KEY!r}, "
                f"got {type(response).__name__}"
            )
        ids, mask = tokenize_plain(tokenizer, value, response)
    else:
        raise ValueError(
            f"key {input_key!r} (--input-key) must be a list of chat messages or a non-empty prompt string, got {type(value).__name__}"
        )
    if max_len is not None and len(ids) > max_len:
        raise ValueError(
            f"the row renders to {len(ids)} tokens, more than the model's context of {max_len} (max_position_embeddings "
            f"of --hf-checkpoint); shorten or split it (rows are not truncated)"
        )
    if 1 not in mask:
        raise ValueError(f"no token to train on: the loss mask of the {len(ids)} rendered tokens is all 0")
    if mask[0] == 1:
        raise ValueError("the first rendered token is already trained; a row needs at least one prompt token before it")
    return SFTExample(index=index, input_ids=list(ids), loss_mask=list(mask))


def load_sft_file(
    path: str | Path,
    *,
    tokenizer: PreTrainedTokenizerBase,
    input_key: str = "messages",
    tool_key: str | None = None,
    on_bad_data: Literal["skip", "fail"] = "fail",
    flag: str = "--prompt-data",
    max_len: int | None = None,
) -> tuple[list[SFTExample], int]:
    """Read and tokenise an SFT file (JSONL or Parquet by extension; see the module docstring).

    ``max_len``: the model's context in tokens; a longer row is a bad row (None: no check).

    Returns:
        (examples, num_bad): the good rows in file order, and how many were skipped.

    Raises:
        DataError: missing / empty file, or a malformed row (``path:line``) with ``on_bad_data="fail"``.
        TemplateError: the chat template cannot give an assistant mask.
    """
    return read_rows(
        path,
        lambda obj, i: parse_sft_row(
            obj, i, tokenizer=tokenizer, input_key=input_key, tool_key=tool_key, max_len=max_len
        ),
        on_bad_data=on_bad_data,
        flag=flag,
    )


def to_group(example: SFTExample, *, group_id: int, policy_version: int) -> Group:
    """One ``Group`` of one ``Sample`` holding ``example`` (module docstring), ready for ``train_step``."""
    p = example.num_prompt_tokens
    sample = Sample(
        prompt_ids=example.input_ids[:p], group_id=group_id, index=0, reward=0.0, metadata={"sft_index": example.index}
    )
    ids, mask = example.input_ids[p:], example.loss_mask[p:]
    start = 0
    for k in range(1, len(ids) + 1):
        if k == len(ids) or mask[k] != mask[start]:
            sample.append(ids[start:k], [0.0] * (k - start), policy_version, trainable=bool(mask[start]))
            start = k
    sample.status = Status.COMPLETED
    return Group(group_id=group_id, samples=[sample], data_index=example.index)
