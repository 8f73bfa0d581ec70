"""The launch plan: which SGLang servers, routers or embedded engines a run starts (or attaches to).

``build_launch_plan`` turns ``EngineConfig`` into commands without starting anything, so ``slime
train --dry-run`` prints exactly what a run would start. Per SGLang server (sglang-protocol.md §6)::

    CUDA_VISIBLE_DEVICES=<its gpus> python -m sglang.launch_server --model-path P --host H --port N
        --tp-size <gpus per engine> --weight-version <policy version>
        [--disaggregation-mode prefill|decode] [--disaggregation-bootstrap-port B]   # PD groups only
        <every --sglang-* flag, prefix stripped, values untouched; a group's YAML args override them>

and per model, one router (§5.1): ``python -m sglang_router.launch_router --worker-urls U... --host H
--port P <every --router-* flag, prefix stripped>``, or for PD ``--pd-disaggregation --prefill U B
... --decode U ...``. With ``--sglang-router-ip/--sglang-router-port`` the actor's router is not
launched: the launched servers are registered with it (``POST /workers``).

Backends: ``sglang`` when ``--rollout-num-gpus`` or ``--sglang-config`` is given; ``external`` with
``--rollout-external-engine-addrs`` or with a router address alone (its workers are listed);
``embedded`` otherwise (CPU engines, ``slime/rollout/launch.py``). On-policy distillation adds a
``teacher`` model: ``--opd-teacher-load`` launches one embedded engine serving it (embedded or
external backends; with SGLang servers declare a ``model: teacher`` group in ``--sglang-config``),
``--opd-teacher-addrs`` attaches to running ones (any backend). GPUs are numbered in order over
the groups, through the parent's ``CUDA_VISIBLE_DEVICES`` when set; ports are the first free ones
from ``base_port``. Not covered: several nodes (everything runs on this machine), DP attention.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import socket
import sys
from typing import Callable, Literal

from slime.config import EngineConfig
from slime.errors import ConfigError
from slime.rollout.launch import EmbeddedEngineProcess
from slime.rollout.server_groups import ACTOR, TEACHER, SglangDeployment, default_deployment, group_args, load_sglang_config

__all__ = ["ServerSpec", "RouterSpec", "LaunchPlan", "build_launch_plan", "backend_of", "port_is_free", "embedded_processes",
           "teacher_processes"]


@dataclasses.dataclass(frozen=True)
class ServerSpec:
    """One inference server to start: a real SGLang server or an embedded engine."""

    name: str
    model: str
    role: Literal["regular", "prefill", "decode"]
    argv: tuple[str, ...]
    env: dict[str, str]
    """Set on top of our environment (``CUDA_VISIBLE_DEVICES``)."""
    url: str
    """``http://host:port``; empty for an embedded engine (it picks a free port and prints it)."""
    bootstrap_port: int | None = None
    """Prefill servers: the KV-transfer bootstrap port the router needs (``--prefill URL PORT``)."""


@dataclasses.dataclass(frozen=True)
class RouterSpec:
    """The router of one model: launched (``argv``) or already running (``argv`` None)."""

    model: str
    url: str
    argv: tuple[str, ...] | None
    register: bool
    """Register the model's servers with ``POST /workers`` (an already running router)."""


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    backend: Literal["embedded", "sglang", "external"]
    servers: tuple[ServerSpec, ...] = ()
    routers: tuple[RouterSpec, ...] = ()
    external_urls: tuple[str, ...] = ()
    """Workers that already run (``--rollout-external-engine-addrs``), all serving the actor."""
    teacher_urls: tuple[str, ...] = ()
    """On-policy-distillation teacher engines that already run (``--opd-teacher-addrs``)."""

    def models(self) -> list[str]:
        return list(dict.fromkeys([ACTOR, *(s.model for s in self.servers), *(r.model for r in self.routers),
                                   *([TEACHER] if self.teacher_urls else [])]))

    def router_of(self, model: str) -> RouterSpec | None:
        return next((r for r in self.routers if r.model == model), None)

    def format(self) -> str:
        """Every command with its environment, one per line, shell-quoted."""
        lines = [f"# slime launch plan: backend {self.backend}, {len(self.servers)} server(s), "
                 f"{sum(r.argv is not None for r in self.routers)} router(s) to start"]
        for s in self.servers:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in s.env.items())
            lines.append(f"[server {s.name}] model={s.model} role={s.role} url={s.url or '(printed at start)'}")
            lines.append(f"  {env} {shlex.join(s.argv)}".rstrip() if env else f"  {shlex.join(s.argv)}")
        for r in self.routers:
            if r.argv is None:
                what = "register the servers with" if r.register else "attach to (list its workers)"
                lines.append(f"[router {r.model}] {what} the running router {r.url}")
            else:
                lines.append(f"[router {r.model}] url={r.url}")
                lines.append(f"  {shlex.join(r.argv)}")
        for url in self.external_urls:
            lines.append(f"[external actor] {url}")
        for url in self.teacher_urls:
            lines.append(f"[external teacher] {url}")
        lines.append("ready: GET /health_generate == 200 on every server; GET /readiness (or /health) on every router")
        return "\n".join(lines)


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def backend_of(engine: EngineConfig) -> Literal["embedded", "sglang", "external"]:
    if engine.rollout_external_engine_addrs:
        return "external"
    if engine.rollout_num_gpus is not None or engine.sglang_config:
        return "sglang"
    return "external" if engine.sglang_router_ip else "embedded"


def build_launch_plan(engine: EngineConfig, *, model_dir: str | None = None, weight_version: str = "0", seed: int = 0,
                      python: str = sys.executable, is_free: Callable[[str, int], bool] = port_is_free) -> LaunchPlan:
    """What to start for ``engine``; nothing is started.

    Args:
        model_dir: the actor's weights at start (default ``engine.hf_checkpoint``; a checkpoint on resume).
        weight_version: the policy version the servers start at.
        is_free: ``(host, port) -> bool``; ports for which it is False are skipped.

    Raises:
        ConfigError: flags that contradict each other, a bad ``--sglang-config``, too few GPUs.
    """
    backend = backend_of(engine)
    if (engine.sglang_args or engine.router_args) and backend != "sglang":
        flags = [t for t in (*engine.sglang_args, *engine.router_args) if t.startswith("--")]
        raise ConfigError(f"--sglang-*/--router-* flags {flags} go to SGLang servers and routers that slime launches, "
                          f"but this run launches none ({backend} engines): add --rollout-num-gpus N or --sglang-config, or drop them")
    if engine.sglang_router_ip and engine.sglang_router_port is None:
        raise ConfigError(f"--sglang-router-ip={engine.sglang_router_ip} needs --sglang-router-port")
    if engine.rollout_external_engine_addrs and (engine.rollout_num_gpus is not None or engine.sglang_config):
        raise ConfigError("--rollout-external-engine-addrs attaches to running engines; it cannot be combined with "
                          "--rollout-num-gpus or --sglang-config, which launch them")
    router = f"http://{engine.sglang_router_ip}:{engine.sglang_router_port}" if engine.sglang_router_ip else None
    teacher_urls = tuple(u if u.startswith("http") else f"http://{u}" for u in engine.opd_teacher_addrs)
    teachers = tuple(ServerSpec("embedded-teacher", TEACHER, "regular", tuple(p.args), p.env, "")
                     for p in teacher_processes(engine, seed=seed))
    if backend == "external":
        urls = tuple(u if u.startswith("http") else f"http://{u}" for u in engine.rollout_external_engine_addrs)
        return LaunchPlan("external", servers=teachers, external_urls=urls, teacher_urls=teacher_urls,
                          routers=(RouterSpec(ACTOR, router, None, False),) if router else ())
    if backend == "embedded":
        procs = embedded_processes(engine, model_dir=model_dir, weight_version=weight_version, seed=seed)
        return LaunchPlan("embedded", servers=tuple(ServerSpec(f"embedded-{i}", ACTOR, "regular", tuple(p.args), p.env, "")
                                                    for i, p in enumerate(procs)) + teachers, teacher_urls=teacher_urls)
    if engine.opd_teacher_load:
        raise ConfigError(f"--opd-teacher-load={engine.opd_teacher_load!r} launches an embedded CPU engine; with SGLang servers "
                          "declare the teacher as a group of --sglang-config ({name: teacher, model: teacher, model_path: ...}) "
                          "or give running ones with --opd-teacher-addrs")
    deployment = load_sglang_config(engine.sglang_config, engine) if engine.sglang_config else default_deployment(engine)
    if teacher_urls and TEACHER in deployment.models():
        raise ConfigError(f"--opd-teacher-addrs with a {TEACHER!r} group in --sglang-config: pick one teacher")
    plan = _sglang_plan(engine, deployment, model_dir=model_dir, weight_version=weight_version, python=python, is_free=is_free, router=router)
    return dataclasses.replace(plan, teacher_urls=teacher_urls)


def embedded_processes(engine: EngineConfig, *, model_dir: str | None, weight_version: str, seed: int) -> list[EmbeddedEngineProcess]:
    """The embedded engines of the plan (``--rollout-num-engines`` of them, seeds ``seed + i``), not started."""
    return [EmbeddedEngineProcess(model_dir or engine.hf_checkpoint, threads=engine.engine_threads, seed=seed + i,
                                  max_running_requests=engine.max_running_requests, weight_version=weight_version)
            for i in range(engine.num_engines)]


def teacher_processes(engine: EngineConfig, *, seed: int) -> list[EmbeddedEngineProcess]:
    """The embedded teacher engine of ``--opd-teacher-load`` (one; seed ``seed + 1000``), or none. Not started."""
    if not engine.opd_teacher_load:
        return []
    return [EmbeddedEngineProcess(engine.opd_teacher_load, threads=engine.engine_threads, seed=seed + 1000,
                                  max_running_requests=engine.max_running_requests, weight_version="0")]


def _sglang_plan(engine: EngineConfig, deployment: SglangDeployment, *, model_dir: str | None, weight_version: str, python: str,
                 is_free: Callable[[str, int], bool], router: str | None) -> LaunchPlan:
    host, global_args = _take_host(engine.sglang_args)
    url_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    gpus = _visible_gpus()
    need = sum(g.num_engines * (g.gpus_per_engine or 1) for g in deployment.groups)
    if engine.rollout_num_gpus is not None and need != engine.rollout_num_gpus:
        raise ConfigError(f"--sglang-config needs {need} GPUs (sum of num_engines x gpus_per_engine) but --rollout-num-gpus={engine.rollout_num_gpus}")
    if gpus is not None and need > len(gpus):
        raise ConfigError(f"the SGLang servers need {need} GPUs but CUDA_VISIBLE_DEVICES lists {len(gpus)}: {','.join(gpus)}")
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
    first_gpu = 0
    for group in deployment.groups:
        tp = group.gpus_per_engine or 1
        model_path = (model_dir or group.model_path) if group.model == ACTOR else group.model_path
        version = weight_version if group.model == ACTOR else "0"
        for i in range(group.num_engines):
            ids = [str(n) for n in range(first_gpu, first_gpu + tp)]
            first_gpu += tp
            port = next_port()
            argv = [python, "-m", "sglang.launch_server", "--model-path", str(model_path), "--host", host or "127.0.0.1",
                    "--port", str(port), "--tp-size", str(tp), "--weight-version", version]
            bootstrap = None
            if group.role != "regular":
                argv += ["--disaggregation-mode", group.role]
            if group.role == "prefill":
                bootstrap = next_port()
                argv += ["--disaggregation-bootstrap-port", str(bootstrap)]
            env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus[int(n)] for n in ids) if gpus is not None else ",".join(ids)}
            servers.append(ServerSpec(f"{group.name}-{i}", group.model, group.role, tuple(argv + group_args(global_args, group)),
                                      env, f"http://{url_host}:{port}", bootstrap))
    routers = []
    for model in deployment.models():
        mine = [s for s in servers if s.model == model]
        if model == ACTOR and router is not None:
            routers.append(RouterSpec(model, router, None, True))
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
        raise ConfigError(f"--router-* flags {[t for t in engine.router_args if t.startswith('--')]} go to routers that slime "
                          f"launches, but the only router is the running one at {router}")
    return LaunchPlan("sglang", servers=tuple(servers), routers=tuple(routers))


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


def _visible_gpus() -> list[str] | None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [g.strip() for g in visible.split(",") if g.strip()] if visible else None
