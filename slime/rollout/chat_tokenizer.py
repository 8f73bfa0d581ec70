"""``ChatTokenizer``: the part of a Hugging Face tokenizer that a multi-turn rollout calls.

A transformers ``PreTrainedTokenizerBase`` has it; its own annotations are unions over every input kind
(``decode`` of one id list is typed ``str | list[str]``), so the rollout names the calls it makes, with
the types those calls return.
"""

from __future__ import annotations

from typing import Any, Protocol

from slime.types import JsonObject

__all__ = ["ChatTokenizer"]


class ChatTokenizer(Protocol):
    """Encode, decode and render chat messages with the model's chat template."""

    @property
    def all_special_ids(self) -> list[int]: ...

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, conversation: list[JsonObject], **kwargs: Any) -> Any:
        """transformers': a str, ids or a ``BatchEncoding`` as its keyword arguments ask (untyped here)."""
        ...
