"""PortMonitor damping: RFC 2439-style penalty mode, and a port cycling through the IB link
bring-up (DOWN/Polling -> DOWN/LinkUp -> INIT/LinkUp -> ACTIVE/LinkUp) under both modes.

Expected values are computed here by hand from the half-life formula
``penalty(t) = penalty(t0) * 2**(-(t - t0) / half_life)`` and the default policy.
"""

from __future__ import annotations

import math

import pytest
from structlog.testing import capture_logs

from linkguard.agent.monitor import DampingPolicy, PortMonitor
from linkguard.drivers.base import PortObservation
from linkguard.models import LinkLayer, PhysState, PortStateName, PortStatus

WALL = 1_700_000_000.0
KEY = "mlx5_0/1"
UP, DOWN, HELD = PortStatus.UP, PortStatus.DOWN, PortStatus.HELD_DOWN
SUPP = PortStatus.SUPPRESSED
CYCLE = [("DOWN", "Polling"), ("DOWN", "LinkUp"), ("INIT", "LinkUp"), ("ACTIVE", "LinkUp")]


def ib(state: str, phys: str = "LinkUp", hca: str = "mlx5_0") -> PortObservation:
    return PortObservation(
        hca=hca,
        port=1,
        monotonic=0.0,
        link_layer=LinkLayer.INFINIBAND,
        state=PortStateName(state),
        phys_state=PhysState(phys),
    )


def decay(p: float, dt: float) -> float:
    return p * 2 ** (-dt / 60.0)  # default half-life 60 s


def events(out) -> list[str]:
    return [f"{e.previous.value}->{e.current.value}" for e in out.events]


def monitor(mode: str = "penalty") -> PortMonitor:
    mon = PortMonitor(host="gpu-01", policy=DampingPolicy(mode=mode))
    assert events(mon.observe([ib("ACTIVE")], now=0.0, wall=WALL)) == ["unknown->up"]
    return mon


def down_up(mon: PortMonitor, t_down: float, t_up: float):
    mon.observe([ib("DOWN", "Polling")], now=t_down, wall=WALL)
    return mon.observe([ib("ACTIVE")], now=t_up, wall=WALL)


def test_penalty_decays_with_half_life():
    mon = monitor()
    out = mon.observe([ib("DOWN", "Polling")], now=10.0, wall=WALL)
    assert out.states[0].damping.penalty == 1000.0
    mon.tick(now=40.0, wall=WALL)
    assert mon.state(KEY).damping.penalty == pytest.approx(1000 / math.sqrt(2), rel=1e-12)
    assert mon.state(KEY).damping.penalty == pytest.approx(707.10678, abs=1e-5)
    mon.tick(now=70.0, wall=WALL)
    assert mon.state(KEY).damping.penalty == 500.0  # one half-life
    mon.observe([ib("ACTIVE")], now=70.0, wall=WALL)
    out = mon.observe([ib("DOWN", "Polling")], now=130.0, wall=WALL)
    st = out.states[0].damping
    assert (st.penalty, st.flaps, st.suppressed) == (1250.0, 2, False)  # 500/2 + 1000


def test_single_flap_needs_only_the_initial_hold_down():
    mon = monitor()
    out = down_up(mon, 10.0, 11.0)
    st = out.states[0]
    assert (st.status, st.damping.hold_down_s, out.next_deadline) == (HELD, 10.0, 21.0)
    assert events(mon.tick(now=21.0, wall=WALL)) == ["held_down->up"]
    down_up(mon, 30.0, 31.0)  # penalty mode: no doubling, the penalty backs off
    assert mon.state(KEY).damping.hold_down_s == 10.0


def test_suppress_then_reuse_at_the_computed_time():
    mon = monitor()
    down_up(mon, 10.0, 11.0)
    down_up(mon, 12.0, 13.0)
    assert mon.state(KEY).status == HELD  # 1000/2**(2/60) + 1000 = 1977 < 2000
    out = mon.observe([ib("DOWN", "Polling")], now=14.0, wall=WALL)
    expected = decay(1000, 4) + decay(1000, 2) + 1000  # 954.84 + 977.16 + 1000
    st = out.states[0]
    assert (st.status, st.reason, st.damping.suppressed) == (DOWN, "phys_polling", True)
    assert st.damping.penalty == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(2932.0, abs=0.01)
    reuse_at = 14.0 + 60 * math.log2(expected / 750)
    assert reuse_at == pytest.approx(132.015, abs=0.001)
    assert out.next_deadline == pytest.approx(reuse_at, rel=1e-12)

    out = mon.observe([ib("ACTIVE")], now=15.0, wall=WALL)
    assert events(out) == ["down->suppressed"]
    assert out.states[0].reason == "suppressed"
    assert out.states[0].damping.hold_down_remaining_s == pytest.approx(reuse_at - 15.0)
    assert out.next_deadline == 25.0
    out = mon.tick(now=25.0, wall=WALL)
    assert out.events == [] and out.states == []  # initial hold-down over, still suppressed
    assert out.next_deadline == pytest.approx(reuse_at, rel=1e-12)
    assert mon.tick(now=reuse_at - 0.001, wall=WALL).events == []
    out = mon.tick(now=out.next_deadline, wall=WALL)
    assert events(out) == ["suppressed->up"]
    assert out.states[0].damping.penalty == pytest.approx(750.0, rel=1e-9)
    assert out.states[0].damping.suppressed is False


def test_suppression_ends_while_down_then_hold_down_applies():
    mon = monitor()
    for t in (10.0, 12.0):
        down_up(mon, t, t + 1)
    out = mon.observe([ib("DOWN", "Disabled")], now=14.0, wall=WALL)
    reuse_at = out.next_deadline
    out = mon.tick(now=reuse_at, wall=WALL)
    assert out.events == []  # suppression lifted, the port is still down
    assert (out.states[0].status, out.states[0].damping.suppressed) == (DOWN, False)
    out = mon.observe([ib("ACTIVE")], now=200.0, wall=WALL)
    assert events(out) == ["down->held_down"] and out.next_deadline == 210.0
    assert events(mon.tick(now=210.0, wall=WALL)) == ["held_down->up"]


def test_max_suppress_caps_the_penalty_at_the_ceiling():
    mon = monitor()
    for i in range(40):  # 40 flaps in 40 s: uncapped the penalty would exceed 30000
        out = down_up(mon, float(i), i + 0.5)
    st = out.states[0]
    assert st.status == SUPP
    ceiling = 750 * 2 ** (300 / 60)
    assert ceiling == 24000.0
    assert mon.state(KEY).damping.penalty == pytest.approx(decay(ceiling, 0.5))
    assert out.next_deadline == 49.5  # the initial hold-down ends first, changes nothing
    out = mon.tick(now=49.5, wall=WALL)
    assert out.events == []
    assert out.next_deadline == 39.0 + 300.0  # exactly max_suppress_s after the last flap
    assert mon.tick(now=338.999, wall=WALL).events == []
    assert events(mon.tick(now=339.0, wall=WALL)) == ["suppressed->up"]


def run_cycles(mon: PortMonitor, starts: list[float]) -> list[str]:
    """Drive the IB bring-up cycle at each start time; return every transition."""
    seen = []
    for t0 in starts:
        for i, reading in enumerate(CYCLE):
            out = mon.observe([ib(*reading)], now=t0 + i, wall=WALL + t0 + i)
            seen += events(out)
            st = mon.state(KEY)
            if reading[0] == "INIT":
                assert (st.status, st.reason) == (DOWN, "no_sm")  # not a cable fault
    return seen


def test_cycling_port_with_backoff_defaults():
    mon = monitor("backoff")
    seen = run_cycles(mon, [5.0, 17.0, 29.0, 41.0, 53.0])  # five cycles inside a minute
    # holds 10, 20, 40, 80 s each interrupted by the next cycle; the fifth return gets 160 s
    assert seen == ["up->down", "down->held_down"] + ["held_down->down", "down->held_down"] * 4
    st = mon.state(KEY)
    assert (st.status, st.damping.flaps, st.damping.hold_down_s) == (HELD, 5, 160.0)
    assert mon.tick(now=60.0, wall=WALL).next_deadline == 56.0 + 160.0
    assert mon.tick(now=215.999, wall=WALL).events == []
    assert events(mon.tick(now=216.0, wall=WALL)) == ["held_down->up"]


def test_cycling_port_with_penalty_defaults():
    mon = monitor("penalty")
    seen = run_cycles(mon, [5.0, 17.0, 29.0, 41.0, 53.0])
    # flaps at 5, 17, 29, 41, 53: suppressed from the third (2628 > 2000)
    p = 0.0
    for i in range(5):  # 12 s between flaps
        p = decay(p, 12.0) + 1000.0
        if i == 2:
            assert p == pytest.approx(2628.4, abs=0.1)
    assert p == pytest.approx(3862.5, abs=0.1)
    assert seen == [
        "up->down",
        "down->held_down",
        "held_down->down",
        "down->held_down",
        "held_down->down",
        "down->suppressed",
        "suppressed->down",
        "down->suppressed",
        "suppressed->down",
        "down->suppressed",
    ]
    reuse_at = 53.0 + 60 * math.log2(p / 750)  # 194.9: out for 2 min 19 s after the last cycle
    assert reuse_at == pytest.approx(194.88, abs=0.01)
    assert mon.tick(now=60.0, wall=WALL).next_deadline == 66.0  # hold-down of the last return
    out = mon.tick(now=66.0, wall=WALL)
    assert out.events == [] and mon.state(KEY).status == SUPP
    assert out.next_deadline == pytest.approx(reuse_at, rel=1e-12)
    assert mon.state(KEY).damping.penalty == pytest.approx(decay(p, 13.0), rel=1e-12)
    assert mon.tick(now=reuse_at - 0.01, wall=WALL).events == []
    assert events(mon.tick(now=out.next_deadline, wall=WALL)) == ["suppressed->up"]


def test_history_survives_a_restart():
    """An agent restarted while a port is held down keeps it held down (a crash loop must not
    bypass damping); the saved history is wall-clock based."""
    pol = DampingPolicy(hold_down_initial_s=10, hold_down_max_s=300, quiet_period_s=600)
    first = PortMonitor(host="gpu-01", policy=pol)
    t = 0.0
    first.observe([ib("ACTIVE")], now=t, wall=5000 + t)
    for _ in range(3):  # three flaps: hold-down 10 -> 20 -> 40 s
        t += 1
        first.observe([ib("DOWN", "Polling")], now=t, wall=5000 + t)
        t += 1
        first.observe([ib("ACTIVE")], now=t, wall=5000 + t)
    assert first.state("mlx5_0/1").status == PortStatus.HELD_DOWN
    saved = first.history(now=t, wall=5000 + t)  # t = 6: held until 6 + 40 = 46
    assert saved["mlx5_0/1"]["flaps"] == 3 and saved["mlx5_0/1"]["hold_until"] == 5046.0

    # a new process: another monotonic origin, 5 s of wall time later
    second = PortMonitor(host="gpu-01", policy=pol)
    assert second.restore(saved, now=100.0, wall=5011.0) == ["mlx5_0/1"]
    out = second.observe([ib("ACTIVE")], now=100.0, wall=5011.0)
    assert events(out) == ["unknown->held_down"]
    assert out.next_deadline == 135.0  # 5046 - 5011 = 35 s left
    assert events(second.tick(now=135.0, wall=5046.0)) == ["held_down->up"]

    # down at shutdown: held down on return, for the backoff of its 3 flaps (40 s)
    saved["mlx5_0/1"]["raw"] = False
    third = PortMonitor(host="gpu-01", policy=pol)
    third.restore(saved, now=0.0, wall=5011.0)
    out = third.observe([ib("ACTIVE")], now=0.0, wall=5011.0)
    assert events(out) == ["unknown->held_down"] and out.next_deadline == 40.0

    # history older than the quiet period is forgotten; garbage is ignored
    late = PortMonitor(host="gpu-01", policy=pol)
    assert late.restore(saved, now=0.0, wall=5000 + 6 + 601) == []
    assert late.restore({"mlx5_0/1": {"raw": True}, "bad key": {}}, now=0.0, wall=1.0) == []


def test_history_of_a_port_no_longer_watched_is_dropped() -> None:
    """A port removed from ``ports:`` between two runs: its saved history is dropped, not
    turned into a port that is published with no reading (found by a fresh-eyes run)."""
    pol = DampingPolicy(hold_down_initial_s=10, quiet_period_s=600)
    first = PortMonitor(host="gpu-01", policy=pol, rails={"mlx5_0/1": 0, "mlx5_bond_0/1": 1})
    first.observe([ib("ACTIVE"), ib("ACTIVE", hca="mlx5_bond_0")], now=0.0, wall=5000.0)
    first.observe(
        [ib("DOWN", "Polling"), ib("DOWN", "Polling", hca="mlx5_bond_0")], now=1.0, wall=5001.0
    )
    saved = first.history(now=1.0, wall=5001.0)
    assert sorted(saved) == ["mlx5_0/1", "mlx5_bond_0/1"]
    second = PortMonitor(host="gpu-01", policy=pol, rails={"mlx5_0/1": 0})
    with capture_logs() as logs:
        assert second.restore(saved, now=0.0, wall=5002.0) == ["mlx5_0/1"]
    (dropped,) = [e for e in logs if e["event"] == "damping_history_dropped"]
    assert dropped["ports"] == ["mlx5_bond_0/1"]
    assert second.state("mlx5_bond_0/1") is None
    assert [st.hca for st in second.snapshot(wall=5002.0)] == ["mlx5_0"]
