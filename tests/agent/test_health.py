"""Counter health, pure: windowed counts, thresholds, hysteresis, resets, saturation, flaps."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from linkguard.agent.health import (
    DEFAULT_THRESHOLDS,
    CounterHealth,
    CounterHealthPolicy,
    CounterThreshold,
)

NONE: frozenset[str] = frozenset()
K = "mlx5_0/1"


def feed(h: CounterHealth, t: float, value: int, name: str = "symbol_error", **kw):
    return h.observe(
        K, {name: value}, kw.pop("saturated", NONE), usable=kw.pop("usable", True), now=t
    )


def test_defaults_are_the_documented_numbers() -> None:
    p = CounterHealthPolicy()
    assert (p.window_s, p.clear_after_s) == (60.0, 300.0)
    assert {n: (t.degrade, t.clear) for n, t in p.thresholds.items()} == {
        "symbol_error": (100, 10),
        "port_rcv_errors": (100, 10),
        "link_error_recovery": (3, 0),
        "link_downed": (2, 0),
        "local_link_integrity_errors": (2, 0),
        "excessive_buffer_overrun_errors": (2, 0),
        "rx_symbol_err_phy": (100, 10),
        "rx_crc_errors_phy": (100, 10),
        "link_down_events_phy": (2, 0),
    }
    # a setting replaces one counter's threshold, the others keep their defaults
    p = CounterHealthPolicy(thresholds={"symbol_error": {"degrade": 5, "clear": 1}})
    assert p.thresholds["symbol_error"] == CounterThreshold(degrade=5, clear=1)
    assert p.thresholds["link_downed"] == DEFAULT_THRESHOLDS["link_downed"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"thresholds": {"symbol_error": {"degrade": 5, "clear": 5}}}, "must be below degrade"),
        ({"window_s": 0}, "greater than 0"),
        ({"clear_after_s": -1}, "greater than or equal to 1"),
        ({"clear_after_s": 0.5}, "greater than or equal to 1"),  # under one counter reading
        ({"thresholds": {"x": {"degrade": 0, "clear": 0}}}, "greater than or equal to 1"),
    ],
)
def test_policy_validation(kwargs, message) -> None:
    with pytest.raises(ValidationError, match=message):
        CounterHealthPolicy(**kwargs)


def test_rate_over_the_window_degrades_and_names_the_counter() -> None:
    h = CounterHealth()
    assert not feed(h, 0.0, 1000).degraded  # first reading: the baseline
    assert not feed(h, 10.0, 1060).degraded  # 60 in the window
    v = feed(h, 20.0, 1120)  # 120 in the last 60 s
    assert v.degraded and v.reason == "symbol_error 120/60s"
    assert v.counts == {"symbol_error": 120}


def test_errors_spread_thinner_than_the_window_never_degrade() -> None:
    h = CounterHealth()
    feed(h, 0.0, 0)
    # 90 every 61 s: each window holds one burst of 90 < 100
    for i in range(1, 10):
        assert not feed(h, 61.0 * i, 90 * i).degraded


def test_reset_saturation_missing_and_unusable_never_degrade() -> None:
    h = CounterHealth()
    feed(h, 0.0, 50_000)
    # reset (cleared, driver reload): lower than before, whatever the new value
    assert not feed(h, 1.0, 40_000).degraded
    # saturated at the 16-bit max: no delta, however it got there
    assert not feed(h, 2.0, 65_535, saturated=frozenset({"symbol_error"})).degraded
    assert not feed(h, 3.0, 65_535, saturated=frozenset({"symbol_error"})).degraded
    # missing (unreadable) then back: a new baseline, no delta across the gap
    assert not h.observe(K, {"symbol_error": None}, NONE, usable=True, now=4.0).degraded
    assert not feed(h, 5.0, 90_000).degraded
    # while the port is down/training errors are expected: dropped
    assert not feed(h, 6.0, 190_000, usable=False).degraded
    assert h.evaluate(K, now=6.0).counts == {}


def test_noisy_counter_around_the_threshold_does_not_flap() -> None:
    """Errors alternate just above and just below the degrade threshold for 10 minutes: one
    transition to degraded, none back while the noise lasts, then one clear 300 s after the
    counts stayed at or below the clear threshold."""
    h = CounterHealth()
    value, transitions, last = 0, [], False
    feed(h, 0.0, value)
    t = 0.0
    for i in range(60):  # every 10 s, 15 or 20 errors: 90..120 per 60 s
        t += 10.0
        value += 20 if i % 2 else 15
        v = feed(h, t, value)
        if v.degraded != last:
            transitions.append((t, v.degraded))
            last = v.degraded
    assert len(transitions) == 1 and transitions[0][1] is True
    quiet_from = t  # no more errors from here: counts fall below 10 when the samples age out
    for _ in range(40):
        t += 10.0
        v = feed(h, t, value)
        if v.degraded != last:
            transitions.append((t, v.degraded))
            last = v.degraded
    assert [d for _, d in transitions] == [True, False]
    cleared_at = transitions[1][0]
    # the window empties 60 s after the last burst; 300 s later it clears
    assert cleared_at == quiet_from + 60.0 + 300.0


def test_clear_after_needs_an_unbroken_quiet_period_and_deadlines_say_when() -> None:
    h = CounterHealth()
    feed(h, 0.0, 0)
    assert feed(h, 1.0, 150).degraded
    assert h.next_deadline(K, now=1.0) == 61.0  # the burst leaves the window
    assert h.evaluate(K, now=61.0).degraded  # clean from 61 s
    assert h.next_deadline(K, now=61.0) == 361.0
    assert feed(h, 200.0, 161).degraded  # 11 > clear 10: the quiet period restarts
    assert h.evaluate(K, now=260.0).degraded
    assert h.next_deadline(K, now=260.0) == 560.0
    assert h.evaluate(K, now=559.9).degraded
    assert not h.evaluate(K, now=560.0).degraded
    assert h.next_deadline(K, now=560.0) is None


def test_flaps_the_monitor_saw_are_not_hidden_flaps() -> None:
    h = CounterHealth()
    feed(h, 0.0, 3, "link_downed")
    h.flap(K, now=5.0)
    h.flap(K, now=30.0)
    assert not feed(h, 40.0, 5, "link_downed").degraded  # both increments were seen flaps
    v = feed(h, 50.0, 7, "link_downed")  # two more the state poll never saw
    assert v.degraded and v.reason == "link_downed 2/60s"
    # a seen flap absorbs only within the window
    h2 = CounterHealth()
    feed(h2, 0.0, 0, "link_down_events_phy")
    h2.flap(K, now=1.0)
    v = h2.observe(K, {"link_down_events_phy": 2}, NONE, usable=True, now=100.0)
    assert v.degraded and v.reason == "link_down_events_phy 2/60s"


def test_disabled_and_unwatched_counters() -> None:
    h = CounterHealth(CounterHealthPolicy(enabled=False))
    feed(h, 0.0, 0)
    assert not feed(h, 1.0, 10_000).degraded
    h = CounterHealth()
    feed(h, 0.0, 0, "port_xmit_data")
    assert not feed(h, 1.0, 10**9, "port_xmit_data").degraded  # not an error counter


def test_first_reading_after_the_port_is_back_is_a_baseline() -> None:
    """Down, training, back: the first usable reading's delta spans the down period (training
    counts symbol errors by design), so it is a baseline; deltas count from the next one."""
    h = CounterHealth()
    feed(h, 0.0, 0)
    assert not feed(h, 1.0, 0, usable=False).degraded  # down
    v = feed(h, 2.0, 5000)  # back: 5000 errors from the training, not a gray failure
    assert not v.degraded and v.counts == {}
    assert not feed(h, 3.0, 5000).degraded
    v = feed(h, 4.0, 10_000)  # the same rise while up does degrade it
    assert v.degraded and v.reason == "symbol_error 5000/60s"
    # counters read while it was not usable, and an unreadable reading, end the same way
    h = CounterHealth()
    feed(h, 0.0, 0)
    feed(h, 1.0, 3000, usable=False)
    feed(h, 2.0, 6000, usable=False)
    assert h.observe(K, {"symbol_error": 7000}, NONE, usable=False, now=2.5).counts == {}
    assert feed(h, 3.0, 9000).counts == {}
    assert feed(h, 4.0, 9050).counts == {"symbol_error": 50}
    # baseline=True: the caller knows these counters may have been read before the edge
    v = h.observe(K, {"symbol_error": 20_000}, NONE, usable=True, now=5.0, baseline=True)
    assert v.counts == {"symbol_error": 50}
    assert feed(h, 6.0, 20_060).counts == {"symbol_error": 110}


def test_a_seen_flap_is_matched_with_one_increment_once() -> None:
    # the reading that shows the port down shows its link_downed too (before flap() is told)
    h = CounterHealth()
    feed(h, 0.0, 0, "link_downed")
    feed(h, 1.0, 1, "link_downed", usable=False)
    h.flap(K, now=1.0)
    feed(h, 2.0, 1, "link_downed")  # back: baseline
    v = feed(h, 10.0, 3, "link_downed")  # two flaps the state poll missed: not absorbed again
    assert v.degraded and v.reason == "link_downed 2/60s"
    # told first, the increment read while down: the same
    h = CounterHealth()
    feed(h, 0.0, 0, "link_downed")
    h.flap(K, now=1.0)
    feed(h, 1.5, 1, "link_downed", usable=False)
    feed(h, 2.0, 1, "link_downed")
    assert feed(h, 10.0, 3, "link_downed").degraded
    # counters read late: the increment shows after the baseline, the seen flap absorbs it once
    h = CounterHealth()
    feed(h, 0.0, 0, "link_downed")
    h.flap(K, now=1.0)
    feed(h, 1.1, 0, "link_downed", usable=False)
    feed(h, 2.0, 0, "link_downed")
    assert feed(h, 3.0, 1, "link_downed").counts == {}
    assert feed(h, 10.0, 2, "link_downed").counts == {"link_downed": 1}
    assert feed(h, 11.0, 3, "link_downed").degraded
    # retrains during one down period: matched with its one flap, the rest forgotten when
    # counting resumes (they do not swallow the next flap's late increment)
    h = CounterHealth()
    feed(h, 0.0, 0, "link_error_recovery")
    feed(h, 1.0, 0, "link_error_recovery", usable=False)
    h.flap(K, now=1.0)
    feed(h, 2.0, 4, "link_error_recovery", usable=False)
    feed(h, 3.0, 4, "link_error_recovery")
    feed(h, 4.0, 4, "link_error_recovery")
    h.flap(K, now=20.0)
    feed(h, 20.1, 4, "link_error_recovery", usable=False)
    feed(h, 21.0, 4, "link_error_recovery")
    assert feed(h, 22.0, 5, "link_error_recovery").counts == {}  # the flap at 20
    assert feed(h, 23.0, 6, "link_error_recovery").counts == {"link_error_recovery": 1}


def test_seeded_verdict_survives_a_restart_and_clears_after_clear_after_s_of_readings() -> None:
    # the first agent: 150 symbol errors in a minute degrade the port
    before = CounterHealth()
    feed(before, 0.0, 0)
    assert feed(before, 10.0, 150).reason == "symbol_error 150/60s"
    assert before.degraded_ports() == {K: ("symbol_error 150/60s", 10.0)}
    # the new agent (its monotonic clock started over) is seeded with what was saved
    h = CounterHealth()
    h.seed(K, reason="symbol_error 150/60s", since=-42.0)
    assert h.degraded_ports() == {K: ("symbol_error 150/60s", -42.0)}
    assert h.next_deadline(K, now=5.0) is None  # the clear timer waits for a reading
    v = feed(h, 5.0, 1_000_150)  # first reading: a baseline (no delta), still degraded
    assert (v.degraded, v.reason, v.counts) == (True, "symbol_error 150/60s", {})
    assert h.next_deadline(K, now=5.0) == 305.0  # clear_after_s from that first reading
    assert feed(h, 200.0, 1_000_155).degraded  # 5 errors: at or below clear (10)
    assert h.evaluate(K, now=304.9).degraded
    assert not h.evaluate(K, now=305.0).degraded
    assert h.degraded_ports() == {}
    # errors after the restart restart the timer, as without a restart
    h = CounterHealth()
    h.seed(K, reason="symbol_error 150/60s", since=0.0)
    feed(h, 5.0, 0)
    assert feed(h, 100.0, 11).degraded  # 11 > clear: dirty until it leaves the window
    assert h.evaluate(K, now=405.0).degraded  # the 300 s run from 5 s was broken
    assert not h.evaluate(K, now=460.0).degraded  # clean from 160 s (100 + 60) + 300


def test_seed_validates_and_is_ignored_when_disabled() -> None:
    h = CounterHealth()
    for reason in ("", "  ", "x" * 201, None, 5):
        with pytest.raises(ValueError, match="reason must be"):
            h.seed(K, reason=reason, since=0.0)  # type: ignore[arg-type]
    for since in (float("nan"), float("inf"), "1", None):
        with pytest.raises(ValueError, match="since must be"):
            h.seed(K, reason="symbol_error 150/60s", since=since)  # type: ignore[arg-type]
    assert h.degraded_ports() == {}
    off = CounterHealth(CounterHealthPolicy(enabled=False))
    off.seed(K, reason="symbol_error 150/60s", since=0.0)
    assert off.degraded_ports() == {} and not feed(off, 1.0, 0).degraded
