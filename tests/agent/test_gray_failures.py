"""Gray failures on real sysfs trees changed over time: counter health and re-admission.

A copy of a real H100 tree (leptonai/gpud, ../shared/fixtures/real) is read by the sysfs driver
(:func:`read_port`), fed to the real :class:`PortMonitor` at explicit times, and its states to
the topology service's real :class:`FabricState` and solver.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard.agent.health import CounterHealthPolicy
from linkguard.agent.monitor import DampingPolicy, PortMonitor, gid_moves
from linkguard.drivers.base import PortObservation
from linkguard.drivers.sysfs_ib import _Poller, read_port, read_sysfs
from linkguard.models import PortStatus
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.state import FabricState
from tests.drivers.test_sysfs_ib import GPUD, copy_tree, put

WALL = 1_700_000_000.0
UP, DOWN, HELD, DEGRADED = (
    PortStatus.UP,
    PortStatus.DOWN,
    PortStatus.HELD_DOWN,
    PortStatus.DEGRADED,
)


class Rig:
    """One port of a real tree, read and monitored at explicit monotonic times."""

    def __init__(self, root: Path, hca: str = "mlx5_0", **mon_kw) -> None:
        self.root, self.hca = root, hca
        self.dir = root / hca / "ports" / "1"
        self.mon = PortMonitor(
            host="gpu000", policy=DampingPolicy(), rails={f"{hca}/1": 0}, **mon_kw
        )
        self.transitions: list[str] = []

    def write(self, rel: str, text: str) -> None:
        put(self.dir / rel, text + "\n")

    def counter(self, name: str) -> int:
        return int((self.dir / "counters" / name).read_text())

    def read(self, t: float) -> PortStatus:
        obs = read_port(self.root, self.hca, 1, now=t)
        out = self.mon.observe([obs], now=t, wall=WALL + t)
        self.transitions += [f"{e.previous.value}->{e.current.value}" for e in out.events]
        return self.state.status

    def tick(self, t: float) -> PortStatus:
        out = self.mon.tick(now=t, wall=WALL + t)
        self.transitions += [f"{e.previous.value}->{e.current.value}" for e in out.events]
        return self.state.status

    @property
    def state(self):
        st = self.mon.state(f"{self.hca}/1")
        assert st is not None
        return st


@pytest.fixture
def gpud(tmp_path: Path) -> Path:
    return copy_tree(tmp_path, GPUD)


# -------------------------------------------------------------------------- counter health


def test_rising_symbol_errors_drain_the_port_and_the_plan_moves_its_traffic(gpud: Path) -> None:
    rig = Rig(gpud)
    fabric = generate_rail_optimized(hosts=4, rails=4)
    service = FabricState(fabric=fabric, epoch_start=1)
    assert rig.read(0.0) == UP and rig.counter("symbol_error") == 0
    service.on_port_state(rig.state)
    first = service.solve(0.0)
    gpu0 = {a.gpu: a.rail for a in first.full["gpu000"].rail_assignments}
    assert gpu0[0] == 0  # GPU 0 on its home rail, mlx5_0

    # a dying optic: 40 symbol errors every 10 s (240/min; the threshold is 100/60 s)
    for i in range(1, 4):
        rig.write("counters/symbol_error", str(40 * i))
        status = rig.read(10.0 * i)
    assert status == DEGRADED and rig.transitions == ["unknown->up", "up->degraded"]
    st = rig.state
    assert st.reason == "symbol_error 120/60s" and st.usable is False
    assert st.state.value == "ACTIVE"  # still up: a gray failure, not a down port
    # more errors while degraded: nothing new to publish (the reason keeps the first count)
    rig.write("counters/symbol_error", "400")
    out = rig.mon.observe([read_port(gpud, "mlx5_0", 1, now=35.0)], now=35.0, wall=WALL)
    assert out.states == [] and out.events == [] and rig.state.reason == st.reason

    assert service.on_port_state(st) is True  # usability changed: a re-plan is due
    assert service.unusable() == {"gpu000": frozenset({0})}
    moved = service.solve(40.0)
    assert "gpu000" in moved.hosts
    plan = moved.full["gpu000"]
    assert all(a.rail != 0 for a in plan.rail_assignments)  # nothing on the degraded rail
    assert {a.gpu for a in plan.rail_assignments if a.home_rail == 0} == {0}


def test_a_counter_reset_does_not_drain(gpud: Path) -> None:
    rig = Rig(gpud)
    rig.write("counters/symbol_error", "60000")
    assert rig.read(0.0) == UP
    rig.write("counters/symbol_error", "60050")
    assert rig.read(1.0) == UP  # 50 in the window
    # cleared (perfquery -x / driver reload): 60050 -> 30000 is a reset, not 30000 errors
    rig.write("counters/symbol_error", "30000")
    assert rig.read(2.0) == UP
    rig.write("counters/symbol_error", "0")
    assert rig.read(3.0) == UP
    assert rig.transitions == ["unknown->up"]


def test_a_saturated_counter_does_not_drain(gpud: Path) -> None:
    # the real tree: mlx5_1's link_downed is 255 (8-bit max), mlx5_0's
    # excessive_buffer_overrun_errors 15 (4-bit max): both saturated, whatever they hide
    rig = Rig(gpud, hca="mlx5_1")
    assert rig.counter("link_downed") == 255
    assert rig.read(0.0) == UP
    assert "link_downed" in rig.state.counters_saturated
    rig.write("counters/symbol_error", "0")
    for t in (1.0, 2.0, 3.0):
        assert rig.read(t) == UP
    rig0 = Rig(gpud)
    assert rig0.counter("excessive_buffer_overrun_errors") == 15
    rig0.read(0.0)
    rig0.write("counters/port_rcv_errors", "15")  # 14 -> 15, one error: noise
    assert rig0.read(1.0) == UP
    assert rig.transitions == rig0.transitions == ["unknown->up"]


def test_a_missing_counter_does_not_drain(gpud: Path) -> None:
    rig = Rig(gpud)
    assert rig.read(0.0) == UP
    (rig.dir / "counters" / "symbol_error").unlink()
    assert rig.read(1.0) == UP
    rig.write("counters/symbol_error", "50000")  # back, far above: a new baseline
    assert rig.read(2.0) == UP
    rig.write("counters/symbol_error", "N/A (no PMA)")  # unreadable
    assert rig.read(3.0) == UP
    assert rig.transitions == ["unknown->up"]


def test_noisy_counter_degrades_once_and_clears_after_clear_after_s(gpud: Path) -> None:
    rig = Rig(gpud)
    rig.read(0.0)
    value, t = 0, 0.0
    for i in range(30):  # 5 minutes of 15 or 20 errors per 10 s: 90..120 per 60 s
        t += 10.0
        value += 20 if i % 2 else 15
        rig.write("counters/symbol_error", str(value))
        rig.read(t)
    assert rig.transitions == ["unknown->up", "up->degraded"]
    # quiet from t; the agent ticks at each deadline the monitor gives (samples leaving the
    # window, then the clear): the last burst (20 > clear 10) leaves at t + 60, 300 s later UP
    now = t
    while rig.state.status == DEGRADED:
        deadline = rig.mon.tick(now=now, wall=WALL).next_deadline
        assert deadline is not None and deadline > now
        now = deadline
        rig.tick(now)
    assert now == t + 60.0 + 300.0
    assert rig.transitions == ["unknown->up", "up->degraded", "degraded->up"]


def test_time_down_does_not_count_towards_clearing_a_degraded_port(gpud: Path) -> None:
    """Degraded on counters, then down longer than clear_after_s: back from its hold-down it
    is still degraded, and clears only after clear_after_s of clean readings of the link up
    (a fresh-eyes run saw it come back up with no clean reading at all)."""
    rig = Rig(gpud, health=CounterHealthPolicy(clear_after_s=30.0))
    assert rig.read(0.0) == UP
    rig.write("counters/symbol_error", "150")
    assert rig.read(1.0) == DEGRADED
    rig.write("state", "1: DOWN")
    rig.write("phys_state", "2: Polling")
    assert rig.read(2.0) == DOWN
    rig.write("state", "4: ACTIVE")
    rig.write("phys_state", "5: LinkUp")
    assert rig.read(100.0) == HELD  # 98 s down: more than clear_after_s, not clean readings
    assert rig.tick(110.0) == DEGRADED and rig.state.reason == "symbol_error 150/60s"
    # clean readings count from the first reading up (100 s): clear at 130 s, not at 31 s
    assert rig.read(129.0) == DEGRADED
    assert rig.read(130.0) == UP


def test_flap_of_a_degraded_port_is_a_flap_and_its_link_downed_is_not_hidden(gpud: Path) -> None:
    rig = Rig(gpud, health=CounterHealthPolicy(clear_after_s=30))
    rig.read(0.0)
    rig.write("counters/symbol_error", "500")
    assert rig.read(1.0) == DEGRADED
    rig.write("state", "1: DOWN")
    rig.write("phys_state", "2: Polling")
    assert rig.read(2.0) == DOWN
    rig.write("counters/symbol_error", "9000")  # link training counts errors: dropped
    rig.write("counters/link_downed", "1")  # the flap the monitor saw
    rig.write("state", "4: ACTIVE")
    rig.write("phys_state", "5: LinkUp")
    assert rig.read(5.0) == HELD
    # hold-down 10 s; the symbol errors aged out at 61 s, clean since then, 30 s to clear
    assert rig.tick(15.0) == DEGRADED
    assert rig.tick(91.0) == UP
    assert rig.transitions == [
        "unknown->up",
        "up->degraded",
        "degraded->down",
        "down->held_down",
        "held_down->degraded",
        "degraded->up",
    ]


def _real_poll(
    gpud: Path, polled: list[PortObservation]
) -> tuple[Callable[[float], PortStatus], PortMonitor]:
    """``poll(t)``: the real sysfs poller reads mlx5_0/1 at ``t`` (counters every 1 s), the
    monitor takes what it reports (also appended to ``polled``); returns the port's status."""
    poller = _Poller(
        root=gpud, ports={"mlx5_0/1"}, reader=read_sysfs, rediscover_s=1e9, counters_interval_s=1.0
    )
    mon = PortMonitor(host="gpu000", policy=DampingPolicy(), rails={"mlx5_0/1": 0})

    def poll(t: float) -> PortStatus:
        batch = poller.poll(t)
        polled.extend(batch)
        mon.observe(batch, now=t, wall=WALL + t)
        st = mon.state("mlx5_0/1")
        assert st is not None
        return st.status

    return poll, mon


def test_errors_counted_while_down_do_not_degrade_the_port_when_it_is_back(gpud: Path) -> None:
    """The real poller re-reads counters once a second and reuses them between re-reads: the
    reading that shows the port back carries counters read while it was down, and the first
    re-read after it the training's 5000 symbol errors. That re-read is the baseline; the same
    rise once the port is back does drain it."""
    d = gpud / "mlx5_0" / "ports" / "1"
    polled: list[PortObservation] = []
    poll, mon = _real_poll(gpud, polled)

    assert poll(0.0) == UP
    put(d / "state", "1: DOWN\n")
    put(d / "phys_state", "2: Polling\n")
    assert poll(0.3) == DOWN
    put(d / "counters" / "symbol_error", "5000\n")  # training
    put(d / "state", "4: ACTIVE\n")
    put(d / "phys_state", "5: LinkUp\n")
    assert poll(0.7) == HELD
    t = 1.0
    while t < 30.0:
        assert poll(t) in (HELD, UP)
        t += 1.0
    # the port came back with the old counters, the re-read at 1 s brought the 5000
    seen = [(o.monotonic, o.counters.get("symbol_error")) for o in polled]
    assert seen[:4] == [(0.0, 0), (0.3, 0), (0.7, 0), (1.0, 5000)]
    st = mon.state("mlx5_0/1")
    assert st is not None and st.status == UP and st.reason is None
    put(d / "counters" / "symbol_error", "10000\n")  # the same rise while up: a gray failure
    assert poll(30.0) == DEGRADED
    assert mon.state("mlx5_0/1").reason == "symbol_error 5000/60s"  # type: ignore[union-attr]


def test_the_flap_the_monitor_saw_hides_no_other_flap(gpud: Path) -> None:
    # the reading that shows the port down shows its link_downed too: that increment is the
    # flap's, so two more the state poll missed count in full
    rig = Rig(gpud)
    rig.read(0.0)
    rig.write("counters/link_downed", "1")
    rig.write("state", "1: DOWN")
    rig.write("phys_state", "2: Polling")
    assert rig.read(1.0) == DOWN
    rig.write("state", "4: ACTIVE")
    rig.write("phys_state", "5: LinkUp")
    assert rig.read(2.0) == HELD
    assert rig.tick(12.0) == UP
    rig.write("counters/link_downed", "3")
    assert rig.read(20.0) == DEGRADED and rig.state.reason == "link_downed 2/60s"


# ---------------------------------------------------------------------------- re-admission


def flap(rig: Rig, t_down: float, t_up: float, **changes: str) -> None:
    rig.write("state", "1: DOWN")
    rig.write("phys_state", "2: Polling")
    assert rig.read(t_down) == DOWN
    for rel, text in changes.items():
        rig.write(rel.replace("__", "/"), text)
    rig.write("state", "4: ACTIVE")
    rig.write("phys_state", "5: LinkUp")
    assert rig.read(t_up) == HELD


def test_back_at_a_lower_rate_is_degraded_until_the_rate_is_back(gpud: Path) -> None:
    rig = Rig(gpud)
    assert rig.read(0.0) == UP and rig.state.rate_gbps == 400.0
    assert rig.tick(3.0) == UP  # 400 held for rate_settle_s (3 s): the reference
    flap(rig, 4.0, 5.0, rate="200 Gb/sec (2X NDR)")  # renegotiated to 2 lanes
    assert rig.tick(15.0) == DEGRADED
    assert rig.state.reason == "rate 200 < 400 Gb/s" and not rig.state.usable
    # another retrain back to 4X: up again (no second hold-down needed for a rate)
    flap(rig, 23.0, 24.0, rate="400 Gb/sec (4X NDR)")
    assert rig.tick(24.0 + 20.0) == UP  # second flap: hold-down 20 s
    assert rig.transitions == [
        "unknown->up",
        "up->down",
        "down->held_down",
        "held_down->degraded",
        "degraded->down",
        "down->held_down",
        "held_down->up",
    ]


def test_back_with_an_unreadable_rate_is_degraded_until_a_rate_reads(gpud: Path) -> None:
    """The re-admission check cannot pass on a rate it cannot read: N/A, then the file
    gone, keep the port out; the first rate read at its reference lets it in."""
    rig = Rig(gpud)
    assert rig.read(0.0) == UP
    assert rig.tick(3.0) == UP  # 400 Gb/s learnt
    flap(rig, 4.0, 5.0, rate="N/A")
    assert rig.state.rate_gbps is None
    assert rig.tick(15.0) == DEGRADED
    assert rig.state.reason == "rate unreadable (was 400 Gb/s)" and not rig.state.usable
    (rig.dir / "rate").unlink()
    assert rig.read(16.0) == DEGRADED
    rig.write("rate", "400 Gb/sec (4X NDR)")
    assert rig.read(17.0) == UP and rig.state.reason is None
    assert rig.transitions[-2:] == ["held_down->degraded", "degraded->up"]


def test_an_unreadable_rate_while_up_or_never_read_holds_nothing(gpud: Path) -> None:
    """While up, an unread rate changes nothing (the rate rule compares readings); a port
    whose rate was never read (as with the netlink driver) is re-admitted on the rest."""
    rig = Rig(gpud)
    rig.write("rate", "N/A")
    assert rig.read(0.0) == UP and rig.state.rate_gbps is None
    flap(rig, 1.0, 2.0)
    assert rig.tick(12.0) == UP and rig.state.reason is None
    rig.write("rate", "400 Gb/sec (4X NDR)")
    assert rig.read(13.0) == UP and rig.tick(16.0) == UP
    assert rig.mon.reference_rates() == {"mlx5_0/1": 400.0}
    rig.write("rate", "N/A")
    assert rig.read(17.0) == UP and rig.state.reason is None


def test_back_at_the_same_rate_is_up(gpud: Path) -> None:
    rig = Rig(gpud)
    rig.read(0.0)
    flap(rig, 1.0, 2.0)
    assert rig.tick(12.0) == UP
    assert rig.state.reason is None and rig.state.gid_index_changed is False


def test_one_glitched_high_rate_reading_is_not_the_bar(gpud: Path) -> None:
    # a reading caught mid-retrain (8X, a width this port does not have) for 2 s: it must not
    # become the reference, or the port would be degraded at its real 400 until a restart
    rig = Rig(gpud)
    assert rig.read(0.0) == UP and rig.tick(3.0) == UP
    rig.write("rate", "800 Gb/sec (8X NDR)")
    assert rig.read(4.0) == UP and rig.state.rate_gbps == 800.0
    assert rig.mon.tick(now=5.0, wall=WALL + 5).next_deadline == 7.0  # when 800 would settle
    rig.write("rate", "400 Gb/sec (4X NDR)")
    assert rig.read(6.0) == UP and rig.tick(7.0) == UP and rig.state.reason is None
    # a rate that is not width x lane rate is no kernel reading: refused, never the bar
    rig.write("rate", "800 Gb/sec (4X NDR)")
    assert rig.read(8.0) == UP and rig.state.rate_gbps is None
    rig.write("rate", "100000 Gb/sec")
    assert rig.read(12.0) == UP and rig.state.rate_gbps is None
    rig.write("rate", "400 Gb/sec (4X NDR)")
    assert rig.read(16.0) == UP and rig.tick(20.0) == UP
    assert rig.mon.reference_rates() == {"mlx5_0/1": 400.0}
    assert rig.transitions == ["unknown->up"]
    # a higher rate held 3 s is real (a port upgraded in place): the new bar
    rig.write("rate", "800 Gb/sec (8X NDR)")
    assert rig.read(21.0) == UP and rig.tick(24.0) == UP
    assert rig.mon.reference_rates() == {"mlx5_0/1": 800.0}


def test_configured_expected_rate_is_the_bar(gpud: Path) -> None:
    # the port ran at 200 before the agent started; its configured rate is 400: degraded at
    # its first reading (no hold-down at start), and after a flap back at 200 too
    rig = Rig(gpud, expected_rates={"mlx5_0/1": 400.0})
    rig.write("rate", "200 Gb/sec (2X NDR)")
    assert rig.read(0.0) == DEGRADED and rig.state.reason == "rate 200 < 400 Gb/s"
    flap(rig, 1.0, 2.0)
    assert rig.tick(12.0) == DEGRADED and rig.state.reason == "rate 200 < 400 Gb/s"
    rig.write("rate", "400 Gb/sec (4X NDR)")
    assert rig.read(13.0) == UP and rig.state.reason is None
    assert rig.transitions == [
        "unknown->degraded",
        "degraded->down",
        "down->held_down",
        "held_down->degraded",
        "degraded->up",
    ]


# ------------------------------------------------------------- rate drop while the port is up


def test_an_expected_rate_below_the_reading_is_said_once(gpud: Path) -> None:
    """``expected_rate_gbps: 40`` typed for 400: the port is held to 40 only; said once."""
    rig = Rig(gpud, expected_rates={"mlx5_0/1": 40.0})
    with capture_logs() as logs:
        assert rig.read(0.0) == UP and rig.read(1.0) == UP
        rig.write("rate", "200 Gb/sec (2X NDR)")  # slower, still over the bar: unnoticed
        assert rig.read(2.0) == UP
    said = [e for e in logs if e["event"] == "expected_rate_below_reading"]
    assert [(e["expected_gbps"], e["read_gbps"]) for e in said] == [(40.0, 400.0)]


def test_rate_drop_while_active_drains_the_port_until_the_rate_is_back(gpud: Path) -> None:
    # the tester's case: mlx5_1 (4X NDR, 400 Gb/s) reads 2X NDR while ACTIVE, no flap seen
    rig = Rig(gpud, hca="mlx5_1")
    service = FabricState(fabric=generate_rail_optimized(hosts=4, rails=4), epoch_start=1)
    assert rig.read(0.0) == UP and rig.state.rate_gbps == 400.0
    assert rig.tick(3.0) == UP  # 400 held for rate_settle_s (3 s): the reference
    service.on_port_state(rig.state)
    first = service.solve(0.0).full["gpu000"]
    assert {a.gpu: a.rail for a in first.rail_assignments}[1] == 1  # GPU 1 on mlx5_1
    rig.write("rate", "200 Gb/sec (2X NDR)")
    assert rig.read(4.0) == DEGRADED
    st = rig.state
    assert (st.reason, st.rate_gbps, st.usable) == ("rate 200 < 400 Gb/s", 200.0, False)
    assert st.state.value == "ACTIVE" and st.damping.flaps == 0  # not a flap, no hold-down
    assert service.on_port_state(st) is True  # usability changed: a re-plan is due
    assert service.unusable() == {"gpu000": frozenset({1})}  # the fabric's rail of mlx5_1
    plan = service.solve(5.0).full["gpu000"]
    assert all(a.rail != 1 for a in plan.rail_assignments)  # no GPU on the half-speed NIC
    assert {a.gpu for a in plan.rail_assignments if a.home_rail == 1} == {1}
    # the reference does not ratchet down to 200: a minute at 200 stays degraded
    for t in (5.0, 30.0, 61.0):
        assert rig.read(t) == DEGRADED and rig.state.reason == "rate 200 < 400 Gb/s"
    rig.write("rate", "400 Gb/sec (4X NDR)")  # retrained to 4 lanes: up at once
    assert rig.read(62.0) == UP and rig.state.reason is None
    rig.write("rate", "200 Gb/sec (2X NDR)")  # and again: the bar is still 400
    assert rig.read(63.0) == DEGRADED and rig.state.reason == "rate 200 < 400 Gb/s"
    assert rig.transitions == ["unknown->up", "up->degraded", "degraded->up", "up->degraded"]


def test_rate_drop_while_up_is_measured_against_the_configured_rate(gpud: Path) -> None:
    # configured 400; a 400 -> 300 drop is below it even though nothing higher was ever read
    rig = Rig(gpud, hca="mlx5_1", expected_rates={"mlx5_1/1": 400.0})
    assert rig.read(0.0) == UP
    rig.write("rate", "300 Gb/sec (3X NDR)")
    assert rig.read(1.0) == DEGRADED and rig.state.reason == "rate 300 < 400 Gb/s"
    # a flap while degraded at 300: back at 300 it is still degraded after its hold-down
    flap(rig, 2.0, 3.0)
    assert rig.tick(13.0) == DEGRADED and rig.state.reason == "rate 300 < 400 Gb/s"
    rig.write("rate", "400 Gb/sec (4X NDR)")
    assert rig.read(14.0) == UP


def test_rate_drop_while_up_on_a_roce_port(gpud: Path) -> None:
    # the real RoCE LAG port (link_layer Ethernet, 200 Gb/s): the same rule and reason
    rig = Rig(gpud, hca="mlx5_bond_0")
    assert rig.read(0.0) == UP and rig.state.link_layer.value == "Ethernet"
    assert rig.tick(3.0) == UP
    rig.write("rate", "100 Gb/sec (2X HDR)")
    assert rig.read(4.0) == DEGRADED and rig.state.reason == "rate 100 < 200 Gb/s"
    rig.write("rate", "200 Gb/sec (2X NDR)")
    assert rig.read(5.0) == UP and rig.state.reason is None
    assert rig.transitions == ["unknown->up", "up->degraded", "degraded->up"]


def test_rate_drop_while_degraded_on_counters_adds_to_the_reason(gpud: Path) -> None:
    rig = Rig(gpud, hca="mlx5_1", health=CounterHealthPolicy(clear_after_s=30))
    rig.read(0.0)
    rig.write("counters/symbol_error", "500")
    assert rig.read(1.0) == DEGRADED and rig.state.reason == "symbol_error 500/60s"
    assert rig.tick(3.0) == DEGRADED  # 400 held 3 s: the reference, counters or not
    rig.write("rate", "200 Gb/sec (2X NDR)")
    assert rig.read(3.5) == DEGRADED
    assert rig.state.reason == "rate 200 < 400 Gb/s; symbol_error 500/60s"
    rig.write("rate", "400 Gb/sec (4X NDR)")
    assert rig.read(3.0) == DEGRADED and rig.state.reason == "symbol_error 500/60s"
    # the errors leave the window at 61 s, 30 s clean: up
    assert rig.tick(91.0) == UP
    assert rig.transitions == ["unknown->up", "up->degraded", "degraded->up"]


def test_changed_link_layer_stays_out(gpud: Path) -> None:
    rig = Rig(gpud)
    rig.read(0.0)
    flap(rig, 1.0, 2.0, link_layer="Ethernet")
    assert rig.tick(12.0) == DEGRADED
    assert rig.state.reason == "link_layer InfiniBand -> Ethernet"
    assert rig.read(100.0) == DEGRADED  # stays out while it reads Ethernet


def test_a_link_layer_changed_while_up_stays_out_and_a_flap_does_not_hide_it(gpud: Path) -> None:
    """A port re-initialised as Ethernet between two state polls (no flap seen): degraded at
    once, as at re-admission, and a later flap still compares with the admitted InfiniBand."""
    rig = Rig(gpud)
    assert rig.read(0.0) == UP
    rig.write("link_layer", "Ethernet")
    with capture_logs() as logs:
        assert rig.read(1.0) == DEGRADED
    assert rig.state.reason == "link_layer InfiniBand -> Ethernet"
    assert [e["event"] for e in logs if e["event"].startswith("port_link")] == [
        "port_link_layer_changed"
    ]
    flap(rig, 2.0, 3.0)
    assert rig.tick(13.0) == DEGRADED and rig.state.reason == "link_layer InfiniBand -> Ethernet"
    rig.write("link_layer", "InfiniBand")
    assert rig.read(14.0) == UP


def test_moved_gid_index_is_recorded(gpud: Path) -> None:
    rig = Rig(gpud, hca="mlx5_bond_0")  # the real RoCE LAG port (Ethernet, 200 Gb/s)
    gids = rig.dir / "gids"
    gids.mkdir()
    zero = "0000:0000:0000:0000:0000:0000:0000:0000"
    link_local = "fe80:0000:0000:0000:0ac0:ebff:fe3b:1a2c"
    v4 = "0000:0000:0000:0000:0000:ffff:0a00:0011"  # 10.0.0.17, RoCEv2
    for i, gid in enumerate([link_local, link_local, v4, v4, zero]):
        rig.write(f"gids/{i}", gid)
    assert rig.read(0.0) == UP and rig.state.gid_index_changed is False
    # after the flap the IPv4 GIDs come back at 4 and 5 (the address was re-added)
    flap(rig, 1.0, 2.0, gids__2=zero, gids__3=zero, gids__4=v4)
    rig.write("gids/5", v4)
    assert rig.read(3.0) == HELD
    assert rig.tick(12.0) == UP  # still used: the GID moved, the port is fine
    assert rig.state.gid_index_changed is True
    # the next clean return clears the flag
    flap(rig, 30.0, 31.0)
    assert rig.tick(31.0 + 20.0) == UP and rig.state.gid_index_changed is False


def test_gid_moves() -> None:
    a, b = "fe80::1", "::ffff:10.0.0.17"
    assert gid_moves({0: a, 2: b}, {0: a, 2: b, 3: b}) == []  # a new entry: not a move
    assert gid_moves({0: a, 1: a, 2: b, 3: b}, {0: a, 1: a, 4: b, 5: b}) == [
        f"2: {b} -> None",
        f"3: {b} -> None",
    ]
    assert gid_moves({0: a}, {0: b}) == [f"0: {a} -> {b}"]


def test_an_idle_port_back_from_a_flap_counts_its_next_error_burst(gpud: Path) -> None:
    """The port comes back between two counter readings (reused counters) and its counters
    do not move: the poller still reports its next counter reading, which is the baseline,
    so the first error burst after that degrades the port instead of being taken as one."""
    d = gpud / "mlx5_0" / "ports" / "1"
    polled: list[PortObservation] = []
    poll, mon = _real_poll(gpud, polled)

    assert poll(0.0) == UP
    put(d / "state", "1: DOWN\n")
    assert poll(0.3) == DOWN
    put(d / "state", "4: ACTIVE\n")
    assert poll(0.6) == HELD
    assert poll(1.0) == HELD  # the counter re-read, unchanged: reported all the same
    fresh = [(o.monotonic, o.counters_fresh) for o in polled]
    assert fresh == [(0.0, True), (0.3, False), (0.6, False), (1.0, True)]
    t = 2.0
    while t < 30.0:
        assert poll(t) in (HELD, UP)
        t += 1.0
    assert poll(30.0) == UP
    put(d / "counters" / "symbol_error", "5000\n")  # the first burst since the return
    assert poll(31.0) == DEGRADED
    assert mon.state("mlx5_0/1").reason == "symbol_error 5000/60s"  # type: ignore[union-attr]
