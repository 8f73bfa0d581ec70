"""``ObsConfig``: what the run shows and records beyond metrics.jsonl (``slime.obs``)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from slime.config._base import STRUCT, Range, check_ranges

__all__ = ["ObsConfig"]


class ObsConfig(msgspec.Struct, **STRUCT):
    """What the run shows and records beyond metrics.jsonl (``slime/obs/``)."""

    enable_trace: bool = False
    """Write a Chrome/Perfetto trace of requests, rewards, train steps, weight syncs and evals to
    ``RUN_DIR/trace.json`` (``--enable-trace``)."""
    trace_flush_interval_s: Annotated[float, Range(ge=0, flag="trace_flush_interval_s")] = 5.0
    """How often new trace events are appended to the file (a crash keeps all but the last interval)."""
    metrics_port: Annotated[int, Range(ge=0, le=65535, note="(0 = any free port)")] | None = None
    """Serve Prometheus ``/metrics`` from the driver on this port (``--metrics-port``); None = off,
    0 = any free port (logged at start)."""
    metrics_host: str = "0.0.0.0"
    """Address the ``/metrics`` server binds (all interfaces, like prometheus_client's own server)."""
    use_tensorboard: bool = False
    """Log every scalar of each step record to TensorBoard (``--use-tensorboard``)."""
    tb_dir: str = ""
    """TensorBoard log directory (``--tb-dir``); empty = ``RUN_DIR/tb``."""
    use_wandb: bool = False
    """Log every scalar of each step record to Weights & Biases (``--use-wandb``; needs ``wandb``)."""
    wandb_project: str | None = None
    """W&B project (``--wandb-project``); None = W&B's default."""
    wandb_group: str | None = None
    """W&B run group (``--wandb-group``)."""

    def validate(self) -> None:
        """Check this section's values.

        Raises:
            ConfigError: naming the flag.
        """
        check_ranges(self)
