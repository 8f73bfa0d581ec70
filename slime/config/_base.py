"""What every config section shares: the struct options and the check helper of ``validate``."""

from __future__ import annotations

from typing import Any

from slime.errors import ConfigError

__all__ = ["STRUCT", "require"]

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
