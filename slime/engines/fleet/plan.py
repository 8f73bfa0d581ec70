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
launches on its node. Not covered: DP attention.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Literal

from slime.config import EngineConfig
from slime.engines.fleet.groups import ACTOR, TEACHER, ServerGroup, SglangDeployment, default_deployment, group_args, load_sglang_config
from slime.engines.fleet.host import port_is_free, visible_gpus
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

SHARED_MEM_FRACTION_STATIC = 0.5
"""``--mem-fraction-static`` of a server that shares its GPU with the trainer, unless the user sets one."""


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
        in_place_updates: weights are updated while requests are paused in place (``--rollout-mode
            async``): the actor's servers get ``--disable-radix-cache`` unless the user set it, so no
            request reuses KV of older weights (docs/ARCHITECTURE.md, "In-place updates and the
            prefix cache": with the cache on, every update becomes an abort + flush).
        gpus_per_node: this node's GPU count when ``CUDA_VISIBLE_DEVICES`` does not say it (the placement
            plan's, ``slime.engines.fleet.placement``); None = unknown unless a GPU trainer probes torch.

    Raises:
        ConfigError: flags that contradict each other, a bad ``--sglang-config``, too few GPUs.
    """
    backend = backend_of(engine)
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
    router = f"http://{engine.sglang_router_ip}:{engine.sglang_router_port}" if engine.sglang_router_ip else None
    teacher_urls = tuple(u if u.startswith("http") else f"http://{u}" for u in engine.opd_teacher_addrs)
    teachers = tuple(
        ServerSpec("embedded-teacher", TEACHER, "regular", tuple(p.args), p.env, "") for p in teacher_processes(engine, seed=seed)
    )
    if backend == "external":
        urls = tuple(u if u.startswith("http") else f"http://{u}" for u in engine.rollout_external_engine_addrs)
        return LaunchPlan(
            "external",
            servers=teachers,
            external_urls=urls,
            teacher_urls=teacher_urls,
            routers=(RouterSpec(ACTOR, router, None, False),) if router else (),
        )
    if backend == "embedded":
        procs = embedded_processes(engine, model_dir=model_dir, weight_version=weight_version, seed=seed)
        return LaunchPlan(
            "embedded",
            servers=tuple(ServerSpec(f"embedded-{i}", ACTOR, "regular", tuple(p.args), p.env, "") for i, p in enumerate(procs)) + teachers,
            teacher_urls=teacher_urls,
        )
    if engine.opd_teacher_load:
        raise ConfigError(
            f"--opd-teacher-load={engine.opd_teacher_load!r} launches an embedded CPU engine; with SGLang servers "
            "declare the teacher as a group of --sglang-config ({name: teacher, model: teacher, model_path: ...}) "
            "or give running ones with --opd-teacher-addrs"
        )
    deployment = load_sglang_config(engine.sglang_config, engine) if engine.sglang_config else default_deployment(engine)
    if teacher_urls and TEACHER in deployment.models():
        raise ConfigError(f"--opd-teacher-addrs with a {TEACHER!r} group in --sglang-config: pick one teacher")
    plan = _sglang_plan(
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


def embedded_processes(engine: EngineConfig, *, model_dir: str | None, weight_version: str, seed: int) -> list[EmbeddedEngineProcess]:
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


def _sglang_plan(
    engine: EngineConfig,
    deployment: SglangDeployment,
    *,
    model_dir: str | None,
    weight_version: str,
    python: str,
    is_free: Callable[[str, int], bool],
    router: str | None,
    trainer_gpus: int,
    colocate: bool,
    in_place_updates: bool = False,
    gpus_per_node: int | None = None,
) -> LaunchPlan:
    host, global_args = _take_host(engine.sglang_args)
    url_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    gpus = visible_gpus(probe=trainer_gpus > 0)
    if gpus is None and gpus_per_node:
        gpus = [str(n) for n in range(gpus_per_node)]
    need = sum(g.num_engines * (g.gpus_per_engine or 1) for g in deployment.groups)
    if engine.rollout_num_gpus is not None and need != engine.rollout_num_gpus:
        raise ConfigError(
            f"--sglang-config needs {need} GPUs (sum of num_engines x gpus_per_engine) but --rollout-num-gpus={engine.rollout_num_gpus}"
        )
    if gpus is not None and need > len(gpus):
        raise ConfigError(f"the SGLang servers need {need} GPUs but CUDA_VISIBLE_DEVICES lists {len(gpus)}: {','.join(gpus)}")
    notes: list[str] = []
    if colocate or trainer_gpus == 0:
        first_gpu = 0
    elif gpus is not None and trainer_gpus + need <= len(gpus):
        first_gpu = trainer_gpus  # THUDM/slime's placement: the rollout GPUs follow the actor's
    else:
        first_gpu = 0
        notes.append(
            f"{len(gpus) if gpus is not None else 'an unknown number of'} GPU(s) visible for a trainer on {trainer_gpus} "
            f"and SGLang servers on {need}: the servers share the trainer's GPUs from GPU 0"
        )
    shared_ids = set(range(trainer_gpus))
    taken: set[int] = set()

    def next_port() -> int:
        port = engine.base_port
        while port in taken or not is_free(host or "127.0.0.1", port):
            port += 1
            if port > 65535:
                raise ConfigError(f"no free port from base_port={engine.base_port}")
        taken.add(port)
        return port

    servers: list[ServerSpec] = []
    for group in deployment.groups:
        tp = group.gpus_per_engine or 1
        model_path = (model_dir or group.model_path) if group.model == ACTOR else group.model_path
        version = weight_version if group.model == ACTOR else "0"
        for i in range(group.num_engines):
            ids = list(range(first_gpu, first_gpu + tp))
            first_gpu += tp
            port = next_port()
            argv = [
                python,
                "-m",
                "sglang.launch_server",
                "--model-path",
                str(model_path),
                "--host",
                host or "127.0.0.1",
                "--port",
                str(port),
                "--tp-size",
                str(tp),
                "--weight-version",
                version,
            ]
            bootstrap = None
            if group.role != "regular":
                argv += ["--disaggregation-mode", group.role]
            if group.role == "prefill":
                bootstrap = next_port()
                argv += ["--disaggregation-bootstrap-port", str(bootstrap)]
            name = f"{group.name}-{i}"
            shares = colocate or bool(shared_ids & set(ids))
            defaults = _sharing_defaults(global_args, group, colocate=colocate) if shares else []
            if defaults:
                notes.append(
                    f"{name} shares GPU(s) with the trainer{' (--colocate)' if colocate else ''}: added {' '.join(defaults)} "
                    "(set --sglang-mem-fraction-static / --sglang-enable-memory-saver to choose)"
                )
            if in_place_updates and group.model == ACTOR:
                if "disable-radix-cache" not in _given_flags(global_args, group):
                    defaults = [*defaults, "--disable-radix-cache"]
                    notes.append(
                        f"{name}: added --disable-radix-cache (async mode updates weights in place; a prefix cache would "
                        "keep KV of older weights, so every update would have to abort and flush instead)"
                    )
                elif group.args.get("disable-radix-cache", group.args.get("--disable-radix-cache")) is False:
                    notes.append(
                        f"{name}: keeps its radix cache (disable-radix-cache: false in --sglang-config): once a request "
                        "reuses cached KV, every async weight update aborts and flushes instead of pausing in place"
                    )
            env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus[n] for n in ids) if gpus is not None else ",".join(map(str, ids))}
            servers.append(
                ServerSpec(
                    name,
                    group.model,
                    group.role,
                    tuple(argv + group_args((*defaults, *global_args), group)),
                    env,
                    f"http://{url_host}:{port}",
                    bootstrap,
                )
            )
    routers = []
    for model in deployment.models():
        mine = [s for s in servers if s.model == model]
        if model == ACTOR and router is not None:
            routers.append(RouterSpec(model, router, None, True))
            continue
        if len(mine) == 1 and not deployment.is_pd(model) and not engine.router_args:
            notes.append(f"model {model!r}: one server, no router (slime calls {mine[0].url} directly)")
            continue
        port = next_port()
        argv = [python, "-m", "sglang_router.launch_router"]
        if deployment.is_pd(model):
            argv.append("--pd-disaggregation")
            for s in mine:
                argv += ["--prefill", s.url, str(s.bootstrap_port)] if s.role == "prefill" else ["--decode", s.url]
        else:
            argv += ["--worker-urls", *(s.url for s in mine)]
        argv += ["--host", host or "127.0.0.1", "--port", str(port), *engine.router_args]
        routers.append(RouterSpec(model, f"http://{url_host}:{port}", tuple(argv), False))
    if engine.router_args and all(r.argv is None for r in routers):
        raise ConfigError(
            f"--router-* flags {[t for t in engine.router_args if t.startswith('--')]} go to routers that slime "
            f"launches, but the only router is the running one at {router}"
        )
    return LaunchPlan("sglang", servers=tuple(servers), routers=tuple(routers), notes=tuple(notes))


def _given_flags(global_args: tuple[str, ...], group: ServerGroup) -> set[str]:
    """SGLang flag names (no dashes) the user set, globally (``--sglang-*``) or in the group's args."""
    return {_flag_name(t) for t in global_args if t.startswith("--")} | {_flag_name("--" + k.removeprefix("--")) for k in group.args}


def _sharing_defaults(global_args: tuple[str, ...], group: ServerGroup, *, colocate: bool) -> list[str]:
    """Flags a server sharing the trainer's GPU gets unless the user set them (globally or in its group)."""
    given = _given_flags(global_args, group)
    out = [] if "mem-fraction-static" in given else ["--mem-fraction-static", str(SHARED_MEM_FRACTION_STATIC)]
    if colocate and "enable-memory-saver" not in given:
        out.append("--enable-memory-saver")
    return out


def _flag_name(token: str) -> str:
    return token.removeprefix("--").split("=", 1)[0].replace("_", "-")


def _take_host(tokens: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """``--host X`` (the last one) out of the pass-through flags: every server and router binds it."""
    host, out, skip = "", [], False
    for i, token in enumerate(tokens):
        if skip:
            skip = False
        elif token == "--host" and i + 1 < len(tokens):
            host, skip = tokens[i + 1], True
        elif token.startswith("--host="):
            host = token.split("=", 1)[1]
        else:
            out.append(token)
    return host, tuple(out)
