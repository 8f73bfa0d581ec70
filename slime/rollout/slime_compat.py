"""THUDM/slime's rollout-function contract (``--rollout-function-path``), and how it maps onto ours.

A rollout function produces a whole rollout step's samples in one call::

    def generate_rollout(args, rollout_id, data_buffer, evaluation=False):
        groups = data_buffer.get_samples(args.rollout_batch_size)      # [rollout_batch_size][n_samples_per_prompt]
        for group in groups:
            for s in group:                                             # fill each prompt sample
                s.tokens = s.tokens + response_ids                      # prompt ids + response ids
                s.response_length = len(response_ids)
                s.rollout_log_probs = logprobs                          # [response_length], or None (offline/SFT data)
                s.loss_mask = [1] * len(response_ids)                   # or None: every response token trains
                s.status = type(s).Status.COMPLETED
        return groups                                                   # or RolloutFnTrainOutput(samples=groups)

``rollout_id`` is 0-based (the step number - 1), as slime passes it. ``async def`` functions are
awaited on the run's event loop; plain ``def`` functions run on a thread of their own (they may
start an event loop, as slime's do).

The parts given to the function:

- ``args`` (``RolloutArgs``): the slime flag values such functions read (``rollout_batch_size``,
  ``n_samples_per_prompt``, ``rollout_max_response_len``, ``rollout_temperature``, ``rollout_top_p``,
  ``rollout_top_k``, ``hf_checkpoint``, ``sglang_router_ip`` / ``sglang_router_port`` (the SGLang
  ``/generate`` endpoint: the router, else the first engine), ...; see ``RolloutArgs.__init__``).
  Reading any other attribute raises AttributeError naming it and what is there. Ours, beyond
  slime's: ``args.pool`` (the run's ``HttpEnginePool``, for ``async def`` functions) and
  ``args.engine_version`` (the engines' policy version during the call).
- ``data_buffer`` (``RolloutDataBuffer``): ``get_samples(n)`` returns ``n`` prompt groups of
  ``n_samples_per_prompt`` fresh ``SlimeSample`` each, from the run's prompt data (``--prompt-data``,
  in the run's order, resumable); ``add_samples(groups)`` hands groups back, returned first by the
  next ``get_samples``; ``len(data_buffer)`` is the number of prompts.

What it returns (``to_groups``): ``list[list[sample]]`` (groups), a flat ``list[sample]`` (cut into
groups of ``n_samples_per_prompt``), our ``Group``s, or any object with a ``samples`` attribute
holding one of those (slime's ``RolloutFnTrainOutput``; its ``metrics`` are logged). A sample is
our ``slime.types.Sample`` (it must be aligned, finished and carry no version newer than the
engines') or anything slime-shaped (``tokens``, ``response_length``, ``loss_mask``,
``rollout_log_probs``, ``status``, ``reward``, ``label``, ``prompt``, ``response``, ``metadata``).
A slime-shaped sample's tokens are tagged with the engines' version during the call (weights do not
move during a step); one without ``rollout_log_probs`` is treated like ``--offline-data`` without
logprobs: its tokens are tagged ``OFFLINE_VERSION`` and the trainer computes the logprobs.
Evaluation (``evaluation=True``) is not called: eval runs on this project's evaluator.

Not covered: a function that imports THUDM/slime's own modules (``slime.utils.types``,
``slime.rollout.sglang_rollout``) cannot import them here; a dict reward (slime's ``--reward-key``);
multimodal inputs.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import logging
import math
from collections.abc import Callable
from typing import Any

from slime.config import DataConfig, LoopConfig, RolloutConfig
from slime.data.dataset import prompt_input, row_metadata
from slime.engines.interface import WorkerPool
from slime.errors import PluginError
from slime.rollout.slime_compat_checks import checked_token_lists, oldest_version
from slime.types import OFFLINE_VERSION, Group, Sample, Status

__all__ = ["SlimeSample", "RolloutFnTrainOutput", "RolloutArgs", "RolloutDataBuffer", "to_groups"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SlimeSample:
    """One sample the way THUDM/slime's rollout functions see it (field names are slime's).

    ``tokens``: prompt ids followed by the ``response_length`` response ids. ``loss_mask`` and
    ``rollout_log_probs``: [response_length] each, or None (all train / none known).
    """

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = dataclasses.field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = dataclasses.field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    status: SlimeSample.Status = Status.PENDING
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RolloutFnTrainOutput:
    """What slime's newer rollout functions return: the groups and optional metrics."""

    samples: list[Any]
    metrics: dict[str, Any] | None = None


class RolloutArgs:
    engine_version: int  # the policy version the engines hold; refreshed by the caller before each call

    """The ``args`` a rollout function gets: slime's flag names over this run's config (see module doc).

    Args:
        rollout / loop / data: the run's sections the flags come from.
        hf_checkpoint: ``--hf-checkpoint``. seed: the run's ``--seed`` (``args.rollout_seed``).
        pool: the engines (``args.pool``, and the router address). engine_version: as the attribute.

    Attributes may be set (some slime functions stash values on ``args``); a missing one raises
    AttributeError naming it and the attributes that exist.
    """

    def __init__(
        self,
        rollout: RolloutConfig,
        loop: LoopConfig,
        data: DataConfig,
        *,
        hf_checkpoint: str | None = None,
        seed: int = 1234,
        pool: WorkerPool | None = None,
        engine_version: int = 0,
    ):
        r, lp, d = rollout, loop, data
        url = ("" if pool is None else pool.router_url or (pool.urls[0] if pool.urls else "")).rstrip("/")
        host, _, port = url.rpartition("//")[2].rpartition(":")
        self.__dict__.update(
            rollout_batch_size=lp.rollout_batch_size,
            n_samples_per_prompt=r.n_samples_per_prompt,
            over_sampling_batch_size=lp.over_sampling_batch_size,
            num_rollout=lp.num_rollout,
            rollout_max_response_len=r.rollout_max_response_len,
            rollout_temperature=r.rollout_temperature,
            rollout_top_p=r.rollout_top_p,
            rollout_top_k=r.rollout_top_k,
            rollout_stop_token_ids=list(r.rollout_stop_token_ids),
            hf_checkpoint=hf_checkpoint,
            prompt_data=d.prompt_data,
            input_key=d.input_key,
            label_key=d.label_key,
            metadata_key=d.metadata_key,
            apply_chat_template=d.apply_chat_template,
            rollout_shuffle=d.rollout_shuffle,
            rollout_seed=seed,
            custom_rm_path=r.custom_rm_path,
            custom_generate_function_path=r.custom_generate_function_path,
            rollout_global_dataset=True,
            partial_rollout=False,
            group_rm=False,
            sglang_router_ip=host or None,
            sglang_router_port=int(port) if port.isdigit() else None,
            pool=pool,
            engine_version=engine_version,
        )

    def __getattr__(self, name: str) -> Any:  # only called for attributes that are not there
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"args.{name}: not provided to rollout functions here (slime_compat.RolloutArgs has: {', '.join(sorted(self.__dict__))})"
        )


class RolloutDataBuffer:
    """The ``data_buffer`` a rollout function gets (see module doc).

    Args:
        next_row: returns the next prompt row (``PromptRow``) in the run's order.
        tokenize: a row -> its prompt ids (the run's tokenizer, chat template applied when asked).
        n_samples_per_prompt: samples per prompt group.
        num_prompts: what ``len()`` answers.
    """

    def __init__(
        self,
        *,
        next_row: Callable[[], Any],
        tokenize: Callable[[Any], list[int]],
        n_samples_per_prompt: int,
        num_prompts: int = 0,
    ):
        self._next_row, self._tokenize, self._n, self._num_prompts = (
            next_row,
            tokenize,
            n_samples_per_prompt,
            num_prompts,
        )
        self._returned: list[list[Any]] = []
        self._next_group_index = 0
        self._next_index = 0
        self.data_index: dict[int, int] = {}
        """group_index of a prompt group handed out -> the row's index in the data (for resume and logs)."""

    def get_samples(self, num_samples: int) -> list[list[SlimeSample]]:
        """``num_samples`` prompt groups: groups handed back by ``add_samples`` first, then new prompts."""
        out, self._returned = self._returned[:num_samples], self._returned[num_samples:]
        for _ in range(num_samples - len(out)):
            row = self._next_row()
            ids = list(self._tokenize(row))
            gi = self._next_group_index
            self._next_group_index += 1
            self.data_index[gi] = row.index
            group = []
            for _ in range(self._n):
                group.append(
                    SlimeSample(
                        group_index=gi,
                        index=self._next_index,
                        prompt=prompt_input(row),
                        tokens=list(ids),
                        label=row.label,
                        metadata=row_metadata(row),
                    )
                )
                self._next_index += 1
            out.append(group)
        return out

    def add_samples(self, samples: list[list[Any]]) -> None:
        """Keep ``samples`` (groups) for the next ``get_samples``. Raises TypeError on a flat list."""
        if samples and not all(isinstance(g, list) for g in samples):
            raise TypeError("data_buffer.add_samples: expected a list of groups (list[list[Sample]])")
        self._returned.extend(samples)

    def __len__(self) -> int:
        return self._num_prompts


def to_groups(
    output: object,
    *,
    n_samples_per_prompt: int,
    engine_version: int,
    next_group_id: int,
    rollout_id: int = 0,
    data_index: dict[int, int] | None = None,
) -> tuple[list[Group], dict[str, Any]]:
    """A rollout function's return value as our groups, with fresh group ids from ``next_group_id``;
    returns ``(groups, metrics)``.

    Raises:
        PluginError: one line naming the group and sample and what is wrong (a wrong shape or type,
            misaligned lists, an unfinished sample, a version newer than ``engine_version``).
    """
    metrics = getattr(output, "metrics", None) or {}
    raw = output.samples if hasattr(output, "samples") and not isinstance(output, (list, Group)) else output
    if not isinstance(raw, list) or not raw:
        kind = "an empty list" if raw == [] else type(raw).__name__
        raise PluginError(
            f"returned {kind}; expected a non-empty list of groups (list[list[Sample]]) or RolloutFnTrainOutput(samples=...)"
        )
    if all(isinstance(g, (list, Group)) for g in raw):
        raw_groups = [g.samples if isinstance(g, Group) else g for g in raw]
    elif any(isinstance(g, (list, Group)) for g in raw):
        raise PluginError(
            "returned a list mixing groups and single samples; return list[list[Sample]] or a flat list[Sample]"
        )
    elif len(raw) % n_samples_per_prompt:
        raise PluginError(
            f"returned a flat list of {len(raw)} samples, not a multiple of n_samples_per_prompt={n_samples_per_prompt}; "
            "return a list of groups instead"
        )
    else:
        raw_groups = [raw[i : i + n_samples_per_prompt] for i in range(0, len(raw), n_samples_per_prompt)]
    groups = []
    for gi, members in enumerate(raw_groups):
        if not members:
            raise PluginError(f"group {gi} is empty")
        gid = next_group_id + gi
        samples = [
            _to_sample(s, group_id=gid, index=i, engine_version=engine_version, where=f"group {gi} sample {i}")
            for i, s in enumerate(members)
        ]
        first = getattr(members[0], "group_index", None)
        row = (data_index or {}).get(first, -1) if first is not None else -1
        groups.append(Group(group_id=gid, samples=samples, rollout_id=rollout_id, data_index=row))
    return groups, metrics


def _to_sample(s: object, *, group_id: int, index: int, engine_version: int, where: str) -> Sample:
    """One returned sample as ours: a ``slime.types.Sample`` checked as it is, a THUDM/slime-shaped one
    converted; PluginError naming ``where`` and what is wrong."""
    if isinstance(s, Sample):
        return _checked_own_sample(s, group_id=group_id, index=index, engine_version=engine_version, where=where)
    if not hasattr(s, "tokens") or not hasattr(s, "response_length"):
        raise PluginError(
            f"{where}: is a {type(s).__module__}.{type(s).__qualname__}, expected slime.types.Sample or a slime-shaped "
            "sample (tokens, response_length, loss_mask, rollout_log_probs, status, reward)"
        )
    return _from_slime_sample(s, group_id=group_id, index=index, engine_version=engine_version, where=where)


def _checked_own_sample(s: Sample, *, group_id: int, index: int, engine_version: int, where: str) -> Sample:
    """Our own ``Sample``, aligned, finished and within the generate contract, given its place in the group."""
    try:
        s.check_aligned()
    except ValueError as exc:
        raise PluginError(f"{where}: {exc}") from None
    problems = s.generate_contract_problems(engine_version=engine_version)
    if s.status is Status.PARTIAL:
        problems.insert(0, f"{where}: status is partial; a rollout function returns finished samples")
    if problems:
        raise PluginError(problems[0])
    s.group_id, s.index = group_id, index
    return s


def _from_slime_sample(s: Any, *, group_id: int, index: int, engine_version: int, where: str) -> Sample:
    """A THUDM/slime-shaped sample (the user's object, read by attribute: ``Any``) as our ``Sample``."""
    tokens, n = list(s.tokens or []), s.response_length
    if not isinstance(n, int) or not 0 <= n <= len(tokens):
        raise PluginError(
            f"{where}: response_length={n!r} with {len(tokens)} tokens; expected 0 <= response_length <= len(tokens)"
        )
    status = _status(getattr(s, "status", None), where)
    mask, logprobs = checked_token_lists(s, n, where)
    reward = getattr(s, "reward", None)
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward)
    ):
        raise PluginError(
            f"{where}: reward is {type(reward).__name__} {reward!r:.60}, expected a finite float or None "
            "(None: the run's reward function scores it)"
        )
    raw_prompt = getattr(s, "prompt", "")
    prompt = raw_prompt if isinstance(raw_prompt, str) else _last_content(raw_prompt)
    metadata = dict(getattr(s, "metadata", None) or {})
    if logprobs is None:  # not sampled by this run's policy (SFT / offline data): as --offline-data without logprobs
        metadata.update(offline=True, offline_logprobs=False)
    out = Sample(
        prompt_ids=tokens[: len(tokens) - n],
        group_id=group_id,
        index=index,
        label=getattr(s, "label", None),
        prompt=prompt,
        response=getattr(s, "response", "") or "",
        metadata=metadata,
        status=status,
        reward=None if reward is None else float(reward),
    )
    response = tokens[len(tokens) - n :]
    version = OFFLINE_VERSION if logprobs is None else oldest_version(s, engine_version)
    lps = [0.0] * n if logprobs is None else [float(x) for x in logprobs]
    masks = [1] * n if mask is None else list(mask)
    start = 0
    for m, run in itertools.groupby(masks):  # one append per run of equal mask values
        end = start + len(list(run))
        out.append(response[start:end], lps[start:end], version, trainable=bool(m))
        start = end
    return out


def _status(value: object, where: str) -> Status:
    name = getattr(value, "value", value)
    if name in ("completed", "truncated", "aborted", "failed"):
        return Status(name)
    raise PluginError(
        f"{where}: status is {name!r}; set COMPLETED, TRUNCATED, ABORTED or FAILED (a rollout function returns finished samples)"
    )


def _last_content(messages: object) -> str:
    """The text view of a chat-message prompt: its last message's content."""
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        return str(messages[-1].get("content", ""))
    return str(messages)
