"""The ``slime`` command: ``slime train`` (an RL run, or SFT with ``--loss-type sft_loss``), ``slime rollout`` (generate and record only) and
``slime engine`` (the embedded engine)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: the CLI imports its parts lazily, so `slime --help` stays fast
    from slime.config import Config
    from slime.engines.fleet.placement import Placement

__all__ = ["main", "preflight", "DEFAULT_CHECKPOINT"]

DEFAULT_CHECKPOINT = str(Path(__file__).parent / "data" / "assets" / "arith-warmstart")
DEFAULT_CHECKPOINTS = {
    "arith": DEFAULT_CHECKPOINT,
    "calc": str(Path(__file__).parent / "data" / "assets" / "calc-warmstart"),
    "chain": str(Path(__file__).parent / "data" / "assets" / "chain-warmstart"),
}
"""The shipped warm start of each built-in task (``--builtin-task``), used without ``--hf-checkpoint``."""


def _train(argv: list[str], prog: str = "slime train") -> int:
    import msgspec

    from slime.cli_args import build_parser, config_from_args, split_passthrough
    from slime.errors import SlimeError, first_slime_error

    parser = build_parser(argparse.ArgumentParser(prog=prog, description="Run GRPO with partial rollouts.", allow_abbrev=False))
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--no-progress", action="store_true", help="plain step lines, no progress bar")
    parser.add_argument("--dry-run", action="store_true", help="print every command the run would start (with its env) and exit")
    try:
        argv, sglang_args, router_args = split_passthrough(argv)
    except SlimeError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        print(
            f"{prog}: error: unrecognized arguments: {' '.join(unknown)} (not flags of this slime; only --sglang-* "
            "and --router-* flags pass through, to SGLang and sglang-router; see slime train --help)",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(ns, sglang_args=sglang_args, router_args=router_args)
        if not config.engine.hf_checkpoint:
            config = msgspec.structs.replace(
                config, engine=msgspec.structs.replace(config.engine, hf_checkpoint=DEFAULT_CHECKPOINTS[config.data.builtin_task])
            )
        from slime.cli_compat import check_compat_flags

        check_compat_flags(ns, config.engine.hf_checkpoint)  # before --dry-run: reads config.json only
        config = config.with_placement_defaults()
        if ns.dry_run:
            from slime.engines.fleet.plan import build_launch_plan

            placement = _placement(config)
            if placement is not None:
                print(placement.format())
            if placement is None or not placement.servers_off_node0:
                print(
                    build_launch_plan(
                        config.engine,
                        seed=config.seed,
                        trainer_gpus=_trainer_gpus(config),
                        colocate=config.sync.colocate,
                        in_place_updates=config.updates_in_place(),
                        gpus_per_node=placement.gpus_per_node if placement else None,
                    ).format()
                )
            return 0
        preflight(config)
        _check_run_dir(config)
        from transformers.utils import logging as hf_logging

        from slime.loop.driver import run_training

        hf_logging.disable_progress_bar()  # no "Writing model shards" bar at every weight sync

        if config.train.loss_type == "sft_loss":
            from slime.loop.sft import run_sft

            summary = _run(run_sft(config, progress=not ns.no_progress))
            fmt = lambda x: "n/a (no --eval-prompt-data)" if x is None else f"{x:.4f}"  # noqa: E731
            print(
                f"done: SFT {summary['num_steps']} steps; eval loss {fmt(summary['eval_loss_before'])} -> "
                f"{fmt(summary['eval_loss_after'])}; model {summary['model_dir']}; run dir {config.run_dir}"
            )
            return 0
        summary = _run(run_training(config, progress=not ns.no_progress))
    except SlimeError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:  # raised inside a task group: report slime's own error plainly
        leaf = first_slime_error(group)
        if leaf is None:
            raise
        print(f"{prog}: error: {leaf}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = f"; resume with --load {config.run_dir}" if config.save_interval else ""
        print(f"{prog}: interrupted; run directory {config.run_dir}{hint}", file=sys.stderr)
        return 130
    if not summary:  # a non-zero rank of a torchrun job
        return 0
    fmt = lambda x: "n/a (no eval set)" if x is None else f"{x:.3f}"  # noqa: E731
    print(
        f"done: eval accuracy {fmt(summary['eval_accuracy_before'])} -> {fmt(summary['eval_accuracy_after'])}; "
        f"aborted {summary['aborted_samples']}, resumed {summary['resumed_samples']}, "
        f"max versions in a trained sample {summary['max_versions_in_a_trained_sample']}; run dir {config.run_dir}"
    )
    return 0


def _warn_if_resuming_another_setup(config: Config) -> None:
    """``--load`` of a run made with other data, model or loss: allowed (e.g. a new data mix), but said."""
    import msgspec

    saved_path = Path(config.load) / "config.json"
    try:
        saved = json.loads(saved_path.read_text())
    except (OSError, ValueError):
        return
    now = msgspec.to_builtins(config)
    fields = [
        ("data", "prompt_data", "--prompt-data"),
        ("engine", "hf_checkpoint", "--hf-checkpoint"),
        ("train", "loss_type", "--loss-type"),
    ]
    changed = [
        f"{flag} {saved.get(sec, {}).get(key)!r} -> {now[sec][key]!r}"
        for sec, key, flag in fields
        if sec in saved and key in saved[sec] and saved[sec][key] != now[sec][key]
    ]
    if changed:
        logging.getLogger("slime.cli").warning("--load %s: resuming a run made with other settings: %s", config.load, "; ".join(changed))


def _check_run_dir(config: Config) -> None:
    """Refuse to overwrite a finished or running run's records unless resuming it with ``--load``."""
    from slime.errors import ConfigError

    if int(os.environ.get("RANK", "0")) != 0:
        return  # torchrun: rank 0 owns the run directory
    from slime.loop.checkpoint import latest_checkpoint

    run_dir = Path(config.run_dir)
    used = (run_dir / "metrics.jsonl").exists() or (run_dir / "summary.json").exists()
    resumable = latest_checkpoint(run_dir / "checkpoints") is not None
    if used and not config.load:
        hint = f"resume it with --load {config.run_dir}" if resumable else "it has no checkpoint to resume (it ran without --save-interval)"
        raise ConfigError(f"--save={config.run_dir!r} already holds a run (metrics.jsonl / summary.json); {hint}, or choose another --save")
    if config.load:
        _warn_if_resuming_another_setup(config)
    if config.load and latest_checkpoint(Path(config.load) / "checkpoints") is None:
        loaded = Path(config.load)
        if (loaded / "metrics.jsonl").exists() or (loaded / "summary.json").exists():
            raise ConfigError(
                f"--load={config.load!r}: that run has no checkpoint (it ran without --save-interval), so there "
                "is nothing to resume; start a new run with another --save"
            )


def preflight(config: Config) -> None:
    """Check at start what would otherwise fail minutes into a run, naming the flag.

    Model directories (``--hf-checkpoint``, ``--ref-load``, ``--opd-teacher-load``) hold files a library can
    load (``slime.hf_checkpoint.check_hf_dir``: config, weights, tokenizer); prompt
    files exist; plugin paths (``--custom-rm-path``, ``--dynamic-sampling-filter-path``,
    ``--buffer-filter-path``, ``--rollout-function-path`` unless it names THUDM/slime's own) import;
    ``--use-wandb`` / ``--use-tensorboard`` have their package; the launch plan builds, and what it
    launches can import ``sglang`` / ``sglang_router`` / ``torch_memory_saver``. The placement flags make
    a plan rank 0 can launch, matching torchrun's ranks (``slime.engines.fleet.placement``).
    The data and debug modes' flags agree (``check_run_modes``), ``--offline-data`` exists, and so does
    the first record of ``--load-debug-rollout-data``.

    Raises:
        ConfigError: the first problem found.
        CheckpointError: a model directory's file is missing, corrupt or truncated.
    """
    import importlib.util

    from slime.errors import CheckpointError, ConfigError
    from slime.hf_checkpoint import check_hf_dir
    from slime.loop.record import record_path

    config.check_run_modes()
    if config.train.train_backend == "megatron":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "--train-backend megatron needs a CUDA GPU (megatron-core's optimizer and DDP allocate on it); "
                "use --train-backend torch on a CPU"
            )
    from slime.engines.fleet.placement import check_torchrun_env

    placement = _placement(config)
    if placement is not None:
        check_torchrun_env(config.train, config.engine)
        if placement.servers_off_node0:
            raise ConfigError(
                "the placement puts SGLang servers on nodes other than rank 0's, which this slime does not launch: "
                "start them there and pass --rollout-external-engine-addrs (slime train --dry-run shows the plan)"
            )
    if config.data.offline_data and not Path(config.data.offline_data).is_file():
        raise ConfigError(f"--offline-data={config.data.offline_data!r}: no such JSONL or Parquet file")
    if config.debug.load_debug_rollout_data and not record_path(config.debug.load_debug_rollout_data, 1).is_file():
        raise ConfigError(
            f"--load-debug-rollout-data={config.debug.load_debug_rollout_data!r}: no record of step 1 "
            f"({record_path(config.debug.load_debug_rollout_data, 1)})"
        )
    from slime.rollout.rewards import load_function

    # running engines and no trainer: only the tokenizer of --hf-checkpoint is read here
    tokenizer_only = config.debug.debug_rollout_only and bool(config.engine.rollout_external_engine_addrs)
    for flag, value in (
        ("--hf-checkpoint", config.engine.hf_checkpoint),
        ("--ref-load", config.train.ref_load),
        ("--opd-teacher-load", config.engine.opd_teacher_load),
    ):
        if not value:
            continue
        try:
            check_hf_dir(value, weights=not (tokenizer_only and flag == "--hf-checkpoint"), tokenizer=flag != "--ref-load", flag=flag)
        except CheckpointError as exc:
            if value == DEFAULT_CHECKPOINT:
                raise CheckpointError(f"{exc} (the default warm start is built by scripts/make_warmstart.py)") from None
            raise
    eval_paths = [("--eval-prompt-data", path) for _, path in config.data.eval_datasets]
    for flag, value in (("--prompt-data", config.data.prompt_data), *eval_paths):
        if value and not Path(value).is_file():
            raise ConfigError(f"{flag}={value!r}: {'is a directory, expected' if Path(value).is_dir() else 'no such'} JSONL file")
    for flag, value in (
        ("--custom-rm-path", config.rollout.custom_rm_path),
        ("--dynamic-sampling-filter-path", config.loop.dynamic_sampling_filter_path),
        ("--buffer-filter-path", config.loop.buffer_filter_path),
        ("--rollout-function-path", config.rollout.rollout_function_path if config.rollout.uses_rollout_function else None),
    ):
        if value:
            load_function(value, flag=flag)
    for flag, on, package in (
        ("--use-wandb", config.obs.use_wandb, "wandb"),
        ("--use-tensorboard", config.obs.use_tensorboard, "tensorboard"),
    ):
        if on and importlib.util.find_spec(package) is None:
            raise ConfigError(f"{flag}: the {package} package is not installed (pip install {package})")
    from slime.engines.fleet.plan import build_launch_plan, check_launchable

    # also checks --sglang-config, the GPU / port arithmetic, and that sglang (sglang_router, torch_memory_saver) import
    check_launchable(
        build_launch_plan(
            config.engine, trainer_gpus=_trainer_gpus(config), colocate=config.sync.colocate, in_place_updates=config.updates_in_place()
        )
    )


def _placement(config: Config) -> Placement | None:
    """The run's per-node plan when it names one (``slime.engines.fleet.placement``), else None."""
    from slime.engines.fleet.placement import build_placement, placement_given

    if not placement_given(config.train, config.engine):
        return None
    return build_placement(config.train, config.engine, colocate=config.sync.colocate, rollout_only=config.debug.debug_rollout_only)


def _trainer_gpus(config: Config) -> int:
    from slime.engines.fleet.plan import trainer_gpus

    return trainer_gpus(config.train, rollout_only=config.debug.debug_rollout_only)


def _run(coro):
    """Run ``coro`` on uvloop. SIGTERM (``timeout``, ``kill``, a job scheduler) ends it like Ctrl-C:
    the main task is cancelled, so every ``finally`` runs and launched SGLang servers are stopped
    (they run in their own sessions: a signal to our process group does not reach them).

    Raises:
        KeyboardInterrupt: on SIGINT or SIGTERM.
    """
    import signal

    terminated = False

    async def main():
        task = asyncio.current_task()

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await coro
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep the CLI usable without it
        run = asyncio.run
    try:
        return run(main())
    except asyncio.CancelledError:
        if terminated:
            raise KeyboardInterrupt("SIGTERM") from None
        raise


def _engine(argv: list[str]) -> int:
    if "--sim" in argv:
        from slime.servers.sim.server import main as sim_main

        return sim_main(argv)
    from slime.servers.embedded.server import main as engine_main

    return engine_main(argv)


def _report(argv: list[str]) -> int:
    from slime.obs.report import main as report_main

    return report_main(argv)


def _check_plugin(argv: list[str]) -> int:
    from slime.rollout.plugin_check import main as check_main

    return check_main(argv)


def _bench(argv: list[str]) -> int:
    if not argv or argv[0] not in ("rollout", "learning"):
        print(
            "usage: slime bench {rollout,learning} [options]   (see slime bench rollout --help, slime bench learning --help)",
            file=sys.stderr,
        )
        return 2
    if argv[0] == "learning":
        from slime.bench.learning import main as learning_main

        return learning_main(argv[1:], train=_train_records)
    from slime.bench.rollout import main as bench_main

    return bench_main(argv[1:])


def _train_records(argv: list[str]) -> list[dict[str, Any]]:
    """Run ``slime train ARGV`` in this process (``slime bench learning``'s runs, no progress bar); return its
    ``metrics.jsonl`` records.

    Raises:
        SlimeError: a bad flag or a failed run (the driver's own errors).
    """
    import msgspec
    from transformers.utils import logging as hf_logging

    from slime import cli_args
    from slime.errors import ConfigError
    from slime.loop.driver import run_training

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar at every weight sync (as slime train)
    argv, sglang_args, router_args = cli_args.split_passthrough(argv)
    parser = cli_args.build_parser(argparse.ArgumentParser(prog="slime bench learning (a run)", allow_abbrev=False))
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ConfigError(f"unrecognized slime train arguments: {' '.join(unknown)}")
    config = cli_args.config_from_args(ns, sglang_args=sglang_args, router_args=router_args)
    if not config.engine.hf_checkpoint:
        config = msgspec.structs.replace(
            config, engine=msgspec.structs.replace(config.engine, hf_checkpoint=DEFAULT_CHECKPOINTS[config.data.builtin_task])
        )
    preflight(config)
    _check_run_dir(config)
    _run(run_training(config, progress=False))
    path = Path(config.run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _rollout(argv: list[str]) -> int:
    """``slime rollout``: ``slime train --debug-rollout-only`` (generate, reward and record with
    ``--save-debug-rollout-data``; nothing trains, the weights never change)."""
    return _train(["--debug-rollout-only", *argv], prog="slime rollout")


def _convert(argv: list[str]) -> int:
    from slime.train.megatron.convert_cli import main as convert_main

    return convert_main(argv)


COMMANDS = {
    "train": _train,
    "rollout": _rollout,
    "engine": _engine,
    "report": _report,
    "check-plugin": _check_plugin,
    "convert": _convert,
    "bench": _bench,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: slime {" + ",".join(COMMANDS) + "} [options]\n  slime train --help\n  slime engine --help", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        return COMMANDS[argv[0]](argv[1:])
    except BrokenPipeError:  # e.g. `slime report RUN | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
