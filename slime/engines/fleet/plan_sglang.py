"""The SGLang part of the launch plan: servers (GPUs, ports, flags) and routers, nothing started.

``sglang_plan`` reads as its steps: the host and pass-through flags, the GPUs (``CUDA_VISIBLE_DEVICES``
or the node's count), the first server GPU (after the trainer's, or shared from GPU 0), then one
``ServerSpec`` per server of each group (``_server``: its command, the flags a server sharing the
trainer's GPUs gets, ``--disable-radix-cache`` for in-place updates) and one ``RouterSpec`` per
model that needs a router (``_router``). Ports are taken in that order, the first free ones from
``base_port``. What each flag means and why: ``slime.engines.fleet.plan``'s docstring.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from slime.config import EngineConfig
from slime.engines.fleet.groups import ACTOR, ServerGroup, SglangDeployment, group_args
from slime.engines.fleet.host import visible_gpus
from slime.engines.fleet.plan_specs import LaunchPlan, RouterSpec, ServerSpec
from slime.errors import ConfigError

__all__ = ["sglang_plan", "SHARED_MEM_FRACTION_STATIC"]

SHARED_MEM_FRACTION_STATIC = 0.5
"""``--mem-fraction-static`` of a server that shares its GPU with the trainer, unless the user sets one."""


class _Ports:
    """The first free ports from ``base_port``, each handed out once."""

    def __init__(self, base_port: int, host: str, is_free: Callable[[str, int], bool]):
        self._base, self._host, self._is_free = base_port, host, is_free
        self._taken: set[int] = set()

    def next(self) -> int:
        """Raises ConfigError past port 65535."""
        port = self._base
        while port in self._taken or not self._is_free(self._host, port):
            port += 1
            if port > 65535:
                raise ConfigError(f"no free port from base_port={self._base}")
        self._taken.add(port)
        return port


@dataclasses.dataclass(frozen=True)
class _Layout:
    """What every server of the plan shares: where it binds, its interpreter, the GPUs and the flags."""

    engine: EngineConfig
    python: str
    host: str
    """The bind address (``--host``; 127.0.0.1 when none is given)."""
    url_host: str
    """How we reach it (127.0.0.1 for a wildcard bind)."""
    global_args: tuple[str, ...]
    gpus: list[str] | None
    """The visible GPU ids (None: unknown; then server GPU ``n`` is ``n``)."""
    trainer_ids: frozenset[int]
    colocate: bool
    in_place_updates: bool
    model_dir: str | None
    weight_version: str


def sglang_plan(
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
    """The servers and routers of ``deployment`` (``build_launch_plan``'s arguments; ``router``: a running one).

    Raises:
        ConfigError: GPU counts that disagree, no free port, ``--router-*`` flags with no router launched.
    """
    host, global_args = _take_host(engine.sglang_args)
    gpus = _gpus(trainer_gpus, gpus_per_node)
    need = _gpus_needed(engine, deployment, gpus)
    notes: list[str] = []
    first_gpu = _first_server_gpu(gpus, need, trainer_gpus=trainer_gpus, colocate=colocate, notes=notes)
    layout = _Layout(
        engine,
        python,
        host or "127.0.0.1",
        "127.0.0.1" if host in ("0.0.0.0", "::", "") else host,
        global_args,
        gpus,
        frozenset(range(trainer_gpus)),
        colocate,
        in_place_updates,
        model_dir,
        weight_version,
    )
    ports = _Ports(engine.base_port, layout.host, is_free)
    servers: list[ServerSpec] = []
    for group in deployment.groups:
        tp = group.gpus_per_engine or 1
        for i in range(group.num_engines):
            servers.append(_server(layout, group, i, tuple(range(first_gpu, first_gpu + tp)), ports, notes))
            first_gpu += tp
    routers = [
        r for model in deployment.models() if (r := _router(layout, deployment, model, servers, router, ports, notes))
    ]
    if engine.router_args and all(r.argv is None for r in routers):
        raise ConfigError(
            f"--router-* flags {[t for t in engine.router_args if t.startswith('--')]} go to routers that slime "
            f"launches, but the only router is the running one at {router}"
        )
    return LaunchPlan("sglang", servers=tuple(servers), routers=tuple(routers), notes=tuple(notes))


def _gpus(trainer_gpus: int, gpus_per_node: int | None) -> list[str] | None:
    """The visible GPU ids (torch probed for a GPU trainer), else the node's ``gpus_per_node``, else None."""
    gpus = visible_gpus(probe=trainer_gpus > 0)
    if gpus is None and gpus_per_node:
        gpus = [str(n) for n in range(gpus_per_node)]
    return gpus


def _gpus_needed(engine: EngineConfig, deployment: SglangDeployment, gpus: list[str] | None) -> int:
    """GPUs of all servers; raises ConfigError when ``--rollout-num-gpus`` or the visible GPUs disagree."""
    need = sum(g.num_engines * (g.gpus_per_engine or 1) for g in deployment.groups)
    if engine.rollout_num_gpus is not None and need != engine.rollout_num_gpus:
        raise ConfigError(
            f"--sglang-config needs {need} GPUs (sum of num_engines x gpus_per_engine) but --rollout-num-gpus={engine.rollout_num_gpus}"
        )
    if gpus is not None and need > len(gpus):
        raise ConfigError(
            f"the SGLang servers need {need} GPUs but CUDA_VISIBLE_DEVICES lists {len(gpus)}: {','.join(gpus)}"
        )
    return need


def _first_server_gpu(gpus: list[str] | None, need: int, *, trainer_gpus: int, colocate: bool, notes: list[str]) -> int:
    """The servers' first GPU: after the trainer's when both fit, else 0 (shared; said in ``notes``)."""
    if colocate or trainer_gpus == 0:
        return 0
    if gpus is not None and trainer_gpus + need <= len(gpus):
        return trainer_gpus  # THUDM/slime's placement: the rollout GPUs follow the actor's
    notes.append(
        f"{len(gpus) if gpus is not None else 'an unknown number of'} GPU(s) visible for a trainer on {trainer_gpus} "
        f"and SGLang servers on {need}: the servers share the trainer's GPUs from GPU 0"
    )
    return 0


def _server(
    layout: _Layout, group: ServerGroup, i: int, ids: tuple[int, ...], ports: _Ports, notes: list[str]
) -> ServerSpec:
    """Server ``i`` of ``group`` on GPUs ``ids`` (its port, then a prefill server's bootstrap port)."""
    port = ports.next()
    argv = _launch_argv(layout, group, port, tp=len(ids))
    bootstrap = None
    if group.role != "regular":
        argv += ["--disaggregation-mode", group.role]
    if group.role == "prefill":
        bootstrap = ports.next()
        argv += ["--disaggregation-bootstrap-port", str(bootstrap)]
    name = f"{group.name}-{i}"
    defaults = _added_flags(layout, group, name, ids, notes)
    gpus = layout.gpus
    env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus[n] for n in ids) if gpus is not None else ",".join(map(str, ids))}
    argv += group_args((*defaults, *layout.global_args), group)
    return ServerSpec(name, group.model, group.role, tuple(argv), env, f"http://{layout.url_host}:{port}", bootstrap)


def _launch_argv(layout: _Layout, group: ServerGroup, port: int, *, tp: int) -> list[str]:
    """``python -m sglang.launch_server`` with model, address, TP size and the starting weight version."""
    model_path = (layout.model_dir or group.model_path) if group.model == ACTOR else group.model_path
    version = layout.weight_version if group.model == ACTOR else "0"
    return [
        layout.python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_path),
        "--host",
        layout.host,
        "--port",
        str(port),
        "--tp-size",
        str(tp),
        "--weight-version",
        version,
    ]


def _added_flags(layout: _Layout, group: ServerGroup, name: str, ids: tuple[int, ...], notes: list[str]) -> list[str]:
    """Flags the plan adds to server ``name`` unless the user set them (each said in ``notes``): sharing
    the trainer's GPUs (memory fraction, memory saver), and no radix cache for in-place updates."""
    shares = layout.colocate or bool(layout.trainer_ids & set(ids))
    defaults = _sharing_defaults(layout.global_args, group, colocate=layout.colocate) if shares else []
    if defaults:
        notes.append(
            f"{name} shares GPU(s) with the trainer{' (--colocate)' if layout.colocate else ''}: added {' '.join(defaults)} "
            "(set --sglang-mem-fraction-static / --sglang-enable-memory-saver to choose)"
        )
    if not (layout.in_place_updates and group.model == ACTOR):
        return defaults
    if "disable-radix-cache" not in _given_flags(layout.global_args, group):
        notes.append(
            f"{name}: added --disable-radix-cache (async mode updates weights in place; a prefix cache would "
            "keep KV of older weights, so every update would have to abort and flush instead)"
        )
        return [*defaults, "--disable-radix-cache"]
    if group.args.get("disable-radix-cache", group.args.get("--disable-radix-cache")) is False:
        notes.append(
            f"{name}: keeps its radix cache (disable-radix-cache: false in --sglang-config): once a request "
            "reuses cached KV, every async weight update aborts and flushes instead of pausing in place"
        )
    return defaults


def _router(
    layout: _Layout,
    deployment: SglangDeployment,
    model: str,
    servers: list[ServerSpec],
    running: str | None,
    ports: _Ports,
    notes: list[str],
) -> RouterSpec | None:
    """``model``'s router: the ``running`` one for the actor (our servers register with it), none for one
    regular server (said in ``notes``), else one to launch over its servers."""
    mine = [s for s in servers if s.model == model]
    if model == ACTOR and running is not None:
        return RouterSpec(model, running, None, True)
    if len(mine) == 1 and not deployment.is_pd(model) and not layout.engine.router_args:
        notes.append(f"model {model!r}: one server, no router (slime calls {mine[0].url} directly)")
        return None
    port = ports.next()
    argv = [layout.python, "-m", "sglang_router.launch_router"]
    if deployment.is_pd(model):
        argv.append("--pd-disaggregation")
        for s in mine:
            argv += ["--prefill", s.url, str(s.bootstrap_port)] if s.role == "prefill" else ["--decode", s.url]
    else:
        argv += ["--worker-urls", *(s.url for s in mine)]
    argv += ["--host", layout.host, "--port", str(port), *layout.engine.router_args]
    return RouterSpec(model, f"http://{layout.url_host}:{port}", tuple(argv), False)


def _given_flags(global_args: tuple[str, ...], group: ServerGroup) -> set[str]:
    """SGLang flag names (no dashes) the user set, globally (``--sglang-*``) or in the group's args."""
    return {_flag_name(t) for t in global_args if t.startswith("--")} | {
        _flag_name("--" + k.removeprefix("--")) for k in group.args
    }


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
