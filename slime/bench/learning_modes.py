"""The runs of ``slime bench learning``: each mode's own ``slime train`` flags, the bench's defaults, the flags
the bench owns, and one run's whole argument list (``train_argv``). ``learning.py`` runs them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["VARIANTS", "OWN_FLAGS", "TRAIN_FLAGS", "train_argv"]

VARIANTS: dict[str, list[str]] = {
    "sync": ["--rollout-mode", "sync"],
    "april": ["--rollout-mode", "april"],
    "april-mask": ["--rollout-mode", "april", "--mask-offpolicy-in-partial-rollout"],
    # issue 30's candidates against APRIL's length bias, at the bench's 8 groups a step: "april" keeps 2x in
    # flight (the default since), april-4x the 32 groups it had before, april-drop expires partial groups
    # after --max-staleness versions (--staleness-policy drop) instead of masking their old tokens
    "april-4x": ["--rollout-mode", "april", "--over-sampling-batch-size", "32"],
    "april-drop": ["--rollout-mode", "april", "--staleness-policy", "drop"],
    # no staleness mask (a bound no token reaches): the over-stale prefix trains, weighted by TIS instead
    "april-tis": ["--rollout-mode", "april", "--max-staleness", "100", "--use-tis"],
    "async": ["--rollout-mode", "async"],
    # async at AReaL's eta 4, its default before issue 30 made it 1 (LoopConfig.default_max_staleness)
    "async-eta4": ["--rollout-mode", "async", "--max-staleness", "4"],
    "async-tis": ["--rollout-mode", "async", "--use-tis"],
    "async-mis": ["--rollout-mode", "async", "--mis-level", "token"],
    "async-decoupled": ["--rollout-mode", "async", "--use-decoupled-ppo"],
}
"""Each mode's own ``slime train`` flags."""

OWN_FLAGS = (
    "--rollout-mode",
    "--partial-rollout",
    "--over-sampling-batch-size",
    "--staleness-policy",
    "--mask-offpolicy-in-partial-rollout",
    "--use-tis",
    "--mis-level",
    "--use-decoupled-ppo",
    "--seed",
    "--save",
    "--load",
    "--num-rollout",
    "--eval-interval",
    "--builtin-task",
)
"""Flags the bench sets on every run; refused among the extra flags."""


TRAIN_FLAGS = [
    "--rollout-batch-size",
    "8",
    "--n-samples-per-prompt",
    "8",
    "--global-batch-size",
    "64",
    "--num-eval-prompts",
    "200",
    "--rollout-max-response-len",
    "96",
]
"""The bench's default ``slime train`` flags (sized for the CPU and ``chain``); extra flags after ``--`` override them."""


def train_argv(
    mode: str,
    seed: int,
    run_dir: str | Path,
    *,
    task: str,
    num_rollout: int,
    eval_interval: int,
    extra: Sequence[str] = (),
) -> list[str]:
    """The ``slime train`` arguments of one run: the bench's, then ``extra`` (the last of a repeated flag wins), then the mode's.

    With ``--prompt-data`` among ``extra`` (e.g. the GPU-sized chain, ``--rm-type chain``) there is no
    ``--builtin-task``: ``slime train`` takes one or the other."""
    return [
        *(() if "--prompt-data" in extra else ("--builtin-task", task)),
        "--num-rollout",
        str(num_rollout),
        "--eval-interval",
        str(eval_interval),
        "--seed",
        str(seed),
        "--save",
        str(run_dir),
        *TRAIN_FLAGS,
        *extra,
        *VARIANTS[mode],
    ]
