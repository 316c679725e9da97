"""Link evidence in the port monitor (linkguard.agent.linkkinds): a flap between two polls
seen in ``carrier_changes``, a bond's members, and the sources' disagreement. Pure: explicit
monotonic times, no clocks."""

from __future__ import annotations

from linkguard.agent.monitor import DampingPolicy, PortMonitor
from linkguard.drivers.base import PortObservation
from linkguard.models import LinkLayer, PhysState, PortDisagreement, PortStateName, PortStatus

WALL = 1_700_000_000.0
UP, DOWN, HELD, DEGRADED = (
    PortStatus.UP,
    PortStatus.DOWN,
    PortStatus.HELD_DOWN,
    PortStatus.DEGRADED,
)


def ipoib(state: str, carrier: bool | None, changes: int | None, phys: str = "LinkUp"):
    """An InfiniBand port's sysfs reading merged with its IPoIB netdev's carrier."""
    return PortObservation(
        hca="mlx5_0",
        port=1,
        monotonic=0.0,
        link_layer=LinkLayer.INFINIBAND,
        state=PortStateName(state),
        phys_state=PhysState(phys),
        netdev="ibp12s0",
        carrier=carrier,
        carrier_changes=changes,
    )


def bond(carrier: bool, members: dict[str, bool | None], state: str = "ACTIVE"):
    """``mlx5_bond_0`` (RoCE LAG) with its bond netdev's and members' carrier."""
    return PortObservation(
        hca="mlx5_bond_0",
        port=1,
        monotonic=0.0,
        link_layer=LinkLayer.ETHERNET,
        state=PortStateName(state),
        netdev="bond0",
        carrier=carrier,
        members=members,
    )


def monitor() -> PortMonitor:
    return PortMonitor(
        host="gpu-01",
        policy=DampingPolicy(hold_down_initial_s=10.0),
        rails={"mlx5_0/1": 0, "mlx5_bond_0/1": 1},
    )


def test_carrier_changes_rise_between_active_polls_is_one_flap() -> None:
    mon = monitor()
    out = mon.observe([ipoib("ACTIVE", True, 4)], now=0.0, wall=WALL)
    assert out.states[0].status is UP and out.states[0].carrier_changes == 4
    # the same reading a poll later: nothing
    assert mon.observe([ipoib("ACTIVE", True, 4)], now=0.1, wall=WALL).events == []
    # down and up between two polls: sysfs ACTIVE both times, the count rose by 2
    out = mon.observe([ipoib("ACTIVE", True, 6)], now=0.2, wall=WALL)
    (event,) = out.events
    assert (event.previous, event.current) == (UP, HELD)
    assert event.reason == "hold_down; carrier_changes 4 -> 6 while usable"
    st = mon.state("mlx5_0/1")
    assert st is not None
    assert (st.damping.flaps, st.damping.hold_down_s, st.carrier_changes) == (1, 10.0, 6)
    assert out.next_deadline == 10.2
    # the hold-down runs its course: UP again, the reason gone
    out = mon.tick(now=10.2, wall=WALL)
    assert [(e.previous, e.current, e.reason) for e in out.events] == [(HELD, UP, None)]


def test_a_flap_counted_once_when_the_poll_saw_the_carrier_off() -> None:
    """The carrier's off reading (a disagreement with sysfs ACTIVE) and its return: one flap,
    counted when the carrier is back; not two for the two transitions."""
    mon = monitor()
    mon.observe([ipoib("ACTIVE", True, 10)], now=0.0, wall=WALL)
    out = mon.observe([ipoib("ACTIVE", False, 11)], now=0.1, wall=WALL)
    assert out.events == []  # the sysfs state is the verdict of an IB port
    (st,) = out.states
    assert st.status is UP
    assert st.disagreement == PortDisagreement(
        sysfs_state=PortStateName.ACTIVE,
        sysfs_phys_state=PhysState.LINK_UP,
        carrier=False,
        netdev="ibp12s0",
    )
    out = mon.observe([ipoib("ACTIVE", True, 12)], now=0.2, wall=WALL)
    assert [(e.current, e.reason) for e in out.events] == [
        (HELD, "hold_down; carrier_changes 10 -> 12 while usable")
    ]
    st = mon.state("mlx5_0/1")
    assert st is not None and st.damping.flaps == 1 and st.disagreement is None


def test_a_flap_the_poll_saw_is_not_counted_again() -> None:
    """sysfs saw the port down: that is the flap; the carrier_changes it caused is not
    another one."""
    mon = monitor()
    mon.observe([ipoib("ACTIVE", True, 0)], now=0.0, wall=WALL)
    out = mon.observe([ipoib("DOWN", False, 1, phys="Polling")], now=0.1, wall=WALL)
    assert [(e.current, e.reason) for e in out.events] == [(DOWN, "phys_polling")]
    out = mon.observe([ipoib("ACTIVE", True, 2)], now=0.2, wall=WALL)
    assert [(e.current, e.reason) for e in out.events] == [(HELD, "hold_down")]
    out = mon.tick(now=20.2, wall=WALL)  # the second hold-down (20 s) would show a 2nd flap
    assert [e.current for e in out.events] == [UP]
    st = mon.state("mlx5_0/1")
    assert st is not None and st.damping.flaps == 1


def test_carrier_changes_that_fall_are_a_new_base_not_a_flap() -> None:
    mon = monitor()
    mon.observe([ipoib("ACTIVE", True, 40)], now=0.0, wall=WALL)
    assert mon.observe([ipoib("ACTIVE", True, 2)], now=0.1, wall=WALL).events == []
    out = mon.observe([ipoib("ACTIVE", True, 4)], now=0.2, wall=WALL)
    assert [e.reason for e in out.events] == ["hold_down; carrier_changes 2 -> 4 while usable"]


def test_sysfs_down_under_a_carrier_up_is_a_disagreement_with_both_readings() -> None:
    mon = monitor()
    out = mon.observe([ipoib("INIT", True, 3)], now=0.0, wall=WALL)
    (st,) = out.states
    assert (st.status, st.reason) == (DOWN, "no_sm")
    assert st.disagreement is not None
    assert (st.disagreement.sysfs_state, st.disagreement.carrier) == (PortStateName.INIT, True)
    assert st.model_dump(mode="json")["disagreement"] == {
        "sysfs_state": "INIT",
        "sysfs_phys_state": "LinkUp",
        "carrier": True,
        "netdev": "ibp12s0",
    }


def test_bond_member_without_carrier_degrades_the_bond() -> None:
    mon = monitor()
    out = mon.observe([bond(True, {"ens1f0np0": True, "ens1f1np1": True})], now=0.0, wall=WALL)
    assert out.states[0].status is UP
    # the second member loses its carrier: the bond still has carrier (one member up)
    out = mon.observe([bond(True, {"ens1f0np0": True, "ens1f1np1": False})], now=1.0, wall=WALL)
    assert [(e.previous, e.current, e.reason) for e in out.events] == [
        (UP, DEGRADED, "bond members without carrier: ens1f1np1 (1/2 up)")
    ]
    # and not only the first member counts: the first down, the second up
    out = mon.observe([bond(True, {"ens1f0np0": False, "ens1f1np1": True})], now=2.0, wall=WALL)
    assert mon.state("mlx5_bond_0/1").reason == (  # type: ignore[union-attr]
        "bond members without carrier: ens1f0np0 (1/2 up)"
    )
    # a member gone from the namespace
    out = mon.observe([bond(True, {"ens1f0np0": None, "ens1f1np1": True})], now=3.0, wall=WALL)
    assert mon.state("mlx5_bond_0/1").reason == (  # type: ignore[union-attr]
        "bond members without carrier: ens1f0np0 absent (1/2 up)"
    )
    # both back: UP at once (DEGRADED is no flap)
    out = mon.observe([bond(True, {"ens1f0np0": True, "ens1f1np1": True})], now=4.0, wall=WALL)
    assert [(e.previous, e.current) for e in out.events] == [(DEGRADED, UP)]
    st = mon.state("mlx5_bond_0/1")
    assert st is not None and st.damping.flaps == 0


def test_bond_without_carrier_or_without_any_member_up_is_down() -> None:
    mon = monitor()
    mon.observe([bond(True, {"a": True, "b": True})], now=0.0, wall=WALL)
    out = mon.observe([bond(True, {"a": False, "b": False})], now=1.0, wall=WALL)
    assert [(e.current, e.reason) for e in out.events] == [
        (DOWN, "bond members without carrier: a, b (0/2 up)")
    ]
    mon2 = monitor()
    mon2.observe([bond(True, {"a": True})], now=0.0, wall=WALL)
    out = mon2.observe([bond(False, {"a": False}, state="DOWN")], now=1.0, wall=WALL)
    assert [(e.current, e.reason) for e in out.events] == [(DOWN, "no_carrier")]
    mon3 = monitor()
    out = mon3.observe([bond(True, {})], now=0.0, wall=WALL)
    assert (out.states[0].status, out.states[0].reason) == (DEGRADED, "bond without members")
