"""CircuitBreaker: closed -> open after K failures -> one half-open probe after the cooldown."""

from __future__ import annotations

import pytest

from slime.engines.breaker import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(k: int = 3, cooldown_s: float = 5.0, max_cooldown_s: float = 20.0) -> tuple[CircuitBreaker, Clock]:
    clock = Clock()
    return CircuitBreaker(failure_threshold=k, cooldown_s=cooldown_s, max_cooldown_s=max_cooldown_s, clock=clock), clock


def test_k_consecutive_failures_open_it_and_a_success_in_between_resets_the_count():
    breaker, _ = make(k=3)
    assert [breaker.record_failure(), breaker.record_failure()] == [False, False]
    breaker.record_success()
    assert [breaker.record_failure(), breaker.record_failure()] == [False, False] and breaker.available()
    assert breaker.record_failure() is True
    assert breaker.state is BreakerState.OPEN and not breaker.available() and breaker.num_opens == 1


def test_after_the_cooldown_exactly_one_probe_goes_through():
    breaker, clock = make(k=1, cooldown_s=5.0)
    breaker.record_failure()
    clock.t += 4.9
    assert not breaker.available()
    clock.t += 0.1
    assert breaker.state is BreakerState.HALF_OPEN and breaker.available()
    breaker.begin()
    assert not breaker.available()  # the probe is out: nobody else
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.available() and breaker.num_consecutive_failures == 0


def test_a_failed_probe_reopens_it_with_a_doubled_cooldown_up_to_the_bound():
    breaker, clock = make(k=1, cooldown_s=5.0, max_cooldown_s=20.0)
    breaker.record_failure()
    waits = []
    for _ in range(4):
        clock.t += breaker.cooldown_s
        assert breaker.available()
        breaker.begin()
        assert breaker.record_failure() is True
        waits.append(breaker.cooldown_s)
    assert waits == [10.0, 20.0, 20.0, 20.0]
    clock.t += 19.9
    assert not breaker.available()
    clock.t += 0.1
    breaker.begin()
    breaker.record_success()
    assert breaker.cooldown_s == 5.0 and breaker.state is BreakerState.CLOSED


def test_a_probe_that_never_reports_frees_its_slot_after_a_cooldown():
    breaker, clock = make(k=1, cooldown_s=5.0)
    breaker.record_failure()
    clock.t += 5.0
    breaker.begin()
    clock.t += 4.0
    assert not breaker.available()
    clock.t += 1.0
    assert breaker.available()


def test_trip_opens_at_once_and_reports_only_the_first_time():
    breaker, _ = make(k=5)
    assert breaker.trip() is True and breaker.state is BreakerState.OPEN
    assert breaker.trip() is False and breaker.num_opens == 1


@pytest.mark.parametrize(
    "kwargs", [dict(failure_threshold=0, cooldown_s=1.0), dict(failure_threshold=1, cooldown_s=0.0)]
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        CircuitBreaker(**kwargs)
