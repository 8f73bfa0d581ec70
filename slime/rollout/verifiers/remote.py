"""The ``remote`` verifier: a reward model behind HTTP (``--rm-url``), as slime's ``remote_rm``.

Request: ``POST <rm_url>`` with JSON ``{"prompt": str, "response": str, "label": str | null}``.
Reply: HTTP 200 with JSON ``{"reward": <finite number>}`` (other keys are ignored).

Every other outcome raises ``PluginError`` naming the url and what arrived (status and the start
of the body, non-JSON, no ``reward``, a non-number, NaN, no reply within ``timeout_s``); the
reward boundary (``slime/rollout/rewards.py``) then marks the sample FAILED. There are no
retries: a flaky reward server shows up as failed samples, not as hidden latency. Evidence:
``{"checked": {"kind": "remote", "url"}, "verdict": "scored" | "error", "logs": ...}``.

Lifecycle: the verifier owns one ``aiohttp.ClientSession``, made on the first call (inside the
running loop) unless one is passed in; ``close()`` (idempotent) or ``async with`` ends it.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import aiohttp

from slime.errors import PluginError
from slime.types import Sample

__all__ = ["RemoteRewardModel"]

_MAX_BODY_CHARS = 500


class RemoteRewardModel:
    """``await RemoteRewardModel(url, timeout_s=30)(sample) -> float``.

    Args:
        url: the reward server's full URL (``http://host:port/path``).
        timeout_s: per request, connect to last byte.
        session: an ``aiohttp.ClientSession`` to use and leave open; None: own one.
    """

    def __init__(self, url: str, *, timeout_s: float = 30.0, session: aiohttp.ClientSession | None = None):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--rm-url={url!r}: expected an http:// or https:// URL")
        if timeout_s <= 0:
            raise ValueError(f"RemoteRewardModel: timeout_s={timeout_s} must be > 0")
        self.url, self.timeout_s = url, timeout_s
        self._session = session
        self._owns_session = session is None

    async def __aenter__(self) -> RemoteRewardModel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the owned session, if one was made. Idempotent."""
        if self._owns_session and self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def __call__(self, sample: Sample) -> float:
        evidence: dict[str, Any] = {"checked": {"kind": "remote", "url": self.url}, "verdict": "error", "logs": ""}
        sample.evidence["verifier"] = evidence
        try:
            reward = await self._post({"prompt": sample.prompt, "response": sample.response, "label": sample.label})
        except PluginError as exc:
            evidence["logs"] = str(exc)
            raise
        evidence.update(verdict="scored", logs=f"reward {reward}")
        return reward

    async def _post(self, payload: dict[str, Any]) -> float:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self._session.post(self.url, json=payload) as resp:
                    status, body = resp.status, await resp.text(errors="replace")
        except TimeoutError:  # a PluginError, not a TimeoutError: the reward boundary reports its own timeouts as such
            raise PluginError(f"remote reward model {self.url}: no reply within {self.timeout_s}s") from None
        except aiohttp.ClientError as exc:
            raise PluginError(f"remote reward model {self.url}: request failed: {type(exc).__name__}: {exc}") from exc
        if status != 200:
            raise PluginError(f"remote reward model {self.url}: HTTP {status}: {body[:_MAX_BODY_CHARS]!r}")
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            raise PluginError(
                f"remote reward model {self.url}: reply is not JSON: {body[:_MAX_BODY_CHARS]!r}"
            ) from None
        if not isinstance(data, dict) or "reward" not in data:
            raise PluginError(f"remote reward model {self.url}: reply has no 'reward' key: {body[:_MAX_BODY_CHARS]!r}")
        value = data["reward"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise PluginError(f"remote reward model {self.url}: 'reward' must be a finite number, got {value!r}")
        return float(value)
