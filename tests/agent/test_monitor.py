"""PortMonitor: classification, down at once, hold-down with backoff, unknown readings, publishing.

Explicit monotonic times, no clocks. Penalty mode and flap cycles: test_damping.py.
"""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from linkguard.agent import monitor, readmission, usability
from linkguard.agent.monitor import DampingPolicy, PortMonitor, raw_usability
from linkguard.drivers.base import PortObservation
from linkguard.models import LinkLayer, PhysState, PortStateName, PortStatus

WALL = 1_700_000_000.0
UP, DOWN, HELD, UNKNOWN = PortStatus.UP, PortStatus.DOWN, PortStatus.HELD_DOWN, PortStatus.UNKNOWN


def ib(state: str | None, phys: str | None = "LinkUp", *, hca="mlx5_0", port=1, **kw):
    return PortObservation(
        hca=hca,
        port=port,
        monotonic=0.0,
        link_layer=LinkLayer.INFINIBAND,
        state=PortStateName(state) if state else None,
        phys_state=PhysState(phys) if phys else None,
        **kw,
    )


def eth(carrier: bool | None, state: str | None = "ACTIVE", **kw):
    return PortObservation(
        hca="mlx5_2",
        port=1,
        monotonic=0.0,
        link_layer=LinkLayer.ETHERNET,
        netdev="ens3np0",
        state=PortStateName(state) if state else None,
        carrier=carrier,
        **kw,
    )


def transitions(out) -> list[str]:
    return [f"{e.previous.value}->{e.current.value}" for e in out.events]


@pytest.fixture
def mon() -> PortMonitor:
    return PortMonitor(host="gpu-01", policy=DampingPolicy(), rails={"mlx5_0/1": 3})


@pytest.mark.parametrize(
    ("obs", "usable", "reason"),
    [
        (ib("ACTIVE", "LinkUp"), True, None),
        (ib("ACTIVE", None), True, None),  # phys unknown: decide on state alone
        (ib("ACTIVE_DEFER", "LinkUp"), False, "active_defer"),
        (ib("INIT", "LinkUp"), False, "no_sm"),
        (ib("ARMED", "LinkUp"), False, "no_sm"),
        (ib("DOWN", "Polling"), False, "phys_polling"),
        (ib("DOWN", "Disabled"), False, "phys_disabled"),
        (ib("DOWN", "LinkErrorRecovery"), False, "link_error_recovery"),
        (ib("ACTIVE", "LinkErrorRecovery"), False, "link_error_recovery"),
        (ib("DOWN", "LinkUp"), False, "state_down"),
        (ib(None, None, errors=("state: EIO",)), None, "unreadable: state: EIO"),
        (ib("NOP", None), None, "unreadable: state NOP"),
        (ib(None, None, carrier=False), False, "no_carrier"),  # IPoIB netdev only
        (eth(False), False, "no_carrier"),
        (eth(True), True, None),
        (eth(True, None), True, None),
        (eth(None, "ACTIVE"), True, None),
        (eth(True, "INIT"), False, "state_init"),  # never "no_sm" on Ethernet
        (eth(None, None), None, "unreadable: state None"),
    ],
)
def test_raw_usability(obs, usable, reason):
    assert raw_usability(obs) == (usable, reason)


def test_first_observation_up_or_down_at_once(mon):
    out = mon.observe([ib("ACTIVE"), ib("DOWN", "Polling", port=2)], now=5.0, wall=WALL)
    assert transitions(out) == ["unknown->up", "unknown->down"]
    a, b = out.states
    assert (a.status, a.usable, a.rail, a.reason) == (UP, True, 3, None)
    assert (b.status, b.usable, b.rail, b.reason) == (DOWN, False, None, "phys_polling")
    assert (a.seq, b.seq) == (1, 2)
    assert out.next_deadline is None  # no flap: nothing pending


def test_down_acted_at_once_and_hold_down_expires_exactly(mon):
    mon.observe([ib("ACTIVE")], now=0.0, wall=WALL)
    out = mon.observe([ib("DOWN", "Polling")], now=100.0, wall=WALL + 100)
    assert transitions(out) == ["up->down"]
    assert (out.events[0].reason, out.events[0].at, out.events[0].rail) == (
        "phys_polling",
        WALL + 100,
        3,
    )
    assert out.states[0].damping.flaps == 1
    assert out.next_deadline == 700.0  # quiet period: history cleared at last flap + 600

    out = mon.observe([ib("ACTIVE")], now=101.0, wall=WALL)
    assert transitions(out) == ["down->held_down"]
    st = out.states[0]
    assert (st.status, st.usable, st.reason) == (HELD, False, "hold_down")
    assert (st.damping.hold_down_s, st.damping.hold_down_remaining_s) == (10.0, 10.0)
    assert out.next_deadline == 111.0

    out = mon.tick(now=110.999, wall=WALL)
    assert (out.events, out.states) == ([], [])
    assert mon.state("mlx5_0/1").status == HELD
    assert mon.state("mlx5_0/1").damping.hold_down_remaining_s == pytest.approx(0.001)
    out = mon.tick(now=111.0, wall=WALL)
    assert transitions(out) == ["held_down->up"]
    assert (out.states[0].status, out.states[0].usable) == (UP, True)
    assert out.next_deadline == 700.0


def flap(mon, t_down: float, t_up: float) -> float:
    """Take the port down at t_down, back at t_up; return the hold-down it got."""
    mon.observe([ib("DOWN", "Polling")], now=t_down, wall=WALL)
    out = mon.observe([ib("ACTIVE")], now=t_up, wall=WALL)
    assert out.states[0].status == HELD
    assert out.next_deadline == t_up + out.states[0].damping.hold_down_s
    return out.states[0].damping.hold_down_s


def test_backoff_doubles_per_flap_up_to_max(mon):
    mon.observe([ib("ACTIVE")], now=0.0, wall=WALL)
    holds, t = [], 0.0
    for _ in range(8):
        hold = flap(mon, t + 1, t + 2)
        holds.append(hold)
        t = t + 2 + hold
        assert transitions(mon.tick(now=t, wall=WALL)) == ["held_down->up"]
    assert holds == [10, 20, 40, 80, 160, 300, 300, 300]
    assert mon.state("mlx5_0/1").damping.flaps == 8


def test_flap_during_hold_down_counts_and_restarts_it(mon):
    mon.observe([ib("ACTIVE")], now=0.0, wall=WALL)
    assert flap(mon, 1.0, 2.0) == 10.0  # held until 12
    out = mon.observe([ib("DOWN", "Polling")], now=11.0, wall=WALL)
    assert transitions(out) == ["held_down->down"]
    assert out.states[0].damping.flaps == 2
    out = mon.observe([ib("ACTIVE")], now=13.0, wall=WALL)
    assert out.next_deadline == 33.0  # restarted with the doubled hold-down
    assert transitions(mon.tick(now=32.9, wall=WALL)) == []
    assert transitions(mon.tick(now=33.0, wall=WALL)) == ["held_down->up"]


def test_quiet_period_clears_history(mon):
    mon.observe([ib("ACTIVE")], now=0.0, wall=WALL)
    flap(mon, 1.0, 2.0)
    mon.tick(now=12.0, wall=WALL)
    flap(mon, 20.0, 21.0)  # second flap: 20 s
    out = mon.tick(now=41.0, wall=WALL)
    assert out.next_deadline == 620.0  # last flap + quiet_period_s
    out = mon.tick(now=620.0, wall=WALL)
    assert out.events == []  # history only: published, no status change
    assert (out.states[0].damping.flaps, out.states[0].damping.hold_down_s) == (0, 10.0)
    assert out.next_deadline is None
    assert flap(mon, 700.0, 701.0) == 10.0  # back to the initial hold-down


def test_unknown_reading_keeps_status(mon):
    mon.observe([ib("ACTIVE")], now=0.0, wall=WALL)
    out = mon.observe([ib(None, None, errors=("state: [Errno 5] EIO",))], now=1.0, wall=WALL)
    assert out.events == []
    st = out.states[0]
    assert (st.status, st.usable, st.state) == (UP, True, None)
    assert st.reason == "unreadable: state: [Errno 5] EIO"
    out = mon.observe([ib("ACTIVE")], now=2.0, wall=WALL)
    assert out.events == [] and out.states[0].reason is None

    out = mon.observe([ib(None, None, port=2)], now=3.0, wall=WALL)  # never readable
    assert out.events == []
    assert (out.states[0].status, out.states[0].usable) == (UNKNOWN, False)
    out = mon.observe([ib("ACTIVE", port=2)], now=4.0, wall=WALL)
    assert transitions(out) == ["unknown->up"]  # first readable reading: no hold-down


def test_unknown_reading_never_completes_a_hold_down(mon):
    mon.observe([ib("ACTIVE")], now=0.0, wall=WALL)
    flap(mon, 1.0, 2.0)  # held until 12
    out = mon.observe([ib(None, None)], now=5.0, wall=WALL)
    assert out.events == [] and out.next_deadline == 601.0  # no hold-down deadline any more
    assert mon.tick(now=12.0, wall=WALL).events == []
    assert mon.state("mlx5_0/1").status == HELD
    assert transitions(mon.observe([ib("ACTIVE")], now=13.0, wall=WALL)) == ["held_down->up"]


def test_ethernet_carrier_is_the_signal():
    mon = PortMonitor(host="gpu-01", policy=DampingPolicy())
    assert transitions(mon.observe([eth(True)], now=0.0, wall=WALL)) == ["unknown->up"]
    out = mon.observe([eth(False, "ACTIVE")], now=1.0, wall=WALL)  # operstate lags carrier
    assert transitions(out) == ["up->down"] and out.events[0].reason == "no_carrier"
    assert out.states[0].link_layer == LinkLayer.ETHERNET and out.states[0].netdev == "ens3np0"
    # link_layer remembered when a later reading lacks it; LID/SM never matter
    obs = PortObservation(hca="mlx5_2", port=1, monotonic=0.0, carrier=True)
    assert transitions(mon.observe([obs], now=2.0, wall=WALL)) == ["down->held_down"]
    assert transitions(mon.tick(now=12.0, wall=WALL)) == ["held_down->up"]


def test_published_fields_seq_and_materiality(mon):
    obs = ib(
        "ACTIVE",
        rate_gbps=400.0,
        counters={"link_downed": 255, "symbol_error": 0},
        saturated=frozenset({"link_downed", "port_rcv_errors"}),
    )
    st = mon.observe([obs], now=0.0, wall=WALL).states[0]
    assert (st.rate_gbps, st.counters, st.observed_at) == (400.0, obs.counters, WALL)
    assert st.counters_saturated == ["link_downed", "port_rcv_errors"]
    assert (st.state, st.phys_state, st.host, st.key) == ("ACTIVE", "LinkUp", "gpu-01", "mlx5_0/1")
    counters_only = ib(
        "ACTIVE", rate_gbps=400.0, counters={"symbol_error": 7}, saturated=obs.saturated
    )
    assert mon.observe([counters_only], now=1.0, wall=WALL).states == []
    assert mon.state("mlx5_0/1").counters == {"symbol_error": 7}  # view is current
    assert mon.observe([ib("ACTIVE", rate_gbps=200.0)], now=2.0, wall=WALL).states[0].seq == 2
    assert mon.state("mlx5_0/1").counters_saturated == []  # saturation cleared: published
    assert mon.observe([ib("INIT", port=2)], now=3.0, wall=WALL).states[0].seq == 3
    snap = mon.snapshot(wall=WALL + 9)
    assert [(s.key, s.seq, s.observed_at) for s in snap] == [
        ("mlx5_0/1", 4, WALL + 9),
        ("mlx5_0/2", 5, WALL + 9),
    ]
    assert snap[1].reason == "no_sm" and mon.state("nope/1") is None


def test_bad_values_never_hide_a_port(mon):
    bad_rate = ib("ACTIVE", rate_gbps=math.nan, netdev="a-netdev-name-far-too-long")
    bad_name = ib("ACTIVE", hca="mlx5 0")  # not a publishable HCA name
    out = mon.observe([bad_name, bad_rate, ib("ACTIVE", port=0)], now=0.0, wall=WALL)
    assert [(s.key, s.status, s.rate_gbps, s.netdev) for s in out.states] == [
        ("mlx5_0/1", UP, None, None)
    ]
    with pytest.raises(ValueError, match="wall"):
        mon.tick(now=1.0, wall=-1.0)
    with pytest.raises(ValueError, match="host"):
        PortMonitor(host="bad host", policy=DampingPolicy())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hold_down_initial_s": 0}, "hold_down_initial_s must be a finite number > 0"),
        ({"half_life_s": math.inf}, "half_life_s must be a finite number > 0"),
        ({"reuse_threshold": 2000.0}, r"reuse_threshold \(2000\) must be below suppress_threshold"),
        ({"hold_down_initial_s": 400.0}, r"must not exceed hold_down_max_s \(300\)"),
        ({"max_suppress_s": 30.0}, "ceiling .* = 1060.66 is not above suppress_threshold"),
        ({"max_suppress_s": 1e6}, "above 64"),
        ({"mode": "exponential"}, "Input should be 'backoff' or 'penalty'"),
        ({"hold_down": 5}, "Extra inputs are not permitted"),
    ],
)
def test_policy_validation(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        DampingPolicy(**kwargs)


def test_policy_defaults_and_frozen():
    pol = DampingPolicy()
    assert (pol.hold_down_initial_s, pol.hold_down_max_s, pol.quiet_period_s) == (10, 300, 600)
    assert pol.ceiling == 750 * 2 ** (300 / 60) == 24000
    with pytest.raises(ValidationError):
        pol.half_life_s = 1.0  # type: ignore[misc]


# Golden timeline (default backoff policy): t, reading (None = tick), status, events, reason.
GOLDEN = [
    (0.0, ("ACTIVE", "LinkUp"), "up", ["unknown->up"], None),
    (5.0, ("DOWN", "Polling"), "down", ["up->down"], "phys_polling"),
    (6.0, ("DOWN", "LinkUp"), "down", [], "state_down"),
    (7.0, ("INIT", "LinkUp"), "down", [], "no_sm"),
    (8.0, ("ACTIVE", "LinkUp"), "held_down", ["down->held_down"], "hold_down"),  # until 18
    (17.9, None, "held_down", [], "hold_down"),
    (18.0, None, "up", ["held_down->up"], None),
    (20.0, ("DOWN", "Disabled"), "down", ["up->down"], "phys_disabled"),  # flap 2
    (21.0, ("ACTIVE", "LinkUp"), "held_down", ["down->held_down"], "hold_down"),  # until 41
    (30.0, (None, None), "held_down", [], "unreadable: state None"),
    (41.0, None, "held_down", [], "unreadable: state None"),  # unknown: no promotion
    (42.0, ("ACTIVE", "LinkUp"), "up", ["held_down->up"], None),
    (50.0, ("ACTIVE_DEFER", "LinkUp"), "down", ["up->down"], "active_defer"),  # flap 3
    (51.0, ("ACTIVE", None), "held_down", ["down->held_down"], "hold_down"),  # 40 s: until 91
    (90.0, ("DOWN", "LinkErrorRecovery"), "down", ["held_down->down"], "link_error_recovery"),
    (95.0, ("ACTIVE", "LinkUp"), "held_down", ["down->held_down"], "hold_down"),  # 80 s
    (175.0, None, "up", ["held_down->up"], None),
]


def test_golden_timeline(mon):
    for t, reading, status, events, reason in GOLDEN:
        if reading is None:
            out = mon.tick(now=t, wall=WALL + t)
        else:
            out = mon.observe([ib(*reading)], now=t, wall=WALL + t)
        st = mon.state("mlx5_0/1")
        assert (st.status.value, transitions(out), st.reason) == (status, events, reason), t
    assert mon.state("mlx5_0/1").damping.flaps == 4


def test_vanished_device_is_down_not_unknown(mon):
    """A device that disappears (hot-unplug, NIC off the bus) is a fault: rerouted at once,
    unlike an unreadable file, which keeps the status."""
    mon.observe([ib("ACTIVE")], now=0.0, wall=1000.0)
    gone = PortObservation(
        hca="mlx5_0",
        port=1,
        monotonic=0.0,
        present=False,
        errors=("mlx5_0/ports/1: ENOENT (device removed)",),
    )
    out = mon.observe([gone], now=5.0, wall=1005.0)
    assert transitions(out) == ["up->down"]
    assert out.states[0].reason == "absent: mlx5_0/ports/1: ENOENT (device removed)"


def test_never_seen_device_is_a_config_mistake_not_a_fault(mon):
    """A configured netdev/HCA that never existed (a typo) must not reroute anything; once it
    appears it is used, and only when it vanishes after that is it a fault."""
    typo = PortObservation(
        hca="mlx5_0", port=1, monotonic=0.0, present=False, errors=("netdev rail9 not found",)
    )
    out = mon.observe([typo], now=0.0, wall=1000.0)
    assert out.events == []
    assert mon.state("mlx5_0/1").status == PortStatus.UNKNOWN
    assert transitions(mon.observe([ib("ACTIVE")], now=1.0, wall=1001.0)) == ["unknown->up"]
    assert transitions(mon.observe([typo], now=2.0, wall=1002.0)) == ["up->down"]


def test_the_moved_decisions_stay_importable_from_the_monitor() -> None:
    assert monitor.raw_usability is usability.raw_usability
    assert monitor.RawVerdict is usability.RawVerdict
    assert monitor.gid_moves is readmission.gid_moves
