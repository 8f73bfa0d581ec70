"""The pieces of ``slime.cli.compat``'s table: what an entry is, and how a fact is read from an HF ``config.json``.

``Checked`` entries read one fact of the HF config (``Fact``: the key, its JSON value, that value in the flag's
terms). Two sentinels stand for what the config cannot give: ``MISSING`` (the config does not say: logged, not
an error) and ``UNUSED`` (the flag configures a part this model does not have, e.g. ``--kv-channels`` with
multi-latent attention, whose head widths are ``--qk-head-dim`` / ``--v-head-dim``: accepted, logged).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MISSING", "UNUSED", "HFConfig", "Fact", "Checked", "NoOp", "key"]

MISSING = object()
UNUSED = object()

HFConfig = dict[str, Any]
"""A model's HF ``config.json`` (its ``text_config`` merged in): JSON, so its values are ``Any``."""
Fact = tuple[str, Any, object]
"""``(key, raw, value)`` of one fact of an ``HFConfig``: the key that holds it, its JSON value there, and that
value in the flag's terms (``MISSING`` when the config does not say, ``UNUSED`` when the flag does not apply)."""


@dataclass(frozen=True)
class Checked:
    """An architecture flag checked against the HF config.

    ``hf_value(hf)`` returns ``(key, raw, value)``: the HF ``config.json`` key that holds the fact, its
    value there, and that value in the flag's terms (``MISSING`` when the config does not say:
    logged, not an error).
    """

    hf_value: Callable[[HFConfig], Fact]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class NoOp:
    """Accepted and logged once with ``reason``; a value outside ``allowed`` (when set) is an error."""

    reason: str
    kwargs: dict[str, Any]
    allowed: tuple[Any, ...] | None = None


def key(
    *keys: str, default: object = MISSING, convert: Callable[[Any], object] = lambda v: v
) -> Callable[[HFConfig], Fact]:
    """The first of ``keys`` present in the HF config, converted; else ``default`` under ``keys[0]``."""

    def get(hf: HFConfig) -> Fact:
        for k in keys:
            if k in hf and hf[k] is not None:
                return k, hf[k], convert(hf[k])
        return keys[0], "absent", default

    return get
