"""RFC 8405 solve back-off: the delays each state gives, the timers that move between them."""

from __future__ import annotations

import pytest

from linkguard.config import ConfigError, ServiceSettings
from linkguard.topology.backoff import BackoffPolicy, BackoffState, SolveBackoff

POLICY = BackoffPolicy(
    initial_ms=10, short_ms=150, long_ms=1000, time_to_learn_ms=500, holddown_ms=3000
)


def test_first_change_after_quiet_is_solved_after_the_initial_delay() -> None:
    b = SolveBackoff(POLICY)
    assert b.on_change(100.0) == pytest.approx(100.010)
    assert b.state is BackoffState.SHORT_WAIT
    # more changes before it runs ride along: the timer is not restarted (RFC 8405 5.1)
    assert b.on_change(100.005) == pytest.approx(100.010)
    b.started(100.010)
    assert b.due is None


def test_leaf_failure_is_two_solves_first_port_then_the_rest() -> None:
    b = SolveBackoff(POLICY)
    solves = []
    # 16 ports reported over one 100 ms poll interval, one every 6.25 ms
    for i in range(16):
        t = 10.0 + i * 0.00625
        if b.due is not None and b.due <= t:
            solves.append(round(b.due, 4))
            b.started(b.due)
        b.on_change(t)
    solves.append(round(b.due, 4))
    assert solves == [10.01, 10.0125 + 0.15]


def test_churn_past_time_to_learn_moves_to_the_long_delay() -> None:
    b = SolveBackoff(POLICY)
    b.on_change(0.0)
    b.started(0.01)
    assert b.on_change(0.4) == pytest.approx(0.55)  # SHORT_WAIT: 150 ms
    b.started(0.55)
    assert b.on_change(0.6) == pytest.approx(1.6)  # 600 ms > time to learn: LONG_WAIT, 1 s
    assert b.state is BackoffState.LONG_WAIT
    b.started(1.6)
    assert b.on_change(3.0) == pytest.approx(4.0)  # 2.4 s since the last change < holddown
    b.started(4.0)
    # 3 s without a change: quiet again, the next failure is solved at once
    assert b.on_change(6.01) == pytest.approx(6.02)
    assert b.state is BackoffState.SHORT_WAIT


def test_a_return_to_use_is_never_urgent() -> None:
    b = SolveBackoff(POLICY)
    assert b.on_change(50.0, urgent=False) == pytest.approx(50.15)
    assert b.state is BackoffState.SHORT_WAIT


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="initial_ms must be >= 0"):
        BackoffPolicy(initial_ms=-1)
    with pytest.raises(ValueError, match=r"holddown_ms \(100\) must be >= time_to_learn_ms"):
        BackoffPolicy(time_to_learn_ms=500, holddown_ms=100)


def test_service_settings_carry_the_policy() -> None:
    s = ServiceSettings(solve={"initial_ms": 5, "short_ms": 200})
    assert s.backoff_policy() == BackoffPolicy(initial_ms=5, short_ms=200)
    with pytest.raises((ConfigError, ValueError), match=r"solve\n.*holddown_ms \(1000\) must be"):
        ServiceSettings(solve={"time_to_learn_ms": 5000, "holddown_ms": 1000})
