"""Core types shared by every part of slime: ``Sample``, ``Group``, ``Status`` and the plugin protocols.

This module imports nothing of ours. ``Sample`` is one trajectory; ``Group`` is the samples of one
prompt (GRPO needs them together) and the unit of scheduling, abort, recycling and filtering.

Invariant (tested in ``tests/test_types.py``): for every sample,
``len(response_ids) == len(rollout_logprobs) == len(versions) == len(loss_mask)``, and only
``Sample.append`` grows those lists.

Example (a resumed sample, abort after 3 tokens under version 4, resume under version 5)::

    s = Sample(prompt_ids=[1, 7, 9])
    s.append([11, 12, 13], [-0.1, -0.5, -0.2], policy_version=4)   # aborted here
    s.append([14, 2], [-0.3, -0.01], policy_version=5)             # resumed, finished
    s.versions == [4, 4, 4, 5, 5]; s.num_versions_spanned == 2
"""

from __future__ import annotations

import enum
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

if TYPE_CHECKING:  # the pool type only: types.py imports nothing of ours at run time
    from slime.engines.interface import EnginePool

__all__ = [
    "JsonObject",
    "OFFLINE_VERSION",
    "Status",
    "Sample",
    "Group",
    "valid_samples",
    "GenerateFn",
    "RewardFn",
    "RewardValue",
    "GroupRewardFn",
]

JsonObject = dict[str, Any]
"""A decoded JSON object (a prompt row, an engine's reply, a metrics row): its values are any JSON, hence
``Any``; the one alias of the package for it."""

OFFLINE_VERSION = -1
"""The version of a token that no policy of this run sampled (``--offline-data``). Such tokens are
off-policy by construction and exempt from the staleness bound: ``mask_stale`` never masks them,
the trainer's staleness check counts their lag as 0, and lag statistics leave them out."""


class Status(enum.Enum):
    """Where a sample stands. Mirrors SGLang's ``finish_reason`` (stop, length, abort) plus our own states.

    - PENDING: never sent to an engine, or resumed and waiting for a slot.
    - PARTIAL: aborted with some tokens kept; will be resumed token-exactly.
    - COMPLETED: the engine stopped on EOS / a stop token (``finish_reason.type == "stop"``).
    - TRUNCATED: the engine hit ``max_new_tokens`` (``finish_reason.type == "length"``).
    - ABORTED: aborted and not to be resumed (e.g. dropped by a staleness policy).
    - FAILED: a plugin (generate / reward / tool function) raised or timed out; ``evidence`` says why.
    """

    PENDING = "pending"
    PARTIAL = "partial"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"

    @property
    def is_finished(self) -> bool:
        """True when generation is over for good (the sample can be rewarded and trained)."""
        return self in (Status.COMPLETED, Status.TRUNCATED, Status.FAILED, Status.ABORTED)

    @property
    def is_resumable(self) -> bool:
        return self in (Status.PENDING, Status.PARTIAL)


class Sample(msgspec.Struct, kw_only=True):
    """One trajectory: a prompt and the response generated for it, token by token.

    Attributes:
        prompt_ids: [num_prompt_tokens] int, the exact ids sent to the engine (never re-tokenized).
        response_ids: [num_tokens] int, every response token (model tokens and, in multi-turn
            rollouts, tool/observation tokens).
        rollout_logprobs: [num_tokens] float, natural log, the logprob the *sampling* engine gave
            each token under the temperature-scaled distribution (SGLang's default). Tool tokens: 0.0.
        versions: [num_tokens] int, the policy version that produced each token (tool tokens: the
            version of the turn that called the tool; pre-generated offline tokens: ``OFFLINE_VERSION``).
        loss_mask: [num_tokens] int in {0, 1}; 1 = a model token that trains.
        reward: scalar reward, set once the sample is finished and scored; None before.
        status: see ``Status``.
        group_id: id of the group (= prompt) this sample belongs to.
        index: position of the sample inside its group, 0..n_samples_per_prompt-1.
        label: the reference answer, handed to reward functions.
        prompt / response: text views of the prompt and response, for reward functions and logs.
        metadata: free-form, JSON-serialisable, carried from the dataset row.
        evidence: what the verifier or a failing plugin saw and said (JSON-serialisable).
        num_aborts: how many times this sample was aborted and kept as a partial rollout.
        num_resumes: how many times a partial was re-sent to an engine.
        teacher_logprobs: [num_tokens] float32, natural log, the on-policy-distillation teacher's
            logprob of each response token given the prompt and the tokens before it (temperature
            1), aligned with ``response_ids``; None until the finished sample is scored
            (``slime.rollout.opd``, ``--use-opd``). Set once through ``set_teacher_logprobs``; a
            scored sample cannot grow. Entries at loss_mask-0 positions (tool output) carry no signal.
        routed_experts: the experts the engine routed each fed token to (``--use-rollout-routing-replay``):
            base64 of int32 [prompt + response - 1, num_hidden_layers, top-k] (``slime.routed_experts``: the
            format, and which request's routes a resumed sample keeps); None when not asked for.
    """

    prompt_ids: list[int]
    response_ids: list[int] = msgspec.field(default_factory=list)
    rollout_logprobs: list[float] = msgspec.field(default_factory=list)
    versions: list[int] = msgspec.field(default_factory=list)
    loss_mask: list[int] = msgspec.field(default_factory=list)
    reward: float | None = None
    status: Status = Status.PENDING
    group_id: int = 0
    index: int = 0
    label: str | None = None
    prompt: str = ""
    """The prompt text as given by the dataset (for rewards and logs; the engine sees ``prompt_ids``)."""
    response: str = ""
    """The decoded response text, refreshed by the generate function after every segment."""
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    evidence: dict[str, Any] = msgspec.field(default_factory=dict)
    num_aborts: int = 0
    num_resumes: int = 0
    teacher_logprobs: list[float] | None = None
    routed_experts: str | None = None  # base64, compact in records and the buffer (one string, not a list of ints)

    def append(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        policy_version: int | Sequence[int],
        trainable: bool = True,
    ) -> None:
        """Append one generated (or tool) segment, keeping every aligned list the same length.

        Args:
            token_ids: [k] int, the new tokens.
            logprobs: [k] float, natural log; for tool tokens pass zeros.
            policy_version: the version of every new token, or a [k] list (from SGLang's
                ``meta_info.weight_versions`` spans when weights changed mid-request).
            trainable: loss mask value of the new tokens (False for tool/observation tokens).

        Raises:
            ValueError: when the lengths disagree, or the sample was already scored by a teacher
                (``teacher_logprobs`` set); nothing is appended then.
        """
        k = len(token_ids)
        if self.teacher_logprobs is not None:
            raise ValueError(
                f"Sample(group={self.group_id}, index={self.index}).append: the sample already has teacher_logprobs "
                f"for its {len(self.response_ids)} tokens; a teacher-scored sample cannot grow"
            )
        if len(logprobs) != k:
            raise ValueError(
                f"Sample(group={self.group_id}, index={self.index}).append: {k} token_ids but {len(logprobs)} logprobs"
            )
        if isinstance(policy_version, int):
            new_versions = [policy_version] * k
        else:
            new_versions = [int(v) for v in policy_version]
            if len(new_versions) != k:
                raise ValueError(
                    f"Sample(group={self.group_id}, index={self.index}).append: {k} token_ids but {len(new_versions)} versions"
                )
        self.response_ids.extend(int(t) for t in token_ids)
        self.rollout_logprobs.extend(float(x) for x in logprobs)
        self.versions.extend(new_versions)
        self.loss_mask.extend([1 if trainable else 0] * k)

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_ids)

    @property
    def is_valid(self) -> bool:
        """Whether the sample counts: not FAILED. The one definition used by GRPO's group statistics
        (``slime.train.batch``), the dynamic-sampling filter and every metric (``valid_samples``). A
        FAILED sample's reward is a 0.0 placeholder and its tokens never train."""
        return self.status is not Status.FAILED

    @property
    def num_versions_spanned(self) -> int:
        """How many distinct policy versions produced this sample's tokens (1 for a fresh sample)."""
        return len(set(self.versions))

    @property
    def oldest_version(self) -> int | None:
        return min(self.versions) if self.versions else None

    def mask_stale(self, current_version: int, max_staleness: int) -> int:
        """Set ``loss_mask`` to 0 on tokens more than ``max_staleness`` versions behind.

        Lag of a token = ``current_version - version``. Returns how many tokens were newly masked.
        Example: versions [3, 3, 5], current 6, max_staleness 2 -> lags [3, 3, 1] -> mask [0, 0, 1].
        Offline tokens (``OFFLINE_VERSION``) are never masked here.
        """
        return self._mask_versions(lambda v: v != OFFLINE_VERSION and current_version - v > max_staleness)

    def mask_older_versions(self) -> int:
        """Set ``loss_mask`` to 0 on tokens of versions older than the sample's newest
        (``--mask-offpolicy-in-partial-rollout``; ``slime.train.batch`` applies the same rule). Returns how
        many tokens were newly masked. Example: versions [4, 4, 5], mask [1, 1, 1] -> [0, 0, 1], returns 2.
        """
        newest = max(self.versions, default=None)
        return self._mask_versions(lambda v: v != newest)

    def _mask_versions(self, drop: Callable[[int], bool]) -> int:
        """Set ``loss_mask`` to 0 on trainable tokens whose version ``drop`` says; returns how many."""
        masked = 0
        for i, v in enumerate(self.versions):
            if self.loss_mask[i] and drop(v):
                self.loss_mask[i] = 0
                masked += 1
        return masked

    def check_aligned(self) -> None:
        """Raise ValueError naming the lengths if the aligned per-token lists disagree."""
        lens = (len(self.response_ids), len(self.rollout_logprobs), len(self.versions), len(self.loss_mask))
        teacher = f" teacher_logprobs={len(self.teacher_logprobs)}" if self.teacher_logprobs is not None else ""
        if len(set(lens)) != 1 or (self.teacher_logprobs is not None and len(self.teacher_logprobs) != lens[0]):
            raise ValueError(
                f"Sample(group={self.group_id}, index={self.index}) misaligned: response_ids={lens[0]} "
                f"rollout_logprobs={lens[1]} versions={lens[2]} loss_mask={lens[3]}{teacher}"
            )

    def generate_contract_problems(
        self, *, max_response_len: int | None = None, engine_version: int | None = None
    ) -> list[str]:
        """What a generate function's call left wrong in this sample, one sentence each ([] = fine).

        Checked after every call (by the scheduler, which raises ``PluginError`` on the first
        problem, and by ``slime check-plugin``): a status was set (not PENDING); the response has at
        most ``max_response_len`` tokens; no token carries a version newer than ``engine_version``
        (the engine's version when the call returned). Alignment is ``check_aligned``'s job.
        """
        where = f"group {self.group_id} sample {self.index}"
        out = []
        if self.status is Status.PENDING:
            out.append(
                f"{where}: status is still pending after the call (returned None or the sample without setting "
                "a status); set COMPLETED, TRUNCATED, PARTIAL or FAILED"
            )
        if max_response_len is not None and len(self.response_ids) > max_response_len:
            out.append(
                f"{where}: {len(self.response_ids)} response tokens, more than max_response_len={max_response_len}"
            )
        if engine_version is not None and self.versions and max(self.versions) > engine_version:
            out.append(
                f"{where}: a token has policy version {max(self.versions)}, newer than the engine's {engine_version}; "
                "tag each token with the engine_version the call was given (or the engine's weight_versions)"
            )
        return out

    def set_teacher_logprobs(self, logprobs: Sequence[float]) -> None:
        """Store the teacher's per-token logprobs of this (finished) sample's response.

        Args:
            logprobs: [num_tokens] float, natural log, one per ``response_ids`` entry, all finite.

        Raises:
            ValueError: a length other than ``len(response_ids)``, a non-finite value, or a second call.
        """
        where = f"Sample(group={self.group_id}, index={self.index}).set_teacher_logprobs"
        if self.teacher_logprobs is not None:
            raise ValueError(f"{where}: already set")
        values = [float(x) for x in logprobs]
        if len(values) != len(self.response_ids):
            raise ValueError(f"{where}: {len(values)} logprobs for {len(self.response_ids)} response tokens")
        bad = next((i for i, x in enumerate(values) if not math.isfinite(x)), None)
        if bad is not None:
            raise ValueError(
                f"{where}: logprob {values[bad]} of response token {bad} (id {self.response_ids[bad]}) is not finite"
            )
        self.teacher_logprobs = values


class Group(msgspec.Struct, kw_only=True):
    """The samples of one prompt: the unit of scheduling, abort, recycling and filtering.

    Attributes:
        group_id: unique id; groups are trained at most once per id (tested invariant).
        samples: [n_samples_per_prompt] samples.
        rollout_id: the rollout step in which the group was first started (a partial group keeps
            its first rollout id when resumed).
        data_index: position of the prompt in the data source (for exact resume).
    """

    group_id: int
    samples: list[Sample]
    rollout_id: int = 0
    data_index: int = -1

    @property
    def is_finished(self) -> bool:
        return all(s.status.is_finished for s in self.samples)

    @property
    def is_rewarded(self) -> bool:
        return all(s.reward is not None for s in self.samples)

    @property
    def oldest_version(self) -> int | None:
        vs = [v for s in self.samples if (v := s.oldest_version) is not None]
        return min(vs) if vs else None

    @property
    def num_response_tokens(self) -> int:
        return sum(s.num_response_tokens for s in self.samples)

    @property
    def valid_samples(self) -> list[Sample]:
        """The samples that count (``Sample.is_valid``), in order."""
        return [s for s in self.samples if s.is_valid]


def valid_samples(groups: Sequence[Group]) -> list[Sample]:
    """The samples of ``groups`` that count (``Sample.is_valid``), group by group: what metrics are
    computed over. Example: groups [[ok, FAILED], [ok]] -> [ok, ok]."""
    return [s for g in groups for s in g.valid_samples]


class GenerateFn(Protocol):
    """A generate function (``--custom-generate-function-path``; the default is ``slime.rollout.generate.generate``):
    grows ``sample`` through ``Sample.append`` and sets its status.

    Called by the scheduler with the sample (possibly a partial one to resume), the sampling params
    (SGLang's ``sampling_params`` keys, without ``max_new_tokens``), the run's engine pool
    (``slime.engines.interface.EnginePool``; most functions only call its ``generate``), the cap on
    response tokens counting those the sample already has, the policy version the engines hold, and
    ``decode`` (token ids -> text). Returns the sample, or a list of samples when one trajectory yields
    several. A function that takes a ``tokenizer`` keyword gets the run's tokenizer bound by the driver.
    """

    def __call__(
        self,
        sample: Sample,
        sampling_params: dict[str, Any],
        *,
        pool: EnginePool,
        max_response_len: int,
        engine_version: int,
        decode: Callable[[list[int]], str] | None = None,
    ) -> Awaitable[Sample | list[Sample]]: ...


RewardValue = float | dict[str, Any]
"""What a reward function returns: the reward, or a dict whose ``--reward-key`` entry is the reward."""


class RewardFn(Protocol):
    """Per-sample reward (``--custom-rm-path``, ``--rm-type``, a built-in task's): ``async def reward(sample)``
    returning a float (or a dict, see ``RewardValue``); a plain function runs on a daemon thread
    (``slime.rollout.rewards``). May raise; the sample is then marked FAILED with the error as evidence.
    A reward that reads ``Sample.label`` says so with an attribute ``needs_label = True`` (the math
    verifier and the built-in tasks' rewards do): the run then refuses, at load, each prompt row whose
    label is missing, null or blank, naming ``file:line`` (``--on-bad-data skip`` skips and counts it)."""

    def __call__(self, sample: Sample, /) -> RewardValue | Awaitable[RewardValue]: ...


class GroupRewardFn(Protocol):
    """Per-group reward (``--group-rm``): one reward per sample of the group, in order; async or plain."""

    def __call__(self, samples: list[Sample], /) -> list[float] | Awaitable[list[float]]: ...
