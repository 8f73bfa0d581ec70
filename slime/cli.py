"""The ``slime`` command: ``slime train`` (an RL run) and ``slime engine`` (the embedded engine)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

__all__ = ["main", "DEFAULT_CHECKPOINT"]

DEFAULT_CHECKPOINT = str(Path(__file__).parent / "data" / "assets" / "arith-warmstart")


def _train(argv: list[str]) -> int:
    import msgspec

    from slime.cli_args import build_parser, config_from_args
    from slime.errors import SlimeError

    parser = build_parser(argparse.ArgumentParser(prog="slime train", description="Run GRPO with partial rollouts."))
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--no-progress", action="store_true", help="plain step lines, no progress bar")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(ns)
        if not config.engine.hf_checkpoint:
            config = msgspec.structs.replace(config, engine=msgspec.structs.replace(config.engine, hf_checkpoint=DEFAULT_CHECKPOINT))
        from slime.loop.driver import run_training

        summary = _run(run_training(config, progress=not ns.no_progress))
    except SlimeError as exc:
        print(f"slime train: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"done: eval accuracy {summary['eval_accuracy_before']:.3f} -> {summary['eval_accuracy_after']:.3f}; "
        f"aborted {summary['aborted_samples']}, resumed {summary['resumed_samples']}, "
        f"max versions in a trained sample {summary['max_versions_in_a_trained_sample']}; run dir {config.run_dir}"
    )
    return 0


def _run(coro):
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep the CLI usable without it
        return asyncio.run(coro)


def _engine(argv: list[str]) -> int:
    if "--sim" in argv:
        from slime.rollout.sim.server import main as sim_main

        return sim_main(argv)
    from slime.rollout.engine.server import main as engine_main

    return engine_main(argv)


COMMANDS = {"train": _train, "engine": _engine}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: slime {" + ",".join(COMMANDS) + "} [options]\n  slime train --help\n  slime engine --help", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
