"""Live and logged metrics: Prometheus ``/metrics`` on the driver, TensorBoard and W&B writers.

Prometheus (``--metrics-port``): served by an aiohttp route on the driver's own event loop, not by
prometheus_client's ``start_http_server`` thread. The scrape then reads the live values (requests
in flight per engine, ready and partial groups) on the loop that owns them, with no lock and no
extra thread; aiohttp is already a dependency. A scrape waits for the loop like any request, so a
blocked loop shows up as a slow scrape. Each exporter has its own ``CollectorRegistry`` (never the
process-wide default), so two runs in one process do not collide.

TensorBoard (``--use-tensorboard``) and W&B (``--use-wandb``) get every number in each record of
``metrics.jsonl`` (nested dicts flattened with ``/``: ``lag_histogram/2``), at the record's
``step``; eval records are prefixed ``eval/``. W&B is imported only when asked for.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from slime.config import ObsConfig
from slime.errors import ConfigError
from slime.step_record import MetricsRow
from slime.types import JsonObject

if TYPE_CHECKING:  # types only: this part never imports the client side at run time
    from slime.engines.interface import WorkerPool

__all__ = ["BufferGauges", "PrometheusExporter", "TensorBoardWriter", "WandbWriter", "ScalarLoggers", "scalars_of"]

log = logging.getLogger(__name__)


class BufferGauges(Protocol):
    """What ``/metrics`` reads of the loop's group buffer (``slime.loop.buffer.DataBuffer``) at each scrape."""

    @property
    def num_partial(self) -> int:
        """Aborted groups waiting to be resumed."""
        ...

    @property
    def num_ready(self) -> int:
        """Finished groups waiting for a train step."""
        ...


# metric name -> (step-record key, help). Gauges set from each step record.
_STEP_GAUGES = {
    "slime_policy_version": ("policy_version", "Policy version the engines hold after the last step"),
    "slime_step": ("step", "Last finished rollout step"),
    "slime_reward_mean": ("reward_mean", "Mean reward of the last step's batch"),
    "slime_accuracy": ("accuracy", "Share of the last batch's samples with reward >= 1"),
    "slime_tokens_per_second": ("tokens_per_s", "Generated tokens per second over the last step"),
    "slime_step_time_seconds": ("step_time_s", "Wall time of the last step"),
    "slime_off_policy_token_fraction": (
        "off_policy_token_fraction",
        "Share of the last batch's trained tokens with version lag > 0",
    ),
    "slime_max_version_lag": ("max_version_lag", "Largest version lag of a token in the last batch"),
}
# metric name (without _total) -> (step-record key, help). Counters incremented by each step record.
_STEP_COUNTERS = {
    "slime_aborted_samples": ("aborted_samples", "Samples aborted and kept as partial rollouts"),
    "slime_resumed_samples": ("resumed_samples", "Partial samples resumed"),
    "slime_failed_samples": ("failed_samples", "Samples marked FAILED (reward or engine refusal)"),
    "slime_generated_tokens": ("generated_tokens", "Tokens generated"),
    "slime_filtered_groups": ("filtered_groups", "Groups rejected by the dynamic-sampling filter"),
    "slime_dropped_stale_groups": ("dropped_stale_groups", "Groups dropped as too stale"),
}


class PrometheusExporter:
    """``GET /metrics`` in the Prometheus text format, from the driver's event loop.

    Args:
        host / port: where to listen; port 0 picks a free one (``self.port`` holds it after ``start``).

    Use: ``async with PrometheusExporter(port=0) as exp: exp.watch(pool=pool, buffer=buffer)``,
    then ``exp.observe(record)`` for every metrics record.
    """

    def __init__(self, *, host: str = "0.0.0.0", port: int = 0):
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.host, self.port = host, port
        self.registry = CollectorRegistry()
        self._gauges = {name: Gauge(name, doc, registry=self.registry) for name, (_, doc) in _STEP_GAUGES.items()}
        self._counters = {name: Counter(name, doc, registry=self.registry) for name, (_, doc) in _STEP_COUNTERS.items()}
        self._eval_accuracy = Gauge("slime_eval_accuracy", "Accuracy of the last evaluation", registry=self.registry)
        self._inflight = Gauge(
            "slime_requests_in_flight", "Generate requests in flight over all engines", registry=self.registry
        )
        self._engine_inflight = Gauge(
            "slime_engine_requests_in_flight",
            "Generate requests in flight per engine",
            ["engine"],
            registry=self.registry,
        )
        self._partial = Gauge(
            "slime_partial_groups_queued", "Aborted groups waiting to be resumed", registry=self.registry
        )
        self._ready = Gauge("slime_ready_groups", "Finished groups waiting for a train step", registry=self.registry)
        self._pool: WorkerPool | None = None
        self._buffer: BufferGauges | None = None
        self._runner: Any = None

    def watch(self, *, pool: WorkerPool | None = None, buffer: BufferGauges | None = None) -> None:
        """Read live values at each scrape: ``pool.num_inflight``, ``pool.clients[i].url/num_inflight``,
        ``buffer.num_partial``, ``buffer.num_ready``."""
        self._pool, self._buffer = pool, buffer

    def observe(self, record: MetricsRow) -> None:
        """Update gauges and counters from one ``metrics.jsonl`` record (step or eval)."""
        if record.get("kind") == "eval":
            self._eval_accuracy.set(float(record.get("accuracy", math.nan)))
            return
        for name, (key, _) in _STEP_GAUGES.items():
            if isinstance(record.get(key), (int, float)):
                self._gauges[name].set(record[key])
        for name, (key, _) in _STEP_COUNTERS.items():
            value = record.get(key)
            if isinstance(value, (int, float)) and value > 0:
                self._counters[name].inc(value)

    def _refresh_live(self) -> None:
        if self._pool is not None:
            self._inflight.set(self._pool.num_inflight)
            for client in self._pool.clients:
                self._engine_inflight.labels(engine=client.url).set(client.num_inflight)
        if self._buffer is not None:
            self._partial.set(self._buffer.num_partial)
            self._ready.set(self._buffer.num_ready)

    def render(self) -> bytes:
        """The current exposition (what a scrape returns)."""
        from prometheus_client import generate_latest

        self._refresh_live()
        return generate_latest(self.registry)

    async def _handle(self, request: object) -> Any:  # aiohttp's web.Response (untyped third-party, imported lazily)
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST

        return web.Response(body=self.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> int:
        """Listen; returns the bound port (logged). Raises ConfigError naming ``--metrics-port`` if taken."""
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(f"--metrics-port={self.port}: cannot listen on {self.host}:{self.port}: {exc}") from exc
        self._runner = runner
        self.port = runner.addresses[0][1]
        log.info("Prometheus metrics at http://%s:%d/metrics", self.host, self.port)
        return self.port

    async def close(self) -> None:
        """Stop listening. Idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> PrometheusExporter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def scalars_of(record: MetricsRow) -> dict[str, float]:
    """Every number of a metrics record, flattened; eval records under ``eval/``.

    Example: ``{"kind": "step", "step": 3, "reward_mean": 0.5, "lag_histogram": {"0": 90, "1": 10}}``
    -> ``{"reward_mean": 0.5, "lag_histogram/0": 90.0, "lag_histogram/1": 10.0}``.
    """
    prefix = "eval/" if record.get("kind") == "eval" else ""
    out: dict[str, float] = {}

    def walk(key: str, value: object) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{key}/{k}", v)
        elif isinstance(value, (int, float)):
            out[prefix + key] = float(value)

    for key, value in record.items():
        if key not in ("kind", "step"):
            walk(key, value)
    return out


class ScalarWriter(Protocol):
    def log(self, scalars: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardWriter:
    """``torch.utils.tensorboard.SummaryWriter`` at ``log_dir``, flushed after every record."""

    def __init__(self, log_dir: str | Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ConfigError(
                f"--use-tensorboard needs the tensorboard package (pip install tensorboard): {exc}"
            ) from exc
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbWriter:
    """A W&B run (``wandb.init(project, group, config, dir)``); ``wandb`` is imported only here.

    Raises:
        ConfigError: naming ``--use-wandb`` when the package is not installed.
    """

    def __init__(self, *, project: str | None, group: str | None, config: JsonObject, run_dir: str | Path):
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError(
                "--use-wandb: the wandb package is not installed (pip install wandb), or drop --use-wandb"
            ) from exc
        self._run = wandb.init(project=project, group=group, config=config, dir=str(run_dir))

    def log(self, scalars: dict[str, float], step: int) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


class ScalarLoggers:
    """Fans each metrics record out to the configured writers (none, TensorBoard, W&B, or both)."""

    def __init__(self, writers: list[ScalarWriter]):
        self.writers = writers

    @classmethod
    def from_config(cls, obs: ObsConfig, *, run_dir: str | Path, config: JsonObject) -> ScalarLoggers:
        """Writers from an ``ObsConfig``; ``config`` (the resolved run config) goes to W&B."""
        writers: list[ScalarWriter] = []
        if obs.use_wandb:
            writers.append(
                WandbWriter(project=obs.wandb_project, group=obs.wandb_group, config=config, run_dir=run_dir)
            )
        if obs.use_tensorboard:
            writers.append(TensorBoardWriter(obs.tb_dir or Path(run_dir) / "tb"))
        return cls(writers)

    def log(self, record: MetricsRow) -> None:
        if not self.writers:
            return
        scalars, step = scalars_of(record), int(record.get("step", 0))
        for writer in self.writers:
            writer.log(scalars, step)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
        self.writers = []
