"""slime's exception tree. Errors are translated once, at the boundary where they arise.

    SlimeError
    ├── ConfigError (ValueError)        a flag or config value is invalid; names the flag
    ├── DataError (ValueError)          a malformed dataset row; names file:line
    ├── RunError                        a run ended with nothing to show (it trained nothing); its files are written
    ├── CheckpointError (ValueError)    a model directory's file is missing, corrupt or truncated; names the file
    ├── EngineError                     anything from an inference engine (SGLang or embedded)
    │   ├── EngineUnavailable           cannot connect / connection dropped / 5xx: retry elsewhere
    │   ├── EngineTimeout (TimeoutError) the call ran past its ``*_timeout_s``
    │   ├── EngineRequestError          the engine refused the request (4xx); carries its message
    │   └── ProtocolError               the engine sent something we do not understand
    └── PluginError                     a user plugin (reward, generate, tool) broke its contract

Every ``EngineError`` carries ``url`` (engine base URL), ``endpoint``, ``status`` (HTTP status or
None) and ``engine_message`` (the engine's own words, from whichever error-body shape it used).
"""

from __future__ import annotations

__all__ = [
    "first_slime_error",
    "SlimeError",
    "ConfigError",
    "DataError",
    "RunError",
    "CheckpointError",
    "EngineError",
    "EngineUnavailable",
    "EngineTimeout",
    "EngineRequestError",
    "ProtocolError",
    "PluginError",
]


class SlimeError(Exception):
    """Base of every error slime raises on purpose."""


class ConfigError(SlimeError, ValueError):
    """An invalid configuration value; the message names the CLI flag."""


class DataError(SlimeError, ValueError):
    """A malformed dataset row; the message names ``path:line``."""


class RunError(SlimeError):
    """A run that finished its steps without a usable result (e.g. every sample FAILED, so nothing
    trained). Raised after the run's records, summary and report are written."""


class CheckpointError(SlimeError, ValueError):
    """A model directory (``--hf-checkpoint`` and the like) with a missing, corrupt or truncated file;
    the message names the file (``slime.hf_checkpoint.check_hf_dir``)."""


class EngineError(SlimeError):
    """An error talking to an inference engine.

    Attributes:
        url: engine base URL (``http://host:port``).
        endpoint: the path called (``/generate``).
        status: HTTP status, or None when no response arrived.
        engine_message: the engine's own error text (or the transport error's text).
    """

    def __init__(self, message: str, *, url: str = "", endpoint: str = "", status: int | None = None, engine_message: str = ""):
        self.url = url
        self.endpoint = endpoint
        self.status = status
        self.engine_message = engine_message
        where = f"{url}{endpoint}" if url or endpoint else "engine"
        status_s = f" (HTTP {status})" if status is not None else ""
        super().__init__(f"{where}{status_s}: {message}")


class EngineUnavailable(EngineError):
    """The engine cannot be reached, dropped the connection, or answered 5xx. Retry elsewhere."""


class EngineTimeout(EngineError, TimeoutError):
    """An engine call ran past its timeout."""


class EngineRequestError(EngineError):
    """The engine refused the request (4xx or ``success: false``)."""


class ProtocolError(EngineError):
    """The engine answered with a body we do not understand."""


class PluginError(SlimeError):
    """A user plugin broke its contract (wrong return type, misaligned lists)."""


def first_slime_error(group: BaseExceptionGroup) -> SlimeError | None:
    """The first ``SlimeError`` in a (nested) exception group (raised inside a task group), or None."""
    for exc in group.exceptions:
        if isinstance(exc, SlimeError):
            return exc
        if isinstance(exc, BaseExceptionGroup) and (found := first_slime_error(exc)) is not None:
            return found
    return None
