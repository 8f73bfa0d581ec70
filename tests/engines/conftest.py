"""Fixtures shared by the rollout tests: ``start_engines`` starts in-process fake SGLang engines
(``FakeEngine`` of ``test_client.py``, canned replies, every call recorded)."""

from tests.engines.test_client import start_engines  # noqa: F401 (re-exported fixture)
