"""SGLang server groups: from ``--sglang-config PATH`` (YAML), or one actor group from the flags.

Example YAML (every key but ``name`` has a default)::

    groups:
      - {name: actor, model: actor, num_engines: 2, gpus_per_engine: 1, args: {mem-fraction-static: 0.7}}
      - {name: prefill, model: policy-pd, role: prefill, num_engines: 1, gpus_per_engine: 2}
      - {name: decode, model: policy-pd, role: decode, num_engines: 2, args: {cuda-graph-max-bs: 256}}
      - {name: ref, model: reference}                       # model_path: --hf-checkpoint (the initial policy)
      - {name: teacher, model: teacher, model_path: /ckpt/teacher-32b, gpus_per_engine: 4}

- ``model``: which pool the group serves (``PoolRegistry``); ``actor`` is the default pool and the
  only one that receives weight updates. Each model gets its own router.
- ``role``: ``regular``, or ``prefill`` / ``decode`` for PD disaggregation (a model has either only
  regular groups, or both prefill and decode groups).
- ``gpus_per_engine``: default ``--rollout-num-gpus-per-engine``; it is the server's ``--tp-size``.
- ``args``: SGLang flags without ``--`` (``true``: bare flag, ``false``/``null``: drop a flag given
  as ``--sglang-*``, a list: several values); they override the ``--sglang-*`` flags for this group.
- ``model_path``: default ``--hf-checkpoint`` for ``actor`` and ``reference``; required otherwise;
  one value per model.

Errors name the file and the path inside it (``$.groups[1].num_engines``). Not covered: placement on
several nodes (GPUs are numbered on this machine), encoder disaggregation, placeholder groups.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from slime.config import EngineConfig
from slime.errors import ConfigError
from slime.yaml_file import read_yaml

__all__ = [
    "ServerGroup",
    "SglangDeployment",
    "ACTOR",
    "TEACHER",
    "load_sglang_config",
    "default_deployment",
    "group_args",
    "RESERVED_SERVER_FLAGS",
    "RESERVED_ROUTER_FLAGS",
]

ACTOR = "actor"
TEACHER = "teacher"
"""The on-policy-distillation teacher's model name (``--use-opd``; ``slime.rollout.opd``)."""
RESERVED_SERVER_FLAGS = {
    "model-path": "--hf-checkpoint (or model_path in --sglang-config)",
    "model": "--hf-checkpoint (or model_path in --sglang-config)",
    "tp-size": "--rollout-num-gpus-per-engine",
    "tensor-parallel-size": "--rollout-num-gpus-per-engine",
    "port": "nothing: slime gives each server its own port",
    "base-gpu-id": "nothing: slime sets CUDA_VISIBLE_DEVICES per server from --rollout-num-gpus",
    "weight-version": "nothing: slime starts servers at the policy version",
    "disaggregation-mode": "role: prefill|decode in --sglang-config",
    "disaggregation-bootstrap-port": "nothing: slime gives each prefill server its own",
}
"""SGLang server flags slime sets itself (``sglang.launch_server --X``), with what to use instead."""
RESERVED_ROUTER_FLAGS = {
    "worker-urls": "nothing: slime passes the servers it launched",
    "host": "--sglang-router-ip",
    "port": "--sglang-router-port",
    "pd-disaggregation": "role: prefill|decode in --sglang-config",
    "prefill": "role: prefill in --sglang-config",
    "decode": "role: decode in --sglang-config",
}
"""sglang-router flags slime sets itself (``sglang_router.launch_router --X``)."""
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_FLAG = re.compile(r"[a-z0-9][a-z0-9_-]*")
_RESERVED = set(RESERVED_SERVER_FLAGS) | {"host"}  # host: one for all servers (--sglang-host)
ArgValue = str | int | float | bool | list[str | int | float] | None


class ServerGroup(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    name: str
    """Unique; servers are named ``<name>-<i>``."""
    model: str = ACTOR
    role: Literal["regular", "prefill", "decode"] = "regular"
    num_engines: int = 1
    gpus_per_engine: int | None = None
    model_path: str | None = None
    args: dict[str, ArgValue] = msgspec.field(default_factory=dict)


class SglangDeployment(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    groups: list[ServerGroup]

    def models(self) -> list[str]:
        """Model names in first-seen order."""
        return list(dict.fromkeys(g.model for g in self.groups))

    def model_path(self, model: str) -> str:
        return next(g.model_path for g in self.groups if g.model == model and g.model_path)

    def is_pd(self, model: str) -> bool:
        return any(g.role != "regular" for g in self.groups if g.model == model)


def load_sglang_config(path: str, engine: EngineConfig) -> SglangDeployment:
    """Read and check ``--sglang-config``; fill ``gpus_per_engine`` and ``model_path`` defaults.

    Raises:
        ConfigError: unreadable file, bad YAML, a field of the wrong type or unknown (with its
            ``$.groups[i].field`` path), or a rule of the module docstring broken.
    """
    where = f"--sglang-config {path!r}"
    raw = read_yaml(path, where)
    try:
        deployment = msgspec.convert(raw, SglangDeployment)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return _resolve(deployment, engine, where)


def default_deployment(engine: EngineConfig) -> SglangDeployment:
    """One actor group: ``--rollout-num-gpus / --rollout-num-gpus-per-engine`` servers.

    Raises:
        ConfigError: the GPU count is not a multiple of the GPUs per engine.
    """
    num_gpus, per_engine = engine.rollout_num_gpus or 0, engine.rollout_num_gpus_per_engine
    if num_gpus < per_engine or num_gpus % per_engine:
        raise ConfigError(
            f"--rollout-num-gpus={num_gpus} must be a positive multiple of --rollout-num-gpus-per-engine={per_engine}"
        )
    group = ServerGroup(name=ACTOR, num_engines=num_gpus // per_engine, gpus_per_engine=per_engine)
    return _resolve(SglangDeployment(groups=[group]), engine, "--rollout-num-gpus")


def _resolve(d: SglangDeployment, engine: EngineConfig, where: str) -> SglangDeployment:
    if not d.groups:
        raise ConfigError(f"{where}: $.groups is empty; expected at least the actor's group")
    groups, seen = [], set()
    for i, g in enumerate(d.groups):
        at = f"{where}: $.groups[{i}]"
        if not _NAME.fullmatch(g.name) or not _NAME.fullmatch(g.model):
            raise ConfigError(f"{at}: name {g.name!r} / model {g.model!r} must match [A-Za-z0-9_.-]+")
        if g.name in seen:
            raise ConfigError(f"{at}.name: {g.name!r} is used by an earlier group; names must be unique")
        seen.add(g.name)
        if g.num_engines < 1 or (g.gpus_per_engine is not None and g.gpus_per_engine < 1):
            raise ConfigError(f"{at}: num_engines={g.num_engines} and gpus_per_engine={g.gpus_per_engine} must be >= 1")
        for key in g.args:
            name = key.removeprefix("--")
            if not _FLAG.fullmatch(name):
                raise ConfigError(f"{at}.args: {key!r} is not an SGLang flag name (expected e.g. mem-fraction-static)")
            if name.replace("_", "-") in _RESERVED:
                raise ConfigError(f"{at}.args.{key}: slime sets --{name} itself for each server")
        model_path = g.model_path or (engine.hf_checkpoint if g.model in (ACTOR, "reference") else None)
        if not model_path:
            raise ConfigError(
                f"{at}.model_path: required for model {g.model!r} (only actor and reference default to --hf-checkpoint)"
            )
        groups.append(
            msgspec.structs.replace(
                g, model_path=model_path, gpus_per_engine=g.gpus_per_engine or engine.rollout_num_gpus_per_engine
            )
        )
    out = SglangDeployment(groups=groups)
    if ACTOR not in out.models():
        raise ConfigError(
            f"{where}: no group serves model {ACTOR!r} (the policy being trained); models: {out.models()}"
        )
    for model in out.models():
        mine = [g for g in out.groups if g.model == model]
        roles, paths = {g.role for g in mine}, {g.model_path for g in mine if g.model_path}  # all filled in above
        if len(paths) > 1:
            raise ConfigError(f"{where}: model {model!r} has groups with different model_path values {sorted(paths)}")
        if roles - {"regular"} and roles != {"prefill", "decode"}:
            raise ConfigError(
                f"{where}: model {model!r} has roles {sorted(roles)}; PD disaggregation needs prefill and decode groups and no regular one"
            )
    return out


def group_args(global_args: tuple[str, ...], group: ServerGroup) -> list[str]:
    """The ``--sglang-*`` tokens with ``group.args`` applied (a group flag replaces every global
    occurrence of it). Example: ``("--mem-fraction-static", "0.7", "--enable-memory-saver")`` with
    ``{"mem-fraction-static": 0.8, "enable-memory-saver": False, "cuda-graph-bs": [1, 2]}`` ->
    ``["--mem-fraction-static", "0.8", "--cuda-graph-bs", "1", "2"]``."""
    entries = _entries(global_args)
    for key, value in group.args.items():
        name = "--" + key.removeprefix("--")
        entries = [e for e in entries if _norm(e[0]) != _norm(name)]
        if value is True:
            entries.append([name])
        elif value is not False and value is not None:
            values = value if isinstance(value, list) else [value]
            entries.append([name, *(_str(v) for v in values)])
    return [token for entry in entries for token in entry]


def _entries(tokens: tuple[str, ...]) -> list[list[str]]:
    """``("--a", "1", "--b", "--c=2")`` -> ``[["--a", "1"], ["--b"], ["--c=2"]]``."""
    entries: list[list[str]] = []
    for token in tokens:
        if token.startswith("--") or not entries:
            entries.append([token])
        else:
            entries[-1].append(token)
    return entries


def _norm(flag: str) -> str:
    return flag.split("=", 1)[0].replace("_", "-")


def _str(value: str | int | float | bool) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
