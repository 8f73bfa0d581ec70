"""``EngineConfig``: the engines: embedded ones, SGLang servers and routers to launch or attach to, health, the OPD teacher (``slime.engines``)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from slime.config._base import STRUCT, Range, check_ranges, require

__all__ = ["EngineConfig", "RAY_ROLES"]

RAY_ROLES = ("actor", "teacher", "router")
"""The roles of ``--ray-placed-engines`` entries."""


class EngineConfig(msgspec.Struct, **STRUCT):
    hf_checkpoint: str = ""
    """HF model directory the engines and the trainer start from (``--hf-checkpoint``)."""
    rollout_external_engine_addrs: tuple[str, ...] = ()
    """Engines that already run (``--rollout-external-engine-addrs``); empty = launch embedded ones."""
    num_engines: Annotated[int, Range(ge=1, flag="--rollout-num-engines")] = 1
    """Embedded engines to launch (``--rollout-num-engines``)."""
    max_running_requests: Annotated[int, Range(ge=1)] = 256
    """Requests an embedded engine runs at once (``--max-running-requests``)."""
    engine_threads: Annotated[int, Range(ge=1)] = 1
    """torch threads per embedded engine."""
    startup_timeout_s: Annotated[float, Range(gt=0, flag="--engine-startup-timeout-s")] = 120.0
    """Bound on one engine's (or router's) start, and on a restarted engine's return."""
    # Real SGLang (slime/engines/fleet/plan.py): launched from these, or attached to.
    rollout_num_gpus: Annotated[int, Range(ge=1)] | None = None
    """GPUs for SGLang servers (``--rollout-num-gpus``); set (or ``sglang_config``) = launch SGLang instead
    of embedded engines; engines = rollout_num_gpus / rollout_num_gpus_per_engine."""
    rollout_num_gpus_per_engine: Annotated[int, Range(ge=1)] = 1
    """GPUs (= ``--tp-size``) per SGLang server (``--rollout-num-gpus-per-engine``)."""
    rollout_num_gpus_per_node: Annotated[int, Range(ge=1, note=", or unset")] | None = None
    """GPUs of each node the placement lays servers (and trainer ranks) on (``--rollout-num-gpus-per-node``,
    THUDM/slime's); None = ``len(CUDA_VISIBLE_DEVICES)``, else 8 (``slime.engines.fleet.placement``)."""
    sglang_args: tuple[str, ...] = ()
    """Every ``--sglang-X ...`` flag of ``slime train``, prefix stripped (``--X ...``), values untouched,
    in order: appended to each ``sglang.launch_server`` command."""
    router_args: tuple[str, ...] = ()
    """Every ``--router-X ...`` flag, prefix stripped, for ``sglang_router.launch_router``."""
    sglang_router_ip: str | None = None
    """A router that already runs (``--sglang-router-ip``), or the address ours binds."""
    sglang_router_port: Annotated[int, Range(ge=1, le=65535)] | None = None
    """Its port (``--sglang-router-port``); None = a free port from ``base_port``."""
    sglang_config: str | None = None
    """YAML of server groups: models, roles (prefill/decode), per-group args (``--sglang-config``)."""
    base_port: Annotated[int, Range(ge=1, le=65535, flag="base_port")] = 15000
    """First port tried for launched servers and routers (taken ports are skipped)."""
    health_check_interval_s: Annotated[float, Range(ge=0, note="(0 = off)")] = 10.0
    """Seconds between ``/health_generate`` probes of each engine (``--health-check-interval-s``); 0 = off."""
    health_check_timeout_s: Annotated[float, Range(gt=0, flag="health_check_timeout_s")] = 30.0
    """Bound on one probe (SGLang answers 503 after its own 20 s, docs/sglang.md#health)."""
    circuit_breaker_threshold: Annotated[int, Range(ge=1, flag="circuit_breaker_threshold")] = 3
    """Consecutive failures (requests or probes) that open an engine's circuit breaker."""
    circuit_breaker_cooldown_s: Annotated[float, Range(ge=0, flag="circuit_breaker_cooldown_s")] = 10.0
    """First wait before a probe of an open breaker; doubles per failed probe, up to 8x."""
    max_engine_restarts: Annotated[int, Range(ge=0, flag="max_engine_restarts")] = 3
    """Restarts of one launched engine before it stays out of rotation for the rest of the run."""
    ray_placed_engines: tuple[str, ...] = ()
    """The engines ``slime train --ray`` placed for this run, ``ROLE=URL`` with ROLE ``actor``, ``teacher``
    or ``router`` (``--ray-placed-engines``, set by the driver on its trainer ranks): the run attaches to
    them instead of launching the engines its other flags describe, and waits for a dead one as for a
    launched engine (Ray restarts it on its bundle). Example: ``("actor=http://10.0.0.3:15000",)``."""
    opd_teacher_load: str | None = None
    """HF directory of the on-policy-distillation teacher (``--opd-teacher-load``): one embedded engine
    serving it is launched beside the actor's (its own pool, ``model: teacher``, never weight-synced).
    With SGLang servers, declare the teacher as a ``model: teacher`` group of ``--sglang-config`` instead."""
    opd_teacher_addrs: tuple[str, ...] = ()
    """Teacher engines (or one router) that already run, ``host:port`` or URLs (``--opd-teacher-addrs``)."""

    def validate(self) -> None:
        """Check this section's values.

        Raises:
            ConfigError: naming the flag.
        """
        check_ranges(self)
        require(
            [
                (
                    all(e.partition("=")[0] in RAY_ROLES and e.partition("=")[2] for e in self.ray_placed_engines),
                    "--ray-placed-engines",
                    " ".join(self.ray_placed_engines),
                    f"ROLE=URL with ROLE one of {', '.join(RAY_ROLES)} (slime train --ray sets it)",
                ),
                (
                    not (self.opd_teacher_load and self.opd_teacher_addrs),
                    "--opd-teacher-load with --opd-teacher-addrs",
                    f"{self.opd_teacher_load!r} and {list(self.opd_teacher_addrs)}",
                    "one teacher: launch one or attach to running ones",
                ),
            ]
        )
