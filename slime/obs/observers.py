"""Everything that watches one run, opened and closed together by the driver.

::

    async with Observers(config.obs, run_dir, num_steps=N, run_config=msgspec.to_builtins(config)) as obs:
        obs.watch(pool=pool, buffer=buffer)          # live values for /metrics
        Scheduler(..., tracer=obs.tracer); run_step(..., tracer=obs.tracer)
        obs.record(record, line)                     # each metrics.jsonl record: TB, W&B, Prometheus, bar

Each step's record first flushes the count lines of warnings repeated during the step (``slime.obs.run_log``,
which also keeps the run's ``train.log`` and ``failed_samples.jsonl``). Closing (also when the run fails) stops
the bar, closes the TensorBoard / W&B writers, stops the ``/metrics`` server and flushes the trace, so a crashed
run keeps its trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from slime.config import ObsConfig
from slime.obs.metrics import BufferGauges, PrometheusExporter, ScalarLoggers
from slime.obs.progress import StepProgress
from slime.obs.run_log import RunLog
from slime.obs.trace import NullTracer, Tracer, open_tracer
from slime.step_record import MetricsRow
from slime.types import JsonObject

if TYPE_CHECKING:  # types only: this part never imports the client side at run time
    from slime.engines.interface import WorkerPool

__all__ = ["Observers"]


class Observers:
    """The trace, the Prometheus exporter, the TensorBoard / W&B writers and the progress bar.

    Args:
        obs: the run's ``obs`` section (what is on).
        run_dir: where ``trace.json`` and ``tb/`` go.
        num_steps: the run's steps (``--num-rollout``), the progress bar's total.
        run_config: the whole run config as JSON-able builtins, for W&B's run config.
        progress: False = plain step lines even on a terminal.

    Raises:
        ConfigError: W&B or TensorBoard asked for and not installed; ``--metrics-port`` taken.
    """

    tracer: Tracer | NullTracer
    exporter: PrometheusExporter | None

    def __init__(
        self, obs: ObsConfig, run_dir: str | Path, *, num_steps: int, run_config: JsonObject, progress: bool = True
    ):
        o = obs
        run_dir = Path(run_dir)
        self.scalars = ScalarLoggers.from_config(o, run_dir=run_dir, config=run_config)
        self.exporter = (
            PrometheusExporter(host=o.metrics_host, port=o.metrics_port) if o.metrics_port is not None else None
        )
        self.tracer = open_tracer(o.enable_trace, run_dir / "trace.json", flush_interval_s=o.trace_flush_interval_s)
        self.progress = StepProgress(num_steps, enabled=progress)
        self.run_log = RunLog(run_dir)  # train.log, failed_samples.jsonl, repeated warnings collapsed

    async def __aenter__(self) -> Observers:
        if self.exporter is not None:
            try:
                await self.exporter.start()
            except BaseException:
                self._close_sync()
                raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def watch(
        self, *, pool: WorkerPool | None = None, buffer: BufferGauges | None = None, groups_per_step: int | None = None
    ) -> None:
        """Live values for ``/metrics`` (see ``PrometheusExporter.watch``); with ``groups_per_step`` (the groups a
        step takes, ``--rollout-batch-size``) the bar shows within a step how many of them are ready."""
        if self.exporter is not None:
            self.exporter.watch(pool=pool, buffer=buffer)
        if buffer is not None and groups_per_step:
            self.progress.watch(lambda: buffer.num_ready, groups_per_step)

    def record(self, record: MetricsRow, line: str | None = None) -> None:
        """One ``metrics.jsonl`` record; ``line`` is printed (a step advances the bar)."""
        self.scalars.log(record)
        if self.exporter is not None:
            self.exporter.observe(record)
        if record.get("kind") == "step":
            self.tracer.counter(
                "groups", ready=record.get("ready_groups_left", 0), partial=record.get("partial_groups_queued", 0)
            )
            self.tracer.counter("tokens_per_s", tokens_per_s=record.get("tokens_per_s", 0.0))
            self.run_log.flush_repeats(f"in step {record.get('step', '?')}")
            if line is not None:
                self.progress.step(line, record)
        else:
            if record.get("kind") == "eval":
                self.progress.eval_result(record)
            if line is not None:
                self.progress.note(line)
        if line is not None:
            self.run_log.write(line)

    def _close_sync(self) -> None:
        self.progress.close()
        self.run_log.close()
        self.scalars.close()
        self.tracer.close()

    async def close(self) -> None:
        """Idempotent."""
        self._close_sync()
        if self.exporter is not None:
            await self.exporter.close()
