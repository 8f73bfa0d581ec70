"""What an RL run is built from: its prompts, prompt tokenizer, reward and generate functions, offline
data and teacher (``--use-opd``), each from the config section that defines it."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from slime.config import DataConfig, LoopConfig, RolloutConfig
from slime.data.dataset import PromptRow, PromptSource, prompt_length_check
from slime.data.offline import OfflineSource, load_offline_data
from slime.data.prompt_index import index_prompt_file
from slime.data.sft import model_context_len
from slime.errors import ConfigError
from slime.hf_checkpoint import load_tokenizer
from slime.loop.plan import RunPlan
from slime.rollout.generate import generate as default_generate
from slime.rollout.rewards import load_function
from slime.train_metrics import TrainMetrics
from slime.types import GenerateFn, Group, JsonObject, RewardFn

if TYPE_CHECKING:
    from slime.engines.fleet.start import RolloutEngines
    from slime.rollout.opd import TeacherScorer

__all__ = [
    "RunInputs",
    "build_inputs",
    "builtin_task",
    "load_prompts",
    "prompt_tokenizer",
    "teacher_scorer",
    "offline_source",
    "with_offline_logprobs",
    "reward_function",
    "generate_function",
]

log = logging.getLogger(__name__)


def builtin_task(name: str) -> ModuleType:
    """The module of ``--builtin-task``: ``slime.data.arith``, ``slime.data.calc`` or ``slime.data.chain``."""
    import importlib

    return importlib.import_module(f"slime.data.{name}")


def load_prompts(
    d: DataConfig,
    counts: dict[str, int] | None = None,
    *,
    seed: int,
    require_label: bool = False,
    check: Any = None,
    by_name: bool = False,
) -> tuple[Sequence[PromptRow], Any]:
    """Train and eval prompt rows of the data section ``d``: the user's JSONL files, or the built-in task (``--builtin-task``).

    The eval rows are one list (every dataset's, in order), or with ``by_name`` a dict ``{name: rows}``
    of ``--eval-prompt-data``'s datasets (name None: one unnamed path, or the built-in eval split; empty:
    no eval), each cut to ``--num-eval-prompts``. JSONL files are streamed (``slime.data.prompt_index``):
    the train rows are read back by offset as the run hands them out, and only the eval rows kept are held.

    ``counts``, when given, receives ``bad_data_lines_skipped`` (``--on-bad-data skip``).
    ``seed``: the run's ``--seed`` (the built-in task's train split is drawn from it).
    ``require_label``: the reward reads labels (its ``needs_label``); rows without one are bad rows.
    ``check``: a per-row check of the files' rows (``load_prompt_file``), e.g. ``prompt_length_check``."""
    num_bad = [0, 0]
    kw = dict(
        input_key=d.input_key,
        label_key=d.label_key,
        metadata_key=d.metadata_key,
        on_bad_data=d.on_bad_data,
        tool_key=d.tool_key,
        apply_chat_template=d.apply_chat_template,
        require_label=require_label,
        check=check,
    )
    if d.prompt_data:
        train, num_bad[0] = index_prompt_file(
            d.prompt_data, flag="--prompt-data", curriculum_key=d.curriculum_key, **kw
        )
    else:
        task = builtin_task(d.builtin_task)
        train = [
            PromptRow(index=i, prompt=r["prompt"], label=r["label"])
            for i, r in enumerate(task.generate_dataset(20000, seed=seed, split="train"))
        ]
    sets: dict[str | None, list[PromptRow]] = {}
    for name, path in d.eval_datasets:
        rows, bad = index_prompt_file(path, flag="--eval-prompt-data", **kw)
        num_bad[1] += bad
        sets[name] = list(rows[: d.num_eval_prompts])
    if not d.eval_datasets and not d.prompt_data:
        task = builtin_task(d.builtin_task)
        # a fixed held-out set (seed 0), the same for every run seed, so runs compare
        sets[None] = [
            PromptRow(index=i, prompt=r["prompt"], label=r["label"])
            for i, r in enumerate(task.generate_dataset(d.num_eval_prompts, seed=0, split="eval"))
        ]
    if counts is not None:
        counts["bad_data_lines_skipped"] = sum(num_bad)
    return train, sets if by_name else [r for rows in sets.values() for r in rows]


def prompt_tokenizer(
    tokenizer: Any, *, apply_chat_template: bool
) -> Callable[..., list[int]]:  # an HF tokenizer (untyped third-party)
    """The run's prompt tokenizer: ``tokenize(text_or_messages, tools=None) -> [num_prompt_tokens] ids``.

    Without ``apply_chat_template``: ``tokenizer.encode(text)`` with the tokenizer's defaults (BOS),
    as SGLang tokenizes ``text``; tools are not rendered (they stay in ``Sample.metadata["tools"]``).
    With it: text becomes ``[{"role": "user", "content": text}]``, a row's messages are used as given,
    and ``apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)``
    renders them (THUDM/slime renders its prompts the same way).
    """

    def tokenize(prompt: str | list[JsonObject], tools: list[JsonObject] | None = None) -> list[int]:
        if not apply_chat_template:
            return tokenizer.encode(prompt)
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        out = tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return list(out if isinstance(out, list) else out["input_ids"])

    return tokenize


def teacher_scorer(engines: RolloutEngines | None, *, use_opd: bool, opd_kl_coef: float) -> TeacherScorer | None:
    """``--use-opd``: the scorer over the ``teacher`` pool (``slime.rollout.opd``); None without OPD or
    engines (train-only runs train on recorded teacher logprobs).

    Raises:
        ConfigError: ``--use-opd`` with no teacher engines.
    """
    if not use_opd or engines is None:
        return None
    from slime.engines.fleet.groups import TEACHER
    from slime.rollout.opd import TeacherScorer

    if TEACHER not in engines.pools:
        raise ConfigError(
            f"--use-opd needs a teacher: --opd-teacher-load HF_DIR, --opd-teacher-addrs HOST:PORT, or a "
            f"'model: {TEACHER}' group in --sglang-config (models served: {sorted(engines.pools)})"
        )
    log.info("on-policy distillation: teacher engines %s, --opd-kl-coef %s", engines.pools[TEACHER].urls, opd_kl_coef)
    return TeacherScorer(engines.pools[TEACHER])


def offline_source(
    d: DataConfig,
    loop: LoopConfig,
    tokenize: Callable[..., list[int]],
    tokenizer: Any,
    *,
    n_samples_per_prompt: int,
    megatron: bool,
    seed: int,
) -> OfflineSource:  # tokenizer: an HF tokenizer (untyped third-party)
    """``--offline-data``, tokenised (prompts as online ones; responses without special tokens), shuffled from ``seed`` + 1.

    Raises ValueError when ``d.offline_data`` is not set (the caller builds a source only for a run that has one)."""
    if d.offline_data is None:
        raise ValueError("offline_source needs --offline-data")
    groups = load_offline_data(
        d.offline_data,
        tokenize=tokenize,
        encode=lambda text: tokenizer.encode(text, add_special_tokens=False),
        group_size=n_samples_per_prompt,
        input_key=d.input_key,
        label_key=d.label_key,
        metadata_key=d.metadata_key,
        tool_key=d.tool_key,
        apply_chat_template=d.apply_chat_template,
        on_bad_data=d.on_bad_data,
    )
    if megatron and any(s.logprobs is None for g in groups for s in g.samples):
        raise ConfigError(
            "--offline-data without 'logprobs' in every row: computing them is implemented for the torch backend only"
        )
    log.info(
        "offline data: %d groups from %s, %.0f%% of each batch; admission control counts %d online groups per batch",
        len(groups),
        d.offline_data,
        100 * loop.offline_ratio,
        loop.online_groups_per_batch,
    )
    return OfflineSource(groups, shuffle=d.rollout_shuffle, seed=seed + 1)


def with_offline_logprobs(
    trainer: Any,  # the torch backend's trainer: its model and rollout temperature, beyond the Trainer Protocol
) -> Callable[[list[Group]], TrainMetrics]:
    """``trainer.train_step`` that first fills the rollout logprobs of offline samples whose file had
    none (``metadata["offline_logprobs"] is False``) with the trainer's own, at the rollout
    temperature: the behaviour policy is unknown, so it is taken to be the current one (slime.data.offline)."""

    def train_step(groups: list[Group]) -> TrainMetrics:
        todo = [
            s for g in groups for s in g.samples if s.metadata.get("offline") and not s.metadata.get("offline_logprobs")
        ]
        if todo:
            import torch

            from slime.train.logprobs import compute_token_logprobs

            device = next(trainer.model.parameters()).device
            with torch.no_grad():
                for s in todo:
                    ids = torch.tensor([s.prompt_ids + s.response_ids], device=device)  # [1, T]
                    lp = compute_token_logprobs(
                        trainer.model, ids, torch.ones_like(ids), temperature=trainer.rollout_temperature
                    )  # [1, T-1]
                    s.rollout_logprobs[:] = lp[0, len(s.prompt_ids) - 1 :].tolist()
        return trainer.train_step(groups)

    return train_step


def reward_function(rollout: RolloutConfig, *, builtin: str) -> RewardFn:
    """``--custom-rm-path``, else the verifier ``--rm-type`` names, else the reward of the built-in task ``builtin`` (``--builtin-task``)."""
    if rollout.custom_rm_path:
        return load_function(rollout.custom_rm_path)
    from slime.rollout.verifiers import reward_fn_from_config

    fn = reward_fn_from_config(rollout)
    if fn is not None:
        return fn
    return builtin_task(builtin).reward


def generate_function(
    path: str | None, tokenizer: Any
) -> GenerateFn:  # tokenizer: an HF tokenizer (untyped third-party)
    """``--custom-generate-function-path`` (with the tokenizer bound when it asks for one), else the default."""
    if not path:
        return default_generate
    fn = load_function(path, flag="--custom-generate-function-path")
    if "tokenizer" in inspect.signature(fn).parameters:
        fn = functools.partial(fn, tokenizer=tokenizer)
    return fn


@dataclasses.dataclass
class RunInputs:
    """What the run's prompts become groups with: the tokenizer's two directions, the reward and
    generate functions, the prompt source, the eval sets and the offline groups."""

    tokenize: Callable[..., list[int]]
    decode: Callable[[list[int]], str]
    reward_fn: RewardFn
    generate_fn: GenerateFn
    source: PromptSource
    eval_sets: dict[str | None, list[PromptRow]]
    offline: OfflineSource | None
    data_counts: dict[str, int]
    """``bad_data_lines_skipped``, added to the summary."""


async def build_inputs(
    data: DataConfig,
    rollout: RolloutConfig,
    loop: LoopConfig,
    plan: RunPlan,
    *,
    reward_fn: RewardFn | None,
) -> RunInputs:
    """The run's ``RunInputs`` (blocking loads in threads): the tokenizer of ``plan.base_model`` (checked
    against ``plan.opd_teacher``'s), the prompts (a train-only run needs no label and has no eval set or
    offline source), the reward function (``reward_fn`` overrides the configured one) and the generate function.

    Raises:
        ConfigError: ``--apply-chat-template`` with a tokenizer that has no chat template; bad prompt files.
    """
    tokenizer = await _tokenizer(plan.base_model, plan.opd_teacher, chat_template=data.apply_chat_template)
    tokenize = prompt_tokenizer(tokenizer, apply_chat_template=data.apply_chat_template)
    reward_fn = reward_fn or reward_function(rollout, builtin=data.builtin_task)
    generate_fn = generate_function(rollout.custom_generate_function_path, tokenizer)
    needs_label = getattr(reward_fn, "needs_label", False) and not plan.train_only  # a train-only run rewards nothing
    counts: dict[str, int] = {}
    check = await _prompt_check(data, rollout, plan.base_model, tokenize)
    load = functools.partial(load_prompts, by_name=True)
    train_rows, eval_sets = await asyncio.to_thread(
        load, data, counts, seed=plan.seed, require_label=needs_label, check=check
    )
    source = PromptSource(
        train_rows, shuffle=data.rollout_shuffle, seed=plan.seed, curriculum=data.curriculum_key is not None
    )
    offline = None
    if data.offline_data and not plan.train_only:
        n = rollout.n_samples_per_prompt
        offline = await asyncio.to_thread(
            offline_source,
            data,
            loop,
            tokenize,
            tokenizer,
            n_samples_per_prompt=n,
            megatron=plan.megatron,
            seed=plan.seed,
        )
    return RunInputs(
        tokenize=tokenize,
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        reward_fn=reward_fn,
        generate_fn=generate_fn,
        source=source,
        eval_sets={} if plan.train_only else eval_sets,
        offline=offline,
        data_counts=counts,
    )


async def _tokenizer(base_model: str, opd_teacher: str | None, *, chat_template: bool) -> Any:
    """The HF tokenizer of ``base_model`` (``Any``: an untyped third-party object), checked against the teacher's and the chat template flag."""
    tokenizer = await asyncio.to_thread(load_tokenizer, base_model, flag="--hf-checkpoint")
    if opd_teacher:
        from slime.rollout.opd import check_same_vocab

        teacher_tokenizer = await asyncio.to_thread(load_tokenizer, opd_teacher, flag="--opd-teacher-load")
        check_same_vocab(tokenizer, teacher_tokenizer, student_name=base_model, teacher_name=opd_teacher)
    if chat_template and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"--apply-chat-template: the tokenizer in {base_model} has no chat template (no chat_template in tokenizer_config.json, "
            "no chat_template.jinja); use a model that has one (e.g. an -Instruct model), or drop --apply-chat-template to tokenize the raw prompt text"
        )
    return tokenizer


async def _prompt_check(
    data: DataConfig, rollout: RolloutConfig, base_model: str, tokenize: Callable[..., list[int]]
) -> Callable[..., object] | None:
    """The per-row prompt length check (``prompt_length_check``) of the prompt files, or None when nothing bounds a prompt."""
    from transformers import AutoConfig

    max_len = model_context_len(await asyncio.to_thread(AutoConfig.from_pretrained, base_model))
    bound: dict[str, object] = dict(max_len=max_len or None)  # the engine would refuse longer prompts
    ctx = rollout.rollout_max_context_len
    if ctx is not None and (not max_len or ctx < max_len):
        bound = dict(max_len=ctx, context="the rollout context", source="--rollout-max-context-len")
    max_prompt_len = data.rollout_max_prompt_len
    if not (bound["max_len"] or max_prompt_len):
        return None
    return prompt_length_check(tokenize, max_prompt_len=max_prompt_len, **bound)  # type: ignore[arg-type]
