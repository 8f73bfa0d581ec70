"""The ``slime`` command: ``slime train`` (an RL run, or SFT with ``--loss-type sft_loss``), ``slime rollout`` (generate and record only),
``slime engine`` (the embedded engine, or ``--sim`` the simulated one) and the tools in ``COMMANDS``.

The package: this module (``main``, ``COMMANDS``, ``slime train``'s steps: flags -> config -> checks -> run);
``args.py`` + ``flags.py`` slime's flags (the ``FLAGS`` table) onto the config; ``compat.py`` THUDM/slime's
other flags (checked against the HF config, or logged no-ops); ``preflight.py`` the checks before a run
starts; ``__main__.py`` ``python -m slime.cli`` (as torchrun and the scripts launch it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

# The start-of-run checks (slime/cli/preflight.py; `preflight` re-exported); it imports slime's parts lazily, so `slime --help` stays fast.
from slime.cli.on_ray import add_ray_flags
from slime.cli.preflight import (
    DEFAULT_CHECKPOINTS,
    check_run_dir,
    preflight,
    run_placement,
    trainer_gpus,
)
from slime.cli.run_folder import fresh_run_folder, link_latest

if TYPE_CHECKING:
    from slime.config import Config

__all__ = ["main", "preflight"]

T = TypeVar("T")


def _train(argv: list[str], prog: str = "slime train") -> int:
    """``slime train ARGV``. SIGTERM (or Ctrl-C) in any phase ends it with one line and exit status 130 (``slime.stop``)."""
    from slime import stop

    stop.clear()
    run: dict[str, Config] = {}  # "config": the run's config, once built (named in the interrupted line)
    with stop.sigterm_raises():  # startup; the run itself: _run
        try:
            return _train_run(argv, prog, run)
        except KeyboardInterrupt as exc:  # stop.Stopped included
            stop.final_line(_interrupted_line(prog, run.get("config"), str(exc)))
            return 130


def _interrupted_line(prog: str, config: Config | None, why: str) -> str:
    """The last line of an interrupted run: why (``SIGTERM during startup``, ``SIGTERM``, Ctrl-C), its run directory."""
    why = why or "Ctrl-C"
    if config is None or not Path(config.run_dir).exists():
        return f"{prog}: interrupted ({why}) before the run started"
    hint = f"; resume with --load {config.run_dir}" if config.save_interval else ""
    return f"{prog}: interrupted ({why}); run directory {config.run_dir}{hint}"


def _train_run(argv: list[str], prog: str, run: dict[str, Config]) -> int:
    """``slime train`` inside the SIGTERM guard: flags -> config -> checks -> the run -> its last line.

    Returns the exit status: 0 done (or ``--dry-run`` printed), 2 a bad flag or one of slime's own errors.
    """
    import msgspec

    from slime.errors import SlimeError, first_slime_error

    parsed = _parse_train_flags(argv, prog)
    if isinstance(parsed, int):  # the flags were refused, the error printed
        return parsed
    ns, sglang_args, router_args = parsed
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = _train_config(ns, sglang_args, router_args)
        run["config"] = config
        if ns.ray:
            from slime.cli.on_ray import run_or_plan

            return run_or_plan(ns, config, argv)
        if ns.dry_run:
            return _dry_run(config)
        preflight(config)
        fresh = fresh_run_folder(config.run_dir, load=config.load)  # no --save: a new runs/<time>
        if fresh is not None:
            config = run["config"] = msgspec.structs.replace(config, run_dir=fresh)
        check_run_dir(config)
        if fresh is not None:
            link_latest(fresh)  # runs/latest -> it
        done = _start_run(config, prog, progress=not ns.no_progress)
    except SlimeError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:  # raised inside a task group: report slime's own error plainly
        leaf = first_slime_error(group)
        if leaf is None:
            raise
        print(f"{prog}: error: {leaf}", file=sys.stderr)
        return 2
    if done is not None:  # None: a non-zero rank of a torchrun job, which prints nothing
        print(done)
    return 0


def _parse_train_flags(argv: list[str], prog: str) -> tuple[argparse.Namespace, tuple[str, ...], tuple[str, ...]] | int:
    """``slime train``'s flags: (namespace, ``--sglang-*`` and ``--router-*`` pass-through), or 2 with the error printed."""
    from slime.cli.args import build_parser, split_passthrough
    from slime.errors import SlimeError

    parser = build_parser(
        argparse.ArgumentParser(prog=prog, description="Run GRPO with partial rollouts.", allow_abbrev=False)
    )
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--no-progress", action="store_true", help="plain step lines, no progress bar")
    parser.add_argument(
        "--dry-run", action="store_true", help="print every command the run would start (with its env) and exit"
    )
    add_ray_flags(parser)
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
    return ns, sglang_args, router_args


def _train_config(ns: argparse.Namespace, sglang_args: tuple[str, ...], router_args: tuple[str, ...]) -> Config:
    """The run's config from its flags, the THUDM/slime compat flags checked, the placement defaults filled.

    Raises:
        ConfigError: a bad flag value, a compat flag the model's ``config.json`` contradicts, or (``--load``) a flag
            that contradicts the saved run.
    """
    from slime.cli.args import config_from_args
    from slime.cli.backend_flags import log_megatron_only_flags
    from slime.cli.compat import check_compat_flags
    from slime.cli.resume_flags import config_on_load

    def of_flags(base: Config | None) -> Config:  # base: the saved run of --load, if any
        config = config_from_args(ns, base, sglang_args=sglang_args, router_args=router_args)
        return _with_default_checkpoint(config).with_placement_defaults()

    config = config_on_load(ns, of_flags)
    check_compat_flags(ns, config.engine.hf_checkpoint)  # before --dry-run: reads config.json only
    log_megatron_only_flags(ns, config.train.train_backend)
    return config


def _with_default_checkpoint(config: Config) -> Config:
    """``config`` with the built-in task's shipped warm start as ``--hf-checkpoint`` when none was given."""
    import msgspec

    if config.engine.hf_checkpoint:
        return config
    engine = msgspec.structs.replace(config.engine, hf_checkpoint=DEFAULT_CHECKPOINTS[config.data.builtin_task])
    return msgspec.structs.replace(config, engine=engine)


def _dry_run(config: Config) -> int:
    """``--dry-run``: the checks that need no engine, then the placement and every command the run would start."""
    from slime.cli.plan_inputs import check_plan_inputs
    from slime.engines.fleet.plan import build_launch_plan

    note = check_plan_inputs(config)  # what needs no engine; paths of another machine (a script's /root/...) named
    if note is not None:
        print(note)
    placement = run_placement(config)
    if placement is not None:
        print(placement.format())
    if placement is None or not placement.servers_off_node0:  # else rank 0 starts no server to show
        plan = build_launch_plan(
            config.engine,
            seed=config.seed,
            trainer_gpus=trainer_gpus(config),
            colocate=config.sync.colocate,
            in_place_updates=config.updates_in_place(),
            gpus_per_node=placement.gpus_per_node if placement else None,
        )
        print(plan.format())
    return 0


def _start_run(config: Config, prog: str, *, progress: bool) -> str | None:
    """Run the SFT or RL run of ``config`` to its end; its ``done:`` line (None on a non-zero torchrun rank)."""
    from transformers.utils import logging as hf_logging

    from slime.loop.driver import run_training

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar at every weight sync
    last_words = lambda: _interrupted_line(prog, config, "SIGTERM")  # noqa: E731
    if config.train.loss_type == "sft_loss":
        from slime.loop.sft import run_sft

        summary = _run(run_sft(config, progress=progress), last_words=last_words)
        fmt = lambda x: "n/a (no --eval-prompt-data)" if x is None else f"{x:.4f}"  # noqa: E731
        return (
            f"done: SFT {summary['num_steps']} steps; eval loss {fmt(summary['eval_loss_before'])} -> "
            f"{fmt(summary['eval_loss_after'])}; model {summary['model_dir']}; run dir {config.run_dir}"
        )
    summary = _run(run_training(config, progress=progress), last_words=last_words)
    if not summary:  # a non-zero rank of a torchrun job
        return None
    from slime.loop.outputs import format_done_line

    return format_done_line(summary, config.run_dir)


def _run(coro: Awaitable[T], *, last_words: Callable[[], str] = lambda: "slime: interrupted (SIGTERM)") -> T:
    """Run ``coro`` on uvloop. SIGTERM (``timeout``, ``kill``, a job scheduler) ends it like Ctrl-C:
    the main task is cancelled, so every ``finally`` runs and launched SGLang servers are stopped
    (they run in their own sessions: a signal to our process group does not reach them); loops that
    run long on worker threads stop at the request, and a run still alive ``SLIME_SIGTERM_GRACE_S``
    later is ended with the line ``last_words()`` (``slime.stop.sigterm_cancels``).

    Raises:
        KeyboardInterrupt: on SIGINT or SIGTERM.
    """
    from slime.stop import sigterm_cancels, stop_requested

    async def main() -> T:
        task = asyncio.current_task()
        assert task is not None  # a coroutine run by asyncio.run / uvloop.run is a task
        with sigterm_cancels(task, last_words=last_words):
            return await coro

    run: Callable[[Coroutine[object, object, T]], T] = asyncio.run
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep the CLI usable without it
        pass
    try:
        return run(main())
    except asyncio.CancelledError:
        if stop_requested():
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
        usage = (
            "usage: slime bench {rollout,learning} [options]\n\n"
            "  rollout   delivered tokens/s of sync vs APRIL vs fully async on a long-tail workload (simulated engine by default)\n"
            "  learning  held-out accuracy against wall time of slime train runs, one per mode\n\n"
            "Each one's flags: slime bench rollout --help, slime bench learning --help."
        )
        if argv and argv[0] in ("-h", "--help"):
            print(usage)
            return 0
        problem = (
            f"slime bench: error: unknown benchmark {argv[0]!r}" if argv else "slime bench: error: no benchmark given"
        )
        print(f"{problem}\n{usage}", file=sys.stderr)
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
    from transformers.utils import logging as hf_logging

    from slime.cli import args as cli_args
    from slime.errors import ConfigError
    from slime.loop.driver import run_training

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar at every weight sync (as slime train)
    argv, sglang_args, router_args = cli_args.split_passthrough(argv)
    parser = cli_args.build_parser(argparse.ArgumentParser(prog="slime bench learning (a run)", allow_abbrev=False))
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ConfigError(f"unrecognized slime train arguments: {' '.join(unknown)}")
    config = _with_default_checkpoint(cli_args.config_from_args(ns, sglang_args=sglang_args, router_args=router_args))
    preflight(config)
    check_run_dir(config)
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

SUMMARIES = {
    "train": "run RL (GRPO with partial rollouts), or SFT with --loss-type sft_loss",
    "rollout": "generate, reward and record rollouts only; nothing trains (slime train --debug-rollout-only)",
    "engine": "serve the embedded CPU engine (SGLang HTTP subset), or with --sim a simulated engine",
    "report": "summarize a run directory (finished or crashed)",
    "check-plugin": "check a generate / reward / filter / rollout function against slime's contract",
    "convert": "convert a Hugging Face model to a megatron-core distributed checkpoint and back",
    "bench": "benchmarks: bench rollout (tokens/s: sync vs APRIL vs async), bench learning (accuracy vs wall time)",
}
"""One line per subcommand, for ``slime --help``."""


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {SUMMARIES[name]}" for name in COMMANDS]
    return (
        "usage: slime {"
        + ",".join(COMMANDS)
        + "} [options]\n       slime --version\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\nEach command's flags: slime COMMAND --help (e.g. slime train --help, slime bench rollout --help)."
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("slime")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    """``slime COMMAND ...``; returns the process exit status (2: no or an unknown command)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv and argv[0] in ("-V", "--version"):
        print(f"slime {_version()}")
        return 0
    if not argv or argv[0] not in COMMANDS:
        problem = f"slime: error: unknown command {argv[0]!r}" if argv else "slime: error: no command given"
        print(f"{problem} (choose from {', '.join(COMMANDS)})\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]](argv[1:])
    except BrokenPipeError:  # e.g. `slime report RUN | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
