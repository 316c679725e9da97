"""Routing around a host whose agent's last will arrived (:meth:`FabricState.route_around`):
the grace period, the limit on hosts routed around at once, and what the plans say while the
host is away and once it is back. Pure: ``now`` is passed in."""

from __future__ import annotations

from ipaddress import IPv4Address

from linkguard.config import OfflineSettings
from linkguard.models import HostStatus, Plan
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.state import FabricState

FABRIC = generate_rail_optimized(hosts=8, rails=4)
H = FABRIC.host_names
GONE = H[3]


def _state() -> FabricState:
    st = FabricState(fabric=FABRIC, epoch_start=1)
    st.solve(now=0.0)
    return st


def _lost(host: str) -> HostStatus:
    return HostStatus(host=host, online=False, reason="lost")


def _unreachable(plan: Plan) -> set[IPv4Address]:
    return set(plan.unreachable)


def test_a_lost_host_is_routed_around_after_the_grace_period_and_back_when_online() -> None:
    st = _state()
    before = {h: st.plans[h] for h in H}
    gone_plan = st.published[GONE]
    assert all(not _unreachable(p) for p in before.values())

    st.on_host_status(_lost(GONE), now=100.0)
    early = st.route_around(129.9, after_s=30, limit=1)
    assert (early.added, early.held, early.due_at) == ([], False, 130.0)
    assert st.solve(now=129.9).publish == []  # nothing moves during the grace period

    due = st.route_around(130.0, after_s=30, limit=1)
    assert (due.added, due.held, due.due_at) == ([GONE], False, None)
    assert st.dirty and st.unusable() == {GONE: frozenset(range(4))}
    solved = st.solve(now=130.0)
    endpoints = {IPv4Address(e) for e in FABRIC.host(GONE).endpoints}
    for h in H:
        if h != GONE:  # every peer fails fast towards the host that may be gone
            assert _unreachable(st.plans[h]) == endpoints, h
    # its own plan stays the one it had (it is not there; it must not come back to a plan
    # without usable rails), and it owes no ack
    assert st.published[GONE] is gone_plan
    assert GONE not in solved.hosts and GONE not in st.pending_acks(solved.hosts)

    st.on_host_status(HostStatus(host=GONE, online=True), now=200.0)
    assert st.dirty and st.away == set() and st.lost == {}
    st.solve(now=200.0)
    after = {h: st.plans[h] for h in H}
    assert all(not _unreachable(p) for p in after.values())
    for h in H:  # every plan back to what it was, the returning host's never touched
        assert after[h].same_assignments(before[h]), h
    assert st.published[GONE] is gone_plan


def test_a_clean_stop_or_an_old_agent_without_reason_is_never_routed_around() -> None:
    st = _state()
    st.on_host_status(HostStatus(host=GONE, online=False, reason="stopped"), now=0.0)
    st.on_host_status(HostStatus(host=H[4], online=False), now=0.0)
    r = st.route_around(10_000.0, after_s=0, limit=8)
    assert (r.added, r.held, r.due_at, st.lost) == ([], False, None, {})


def test_back_within_the_grace_period_changes_nothing() -> None:
    st = _state()
    st.on_host_status(_lost(GONE), now=0.0)
    st.on_host_status(HostStatus(host=GONE, online=True), now=5.0)  # an agent restart
    r = st.route_around(1_000.0, after_s=30, limit=1)
    assert (r.added, r.due_at) == ([], None)
    assert st.solve(now=1_000.0).publish == []


def test_more_hosts_lost_than_the_limit_holds_and_keeps_those_already_away() -> None:
    st = _state()
    st.on_host_status(_lost(H[0]), now=0.0)
    assert st.route_around(30.0, after_s=30, limit=2).added == [H[0]]
    st.on_host_status(_lost(H[1]), now=31.0)
    st.on_host_status(_lost(H[2]), now=31.0)
    held = st.route_around(100.0, after_s=30, limit=2)
    assert (held.added, held.held, held.due_at) == ([], True, None)
    assert st.away == {H[0]}  # already routed around: stays so
    # one comes back: two lost or away again, within the limit: the other is added
    st.on_host_status(HostStatus(host=H[2], online=True), now=101.0)
    assert st.route_around(101.0, after_s=30, limit=2).added == [H[1]]
    assert st.away == {H[0], H[1]}


def test_a_lost_host_the_fabric_does_not_list_is_ignored() -> None:
    st = _state()
    st.on_host_status(_lost("not-in-fabric"), now=0.0)
    assert st.lost == {} and st.route_around(100.0, after_s=0, limit=1).added == []


def test_never_when_switched_off() -> None:
    st = _state()
    st.on_host_status(_lost(GONE), now=0.0)
    r = st.route_around(1e9, after_s=None, limit=8)
    assert (r.added, r.held, r.due_at, st.away) == ([], False, None, set())


def test_the_limit_is_a_fraction_of_the_fabric_with_at_least_one_host() -> None:
    assert OfflineSettings().limit(2) == 1
    assert OfflineSettings().limit(2048) == 102
    assert OfflineSettings(max_fraction=0).limit(2048) == 1
    assert OfflineSettings(max_fraction=1).limit(16) == 16
