"""Strict JSON for every file a run writes (``metrics.jsonl``, ``summary.json``, ``config.json``, reports).

Python's ``json`` writes NaN and infinities as the bare tokens ``NaN`` / ``Infinity``, which are not
JSON (RFC 8259) and break ``jq``, JavaScript and most other readers. Here they become ``null``, the
value a metric with nothing to measure has (no eval set, no counted sample). Example:
``dumps({"accuracy": float("nan"), "lag": {0: 3}})`` -> ``'{"accuracy": null, "lag": {"0": 3}}'``.
"""

from __future__ import annotations

import json
import math

__all__ = ["dumps", "finite_or_null"]


def finite_or_null(obj: object) -> object:
    """``obj`` with every non-finite float (NaN, +-inf) replaced by None, through dicts, lists and tuples
    (tuples come back as lists, as JSON has them)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def dumps(obj: object, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """``json.dumps`` that writes only valid JSON: non-finite floats as null, unknown objects as ``str(obj)``.

    Raises:
        ValueError: never for floats; ``json.dumps``'s own errors (e.g. a circular reference) pass through.
    """
    return json.dumps(finite_or_null(obj), indent=indent, sort_keys=sort_keys, default=str, allow_nan=False)
