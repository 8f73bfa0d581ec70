"""What a launch plan is made of: ``ServerSpec`` (one server to start), ``RouterSpec`` (one model's
router, launched or already running) and ``LaunchPlan`` (all of them, plus the engines that already run).

These are plain frozen records: ``slime.engines.fleet.plan.build_launch_plan`` fills them from the run's
``EngineConfig`` without starting anything, ``LaunchPlan.format`` renders every command for ``slime train
--dry-run``, and ``slime.engines.fleet.start`` starts what they name.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Literal

from slime.engines.fleet.groups import ACTOR, TEACHER

__all__ = ["ServerSpec", "RouterSpec", "LaunchPlan"]


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
    notes: tuple[str, ...] = ()
    """What the plan decided for the user (GPU sharing, defaults added, routers left out); logged at start."""

    def models(self) -> list[str]:
        return list(
            dict.fromkeys(
                [
                    ACTOR,
                    *(s.model for s in self.servers),
                    *(r.model for r in self.routers),
                    *([TEACHER] if self.teacher_urls else []),
                ]
            )
        )

    def router_of(self, model: str) -> RouterSpec | None:
        return next((r for r in self.routers if r.model == model), None)

    def format(self) -> str:
        """Every command with its environment, one per line, shell-quoted."""
        lines = [
            f"# slime launch plan: backend {self.backend}, {len(self.servers)} server(s), "
            f"{sum(r.argv is not None for r in self.routers)} router(s) to start"
        ]
        lines += [f"# {note}" for note in self.notes]
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
