"""The start-of-run checks of ``slime train``: ``preflight`` (what would otherwise fail minutes into a
run, naming the flag), the run directory's guard against overwriting a run (``check_run_dir``), the
run's placement and trainer GPU count as the launch plan sees them, and the shipped warm starts used
without ``--hf-checkpoint`` (``DEFAULT_CHECKPOINTS``). ``slime.cli`` runs these before a run starts and
re-exports every name here; slime's own modules are imported lazily, so ``slime --help`` stays fast.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slime.config import Config
    from slime.engines.fleet.placement import Placement

__all__ = ["preflight", "check_inputs", "DEFAULT_CHECKPOINT", "DEFAULT_CHECKPOINTS"]

DEFAULT_CHECKPOINT = str(Path(__file__).parents[1] / "data" / "assets" / "arith-warmstart")
DEFAULT_CHECKPOINTS = {
    "arith": DEFAULT_CHECKPOINT,
    "calc": str(Path(__file__).parents[1] / "data" / "assets" / "calc-warmstart"),
    "chain": str(Path(__file__).parents[1] / "data" / "assets" / "chain-warmstart"),
}
"""The shipped warm start of each built-in task (``--builtin-task``), used without ``--hf-checkpoint``."""


def check_run_dir(config: Config) -> None:
    """Refuse a run folder another live run holds (``slime.loop.run_lock``), and to overwrite a finished
    run's records unless resuming it with ``--load``.

    Raises:
        RunFolderInUse: a live run holds ``--save`` / ``--load``; names its pid, host and start.
        ConfigError: ``--save`` holds a run and there is no ``--load``, or ``--load`` has nothing to resume.
        CheckpointError: ``--load``'s checkpoints exist but none is complete; names each one's file and step.
    """
    from slime.errors import ConfigError

    if int(os.environ.get("RANK", "0")) != 0:
        return  # torchrun: rank 0 owns the run directory
    from slime.loop.checkpoint import resume_checkpoint, scan_checkpoints
    from slime.loop.run import run_folders
    from slime.loop.run_lock import check_run_folder_free

    for flag, folder in run_folders(config):
        check_run_folder_free(folder, flag=flag)
    run_dir = Path(config.run_dir)
    used = (run_dir / "metrics.jsonl").exists() or (run_dir / "summary.json").exists()
    scan = scan_checkpoints(run_dir / "checkpoints")
    if used and not config.load:
        hint = (
            f"resume it with --load {config.run_dir}"
            if scan.path is not None
            else f"none of its checkpoints is complete ({scan.skipped[0]})"
            if scan.skipped
            else "it has no checkpoint to resume (it ran without --save-interval)"
        )
        if config.run_dir == _default_run_dir(config):  # the user most likely never passed --save
            raise ConfigError(
                f"{config.run_dir!r}, the run directory used when --save is not given, already holds a run (metrics.jsonl / "
                f"summary.json); {hint}, or pass --save DIR to start a new run in another directory (e.g. --save runs/run2)"
            )
        raise ConfigError(
            f"--save={config.run_dir!r} already holds a run (metrics.jsonl / summary.json); {hint}, or choose another --save"
        )
    if (
        config.load and resume_checkpoint(config.load, warn=False) is None
    ):  # none at all (damaged ones: CheckpointError)
        loaded = Path(config.load)
        if (loaded / "metrics.jsonl").exists() or (loaded / "summary.json").exists():
            raise ConfigError(
                f"--load={config.load!r}: that run has no checkpoint (it ran without --save-interval), so there "
                "is nothing to resume; start a new run with another --save"
            )


def _default_run_dir(config: Config) -> str:
    """``Config.run_dir``'s default (``runs/latest``): where a run without ``--save`` writes."""
    import msgspec

    return next(f.default for f in msgspec.structs.fields(config) if f.name == "run_dir")


def check_inputs(config: Config, *, parse_data: bool = False, absent: frozenset[str] = frozenset()) -> None:
    """The start-of-run checks that need no engine, GPU or SGLang (``slime train --dry-run`` runs these alone).

    The data and debug modes' flags agree (``check_run_modes``); model directories (``--hf-checkpoint``,
    ``--ref-load``, ``--opd-teacher-load``) hold files a library can load (``slime.hf_checkpoint.check_hf_dir``:
    config, weights, tokenizer); prompt files exist, and with ``parse_data`` every row of ``--prompt-data`` /
    ``--eval-prompt-data`` parses (``slime.data.dataset.load_prompt_file``, under ``--on-bad-data``); plugin
    paths (``--custom-rm-path``, ``--custom-generate-function-path``, ``--dynamic-sampling-filter-path``,
    ``--buffer-filter-path``, ``--rollout-function-path`` unless it names THUDM/slime's own) import;
    ``--offline-data`` exists, and so does the first record of ``--load-debug-rollout-data``. A run on the
    shipped warm start (no ``--hf-checkpoint``) logs one line saying so. Paths in ``absent`` are skipped (a
    plan for another machine's paths: ``slime.cli.plan_inputs``).

    Raises:
        ConfigError: the first problem found, naming the flag.
        CheckpointError: a model directory's file is missing, corrupt or truncated.
        DataError: with ``parse_data`` and ``--on-bad-data fail``, the first bad row (``path:line``).
    """
    config.check_run_modes()
    d = config.data
    if config.engine.hf_checkpoint == DEFAULT_CHECKPOINTS.get(d.builtin_task):
        logging.getLogger("slime.cli").info(
            "no --hf-checkpoint: using the shipped warm start of the built-in task %s (%s)",
            d.builtin_task,
            config.engine.hf_checkpoint,
        )
    _check_recorded_inputs(config, absent)
    if config.engine.hf_checkpoint not in absent:  # --use-rollout-routing-replay: an MoE model
        from slime.config.routing_replay import check_routing_replay_model

        check_routing_replay_model(config.rollout, config.engine.hf_checkpoint)
    _check_model_dirs(config, absent)
    _check_response_lengths(config)
    _check_prompt_files(config, parse_data=parse_data, absent=absent)
    _check_plugin_paths(config)


def _check_recorded_inputs(config: Config, absent: frozenset[str]) -> None:
    """``--offline-data`` is a file; ``--load-debug-rollout-data`` has its step-1 record (ConfigError if not)."""
    from slime.errors import ConfigError
    from slime.loop.record import record_path

    offline, recorded = config.data.offline_data, config.debug.load_debug_rollout_data
    if offline and offline not in absent and not Path(offline).is_file():
        raise ConfigError(f"--offline-data={offline!r}: no such JSONL or Parquet file")
    if recorded and recorded not in absent and not record_path(recorded, 1).is_file():
        raise ConfigError(f"--load-debug-rollout-data={recorded!r}: no record of step 1 ({record_path(recorded, 1)})")


def _check_model_dirs(config: Config, absent: frozenset[str]) -> None:
    """Each model directory given holds what its use loads (``check_hf_dir``; CheckpointError naming the flag)."""
    from slime.errors import CheckpointError
    from slime.hf_checkpoint import check_hf_dir

    # running engines and no trainer: only the tokenizer of --hf-checkpoint is read here
    tokenizer_only = config.debug.debug_rollout_only and bool(config.engine.rollout_external_engine_addrs)
    for flag, value in (
        ("--hf-checkpoint", config.engine.hf_checkpoint),
        ("--ref-load", config.train.ref_load),
        ("--opd-teacher-load", config.engine.opd_teacher_load),
    ):
        if not value or value in absent:
            continue
        try:
            check_hf_dir(
                value,
                weights=not (tokenizer_only and flag == "--hf-checkpoint"),
                tokenizer=flag != "--ref-load",
                flag=flag,
            )
        except CheckpointError as exc:
            if value == DEFAULT_CHECKPOINT:
                raise CheckpointError(f"{exc} (the default warm start is built by scripts/make_warmstart.py)") from None
            raise


def _check_prompt_files(config: Config, *, parse_data: bool, absent: frozenset[str]) -> None:
    """The prompt files exist (ConfigError); with ``parse_data`` their rows parse (``_parse_prompt_files``)."""
    from slime.errors import ConfigError

    d = config.data
    files = [("--prompt-data", d.prompt_data), *(("--eval-prompt-data", path) for _, path in d.eval_datasets)]
    files = [(flag, value) for flag, value in files if value not in absent]
    for flag, value in files:
        if value and not Path(value).is_file():
            raise ConfigError(
                f"{flag}={value!r}: {'is a directory, expected' if Path(value).is_dir() else 'no such'} JSONL file"
            )
    if parse_data:
        _parse_prompt_files(config, [(flag, value) for flag, value in files if value])


def _check_plugin_paths(config: Config) -> None:
    """Every plugin path given imports to a callable that keeps its contract (``slime.cli.check_plugins``)."""
    from slime.cli.check_plugins import check_plugins

    check_plugins(config.rollout, config.loop, rollout_function=config.rollout.uses_rollout_function)


def _engine_context(config: Config) -> tuple[int | None, str]:
    """The longest sequence the engines take, and where that number comes from: ``--sglang-context-length``, else the
    ``config.json`` of ``--hf-checkpoint`` (``max_position_embeddings``, as ``slime.data.sft.model_context_len``)."""
    args = list(config.engine.sglang_args)
    if "--context-length" in args[:-1]:
        given = args[args.index("--context-length") + 1]
        return (int(given), "--sglang-context-length") if given.isdigit() else (None, "")
    try:
        hf = json.loads((Path(config.engine.hf_checkpoint) / "config.json").read_text())
    except (OSError, ValueError):
        return None, ""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = hf.get(key) if isinstance(hf, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, f"{key} of --hf-checkpoint"
    return None, ""


def _check_response_lengths(config: Config) -> None:
    """Response caps that leave no room in the engines' context for a prompt token: every sample would be refused.

    Raises:
        ConfigError: ``--rollout-max-response-len`` or ``--eval-max-response-len`` >= the context, or
            ``--rollout-max-context-len`` over it; naming the flag, the allowed range and where the context comes from.
    """
    from slime.config._base import require

    context, source = _engine_context(config)
    if context is None:
        return
    r = config.rollout
    within = f"the engines' context of {context} tokens ({source}) less a prompt token"
    require(
        [
            (
                r.rollout_max_response_len < context,
                "--rollout-max-response-len",
                r.rollout_max_response_len,
                f"in [1, {context - 1}]: {within}",
            ),
            (
                r.eval_max_response_len is None or r.eval_max_response_len < context,
                "--eval-max-response-len",
                r.eval_max_response_len,
                f"in [1, {context - 1}]: {within}",
            ),
            (
                r.rollout_max_context_len is None or r.rollout_max_context_len <= context,
                "--rollout-max-context-len",
                r.rollout_max_context_len,
                f"in [2, {context}]: the engines' context of {context} tokens ({source})",
            ),
        ]
    )


def _parse_prompt_files(config: Config, files: list[tuple[str, str]]) -> None:
    """Parse every row of the prompt files (no tokenizer: lengths are checked when the run loads them), one row at a
    time (``slime.data.prompt_index``: a large file is not held)."""
    from slime.data.prompt_index import index_prompt_file

    d = config.data
    for flag, path in files:
        _, bad = index_prompt_file(
            path,
            flag=flag,
            input_key=d.input_key,
            label_key=d.label_key,
            metadata_key=d.metadata_key,
            tool_key=d.tool_key,
            curriculum_key=d.curriculum_key if flag == "--prompt-data" else None,
            apply_chat_template=d.apply_chat_template,
            on_bad_data=d.on_bad_data,
        )
        if bad:
            logging.getLogger("slime.cli").warning(
                "%s=%r: %d bad rows would be skipped (--on-bad-data skip)", flag, path, bad
            )


def preflight(config: Config) -> None:
    """Check at start what would otherwise fail minutes into a run, naming the flag.

    ``check_inputs`` (the checks that need no engine), then: ``--use-wandb`` / ``--use-tensorboard`` have
    their package; ``--train-backend megatron`` has a GPU; the launch plan builds, and what it launches can
    import ``sglang`` / ``sglang_router`` / ``torch_memory_saver``. The placement flags make a plan rank 0
    can launch, matching torchrun's ranks (``slime.engines.fleet.placement``).

    Raises:
        ConfigError: the first problem found.
        CheckpointError: a model directory's file is missing, corrupt or truncated.
    """
    import importlib.util

    from slime.errors import ConfigError

    config.check_run_modes()
    if config.train.train_backend == "megatron":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "--train-backend megatron needs a CUDA GPU (megatron-core's optimizer and DDP allocate on it); "
                "use --train-backend torch on a CPU"
            )
    from slime.engines.fleet.placement import check_torchrun_env

    placement = run_placement(config)
    if placement is not None:
        check_torchrun_env(config.train, config.engine)
        if placement.servers_off_node0:
            raise ConfigError(
                "the placement puts SGLang servers on nodes other than rank 0's, which this slime does not launch: "
                "start them there and pass --rollout-external-engine-addrs (slime train --dry-run shows the plan)"
            )
    check_inputs(config)
    for flag, on, package in (
        ("--use-wandb", config.obs.use_wandb, "wandb"),
        ("--use-tensorboard", config.obs.use_tensorboard, "tensorboard"),
    ):
        if on and importlib.util.find_spec(package) is None:
            raise ConfigError(f"{flag}: the {package} package is not installed (pip install {package})")
    from slime.engines.fleet.host import check_launchable
    from slime.engines.fleet.plan import build_launch_plan

    # also checks --sglang-config, the GPU / port arithmetic, and that sglang (sglang_router, torch_memory_saver) import
    check_launchable(
        build_launch_plan(
            config.engine,
            trainer_gpus=trainer_gpus(config),
            colocate=config.sync.colocate,
            in_place_updates=config.updates_in_place(),
        )
    )


def run_placement(config: Config) -> Placement | None:
    """The run's per-node plan when it names one (``slime.engines.fleet.placement``), else None."""
    from slime.engines.fleet.placement import build_placement, placement_given

    if not placement_given(config.train, config.engine):
        return None
    return build_placement(
        config.train, config.engine, colocate=config.sync.colocate, rollout_only=config.debug.debug_rollout_only
    )


def trainer_gpus(config: Config) -> int:
    """The GPUs the trainer takes on this node (none in a rollout-only run; ``slime.engines.fleet.host``)."""
    from slime.engines.fleet import host

    return host.trainer_gpus(config.train, rollout_only=config.debug.debug_rollout_only)
