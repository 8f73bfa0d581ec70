"""Reading a user's YAML file (``--sglang-config``, ``--eval-config``) with one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slime.errors import ConfigError

__all__ = ["read_yaml"]


def read_yaml(path: str | Path, where: str) -> Any:
    """``yaml.safe_load`` of the file at ``path``.

    Raises:
        ConfigError: ``"<where>: cannot read: ..."`` or ``"<where>: not valid YAML: ..."``.
    """
    import yaml  # PyYAML (a transformers dependency)

    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None
