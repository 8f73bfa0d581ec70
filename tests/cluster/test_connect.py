"""``--ray-address`` semantics (``slime.cluster.connect``): auto joins or starts, an address must answer."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from slime.cluster import connect as connect_module  # noqa: E402
from slime.cluster.connect import Connection, connect  # noqa: E402
from slime.errors import RunError  # noqa: E402


class FakeInit:
    """``ray.init`` that finds a cluster only at ``running`` (None: none anywhere)."""

    def __init__(self, running: str | None) -> None:
        self.running, self.calls = running, []

    def __call__(self, address: str | None = None, **kwargs):
        self.calls.append(address)
        if address is None:
            return type("Ctx", (), {"address_info": {"gcs_address": "127.0.0.1:6379"}})()
        if self.running is None or (address != "auto" and address != self.running):
            raise ConnectionError(f"no cluster at {address}")
        return type("Ctx", (), {"address_info": {"gcs_address": self.running}})()


@pytest.fixture
def not_connected(monkeypatch):
    monkeypatch.setattr(connect_module.ray, "is_initialized", lambda: False)


def test_auto_joins_a_running_cluster(not_connected):
    init = FakeInit("10.0.0.1:6379")
    assert connect("auto", init=init) == Connection("10.0.0.1:6379", started=False)
    assert init.calls == ["auto"]


def test_auto_starts_a_local_ray_when_none_runs(not_connected):
    init = FakeInit(None)
    assert connect(init=init) == Connection("127.0.0.1:6379", started=True)
    assert init.calls == ["auto", None]


def test_an_address_that_does_not_answer_is_one_line(not_connected):
    with pytest.raises(
        RunError, match=r"^--ray-address 10.9.9.9:6379: no Ray cluster reachable there .*docs/ray.md\)$"
    ):
        connect("10.9.9.9:6379", init=FakeInit("10.0.0.1:6379"))


def test_local_always_starts_one(not_connected):
    init = FakeInit("10.0.0.1:6379")
    assert connect("local", init=init).started and init.calls == [None]


def test_already_connected_is_kept(ray_cluster):
    assert connect("auto", init=FakeInit(None)) == Connection(ray_cluster.address, started=False)
