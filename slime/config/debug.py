"""``DebugConfig``: record and replay of rollouts, and the one-sided runs (``slime.loop.record``)."""

from __future__ import annotations

import msgspec

from slime.config._base import STRUCT
from slime.errors import ConfigError

__all__ = ["DebugConfig"]


class DebugConfig(msgspec.Struct, **STRUCT):
    """Record and replay of rollouts, and the one-sided runs (THUDM/slime's debug flags).

    Record and replay paths are templates with ``{rollout_id}``, the 1-based step number (the
    ``step`` of metrics.jsonl), e.g. ``runs/x/rollout_{rollout_id}.msgpack``.
    """

    save_debug_rollout_data: str | None = None
    """Write each step's groups, as taken for training (before staleness masking), to this template
    (``--save-debug-rollout-data``): a ``slime.loop.record.RolloutRecord`` in the format of the suffix
    (``.jsonl`` JSON lines, ``.pt`` a torch file, else msgpack; ``slime.loop.record.FORMATS``); a rollout-only
    run without it keeps them in ``RUN_DIR/rollouts/rollout_{rollout_id}.jsonl``."""
    load_debug_rollout_data: str | None = None
    """Train on recorded groups, step by step, with no engine (``--load-debug-rollout-data``; implies
    ``debug_train_only``)."""
    debug_rollout_only: bool = False
    """Generate and reward, never train: weights never change (``--debug-rollout-only``, ``slime rollout``)."""
    debug_train_only: bool = False
    """Train only, on ``load_debug_rollout_data``: no engine, no generation, no eval, no weight sync
    (``--debug-train-only``)."""

    @property
    def train_only(self) -> bool:
        return self.debug_train_only or self.load_debug_rollout_data is not None

    def validate(self) -> None:
        """Check this section's values.

        Raises:
            ConfigError: naming the flag.
        """
        if self.debug_rollout_only and self.train_only:
            raise ConfigError("--debug-rollout-only with --debug-train-only / --load-debug-rollout-data: pick one")
        for flag, template in (
            ("--save-debug-rollout-data", self.save_debug_rollout_data),
            ("--load-debug-rollout-data", self.load_debug_rollout_data),
        ):
            if template is None:
                continue
            try:
                ok = template.format(rollout_id=1) != template.format(rollout_id=2)
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigError(
                    f"{flag}={template!r}: not a path template ({type(exc).__name__}: {exc}); use {{rollout_id}}"
                ) from None
            if not ok:
                raise ConfigError(f"{flag}={template!r}: the path needs {{rollout_id}} (one file per step)")
