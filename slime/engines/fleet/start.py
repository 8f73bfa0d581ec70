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
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from slime.config import EngineConfig, RolloutConfig
from slime.engines.client import CONNECT_TIMEOUT_S, EngineClient
from slime.engines.fleet.groups import ACTOR, TEACHER
from slime.engines.fleet.host import check_launchable
from slime.engines.fleet.plan import build_launch_plan, embedded_processes, teacher_processes
from slime.engines.fleet.plan_specs import LaunchPlan
from slime.engines.fleet.processes import CommandProcess
from slime.engines.fleet.supervisor import EngineSupervisor
from slime.engines.pool import KEEPALIVE_S, MAX_CONNECTIONS, HttpEnginePool
from slime.engines.probe import wait_unless_refused
from slime.engines.router import RouterClient
from slime.errors import ConfigError

__all__ = ["start_rollout", "load_initial_weights", "rejoin_bound", "PoolRegistry", "RolloutEngines"]

log = logging.getLogger(__name__)
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
    processes: dict[str, Any]
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
    timeout_s = engine.startup_timeout_s
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, limit_per_host=0, keepalive_timeout=KEEPALIVE_S),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
    )
    processes: dict[str, Any] = {}
    routers: dict[str, CommandProcess] = {}
    pools: dict[str, HttpEnginePool] = {}
    model_of: dict[str, str] = {}
    try:
        teachers = teacher_processes(engine, seed=seed)  # --opd-teacher-load: one embedded engine (embedded / external backends)
        if plan.backend == "embedded":
            procs: list[Any] = embedded_processes(engine, model_dir=model_dir, weight_version=weight_version, seed=seed)
            urls = await _start_all(procs + teachers, timeout_s)
            processes.update(zip(urls, procs + teachers))
            model_of.update((u, ACTOR) for u in urls[: len(procs)])
            model_of.update((u, TEACHER) for u in urls[len(procs) :])
        elif plan.backend == "sglang":
            procs = [
                CommandProcess(
                    s.name,
                    s.argv,
                    env=s.env,
                    url=s.url,
                    log_path=_log(log_dir, s.name),
                    ready=EngineClient(s.url, session=session, config=rollout).wait_ready,
                )
                for s in plan.servers
            ]
            await _start_all(procs, timeout_s)
            processes.update((p.url, p) for p in procs)
            model_of.update((s.url, s.model) for s in plan.servers)
        elif teachers:  # external actor engines, an embedded teacher (the plan refuses one beside SGLang servers)
            urls = await _start_all(teachers, timeout_s)
            processes.update(zip(urls, teachers))
            model_of.update((u, TEACHER) for u in urls)
        model_of.update((u, ACTOR) for u in plan.external_urls)
        model_of.update((u, TEACHER) for u in plan.teacher_urls)
        router_clients: dict[str, RouterClient] = {}
        registration: dict[str, dict[str, Any]] = {}
        for s in plan.servers:
            if s.role != "regular":
                registration[s.url] = {"worker_type": s.role, **({"bootstrap_port": s.bootstrap_port} if s.bootstrap_port else {})}
        for spec in plan.routers:
            client = RouterClient(spec.url, session=session, config=rollout)
            if spec.argv is not None:
                proc = CommandProcess(
                    f"router-{spec.model}",
                    spec.argv,
                    env={},
                    url=spec.url,
                    ready=client.wait_ready,
                    log_path=_log(log_dir, f"router-{spec.model}"),
                )
                routers[spec.model] = proc
                await proc.start(timeout_s)
            else:  # a running router: fail fast when nothing listens at its address
                await wait_unless_refused(
                    client.wait_ready(timeout_s),
                    [spec.url],
                    min(EXTERNAL_REFUSED_GRACE_S, timeout_s),
                    endpoint="/readiness",
                    hint=f" (not the whole --engine-startup-timeout-s={timeout_s:g}); start the router first, or fix "
                    "--sglang-router-ip / --sglang-router-port",
                )
            if spec.register:
                for s in plan.servers:
                    if s.model == spec.model:
                        await client.add_worker(s.url, **registration.get(s.url, {}))
            elif spec.argv is None and not plan.external_urls:
                model_of.update((u, spec.model) for u in await client.worker_urls())
                log.info("router %s lists workers %s", spec.url, [u for u, m in model_of.items() if m == spec.model])
            if spec.argv is not None or spec.register:
                router_clients[spec.model] = client  # registration follows our restarts
        for model in plan.models():
            urls = [u for u, m in model_of.items() if m == model]
            rejoin_timeout_s = rejoin_bound(engine, rollout, launched=any(u in processes for u in urls))
            router = plan.router_of(model)
            weights = (model_dir or engine.hf_checkpoint, weight_version) if model == ACTOR else None
            pools[model] = HttpEnginePool(
                urls,
                config=rollout,
                session=session,
                router_url=router.url if router else None,
                failure_threshold=engine.circuit_breaker_threshold,
                rejoin_timeout_s=rejoin_timeout_s,
                breaker_cooldown_s=engine.circuit_breaker_cooldown_s,
                weights=weights,
            )
            if plan.backend == "external" or (model == TEACHER and plan.teacher_urls):
                log.info("waiting up to %.0fs for %s engines to answer /health_generate (--engine-startup-timeout-s)", timeout_s, model)
                launched = any(u in processes for u in urls)  # a launched engine still loading may refuse connections: wait
                flag = "--opd-teacher-addrs" if model == TEACHER and plan.teacher_urls else "--rollout-external-engine-addrs"
                await pools[model].wait_ready(
                    timeout_s,
                    refused_grace_s=None if launched else EXTERNAL_REFUSED_GRACE_S,
                    refused_hint=f" (not the whole --engine-startup-timeout-s={timeout_s:g}); start the engines first "
                    f"and wait until they answer /health_generate, or fix the address ({flag})",
                )
        supervisors = {
            model: EngineSupervisor(
                pool,
                config=engine,
                processes={u: processes[u] for u in pool.urls if u in processes},
                router=router_clients.get(model),
                registration=registration,
            )
            for model, pool in pools.items()
        }
        log.info("rollout engines up: %s", {m: {"workers": p.urls, "router": p.router_url} for m, p in pools.items()})
        async with asyncio.TaskGroup() as tg:
            for model, supervisor in supervisors.items():
                tg.create_task(supervisor.run(), name=f"supervisor-{model}")
            try:
                yield RolloutEngines(plan, PoolRegistry(pools), supervisors, processes, routers)
            finally:
                for supervisor in supervisors.values():
                    supervisor.close()
    finally:
        await asyncio.gather(*(r.stop() for r in routers.values()), return_exceptions=True)
        await asyncio.gather(*(p.stop() for p in processes.values()), return_exceptions=True)
        for pool in pools.values():
            await pool.close()
        await session.close()


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


def _hf_config(model_dir: str | Path) -> dict[str, Any]:
    """``model_dir/config.json`` as a dict; {} when it is not a readable local file."""
    try:
        return json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


async def _start_all(procs: list[Any], timeout_s: float) -> list[str]:
    """Start every process concurrently; if one fails, stop them all and raise its error."""
    results = await asyncio.gather(*(p.start(timeout_s) for p in procs), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await asyncio.gather(*(p.stop() for p in procs), return_exceptions=True)
        raise errors[0]
    urls = [r for r in results if isinstance(r, str)]  # no errors: every result is a url
    log.info("engines ready: %s", ", ".join(urls))
    return urls


def _log(log_dir: str | Path | None, name: str) -> Path | None:
    return Path(log_dir) / f"{name}.log" if log_dir else None
