"""Typed configuration: one ``msgspec.Struct`` section per component, under one root ``Config``.

One module per section, each with its own ``validate`` (checks of that section's fields alone):
``data`` (prompts, eval sets), ``rollout`` (sampling, requests, rewards, eval sampling), ``loop``
(mode, batch and step counts, staleness, buffer), ``train`` (optimizer, algorithm, backend) with
``megatron`` (the megatron-core backend's knobs), ``sync`` (weight updates), ``engine`` (engines and
their launch), ``obs`` (trace, metrics), ``debug`` (record, replay, one-sided runs); ``root`` holds
``Config``, the run-wide fields (``run_dir``, ``save_interval``, ``load``, ``seed``) and the checks
across sections.

Each fact is one field, in the section that owns it; code that needs another section's fact gets it
passed by the code that wires the run (e.g. the trainer's ``rollout_temperature``, ``max_staleness``
and ``seed``, from ``rollout``, ``loop`` and the root), so a ``Config`` cannot disagree with itself.
Each component receives its own section, never the root (``Scheduler(config.loop, ...)``).
Slime-compatible CLI flags map onto these fields in ``slime/cli/args.py``; a test pins that map.
Values are checked at start: ``Config.validate`` raises ``ConfigError`` naming the CLI flag.
"""

from __future__ import annotations

from slime.config.data import DataConfig
from slime.config.debug import DebugConfig
from slime.config.engine import EngineConfig
from slime.config.loop import LoopConfig
from slime.config.megatron import MegatronConfig
from slime.config.obs import ObsConfig
from slime.config.rollout import RolloutConfig
from slime.config.root import Config
from slime.config.sync import SyncConfig
from slime.config.train import TrainConfig

__all__ = [
    "DataConfig",
    "RolloutConfig",
    "LoopConfig",
    "MegatronConfig",
    "TrainConfig",
    "SyncConfig",
    "EngineConfig",
    "ObsConfig",
    "DebugConfig",
    "Config",
]
