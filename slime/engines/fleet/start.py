"""``start_rollout``: bring up a run's inference side from its ``LaunchPlan`` and tear it down after.

::

    plan ──► start servers (all at once; each: start, wait /health_generate)   [sglang | embedded]
         ──► routers: launch (worker urls on the command line) and wait /readiness,
             or use a running one (register our servers, or list its workers)
         ──► one HttpEnginePool per model (router url + worker urls) ──► PoolRegistry (actor = default)
         ──► one EngineSupervisor per pool (health checks, restarts / sidelining), in a TaskGroup
    exit: supervisors stop, routers stop, servers stop (SIGTERM, then SIGKILL), pools close

If any server or router fails to start, everything started so far is stopped and the error
(naming the server and its log file) is raised. External engines are only waited for here; the
driver then gives them the run's initial weights (``load_initial_weights``). An external address
(engines, a running router) that refuses every connection for ``EXTERNAL_REFUSED_GRACE_S`` fails the
start then, not at ``--engine-startup-timeout-s``: nothing listens there (a launched server still
loading is waited for the whole timeout). With no engine of a pool left in rotation the run ends
after ``rejoin_bound`` (``EnginesGone``, one line naming each engine and why).
Logs of launched SGLang processes go to ``log_dir/<name>.log``. Not covered: relaunching a router
that dies (its pool's calls fail after their retries), servers on other nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path

from slime.config import EngineConfig, RolloutConfig
from slime.engines.client import EngineClient
from slime.engines.fleet.groups import ACTOR, TEACHER
from slime.engines.fleet.host import check_launchable
from slime.engines.fleet.plan import build_launch_plan, embedded_processes, teacher_processes
from slime.engines.fleet.plan_specs import LaunchPlan, RouterSpec, ServerSpec
from slime.engines.fleet.processes import CommandProcess, EmbeddedEngineProcess
from slime.engines.fleet.supervisor import EngineSupervisor
from slime.engines.pool import HttpEnginePool
from slime.engines.pool_session import new_session
from slime.engines.probe import wait_unless_refused
from slime.engines.router import RouterClient, WorkerRegistration
from slime.errors import ConfigError
from slime.types import JsonObject

__all__ = ["start_rollout", "load_initial_weights", "rejoin_bound", "PoolRegistry", "RolloutEngines"]

log = logging.getLogger(__name__)
Process = CommandProcess | EmbeddedEngineProcess
"""A server ``start_rollout`` starts: a launched command (SGLang, a router) or an embedded engine."""
EXTERNAL_REJOIN_CHECKS = 3
"""Health-check intervals a pool of external engines waits, with none in rotation, for one to answer
again before the run ends (``EnginesGone``): nothing here can restart them."""
EXTERNAL_REFUSED_GRACE_S = 5.0
"""Seconds an external address (an engine or router nobody here launched) may refuse every connection
before the start fails, instead of at ``--engine-startup-timeout-s``: nothing listens there."""


class PoolRegistry(Mapping[str, HttpEnginePool]):
    """``model -> HttpEnginePool``; ``default`` is the actor's pool (the policy; the only one updated)."""

    def __init__(self, pools: Mapping[str, HttpEnginePool], default: str = ACTOR):
        if default not in pools:
            raise ValueError(f"no pool for the default model {default!r} (have {sorted(pools)})")
        self._pools, self.default_model = dict(pools), default

    def __getitem__(self, model: str) -> HttpEnginePool:
        if model not in self._pools:
            raise KeyError(f"no engines serve model {model!r} (have {sorted(self._pools)})")
        return self._pools[model]

    def __iter__(self) -> Iterator[str]:
        return iter(self._pools)

    def __len__(self) -> int:
        return len(self._pools)

    @property
    def default(self) -> HttpEnginePool:
        return self._pools[self.default_model]


@dataclasses.dataclass
class RolloutEngines:
    plan: LaunchPlan
    pools: PoolRegistry
    supervisors: dict[str, EngineSupervisor]
    """model -> its pool's supervisor."""
    processes: dict[str, Process]
    """worker url -> its process (launched servers and embedded engines)."""
    routers: dict[str, CommandProcess]
    """model -> its launched router process."""


@contextlib.asynccontextmanager
async def start_rollout(
    engine: EngineConfig,
    rollout: RolloutConfig,
    *,
    model_dir: str | None = None,
    weight_version: str = "0",
    seed: int = 0,
    log_dir: str | Path | None = None,
    trainer_gpus: int = 0,
    colocate: bool = False,
    in_place_updates: bool = False,
) -> AsyncIterator[RolloutEngines]:
    """Start (or attach to) the engines of ``build_launch_plan(engine, ...)``; yield them running.

    ``trainer_gpus`` / ``colocate`` / ``in_place_updates``: as ``build_launch_plan``.

    Raises:
        ConfigError: from the plan, or a package its commands need that cannot be imported
            (``check_launchable``). EngineError: a server or router that did not come up in
            ``startup_timeout_s``, or a running router that could not be listed or registered with.
    """
    plan = build_launch_plan(
        engine,
        model_dir=model_dir,
        weight_version=weight_version,
        seed=seed,
        trainer_gpus=trainer_gpus,
        colocate=colocate,
        in_place_updates=in_place_updates,
    )
    check_launchable(plan)
    for note in plan.notes:
        log.info("launch plan: %s", note)
    fleet = _Startup(plan, engine, rollout, log_dir=log_dir)
    try:
        await fleet.start_servers(model_dir=model_dir, weight_version=weight_version, seed=seed)
        await fleet.start_routers()
        await fleet.open_pools(weights=((model_dir or engine.hf_checkpoint), weight_version))
        supervisors = fleet.supervisors()
        log.info(
            "rollout engines up: %s", {m: {"workers": p.urls, "router": p.router_url} for m, p in fleet.pools.items()}
        )
        async with asyncio.TaskGroup() as tg:
            for model, supervisor in supervisors.items():
                tg.create_task(supervisor.run(), name=f"supervisor-{model}")
            try:
                yield RolloutEngines(plan, PoolRegistry(fleet.pools), supervisors, fleet.processes, fleet.routers)
            finally:
                for supervisor in supervisors.values():
                    supervisor.close()
    finally:
        await fleet.stop()


class _Startup:
    """What ``start_rollout`` started so far, step by step (servers, routers, pools), and stopping it all."""

    def __init__(self, plan: LaunchPlan, engine: EngineConfig, rollout: RolloutConfig, *, log_dir: str | Path | None):
        self.plan, self.engine, self.rollout = plan, engine, rollout
        self.timeout_s = engine.startup_timeout_s
        self.session = new_session()
        self.processes: dict[str, Process] = {}
        """worker url -> its process (launched servers and embedded engines)."""
        self.routers: dict[str, CommandProcess] = {}
        self.router_clients: dict[str, RouterClient] = {}
        """model -> the router whose registration follows our restarts."""
        self.pools: dict[str, HttpEnginePool] = {}
        self.model_of: dict[str, str] = {}
        """worker url -> the model it serves."""
        self.registration = {s.url: _registration(s) for s in plan.servers if s.role != "regular"}
        """PD worker url -> what a router registers it with."""
        self._log_dir = log_dir

    async def start_servers(self, *, model_dir: str | None, weight_version: str, seed: int) -> None:
        """Start the plan's servers (all at once; each waited for) and note which model each serves."""
        plan = self.plan
        teachers = teacher_processes(
            self.engine, seed=seed
        )  # --opd-teacher-load: one embedded engine (embedded / external backends)
        if plan.backend == "embedded":
            procs = embedded_processes(self.engine, model_dir=model_dir, weight_version=weight_version, seed=seed)
            urls = await self._start_all([*procs, *teachers])
            self.model_of.update((u, ACTOR) for u in urls[: len(procs)])
            self.model_of.update((u, TEACHER) for u in urls[len(procs) :])
        elif plan.backend == "sglang":
            await self._start_all([self._command(s.name, s.argv, s.env, s.url) for s in plan.servers])
            self.model_of.update((s.url, s.model) for s in plan.servers)
        elif teachers:  # external actor engines, an embedded teacher (the plan refuses one beside SGLang servers)
            self.model_of.update((u, TEACHER) for u in await self._start_all(teachers))
        self.model_of.update((u, ACTOR) for u in plan.external_urls)
        self.model_of.update((u, TEACHER) for u in plan.teacher_urls)

    async def _start_all(self, procs: Sequence[Process]) -> list[str]:
        urls = await _start_all(procs, self.timeout_s)
        self.processes.update(zip(urls, procs))
        return urls

    def _command(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], url: str, *, client: EngineClient | None = None
    ) -> CommandProcess:
        """A launched server or router, ready when ``client`` (default: an engine client of ``url``) is."""
        ready = (client or EngineClient(url, session=self.session, config=self.rollout)).wait_ready
        return CommandProcess(name, argv, env=env, url=url, log_path=_log(self._log_dir, name), ready=ready)

    async def start_routers(self) -> None:
        """Launch each planned router (or wait for a running one), then register or list its workers."""
        for spec in self.plan.routers:
            client = RouterClient(spec.url, session=self.session, config=self.rollout)
            if spec.argv is not None:
                proc = self._command(f"router-{spec.model}", spec.argv, {}, spec.url, client=client)
                self.routers[spec.model] = proc
                await proc.start(self.timeout_s)
            else:
                await self._wait_running_router(spec, client)
            await self._enlist(spec, client)
            if spec.argv is not None or spec.register:
                self.router_clients[spec.model] = client  # registration follows our restarts

    async def _wait_running_router(self, spec: RouterSpec, client: RouterClient) -> None:
        """Wait for a running router to be ready; fail fast when nothing listens at its address."""
        timeout_s = self.timeout_s
        await wait_unless_refused(
            client.wait_ready(timeout_s),
            [spec.url],
            min(EXTERNAL_REFUSED_GRACE_S, timeout_s),
            endpoint="/readiness",
            hint=f" (not the whole --engine-startup-timeout-s={timeout_s:g}); start the router first, or fix "
            "--sglang-router-ip / --sglang-router-port",
        )

    async def _enlist(self, spec: RouterSpec, client: RouterClient) -> None:
        """Register our servers with a running router, or take the workers a running one lists."""
        if spec.register:
            for s in self.plan.servers:
                if s.model == spec.model:
                    await client.add_worker(s.url, **self.registration.get(s.url, {}))
        elif spec.argv is None and not self.plan.external_urls:
            self.model_of.update((u, spec.model) for u in await client.worker_urls())
            log.info("router %s lists workers %s", spec.url, [u for u, m in self.model_of.items() if m == spec.model])

    async def open_pools(self, *, weights: tuple[str, str]) -> None:
        """One pool per model (the actor's holds ``weights``); engines nobody here launched are waited for."""
        engine = self.engine
        for model in self.plan.models():
            urls = [u for u, m in self.model_of.items() if m == model]
            # Ray-placed engines (slime train --ray) are restarted on their bundles: waited for as launched ones
            launched = any(u in self.processes for u in urls) or bool(engine.ray_placed_engines)
            router = self.plan.router_of(model)
            self.pools[model] = HttpEnginePool(
                urls,
                config=self.rollout if model == ACTOR else self.rollout.without_routes,  # a teacher's are not replayed
                session=self.session,
                router_url=router.url if router else None,
                failure_threshold=engine.circuit_breaker_threshold,
                rejoin_timeout_s=rejoin_bound(engine, self.rollout, launched=launched),
                breaker_cooldown_s=engine.circuit_breaker_cooldown_s,
                weights=weights if model == ACTOR else None,
            )
            if self.plan.backend == "external" or (model == TEACHER and self.plan.teacher_urls):
                await self._wait_external(model, launched=launched)

    async def _wait_external(self, model: str, *, launched: bool) -> None:
        """Wait for ``model``'s running engines; where none was launched here, fail fast when nothing listens."""
        timeout_s = self.timeout_s
        log.info(
            "waiting up to %.0fs for %s engines to answer /health_generate (--engine-startup-timeout-s)",
            timeout_s,
            model,
        )
        flag = (
            "--opd-teacher-addrs" if model == TEACHER and self.plan.teacher_urls else "--rollout-external-engine-addrs"
        )
        await self.pools[model].wait_ready(
            timeout_s,
            refused_grace_s=None
            if launched
            else EXTERNAL_REFUSED_GRACE_S,  # a launched engine still loading may refuse: wait
            refused_hint=f" (not the whole --engine-startup-timeout-s={timeout_s:g}); start the engines first "
            f"and wait until they answer /health_generate, or fix the address ({flag})",
        )

    def supervisors(self) -> dict[str, EngineSupervisor]:
        """One supervisor per pool: restarts the workers launched here, follows the router's registration."""
        return {
            model: EngineSupervisor(
                pool,
                config=self.engine,
                processes={u: self.processes[u] for u in pool.urls if u in self.processes},
                router=self.router_clients.get(model),
                registration=self.registration,
            )
            for model, pool in self.pools.items()
        }

    async def stop(self) -> None:
        """Routers, then servers (SIGTERM, then SIGKILL), then pools and the session; errors are not raised."""
        await asyncio.gather(*(r.stop() for r in self.routers.values()), return_exceptions=True)
        await asyncio.gather(*(p.stop() for p in self.processes.values()), return_exceptions=True)
        for pool in self.pools.values():
            await pool.close()
        await self.session.close()


def rejoin_bound(engine: EngineConfig, rollout: RolloutConfig, *, launched: bool) -> float:
    """Seconds a pool's generate waits for a worker to come back when none is in rotation (then
    ``EnginesGone`` ends the run): a restart's bound (``--engine-startup-timeout-s`` plus
    ``--control-timeout-s``) when the pool has engines we launched, else ``EXTERNAL_REJOIN_CHECKS``
    health-check intervals (the breaker cooldown when health checks are off). Example, defaults: 180 s
    launched, 30 s external."""
    if launched:
        return engine.startup_timeout_s + rollout.control_timeout_s
    return EXTERNAL_REJOIN_CHECKS * (engine.health_check_interval_s or engine.circuit_breaker_cooldown_s)


SHAPE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)
"""``config.json`` fields two checkpoints must share for one's weights to load into the other's model."""


async def load_initial_weights(pool: HttpEnginePool, model_dir: str, weight_version: str) -> None:
    """Give running (external) engines the run's weights at start: ``/update_weights_from_disk`` of
    ``model_dir`` at ``weight_version``, cache flushed (nothing was sent to them yet).

    An external engine serves whatever it last loaded, e.g. another run's final weights; without
    this the trainer would start from ``model_dir`` and the engine from those. Each engine's
    ``/model_info`` is checked first: its ``architectures`` and ``model_type`` (when reported) must
    be ``model_dir``'s, and when its ``model_path`` is a directory on this machine, the ``SHAPE_KEYS``
    of both ``config.json`` files must agree.

    Raises:
        ConfigError: an engine serves an incompatible model (one line naming both).
        EngineError: from ``/model_info`` or the update.
    """
    ours = _hf_config(model_dir)
    for client in pool.clients:
        info = await client.model_info()
        served = info.get("model_path")
        theirs = {k: info.get(k) for k in ("architectures", "model_type")} | (_hf_config(served) if served else {})
        problems = [
            f"{key} {theirs[key]!r} (engine) vs {ours[key]!r} (run)"
            for key in ("architectures", *SHAPE_KEYS)
            if ours.get(key) is not None and theirs.get(key) is not None and ours[key] != theirs[key]
        ]
        if problems:
            raise ConfigError(
                f"the external engine {client.url} serves {served!r}, which is not the model of this run "
                f"({model_dir}): {'; '.join(problems)}; start it with --model-path {model_dir}"
            )
        log.info(
            "external engine %s serves %s (weight_version %s): loading this run's %s as version %s",
            client.url,
            served,
            info.get("weight_version"),
            model_dir,
            weight_version,
        )
    await pool.update_weights_from_disk(model_dir, weight_version, flush_cache=True)


def _hf_config(model_dir: str | Path) -> JsonObject:
    """``model_dir/config.json`` as a dict; {} when it is not a readable local file."""
    try:
        return json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


async def _start_all(procs: Sequence[Process], timeout_s: float) -> list[str]:
    """Start every process concurrently; if one fails, stop them all and raise its error."""
    results = await asyncio.gather(*(p.start(timeout_s) for p in procs), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await asyncio.gather(*(p.stop() for p in procs), return_exceptions=True)
        raise errors[0]
    urls = [r for r in results if isinstance(r, str)]  # no errors: every result is a url
    log.info("engines ready: %s", ", ".join(urls))
    return urls


def _registration(server: ServerSpec) -> WorkerRegistration:
    """A PD server's ``add_worker`` fields: its role, and a prefill server's bootstrap port."""
    fields = WorkerRegistration(worker_type=server.role)
    if server.bootstrap_port:
        fields["bootstrap_port"] = server.bootstrap_port
    return fields


def _log(log_dir: str | Path | None, name: str) -> Path | None:
    return Path(log_dir) / f"{name}.log" if log_dir else None
