"""The topology service's pure core (:class:`ServiceCore`): bus messages and ticks with an explicit
``now`` in, exact effects out. No bus, no clock, no event loop."""

from __future__ import annotations

import ast
import inspect

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from linkguard import topics
from linkguard.config import ProbeRunSettings, ServiceSettings
from linkguard.models import (
    FabricFaults,
    HostStatus,
    PeerRoutes,
    Plan,
    PortState,
    PortStatus,
    ProbePair,
    ProbeReport,
    ServiceStatus,
    encode,
)
from linkguard.presence import Me
from linkguard.signing import Signer
from linkguard.topology import core as core_module
from linkguard.topology import effects, faultsdesk, integrity, probedesk, schedule
from linkguard.topology.core import ServiceCore
from linkguard.topology.effects import (
    ClearRetained,
    ClearStalePlans,
    Emit,
    KickAudit,
    KickRouteAround,
    Log,
    PublishPlans,
    Reissue,
    ScheduleSolve,
    StopDuplicate,
)
from linkguard.topology.generator import generate_rail_optimized
from linkguard.topology.probeplan import PortId

FABRIC = generate_rail_optimized(hosts=3, rails=2)
WALL = 1.7e9  # a Unix time for the plans' issued_at
#: the back-off of these tests (ms): initial 10, short 100, long 1000, learn 500, holddown 3000
SETTINGS = ServiceSettings(
    solve={
        "initial_ms": 10,
        "short_ms": 100,
        "long_ms": 1000,
        "time_to_learn_ms": 500,
        "holddown_ms": 3000,
    }
)


def _core(
    settings: ServiceSettings = SETTINGS, signer: Signer | None = None, *, elected: bool = False
) -> ServiceCore:
    return ServiceCore(
        settings,
        FABRIC,
        verifier=signer.verifier if signer is not None else None,
        me=Me(instance="ffff", started_at=100.0),
        elected=elected,
        epoch_start=1000,
    )


def _port(host: str, rail: int, status: PortStatus, **kw: object) -> PortState:
    return PortState(
        host=host,
        hca=f"mlx5_{rail}",
        port=1,
        rail=rail,
        status=status,
        usable=status == PortStatus.UP,
        observed_at=WALL,
        **kw,  # type: ignore[arg-type]
    )


def _send(core: ServiceCore, st: PortState, now: float) -> list[effects.Effect]:
    topic = topics.port_state(st.host, st.hca, st.port)
    return core.on_message(topic, encode(st), False, now, leading=True)


def _solve(core: ServiceCore, now: float) -> tuple[object, PublishPlans]:
    """What the wiring's solver task does at ``now`` (the compute in-line, not in a thread)."""
    assert core.schedule.solve_started(now)
    unusable = core.state.prepare()
    return core.schedule.commit(core.state.compute(unusable, now=WALL))


def test_a_port_down_schedules_an_urgent_solve() -> None:
    core = _core()
    down = _port("gpu000", 0, PortStatus.DOWN, reason="link_down")
    assert _send(core, down, now=10.0) == [
        Emit("port", down.model_dump(mode="json")),
        Log(
            "info",
            "port_usability_changed",
            {
                "host": "gpu000",
                "port": "mlx5_0/1",
                "rail": 0,
                "status": "down",
                "reason": "link_down",
            },
        ),
        ScheduleSolve(at=10.010),  # initial_ms after a quiet period: urgent
        Log("debug", "solve_scheduled", {"state": "short_wait", "due_in_ms": 10.0}),
    ]
    # a second port 5 ms later joins the solve already scheduled (never postponed)
    other = _port("gpu001", 0, PortStatus.DOWN, reason="link_down")
    assert _send(core, other, now=10.005)[-2:] == [
        ScheduleSolve(at=10.010),
        Log("debug", "solve_scheduled", {"state": "short_wait", "due_in_ms": 5.0}),
    ]
    # the same state again (an agent's periodic re-publish) changes nothing
    assert _send(core, down, now=10.006) == []


def test_a_port_back_up_is_not_urgent() -> None:
    core = _core()
    up = _port("gpu000", 0, PortStatus.DOWN)
    _send(core, up, now=0.0)
    assert core.schedule.solve_started(0.01)
    back = _port("gpu000", 0, PortStatus.UP)
    # quiet again after holddown (3 s): a return to use waits short_ms, not initial_ms
    assert [e for e in _send(core, back, now=5.0) if isinstance(e, ScheduleSolve)] == [
        ScheduleSolve(at=5.1)
    ]


def test_back_off_timing() -> None:
    """RFC 8405 through the core: initial, then short while learning, then long, then quiet
    again after the holddown."""
    core = _core()

    def due(now: float, urgent: bool = True) -> float:
        (sched,) = [e for e in core.changed(now, urgent=urgent) if isinstance(e, ScheduleSolve)]
        return sched.at

    assert due(0.0) == pytest.approx(0.010)  # QUIET -> initial
    core.schedule.solve_started(0.010)
    assert due(0.2) == pytest.approx(0.3)  # SHORT_WAIT (within time_to_learn 0.5 s): short
    core.schedule.solve_started(0.3)
    assert due(0.6) == pytest.approx(1.6)  # past time_to_learn: LONG_WAIT, long
    assert due(0.9) == pytest.approx(1.6)  # pending: not postponed
    core.schedule.solve_started(1.6)
    assert due(4.7) == pytest.approx(4.71)  # holddown (3 s after the last change): quiet
    assert core.schedule.backoff.state.value == "short_wait"


def test_a_solve_publishes_plans_with_the_right_epochs() -> None:
    core = _core()
    assert core.settle() == []
    solved, publish = _solve(core, now=1.0)
    # the full build: every host's (compact) plan, epoch_start
    assert [(t, m.epoch) for t, m in publish.messages] == [
        (topics.plan(h), 1000) for h in ("gpu000", "gpu001", "gpu002")
    ]
    assert publish.why == "solve" and core.schedule.solves == 1
    _send(core, _port("gpu000", 0, PortStatus.DOWN), now=2.0)
    solved, publish = _solve(core, now=2.01)
    # full plans first, then peer routes, then compact plans; the peer routes one epoch
    # below the plans of the same solve (a host acks its plan, never the peer routes alone)
    assert [(t, type(m), m.epoch) for t, m in publish.messages] == [
        (topics.plan("gpu000"), Plan, 1002),
        (topics.peer_routes("gpu000"), PeerRoutes, 1001),
    ]
    assert solved.epoch == 1002 and core.state.epoch == 1002  # type: ignore[attr-defined]
    plan = publish.messages[0][1]
    assert isinstance(plan, Plan) and plan.shared is None  # a host with a rail down: full
    assert core.schedule.published(
        solved,  # type: ignore[arg-type]
        {"gpu000": frozenset({0})},
        now=2.05,
        messages=2,
        size=900,
        timings_ms=(1.5, 0.5, 2.0),
    ) == [
        Emit(
            "plans",
            {
                "epoch": 1002,
                "hosts": ["gpu000", "gpu001", "gpu002"],
                "peer_routes": ["gpu000"],
                "messages": 2,
                "solve_ms": 1.5,
            },
        ),
        Log(
            "info",
            "plans_published",
            {
                "epoch": 1002,
                "changed": 3,
                "messages": 2,
                "peer_routes": 1,
                "unchanged": 0,
                "solve_ms": 1.5,
                "encode_ms": 0.5,
                "publish_ms": 2.0,
                "bytes": 900,
                "unusable": ["gpu000:[0]"],
            },
        ),
    ]
    assert core.schedule.plans_published == 3
    # nothing changed: no solve is needed
    assert not core.schedule.solve_started(3.0)


def test_a_forged_retained_plan_is_refused_with_a_typed_reason() -> None:
    mine, theirs = Signer(Ed25519PrivateKey.generate()), Signer(Ed25519PrivateKey.generate())
    core = _core(signer=mine)
    plan = Plan(host="gpu000", epoch=5, issued_at=WALL)
    topic = topics.plan("gpu000")
    forged = theirs.seal(encode(plan))
    out = core.on_message(topic, forged, True, 50.0, leading=True)
    (log,) = [e for e in out if isinstance(e, Log)]
    assert (log.event, log.fields["reason"], log.fields["topic"]) == (
        "message_dropped",
        "unknown_key",
        topic,
    )
    assert out[-1] == Reissue("plan", "gpu000", topic, at=50.0)
    assert core.dropped == {"unknown_key": 1}
    assert "gpu000" not in core.state.published  # not taken as what is on the bus
    # unsigned: refused too; the put-back already pending covers it
    out = core.on_message(topic, encode(plan), True, 50.2, leading=True)
    assert [type(e) for e in out] == [Log] and core.dropped["unsigned"] == 1
    # one signed by this service's key is taken
    assert core.on_message(topic, mine.seal(encode(plan)), True, 50.3, leading=True) == []
    assert core.state.published["gpu000"] == plan


def test_a_foreign_live_plan_is_answered_with_the_services_own_at_most_once_a_second() -> None:
    mine = Signer(Ed25519PrivateKey.generate())
    core = _core(signer=mine)
    core.settle()
    _, publish = _solve(core, now=1.0)
    sent = [(t, mine.seal(encode(m))) for t, m in publish.messages]
    core.sent(sent, now=1.0)
    topic, own = sent[0]
    # this service's own coming back: nothing
    assert core.on_message(topic, own, False, 1.1, leading=True) == []
    # another client's: dropped as foreign, own put back at once
    forged = mine.seal(encode(Plan(host="gpu000", epoch=1, issued_at=WALL)))  # a replay
    out = core.on_message(topic, forged, False, 20.0, leading=True)
    assert out == [
        Log(
            "warning",
            "message_dropped",
            {
                "topic": topic,
                "reason": "foreign",
                "detail": "published on this topic by another client",
                "bytes": len(forged),
            },
        ),
        Reissue("plan", "gpu000", topic, at=20.0),
    ]
    # more of them while the put-back is pending: dropped, no second put-back
    assert [type(e) for e in core.on_message(topic, b"", False, 20.1, leading=True)] == [Log]
    out = core.reissue_due("plan", "gpu000", now=20.0)
    assert out == [
        Log(
            "warning",
            "foreign_retained_replaced",
            {"topic": topic, "epoch": 1000, "action": "re-published this service's own"},
        ),
        PublishPlans(((topic, core.state.published["gpu000"]),), why="reissue"),
    ]
    core.integrity.reissue_done(topic)
    # the next one waits REISSUE_INTERVAL_S (1 s) from the last put-back
    assert core.on_message(topic, forged, False, 20.4, leading=True)[-1] == Reissue(
        "plan", "gpu000", topic, at=21.0
    )
    # peer routes this service never published are deleted
    peers_topic = topics.peer_routes("gpu001")
    assert core.refuse(
        peers_topic, b"x", "peers", "gpu001", integrity.Refused("foreign", "", reissue=True), 30.0
    )[-1] == Reissue("peers", "gpu001", peers_topic, at=30.0)
    assert core.reissue_due("peers", "gpu001", now=30.0)[-1] == ClearRetained((peers_topic,))


def test_a_standby_takes_the_leaders_live_plans_as_retained() -> None:
    core = _core(elected=True)
    plan = Plan(host="gpu000", epoch=7, issued_at=WALL)
    assert core.on_message(topics.plan("gpu000"), encode(plan), False, 1.0, leading=False) == []
    assert core.state.published["gpu000"] == plan
    # a leader ignores its own live plans coming back
    other = Plan(host="gpu001", epoch=7, issued_at=WALL)
    assert core.on_message(topics.plan("gpu001"), encode(other), False, 1.0, leading=True) == []
    assert "gpu001" not in core.state.published


def test_stale_plans_of_hosts_not_in_the_fabric_are_cleared_after_the_settle() -> None:
    core = _core()
    stale = Plan(host="gone01", epoch=3, issued_at=WALL)
    topic = topics.plan("gone01")
    assert core.on_message(topic, encode(stale), True, 0.1, leading=True) == []
    assert core.stale_plans == {"gone01": 3}
    core.settle()
    later = Plan(host="gone02", epoch=4, issued_at=WALL)
    out = core.on_message(topics.plan("gone02"), encode(later), True, 2.0, leading=True)
    assert out == [ClearStalePlans()] and core.stale_plans == {"gone01": 3, "gone02": 4}


def test_host_status_and_a_duplicate_service() -> None:
    core = _core()
    online = HostStatus(host="gpu001", online=True, at=WALL)
    out = core.on_message(topics.status("gpu001"), encode(online), True, 7.0, leading=True)
    assert out == [
        Emit("host", online.model_dump(mode="json")),
        KickAudit(),
        Log("info", "host_status", {"host": "gpu001", "online": True, "reason": None}),
        KickRouteAround(),
    ]
    assert core.online_since == {"gpu001": 7.0}
    # another instance that started first (50 < 100): this one stops
    first = ServiceStatus(online=True, at=WALL, instance="0abc", started_at=50.0)
    out = core.on_message(topics.service_status(), encode(first), False, 8.0, leading=True)
    assert out[-1] == StopDuplicate() and core.duplicate == first


def test_probe_reports_take_only_assigned_pairs_of_targets_online() -> None:
    settings = ServiceSettings(probes=ProbeRunSettings(enabled=True))
    core = _core(settings)
    targets = {t.host: t for t in core.probes.targets(epoch=5)}
    assert sorted(core.probes.plans) == [4, 5]
    rail = targets["gpu000"].rails[0]
    peer = rail.peers[0]
    for h in FABRIC.host_names:  # agents online since t=0
        status = HostStatus(host=h, online=True, at=WALL)
        core.on_message(topics.status(h), encode(status), True, 0.0, leading=True)
    assigned = ProbePair(rail=rail.rail, peer_host=peer.host, peer_rail=peer.rail, sent=10, lost=0)
    unassigned = ProbePair(
        rail=rail.rail, peer_host="gpu000", peer_rail=1 - rail.rail, sent=1, lost=1
    )
    report = ProbeReport(
        host="gpu000", epoch=5, window_end=WALL, window_s=10, pairs=[assigned, unassigned]
    )
    out = core.on_message(topics.probe_report("gpu000"), encode(report), False, 30.0, leading=True)
    prober = PortId("gpu000", rail.rail)
    assert out == [
        Log(
            "warning",
            "message_dropped",
            {
                "topic": topics.probe_report("gpu000"),
                "reason": "unassigned_probe_pair",
                "host": "gpu000",
                "count": 1,
                "epoch": 5,
                "first": [f"{prober}->{PortId('gpu000', 1 - rail.rail)}"],
            },
        )
    ]
    (result,) = core.probes.results.values()
    assert (result.prober, result.target, result.sent, result.window_end) == (
        prober,
        PortId(peer.host, peer.rail),
        10,
        30.0,
    )
    assert core.probes.reports == 1 and core.dropped == {"unassigned_probe_pair": 1}
    # within the window + timeout (11 s) of its target coming online: not counted
    core.on_message(
        topics.status(peer.host),
        encode(HostStatus(host=peer.host, online=False, at=WALL)),
        True,
        31.0,
        leading=True,
    )
    core.on_message(
        topics.status(peer.host),
        encode(HostStatus(host=peer.host, online=True, at=WALL)),
        True,
        32.0,
        leading=True,
    )
    only = report.model_copy(update={"pairs": [assigned]})
    assert core.probes.on_report(only, now=42.0) == []
    assert core.probes.pairs_unanswerable == 1
    # a report of an epoch the service no longer asks for: dropped whole, logged once a minute
    old = only.model_copy(update={"epoch": 3})
    assert [type(e) for e in core.probes.on_report(old, now=43.0)] == [Log]
    assert core.probes.on_report(old, now=44.0) == []
    assert core.dropped["stale_probe_epoch"] == 2


def test_switch_faults_in_effect_refused_and_unchanged() -> None:
    core = _core()
    desk = core.switch_faults
    leaf = next(sw.name for sw in FABRIC.switches if sw.role == "leaf" and sw.rail == 0)
    faults = FabricFaults(switches_down=[leaf], at=WALL)
    topic = topics.fabric_faults()
    assert desk.read(topic, encode(faults)) == faults
    out = desk.accept(faults, core.state.assess_faults(faults), now=5.0, wall=WALL)
    assert [type(e) for e in out] == [Log, ScheduleSolve, Log]  # rail 0 unusable: a solve
    assert out[1] == ScheduleSolve(at=5.010)
    assert (out[0].event, desk.faults, desk.health_at) == ("fabric_faults", faults, WALL)  # type: ignore[union-attr]
    # the same set again (the service's own re-publish): nothing to do
    assert desk.read(topic, encode(faults)) is None
    # a malformed set: refused with its typed reason, the set in effect stays
    refused = desk.read(topic, b"{not json")
    assert isinstance(refused, integrity.Refused) and refused.reason == "not_json"
    assert desk.refusal(b"{not json", refused.reason, "x", wall=WALL) == {
        "reason": "not_json",
        "detail": "x",
        "at": WALL,
        "faults": "{not json",
    }
    assert desk.refused_log("not_json") == Log(
        "warning",
        "fabric_faults_refused",
        {"reason": "not_json", "action": "put the set in effect back on the topic"},
    )


@pytest.mark.parametrize(
    "module", [core_module, effects, faultsdesk, integrity, probedesk, schedule]
)
def test_the_core_imports_no_bus_asyncio_or_clock(module: object) -> None:
    """What the import-linter contract cannot say (the standard library): no asyncio, no
    time, no threads or sockets in the core's own modules."""
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {n.split(".")[0] for n in names} & {
        "asyncio",
        "time",
        "threading",
        "socket",
        "datetime",
    }
    assert not {n for n in names if n.startswith(("linkguard.bus", "linkguard.membus"))}
