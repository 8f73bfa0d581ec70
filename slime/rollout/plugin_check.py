"""``slime check-plugin PATH [--kind generate|reward|filter|rollout]``: run a plugin against slime's contract.

``PATH`` is ``pkg.module.func``, ``pkg.module:func`` or ``path/to/file.py:func``. For a generate
function the embedded engine is started in-process on a tiny random Llama (vocab 64; ``--model
DIR`` serves your own HF model instead, e.g. for a multi-turn function with its tokenizer), and
the function is called the way the scheduler calls it::

    await fn(sample, sampling_params, pool=pool, max_response_len=N, engine_version=0, decode=decode)

Checked for ``generate``: it is async and takes those arguments; it returns the same Sample or a
non-empty list of finished Samples; every per-token list is as long as ``response_ids``; the mask
is 0/1 and logprobs are finite and <= 0; a status is set; tokens are only appended; an abort in the
middle of generation comes back PARTIAL with its tokens kept, and a second call finishes it. A
function whose required arguments are a reward function's (``(sample)``, or THUDM/slime's ``(args,
sample)``) fails the signature check with a hint to pass ``--kind reward``. For ``reward``: it takes
``(sample)`` and returns a finite float (not a bool) for a finished sample, or with ``--reward-key
KEY`` (as slime train's) a dict whose KEY entry is one (a sync function is a warning: slime runs it
in a thread, where a hang cannot be cancelled). For ``filter`` (dynamic sampling): a ``bool``.
For ``rollout`` (``--rollout-function-path``, THUDM/slime's whole-step contract): it takes ``(args,
rollout_id, data_buffer, evaluation=False)``; one call on two probe prompts (2 samples each, the
engine at ``args.sglang_router_ip:port`` and ``args.pool``) returns groups that convert
(``slime.rollout.slime_compat.to_groups``: aligned, finished, 0/1 mask, finite logprobs <= 0);
missing rewards or logprobs and a group count other than ``args.rollout_batch_size`` are warnings.

Output: one ``PASS``/``FAIL``/``WARN`` line per check naming the problem precisely, then
``RESULT: PASS`` or ``RESULT: FAIL``. Exit status 0 when nothing failed, else 1.

Not covered: group reward functions, buffer filters, weight updates mid-generation, other inputs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import inspect
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slime.rollout.plugin_contracts import (  # re-exported
    Report,
    check_filter,
    check_generate,
    check_reward,
    check_rollout,
    generate_signature_problem,
)
from slime.rollout.rewards import load_function

__all__ = [
    "main",
    "load_plugin",
    "check_generate",
    "check_reward",
    "check_filter",
    "check_rollout",
    "generate_signature_problem",
    "Report",
]


def load_plugin(spec: str) -> Callable[..., Any]:
    """Import ``file.py:func`` (by path) or ``pkg.module.func`` / ``pkg.module:func``. Raises ConfigError."""
    return load_function(spec, flag="check-plugin PATH")


def _takes_tokenizer(fn: Any) -> bool:
    try:
        return "tokenizer" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


async def _run(fn: Callable[..., Any], args: argparse.Namespace, report: Report) -> None:
    if args.kind == "reward":
        return await check_reward(fn, report=report, timeout_s=args.timeout_s, reward_key=args.reward_key)
    if args.kind == "filter":
        return check_filter(fn, report=report)
    if args.kind == "generate":  # the signature before starting an engine for it (tokenizer= is bound below)
        if (
            problem := generate_signature_problem(functools.partial(fn, tokenizer=None) if _takes_tokenizer(fn) else fn)
        ) is not None:
            report.fail(problem)
            return
    from transformers.utils import logging as hf_logging

    from slime.config import RolloutConfig
    from slime.engines.pool import HttpEnginePool
    from slime.servers.embedded import EngineServer

    hf_logging.disable_progress_bar()  # keep the report line-oriented
    with tempfile.TemporaryDirectory(prefix="slime-check-plugin-") as tmp:
        model_dir = args.model
        decode: Callable[[list[int]], str] = lambda ids: " ".join(f"w{i}" for i in ids)  # noqa: E731
        tok = None
        if model_dir is None:
            from slime.servers.embedded.tiny import write_tiny_llama

            model_dir = await asyncio.to_thread(write_tiny_llama, Path(tmp) / "tiny", seed=0)
        else:
            from slime.errors import CheckpointError
            from slime.hf_checkpoint import check_hf_dir

            try:
                await asyncio.to_thread(check_hf_dir, model_dir, tokenizer=True, flag="--model")
            except CheckpointError as exc:
                report.fail(str(exc))
                return
            with contextlib.suppress(Exception):  # a model directory without a tokenizer
                from transformers import AutoTokenizer

                tok = await asyncio.to_thread(AutoTokenizer.from_pretrained, model_dir)
                decode = lambda ids: str(tok.decode(ids, skip_special_tokens=True))  # noqa: E731
        if _takes_tokenizer(fn):  # as slime train does: the run's tokenizer is bound as tokenizer=
            if tok is None:
                report.fail(
                    "takes tokenizer=: pass --model DIR, a model directory with a tokenizer (and a chat "
                    "template if the function renders conversations), so it can be bound as slime train binds it"
                )
                return
            fn = functools.partial(fn, tokenizer=tok)
        async with EngineServer(model_dir, port=0, seed=0, weight_version="0", num_threads=1) as server:
            config = RolloutConfig(request_timeout_s=args.timeout_s, max_retries=0)
            async with HttpEnginePool([server.url], config=config) as pool:
                if args.kind == "rollout":
                    await check_rollout(
                        fn, pool=pool, report=report, model_dir=str(model_dir), timeout_s=args.timeout_s
                    )
                else:
                    await check_generate(fn, pool=pool, report=report, decode=decode, timeout_s=args.timeout_s)


def main(argv: list[str] | None = None) -> int:
    """``slime check-plugin``; returns 0 when every check passed, else 1."""
    p = argparse.ArgumentParser(
        prog="slime check-plugin",
        description="Check a generate / reward / filter / rollout plugin against slime's contract.",
    )
    p.add_argument("path", help="pkg.module.func, pkg.module:func or path/to/file.py:func")
    p.add_argument("--kind", choices=["generate", "reward", "filter", "rollout"], default="generate")
    p.add_argument("--model", default=None, help="HF model dir for the embedded engine (default: a tiny random Llama)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="per call of the plugin")
    p.add_argument(
        "--reward-key",
        default=None,
        help="--kind reward: the entry of a dict the function returns that is the reward (as slime train's)",
    )
    args = p.parse_args(argv)
    report = Report(args.kind)
    try:
        fn = load_plugin(args.path)
    except Exception as exc:  # ConfigError, or whatever importing the user's module raised
        report.fail(f"cannot load {args.path!r}: {type(exc).__name__}: {exc}")
    else:
        asyncio.run(_run(fn, args, report))
    print("RESULT: FAIL" if report.failed else "RESULT: PASS", flush=True)
    return 1 if report.failed else 0
