"""Convergence decisions (:mod:`linkguard.topology.convergence`), pure: ``now`` is passed in.
When an online host counts as not acking, the capped back-off of the re-sends, what a re-send
holds (a compact plan's peer routes newer than its last ack), who owes nothing (offline,
routed around, answered), and the plan requests' answers and rate limit. The same on real
processes (Mosquitto, the chaos proxy, agents): tests/test_convergence_bus.py."""

from __future__ import annotations

import itertools

import pydantic
import pytest

from linkguard import topics
from linkguard.config import ConvergenceSettings
from linkguard.models import Ack, AckResult, HostStatus, PlanRequest, PortState, PortStatus
from linkguard.topology.convergence import Convergence, NotAcking
from linkguard.topology.effects import Log, PublishPlans
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.state import FabricState

FABRIC = generate_rail_optimized(hosts=4, rails=2)
H = FABRIC.host_names
SETTINGS = ConvergenceSettings(resend_after_s=5, resend_max_s=30, request_min_interval_s=2)


def _setup(*, online: list[str] = H) -> tuple[FabricState, Convergence, dict[str, float]]:
    st = FabricState(fabric=FABRIC, epoch_start=1)
    since: dict[str, float] = {}
    conv = Convergence(SETTINGS, st, since)
    for h in online:
        st.on_host_status(HostStatus(host=h, online=True), now=0.0)
        since[h] = 0.0
    solved = st.solve(now=0.0)
    sent = [topics.plan(p.host) for p in solved.publish]
    conv.sent(sent + [topics.peer_routes(p.host) for p in solved.peers], 10.0)
    return st, conv, since


def _port_down(st: FabricState, host: str) -> None:
    """``host``'s first port reported down (seq 2, at 2.0 s): a full plan for it and its
    peer routes at the next solve."""
    hca = FABRIC.host(host).hcas[0]
    st.on_port_state(
        PortState(
            host=host, hca=hca.hca, port=hca.port, rail=hca.rail, status=PortStatus.DOWN,
            seq=2, observed_at=2.0,
        )
    )  # fmt: skip


def _ack(
    st: FabricState,
    conv: Convergence,
    host: str,
    epoch: int,
    result=AckResult.APPLIED,
    peers: dict[str, int] | None = None,
):
    ack = Ack(host=host, epoch=epoch, result=result, applied_at=1.0, peers=peers)
    st.on_ack(ack)
    conv.on_ack(ack)


def _resent_topics(effects) -> list[str]:
    return [t for e in effects if isinstance(e, PublishPlans) for t, _ in e.messages]


def test_a_host_past_its_deadline_is_resent_with_a_capped_backoff() -> None:
    st, conv, _ = _setup()
    for h in H[1:]:
        _ack(st, conv, h, st.acked_epoch(h))
    epoch = st.acked_epoch(H[0])
    effects, due = conv.tick(14.9)  # published at 10 s: 5 s deadline
    assert effects == [] and due == 15.0 and conv.not_acking(14.9) == []
    times = []
    now = 15.0
    for _ in range(6):
        effects, due = conv.tick(now)
        warn = [e for e in effects if isinstance(e, Log)]
        assert [(w.event, w.fields["host"], w.fields["epoch"]) for w in warn] == [
            ("host_not_acking", H[0], epoch)
        ]
        assert warn[0].fields["age_s"] == now - 10.0
        assert _resent_topics(effects) == [topics.plan(H[0])]
        times.append(now)
        assert due is not None
        assert conv.tick(due - 0.01)[0] == []  # nothing before it is due
        now = due
    # waits of 10, 20, then capped at 30 s
    assert [b - a for a, b in itertools.pairwise(times)] == [10, 20, 30, 30, 30]
    assert conv.resends == 6
    assert conv.not_acking(now) == [NotAcking(H[0], epoch, now - 10.0, 6)]
    _ack(st, conv, H[0], epoch)
    assert conv.not_acking(now) == [] and conv.tick(now) == ([], None)


def test_offline_routed_around_and_answered_hosts_owe_nothing() -> None:
    st, conv, since = _setup(online=H[:3])  # H[3] never came online
    st.on_host_status(HostStatus(host=H[1], online=False, reason="stopped"), now=1.0)
    conv.forget(H[1])
    # a refusal of the epoch owed is an answer: the ack warning is its business, not a re-send
    _ack(st, conv, H[2], st.acked_epoch(H[2]), AckResult.REFUSED)
    effects, _ = conv.tick(100.0)
    assert _resent_topics(effects) == [topics.plan(H[0])]
    # back online late: its deadline counts from then, not from the publish
    st.on_host_status(HostStatus(host=H[3], online=True), now=50.0)
    since[H[3]] = 50.0
    effects, due = conv.tick(54.0)
    assert _resent_topics(effects) == [] and due == 55.0
    assert _resent_topics(conv.tick(55.0)[0]) == [topics.plan(H[3])]


def test_a_compact_plan_is_resent_with_the_peer_routes_it_has_not_acked() -> None:
    st, conv, _ = _setup()
    first = {h: st.acked_epoch(h) for h in H}
    for h in H:
        _ack(st, conv, h, first[h])
    # a port of H[3] goes down: its full plan and its peer routes; whole hosts owe the latter
    _port_down(st, H[3])
    solved = st.solve(now=20.0)
    assert [p.host for p in solved.peers] == [H[3]]
    conv.sent([topics.peer_routes(H[3]), topics.plan(H[3])], 20.0)
    for h in H[1:]:
        _ack(st, conv, h, st.acked_epoch(h))
    assert st.published[H[0]].shared is not None  # whole: a compact plan
    effects, _ = conv.tick(25.0)
    assert _resent_topics(effects) == [topics.peer_routes(H[3]), topics.plan(H[0])]


def test_an_ack_of_the_epoch_without_a_peers_routes_is_not_converged() -> None:
    """The lab chaos run: a solve publishes a compact plan and a peer's routes with one
    epoch; an agent that lost the peer routes acks that epoch all the same. Its ack names the
    peer routes it holds: one missing keeps the host owing (not acking, pending), and the
    re-send holds that peer routes message though its epoch is not above the ack's."""
    st, conv, _ = _setup()
    for h in H:
        _ack(st, conv, h, st.acked_epoch(h), peers={})
    assert st.pending_acks() == []
    _port_down(st, H[3])
    solved = st.solve(now=20.0)
    assert [p.host for p in solved.peers] == [H[3]]
    epoch = st.peers[H[3]].epoch
    conv.sent([topics.peer_routes(H[3]), topics.plan(H[3])], 20.0)
    _ack(st, conv, H[3], st.acked_epoch(H[3]))  # a full plan: no names
    _ack(st, conv, H[1], st.acked_epoch(H[1]), peers={H[3]: epoch})  # has it
    _ack(st, conv, H[2], st.acked_epoch(H[2]))  # an older agent: no names, epoch only
    assert st.acked_epoch(H[0]) == epoch
    _ack(st, conv, H[0], epoch, peers={})  # the epoch, without H[3]'s peer routes
    assert st.pending_acks() == [H[0]]
    assert not st.ack_covers(H[0], st.acks[H[0]]) and st.ack_covers(H[1], st.acks[H[1]])
    effects, _ = conv.tick(25.0)
    assert _resent_topics(effects) == [topics.peer_routes(H[3]), topics.plan(H[0])]
    assert [n.host for n in conv.not_acking(25.0)] == [H[0]]
    _ack(st, conv, H[0], epoch, peers={H[3]: epoch})  # the re-send brought it
    assert st.pending_acks() == [] and conv.not_acking(26.0) == []
    assert conv.tick(26.0)[0] == []


def test_plan_requests_are_answered_when_behind_and_rate_limited() -> None:
    st, conv, _ = _setup()
    owed = st.acked_epoch(H[0])
    assert owed is not None

    def ask(epoch: int | None, now: float):
        return conv.on_request(PlanRequest(host=H[0], epoch=epoch, at=1.0), now)

    assert ask(owed, 11.0) == ([], None)  # it has the current one
    effects, refused = ask(None, 11.0)
    assert refused is None and _resent_topics(effects) == [topics.plan(H[0])]
    assert [e.event for e in effects if isinstance(e, Log)] == ["plan_request_answered"]
    assert ask(owed - 1, 12.9) == ([], "plan_request_limited")
    effects, refused = ask(owed - 1, 13.0)
    assert refused is None and _resent_topics(effects) == [topics.plan(H[0])]
    assert conv.resends == 2 and conv.requests_answered == 2
    unplanned = Convergence(SETTINGS, FabricState(fabric=FABRIC, epoch_start=1), {})
    req = PlanRequest(host=H[0], epoch=None, at=1.0)
    assert unplanned.on_request(req, 1.0) == ([], None)  # no plan yet: the solve sends it


def test_settings_refuse_a_cap_below_the_first_wait() -> None:
    with pytest.raises(pydantic.ValidationError, match="resend_max_s"):
        ConvergenceSettings(resend_after_s=10, resend_max_s=5)
