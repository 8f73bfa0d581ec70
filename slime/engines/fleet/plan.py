"""The launch plan: which SGLang servers, routers or embedded engines a run starts (or attaches to).

``build_launch_plan`` turns ``EngineConfig`` into commands without starting anything, so ``slime
train --dry-run`` prints exactly what a run would start. Per SGLang server (docs/sglang.md#launch)::

    CUDA_VISIBLE_DEVICES=<its gpus> python -m sglang.launch_server --model-path P --host H --port N
        --tp-size <gpus per engine> --weight-version <policy version>
        [--disaggregation-mode prefill|decode] [--disaggregation-bootstrap-port B]   # PD groups only
        <every --sglang-* flag, prefix stripped, values untouched; a group's YAML args override them>

and per model served by several servers (or by PD groups, or given ``--router-*`` flags), one router
(docs/sglang.md#router): ``python -m sglang_router.launch_router --worker-urls U... --host H --port P <every --router-*
flag, prefix stripped>``, or for PD ``--pd-disaggregation --prefill U B ... --decode U ...``. A model
with one regular server gets no router: ``HttpEnginePool`` calls the server directly (a router in front
of one worker adds a hop and a process, nothing else). With ``--sglang-router-ip/--sglang-router-port``
the actor's router is not launched: the launched servers are registered with it (``POST /workers``).

GPUs and the trainer (``trainer_gpus``: the trainer's GPUs are the first ones visible, 0 for a CPU
trainer). With ``--colocate`` the servers are numbered from GPU 0 and share the trainer's GPUs;
otherwise they take the GPUs after the trainer's, and share from GPU 0 only when too few GPUs are
visible for both (one H200: trainer and server on GPU 0). A server that shares GPUs with the trainer
gets ``--mem-fraction-static 0.5`` unless ``--sglang-mem-fraction-static`` (or a group's
``mem-fraction-static``) is given: SGLang's default (~0.9 of the GPU) would leave the trainer nothing.
With ``--colocate`` it also gets ``--enable-memory-saver`` (unless a group sets it ``false``), which
``/release_memory_occupation`` needs; SGLang implements it with the ``torch_memory_saver`` package
(in SGLang 0.5.17's site). ``LaunchPlan.notes`` says which of these applied.

Backends: ``sglang`` when ``--rollout-num-gpus`` or ``--sglang-config`` is given; ``external`` with
``--rollout-external-engine-addrs`` or with a router address alone (its workers are listed);
``embedded`` otherwise (CPU engines, ``slime/engines/fleet/processes.py``). On-policy distillation adds a
``teacher`` model: ``--opd-teacher-load`` launches one embedded engine serving it (embedded or
external backends; with SGLang servers declare a ``model: teacher`` group in ``--sglang-config``),
``--opd-teacher-addrs`` attaches to running ones (any backend). GPUs are numbered in order over
the groups, through the parent's ``CUDA_VISIBLE_DEVICES`` when set; ports are the first free ones
from ``base_port``. Several nodes: ``slime.engines.fleet.placement`` lays them out; this plan is what rank 0
launches on its node. The SGLang servers and routers are planned in ``plan_sglang.py``. Not
covered: DP attention.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Literal

from slime.config import EngineConfig
from slime.engines.fleet.groups import ACTOR, TEACHER, SglangDeployment, default_deployment, load_sglang_config
from slime.engines.fleet.host import port_is_free
from slime.engines.fleet.plan_sglang import SHARED_MEM_FRACTION_STATIC, sglang_plan
from slime.engines.fleet.plan_specs import LaunchPlan, RouterSpec, ServerSpec
from slime.engines.fleet.processes import EmbeddedEngineProcess
from slime.errors import ConfigError

__all__ = [
    "build_launch_plan",
    "backend_of",
    "embedded_processes",
    "teacher_processes",
    "SHARED_MEM_FRACTION_STATIC",
]


def backend_of(engine: EngineConfig) -> Literal["embedded", "sglang", "external"]:
    if engine.rollout_external_engine_addrs:
        return "external"
    if engine.rollout_num_gpus is not None or engine.sglang_config:
        return "sglang"
    return "external" if engine.sglang_router_ip else "embedded"


def build_launch_plan(
    engine: EngineConfig,
    *,
    model_dir: str | None = None,
    weight_version: str = "0",
    seed: int = 0,
    python: str = sys.executable,
    is_free: Callable[[str, int], bool] = port_is_free,
    trainer_gpus: int = 0,
    colocate: bool = False,
    in_place_updates: bool = False,
    gpus_per_node: int | None = None,
) -> LaunchPlan:
    """What to start for ``engine``; nothing is started.

    Args:
        model_dir: the actor's weights at start (default ``engine.hf_checkpoint``; a checkpoint on resume).
        weight_version: the policy version the servers start at.
        is_free: ``(host, port) -> bool``; ports for which it is False are skipped.
        trainer_gpus: how many GPUs the trainer uses, from the first visible one (``trainer_gpus(config.train, ...)``).
        colocate: ``--colocate``: the servers share the trainer's GPUs and release memory while it trains.
        in_place_updates: weights are updated while requests are paused in place (``--rollout-mode async``):
            the actor's servers get ``--disable-radix-cache`` unless the user set it, so no request reuses KV
            of older weights (docs/ARCHITECTURE.md, "In-place updates and the prefix cache").
        gpus_per_node: this node's GPU count when ``CUDA_VISIBLE_DEVICES`` does not say it (the placement
            plan's, ``slime.engines.fleet.placement``); None = unknown unless a GPU trainer probes torch.

    Raises:
        ConfigError: flags that contradict each other, a bad ``--sglang-config``, too few GPUs.
    """
    if engine.ray_placed_engines:  # slime train --ray started the engines: attach to them, launch nothing
        return _ray_placed_plan(engine)
    backend = backend_of(engine)
    _check_backend_flags(engine, backend)
    router = f"http://{engine.sglang_router_ip}:{engine.sglang_router_port}" if engine.sglang_router_ip else None
    teacher_urls = _http_urls(engine.opd_teacher_addrs)
    teachers = tuple(
        ServerSpec("embedded-teacher", TEACHER, "regular", tuple(p.args), p.env, "")
        for p in teacher_processes(engine, seed=seed)
    )
    if backend == "external":  # running engines (and a router that lists them), maybe an embedded teacher
        return _external_plan(engine, router=router, teachers=teachers, teacher_urls=teacher_urls)
    if backend == "embedded":
        procs = embedded_processes(engine, model_dir=model_dir, weight_version=weight_version, seed=seed)
        return _embedded_plan(procs, teachers=teachers, teacher_urls=teacher_urls)
    deployment = _sglang_deployment(engine, with_teacher_urls=bool(teacher_urls))
    plan = sglang_plan(
        engine,
        deployment,
        model_dir=model_dir,
        weight_version=weight_version,
        python=python,
        is_free=is_free,
        router=router,
        trainer_gpus=trainer_gpus,
        colocate=colocate,
        in_place_updates=in_place_updates,
        gpus_per_node=gpus_per_node,
    )
    return dataclasses.replace(plan, teacher_urls=teacher_urls)


def _external_plan(
    engine: EngineConfig, *, router: str | None, teachers: tuple[ServerSpec, ...], teacher_urls: tuple[str, ...]
) -> LaunchPlan:
    """The ``external`` plan: running engines (and the router that lists them), plus an embedded teacher if any."""
    routers = (RouterSpec(ACTOR, router, None, False),) if router else ()
    external_urls = _http_urls(engine.rollout_external_engine_addrs)
    return LaunchPlan(
        "external", servers=teachers, external_urls=external_urls, teacher_urls=teacher_urls, routers=routers
    )


def _ray_placed_plan(engine: EngineConfig) -> LaunchPlan:
    """The engines ``slime train --ray`` placed (``ROLE=URL`` entries), as running ones: actors, teachers,
    the actor's router; the note says why the run's launch flags start nothing here."""
    placed: dict[str, list[str]] = {}
    for entry in engine.ray_placed_engines:
        role, _, url = entry.partition("=")
        placed.setdefault(role, []).append(url)
    routers = tuple(RouterSpec(ACTOR, url, None, False) for url in placed.get("router", [])[:1])
    note = "the engines were placed by slime train --ray (--ray-placed-engines): attached to, none launched here"
    return LaunchPlan(
        "external",
        external_urls=tuple(placed.get("actor", [])),
        teacher_urls=tuple(placed.get("teacher", [])),
        routers=routers,
        notes=(note,),
    )


def _embedded_plan(
    procs: Sequence[EmbeddedEngineProcess], *, teachers: tuple[ServerSpec, ...], teacher_urls: tuple[str, ...]
) -> LaunchPlan:
    """The ``embedded`` plan: one actor server per embedded engine process, then the teacher's."""
    actors = tuple(ServerSpec(f"embedded-{i}", ACTOR, "regular", tuple(p.args), p.env, "") for i, p in enumerate(procs))
    return LaunchPlan("embedded", servers=actors + teachers, teacher_urls=teacher_urls)


def _check_backend_flags(engine: EngineConfig, backend: str) -> None:
    """Raises ConfigError for flags that contradict each other or the backend (one line naming them)."""
    if (engine.sglang_args or engine.router_args) and backend != "sglang":
        flags = [t for t in (*engine.sglang_args, *engine.router_args) if t.startswith("--")]
        raise ConfigError(
            f"--sglang-*/--router-* flags {flags} go to SGLang servers and routers that slime launches, "
            f"but this run launches none ({backend} engines): add --rollout-num-gpus N or --sglang-config, or drop them"
        )
    if engine.sglang_router_ip and engine.sglang_router_port is None:
        raise ConfigError(f"--sglang-router-ip={engine.sglang_router_ip} needs --sglang-router-port")
    if engine.rollout_external_engine_addrs and (engine.rollout_num_gpus is not None or engine.sglang_config):
        raise ConfigError(
            "--rollout-external-engine-addrs attaches to running engines; it cannot be combined with "
            "--rollout-num-gpus or --sglang-config, which launch them"
        )


def _http_urls(addrs: Sequence[str]) -> tuple[str, ...]:
    """``host:port`` addresses as ``http://host:port`` (urls given whole are kept)."""
    return tuple(u if u.startswith("http") else f"http://{u}" for u in addrs)


def _sglang_deployment(engine: EngineConfig, *, with_teacher_urls: bool) -> SglangDeployment:
    """The server groups to launch: ``--sglang-config``'s, else one actor group from the flags.

    Raises:
        ConfigError: ``--opd-teacher-load`` (embedded only) with SGLang servers, or two teachers.
    """
    if engine.opd_teacher_load:
        raise ConfigError(
            f"--opd-teacher-load={engine.opd_teacher_load!r} launches an embedded CPU engine; with SGLang servers "
            "declare the teacher as a group of --sglang-config ({name: teacher, model: teacher, model_path: ...}) "
            "or give running ones with --opd-teacher-addrs"
        )
    deployment = (
        load_sglang_config(engine.sglang_config, engine) if engine.sglang_config else default_deployment(engine)
    )
    if with_teacher_urls and TEACHER in deployment.models():
        raise ConfigError(f"--opd-teacher-addrs with a {TEACHER!r} group in --sglang-config: pick one teacher")
    return deployment


def embedded_processes(
    engine: EngineConfig, *, model_dir: str | None, weight_version: str, seed: int
) -> list[EmbeddedEngineProcess]:
    """The embedded engines of the plan (``--rollout-num-engines`` of them, seeds ``seed + i``), not started."""
    return [
        EmbeddedEngineProcess(
            model_dir or engine.hf_checkpoint,
            threads=engine.engine_threads,
            seed=seed + i,
            max_running_requests=engine.max_running_requests,
            weight_version=weight_version,
        )
        for i in range(engine.num_engines)
    ]


def teacher_processes(engine: EngineConfig, *, seed: int) -> list[EmbeddedEngineProcess]:
    """The embedded teacher engine of ``--opd-teacher-load`` (one; seed ``seed + 1000``), or none. Not started."""
    if not engine.opd_teacher_load:
        return []
    return [
        EmbeddedEngineProcess(
            engine.opd_teacher_load,
            threads=engine.engine_threads,
            seed=seed + 1000,
            max_running_requests=engine.max_running_requests,
            weight_version="0",
        )
    ]
