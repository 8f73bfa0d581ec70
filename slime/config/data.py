"""``DataConfig``: the prompt data, its keys and checks, and the eval datasets (``slime.data``)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from slime.config._base import STRUCT, Range, check_ranges, require
from slime.errors import ConfigError

__all__ = ["DataConfig"]


class DataConfig(msgspec.Struct, **STRUCT):
    prompt_data: str | None = None
    """JSONL or Parquet (by extension) file of prompts (``--prompt-data``; ``slime.data.dataset``). None: the
    built-in task (``builtin_task``)."""
    builtin_task: Literal["arith", "calc", "chain"] = "arith"
    """The built-in task used without ``--prompt-data`` (and its reward, without ``--custom-rm-path`` /
    ``--rm-type``; giving both ``--builtin-task`` and ``--prompt-data`` is refused, ``slime.cli.args``): ``arith`` (``slime.data.arith``, the first demo), ``calc`` (``slime.data.calc``,
    large-number arithmetic with a calculator tool) or ``chain`` (``slime.data.chain``, addition chains with a
    long-tailed response length) (``--builtin-task``)."""
    input_key: str = "prompt"
    """Key of the prompt text in each row (``--input-key``)."""
    label_key: str | None = "label"
    """Key of the reference answer (``--label-key``)."""
    metadata_key: str | None = None
    """Key of a dict copied into ``Sample.metadata`` (``--metadata-key``)."""
    apply_chat_template: bool = False
    """Render the prompt as a user message (or a row's list of messages as given) with the HF
    tokenizer's ``apply_chat_template(..., add_generation_prompt=True)`` (``--apply-chat-template``)."""
    tool_key: str | None = None
    """Key of each row's tools, OpenAI function schema (``--tool-key``): kept in
    ``Sample.metadata["tools"]`` for the multi-turn generate, and rendered by the chat template."""
    rollout_shuffle: bool = False
    """Shuffle prompts each epoch with the run's seed (``Config.seed``, ``--seed``) (``--rollout-shuffle``)."""
    curriculum_key: str | None = None
    """Key of a numeric difficulty (``--curriculum-key``): each epoch goes through the prompts in
    ascending difficulty instead of shuffled (ties: file order, or shuffled with ``--rollout-shuffle``)."""
    offline_data: str | None = None
    """JSONL (or Parquet) of pre-generated samples mixed into each batch at ``--offline-ratio``
    (``--offline-data``); see ``slime.data.offline``."""
    eval_prompt_data: str | tuple[str, ...] | None = None
    """Held-out prompts, JSONL or Parquet (``--eval-prompt-data``): one path (reported as ``accuracy``,
    ``pass@k``, ...), or THUDM/slime's ``name path`` pairs, e.g. ``("aime", "aime.jsonl", "math", "m.jsonl")``
    (each reported as ``eval/<name>/accuracy``, ...; ``eval_datasets``). None: the built-in task's eval split."""
    eval_config: str | None = None
    """THUDM/slime's YAML of eval datasets (``--eval-config``); read into ``eval_prompt_data`` and the
    eval sampling fields when the flags are parsed (``slime.eval_config``)."""
    num_eval_prompts: Annotated[int, Range(ge=0)] = 200
    """How many eval prompts to score (``--num-eval-prompts``): at most this many of each eval dataset."""
    on_bad_data: Literal["skip", "fail"] = "fail"
    """A malformed line: skip it with a warning and a count, or stop (``--on-bad-data``)."""
    rollout_max_prompt_len: Annotated[int, Range(ge=1, note=", or unset")] | None = None
    """Prompts over this many tokens (as rendered for the engine) are bad rows at load, named by
    ``path:line`` and skipped or refused by ``on_bad_data`` (``--rollout-max-prompt-len``, THUDM/slime's,
    whose dataset drops them). None = only the model's context bounds a prompt."""

    def validate(self) -> None:
        """Check this section's values.

        Raises:
            ConfigError: naming the flag.
        """
        check_ranges(self)
        require(
            [
                (
                    bool(self.eval_datasets) or self.eval_prompt_data is None,
                    "--eval-prompt-data",
                    self.eval_prompt_data,
                    "one path or 'name path' pairs",
                ),
            ]
        )

    @property
    def eval_datasets(self) -> tuple[tuple[str | None, str], ...]:
        """``eval_prompt_data`` as ``(name, path)`` pairs; name None for one unnamed path. Example:
        ``"e.jsonl"`` -> ``((None, "e.jsonl"),)``; ``("aime", "a.jsonl")`` -> ``(("aime", "a.jsonl"),)``.

        Raises:
            ConfigError: an odd number of tokens (more than one), or a name used twice.
        """
        given = self.eval_prompt_data
        if given is None or len(given) == 0:
            return ()
        if isinstance(given, str) or len(given) == 1:
            return ((None, given if isinstance(given, str) else given[0]),)
        if len(given) % 2:
            raise ConfigError(
                f"--eval-prompt-data {' '.join(given)}: expected one path or 'name path' pairs, got {len(given)} values"
            )
        names = given[0::2]
        if len(set(names)) != len(names):
            raise ConfigError(f"--eval-prompt-data: dataset names must be unique, got {list(names)}")
        return tuple(zip(names, given[1::2]))
