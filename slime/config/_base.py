"""What every config section shares: the struct options, the check helper of ``validate``, and the
declared range of each numeric field (``Range``, checked by ``check_ranges``).

A numeric field declares its values next to it, as ``Annotated`` metadata (msgspec ignores it)::

    rollout_batch_size: Annotated[int, Range(ge=1)] = 16
    eval_top_k: Annotated[int, Range(ge=1, also=(-1,), note="(the whole vocabulary)")] | None = None
    rollout_stop_token_ids: tuple[Annotated[int, Range(ge=0)], ...] = ()

and each section's ``validate`` starts with ``check_ranges(self)``: one line per bad value, naming the
CLI flag and the range, e.g. ``--n-samples-per-prompt=100000 is invalid: expected in [1, 1024]``. A
float must also be finite (``inf`` and ``nan`` are never in a range). ``tests/test_flag_ranges.py``
fails for a numeric field without a ``Range``, so a new flag cannot slip through unchecked.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from slime.errors import ConfigError

__all__ = ["STRUCT", "require", "Range", "check_ranges", "field_ranges"]

STRUCT: dict[str, Any] = dict(kw_only=True, frozen=True, forbid_unknown_fields=True)
"""``msgspec.Struct`` options of every section: keyword-only, immutable, unknown fields refused."""


def require(checks: list[tuple[bool, str, object, str]]) -> None:
    """Raise on the first failed check of ``(ok, flag, value, expected)``.

    Raises:
        ConfigError: ``"{flag}={value!r} is invalid: expected {expected}"``.
    """
    for ok, flag, value, want in checks:
        if not ok:
            raise ConfigError(f"{flag}={value!r} is invalid: expected {want}")


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric field may take: the bounds given (``ge`` / ``gt`` below, ``le`` / ``lt``
    above), or one of ``also`` (a special value, e.g. -1 = off). Floats must be finite.

    ``flag``: what the message names; default ``--`` + the field name with dashes (give it where the CLI
    flag is spelled otherwise, or the field name for a field without a flag). ``note``: appended to the
    range in the message, e.g. ``"(0 = off)"``.
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    also: tuple[float, ...] = ()
    flag: str | None = None
    note: str = ""

    def admits(self, value: object) -> bool:
        """Whether ``value`` (an int or float, never a bool) is in the range."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if value in self.also:
            return True
        if isinstance(value, float) and not math.isfinite(value):
            return False
        low = (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
        return low and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt)

    def describe(self) -> str:
        """The range in words: ``>= 1``, ``in [0, 1)``, ``in (0, 1], or -1 (off)``."""
        low = ("[", self.ge) if self.ge is not None else ("(", self.gt) if self.gt is not None else None
        high = (self.le, "]") if self.le is not None else (self.lt, ")") if self.lt is not None else None
        if low and high:
            text = f"in {low[0]}{_num(low[1])}, {_num(high[0])}{high[1]}"
        elif low:
            text = f"{'>=' if low[0] == '[' else '>'} {_num(low[1])}"
        elif high:
            text = f"{'<=' if high[1] == ']' else '<'} {_num(high[0])}"
        else:
            text = "a finite number"
        text += "".join(f", or {_num(v)}" for v in self.also)
        return text + (self.note if self.note.startswith(",") else f" {self.note}") if self.note else text

    def flag_of(self, field: str) -> str:
        return self.flag or "--" + field.replace("_", "-")


def _num(x: float) -> str:
    """A bound as written in a message: ``1`` for 1.0, ``1e-08`` as is."""
    return str(int(x)) if isinstance(x, float) and x.is_integer() and abs(x) < 1e15 else str(x)


_RANGES: dict[type, dict[str, tuple[Range | None, bool]]] = {}


def field_ranges(cls: type) -> dict[str, tuple[Range | None, bool]]:
    """``{field: (its Range or None, whether the field holds numbers)}`` of a config section class.

    A field holds numbers when its type is ``int`` or ``float`` (bools excluded), optionally ``| None`` or
    a ``tuple[..., ...]`` of them; its ``Range`` is the ``Annotated`` metadata of that number type.
    """
    import msgspec

    if cls not in _RANGES:  # read once per class
        hints = typing.get_type_hints(cls, include_extras=True)
        _RANGES[cls] = {f.name: _range_of(hints[f.name]) for f in msgspec.structs.fields(cls)}
    return _RANGES[cls]


def _range_of(hint: Any) -> tuple[Range | None, bool]:
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(hint)
        found = next((m for m in meta if isinstance(m, Range)), None)
        return found, _is_number(base)
    if origin in (typing.Union, types.UnionType):
        parts = [_range_of(a) for a in typing.get_args(hint) if a is not type(None)]
        return next((r for r, _ in parts if r is not None), None), any(n for _, n in parts)
    if origin is tuple:
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        parts = [_range_of(a) for a in args]
        return next((r for r, _ in parts if r is not None), None), any(n for _, n in parts)
    return None, _is_number(hint)


def _is_number(t: Any) -> bool:
    return t in (int, float)


def check_ranges(section: Any) -> None:
    """Check every numeric field of ``section`` (a config struct) against its declared ``Range``; None
    (an unset optional field) passes; each element of a tuple is checked.

    Raises:
        ConfigError: the first value outside its range, ``"{flag}={value!r} is invalid: expected {range}"``.
    """
    for name, (rng, _) in field_ranges(type(section)).items():
        if rng is None:
            continue
        value = getattr(section, name)
        for v in value if isinstance(value, tuple) else (value,):
            if v is not None and not rng.admits(v):
                shown = value if isinstance(value, tuple) else v
                finite = "a finite value " if isinstance(v, float) and not math.isfinite(v) else ""
                raise ConfigError(f"{rng.flag_of(name)}={shown!r} is invalid: expected {finite}{rng.describe()}")
