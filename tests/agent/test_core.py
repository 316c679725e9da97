"""The agent's pure core: monitor outputs, plans and peer routes in, with an explicit ``now``;
the exact effects out. No bus, no kernel, no clock: plans come from the real solver."""

from __future__ import annotations

import ast
import ipaddress
from pathlib import Path

import pytest

import linkguard.agent.core as core_module
from linkguard.agent.core import FAST_PATH_FROM, AgentCore
from linkguard.agent.effects import (
    ApplyPlan,
    FastPath,
    FlushNeighbours,
    MarkPortUp,
    ObserveAck,
    ObserveEvents,
    PersistHealth,
    PersistHistory,
    PersistPeerRoutes,
    PersistPlan,
    PersistTerm,
    PublishEvent,
    PublishState,
    RailChange,
    Reannounce,
    RenderNccl,
    ResendAck,
    ScheduleTimer,
    SendAck,
    Yield,
)
from linkguard.agent.monitor import MonitorOutput
from linkguard.agent.plans import Refusal
from linkguard.models import (
    Ack,
    AckResult,
    HostStatus,
    Plan,
    PortEvent,
    PortState,
    PortStatus,
    RouteAssignment,
    encode,
    expand_plan,
)
from linkguard.presence import Me
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.solver import Solver, solve

FABRIC = generate_rail_optimized(hosts=12, rails=4)
HOST = "gpu005"
PEER = "gpu001"
NETDEVS = {"rail0", "rail1", "rail2", "rail3"}
PREFIXES = [ipaddress.IPv4Network("10.200.0.0/16")]
NOW = 1_000.0  # wall s: what a refused ack is stamped with
TOPIC = f"linkguard/v1/plans/{HOST}"


def _core(*, signed_deletions_only: bool = False) -> AgentCore:
    return AgentCore(
        host=HOST, netdevs=NETDEVS, prefixes=PREFIXES, signed_deletions_only=signed_deletions_only
    )


def _full(epoch: int, term: int = 0) -> Plan:
    return solve(FABRIC, {}, epoch=epoch, now=1.0)[HOST].model_copy(update={"term": term})


def _event(previous: PortStatus, current: PortStatus, hca: str = "mlx5_1") -> PortEvent:
    return PortEvent(host=HOST, hca=hca, port=1, rail=1, previous=previous, current=current, at=5.0)


def _state(status: PortStatus, hca: str = "mlx5_1") -> PortState:
    return PortState(host=HOST, hca=hca, port=1, rail=1, status=status, observed_at=5.0)


def _ack(epoch: int, *, fast_path: bool = False) -> Ack:
    return Ack(
        host=HOST,
        epoch=epoch,
        result=AckResult.APPLIED,
        applied_at=NOW,
        apply_ms=0.4,
        fast_path=fast_path,
    )


# -- the fast path -----------------------------------------------------------------------


def test_port_down_takes_the_fast_path_before_anything_else() -> None:
    core = _core()
    ev, st = _event(PortStatus.UP, PortStatus.DOWN), _state(PortStatus.DOWN)
    effects = core.observe(MonitorOutput(states=[st], events=[ev], next_deadline=12.5))
    assert effects == [
        FastPath("mlx5_1/1"),
        PublishState(st),
        FlushNeighbours(background=True),
        PublishEvent(ev),
        ObserveEvents((ev,)),
        PersistHistory(),
        RailChange("port_event"),
        PersistHealth(),
        RenderNccl(),
        ScheduleTimer(12.5),
    ]
    # the fast path's ack goes out at once, with the rail change it makes for jobs
    ack = _ack(7, fast_path=True)
    assert core.fast_path_applied("mlx5_1/1", ack) == [
        SendAck(ack),
        RailChange("fast_path"),
        ObserveAck(ack),
    ]
    assert core.stats.fast_paths == 1
    # no plan (or no backup for the port): nothing was applied, nothing to tell
    assert core.fast_path_applied("mlx5_1/1", None) == []
    assert core.stats.fast_paths == 1


@pytest.mark.parametrize("previous", list(PortStatus))
def test_fast_path_only_from_a_usable_or_unknown_or_degraded_port(previous: PortStatus) -> None:
    effects = _core().observe(MonitorOutput(events=[_event(previous, PortStatus.DOWN)]))
    fast = [e for e in effects if isinstance(e, FastPath)]
    expected = previous in (PortStatus.UP, PortStatus.UNKNOWN, PortStatus.DEGRADED)
    assert fast == ([FastPath("mlx5_1/1")] if expected else [])
    assert (FlushNeighbours(background=True) in effects) == expected
    assert (previous in FAST_PATH_FROM) == expected


def test_degraded_is_no_emergency_and_up_is_only_marked() -> None:
    core = _core()
    degraded = _event(PortStatus.UP, PortStatus.DEGRADED)
    effects = core.observe(MonitorOutput(events=[degraded]))
    assert not [e for e in effects if isinstance(e, FastPath | MarkPortUp | FlushNeighbours)]
    up = _event(PortStatus.HELD_DOWN, PortStatus.UP)
    effects = core.observe(MonitorOutput(events=[up], next_deadline=None))
    assert effects[0] == MarkPortUp("mlx5_1/1")
    assert effects[-1] == ScheduleTimer(None)


def test_a_quiet_tick_persists_health_and_reschedules_only() -> None:
    assert _core().observe(MonitorOutput(next_deadline=3.0)) == [
        ObserveEvents(()),
        PersistHealth(),
        ScheduleTimer(3.0),
    ]


def test_states_and_fast_paths_come_before_what_may_wait() -> None:
    """The ordering rule: every fast path and every state publish of a batch precede the
    persistence, metrics, hooks (rail change) and NCCL rendering of that batch."""
    events = [
        _event(PortStatus.UP, PortStatus.DOWN, "mlx5_0"),
        _event(PortStatus.DEGRADED, PortStatus.DOWN, "mlx5_2"),
        _event(PortStatus.HELD_DOWN, PortStatus.UP, "mlx5_3"),
    ]
    states = [_state(PortStatus.DOWN, "mlx5_0"), _state(PortStatus.DOWN, "mlx5_2")]
    effects = _core().observe(MonitorOutput(states=states, events=events, next_deadline=1.0))
    urgent = [i for i, e in enumerate(effects) if isinstance(e, FastPath | PublishState)]
    later = [
        i
        for i, e in enumerate(effects)
        if isinstance(e, PersistHistory | PersistHealth | ObserveEvents | RailChange | RenderNccl)
    ]
    assert len(urgent) == 4 and len(later) == 5
    assert max(urgent) < min(later)
    assert [e for e in effects if isinstance(e, FastPath)] == [
        FastPath("mlx5_0/1"),
        FastPath("mlx5_2/1"),
    ]


# -- plan acceptance -----------------------------------------------------------------------


def test_plan_accepted_applies_persists_as_received_and_acks() -> None:
    core = _core()
    plan = _full(3)
    raw = encode(plan)
    assert core.on_plan(plan, raw=raw, topic=TOPIC, applied=None, now=NOW) == [
        ApplyPlan(plan, raw=raw)
    ]
    assert core.plan_received == plan
    ack = _ack(3)
    assert core.plan_applied(ack) == [
        SendAck(ack),
        ObserveAck(ack),
        RenderNccl(),
        RailChange("plan"),
        FlushNeighbours(),
    ]
    assert core.stats.plans_applied == 1 and not core.stats.plans_refused


def test_the_same_plan_again_changes_nothing_but_acks_again() -> None:
    """A plan applied already arrives again (the service re-sends it: it has no ack of it,
    linkguard.topology.convergence): nothing is applied, the last ack goes out again."""
    core = _core()
    plan = _full(3)
    core.on_plan(plan, raw=encode(plan), topic=TOPIC, applied=None, now=NOW)
    again = core.on_plan(plan, raw=encode(plan), topic=TOPIC, applied=plan, now=NOW)
    assert again == [ResendAck(3)]


def _refused_ack(epoch: int, reason: Refusal, detail: str) -> SendAck:
    return SendAck(
        Ack(
            host=HOST,
            epoch=epoch,
            result=AckResult.REFUSED,
            error=f"{reason.value}: {detail}",
            applied_at=NOW,
        )
    )


def test_wrong_host_is_refused_and_acked() -> None:
    core = _core()
    other = solve(FABRIC, {}, epoch=3, now=1.0)["gpu006"]
    effects = core.on_plan(other, raw=b"", topic=TOPIC, applied=None, now=NOW)
    assert effects == [_refused_ack(3, Refusal.WRONG_HOST, "plan for 'gpu006', this is 'gpu005'")]
    assert core.stats.plans_refused == {"wrong_host": 1}


def test_out_of_scope_is_refused_and_acked() -> None:
    core = AgentCore(host=HOST, netdevs=NETDEVS, prefixes=[ipaddress.IPv4Network("10.200.0.0/24")])
    plan = _full(3)
    (effect,) = core.on_plan(plan, raw=b"", topic=TOPIC, applied=None, now=NOW)
    assert isinstance(effect, SendAck) and effect.ack.result == AckResult.REFUSED
    assert effect.ack.error is not None and effect.ack.error.startswith("out_of_scope: prefix")
    assert core.stats.plans_refused == {"out_of_scope": 1}
    # a netdev this host does not have
    core = _core()
    foreign = plan.model_copy(
        update={
            "routes": [
                RouteAssignment(
                    destination=ipaddress.IPv4Address("10.200.1.9"),
                    peer="gpu009",
                    peer_gpu=1,
                    rail=1,
                    home_rail=1,
                    netdev="eth9",
                    gateway=ipaddress.IPv4Address("10.200.1.10"),
                )
            ]
        }
    )
    (effect,) = core.on_plan(foreign, raw=b"", topic=TOPIC, applied=None, now=NOW)
    assert effect == _refused_ack(
        3, Refusal.OUT_OF_SCOPE, "netdev 'eth9' is not one of this host's rails"
    )


def test_invalid_prefix_routes_are_refused_and_acked() -> None:
    core = _core()
    plan = _full(3)
    twice = plan.model_copy(update={"prefix_routes": plan.prefix_routes[:1] * 2})
    (effect,) = core.on_plan(twice, raw=b"", topic=TOPIC, applied=None, now=NOW)
    prefix = plan.prefix_routes[0].prefix
    assert effect == _refused_ack(3, Refusal.INVALID, f"plan: prefix {prefix} listed twice")
    assert core.stats.plans_refused == {"invalid": 1}


def test_stale_epoch_is_counted_never_acked() -> None:
    core = _core()
    applied = _full(5)
    # older than the applied plan (nothing in hand: a restart without a saved plan)
    assert core.on_plan(_full(4), raw=b"", topic=TOPIC, applied=applied, now=NOW) == []
    assert core.stats.plans_refused == {"stale_epoch": 1}
    # older than the plan in hand
    core.on_plan(_full(6), raw=b"", topic=TOPIC, applied=applied, now=NOW)
    assert core.on_plan(_full(5), raw=b"", topic=TOPIC, applied=applied, now=NOW) == []
    assert core.stats.plans_refused == {"stale_epoch": 2}


def test_deposed_leader_is_counted_never_acked_and_terms_are_persisted() -> None:
    core = _core()
    plan = _full(100, term=5)
    assert core.on_plan(plan, raw=b"x", topic=TOPIC, applied=None, now=NOW) == [
        PersistTerm(5),
        ApplyPlan(plan, raw=b"x"),
    ]
    assert core.term == 5
    assert core.on_plan(_full(500, term=4), raw=b"", topic=TOPIC, applied=plan, now=NOW) == []
    assert core.stats.plans_refused == {"deposed_leader": 1}
    # a new leader's epochs may be lower
    newer = _full(50, term=6)
    assert core.on_plan(newer, raw=b"y", topic=TOPIC, applied=plan, now=NOW) == [
        PersistTerm(6),
        ApplyPlan(newer, raw=b"y"),
    ]
    # a restart: the term file and the restored messages' terms count
    again = _core()
    again.restore(received=newer, peers={})
    again.restore_term(3)
    assert again.term == 6


def test_every_refusal_reason_is_typed() -> None:
    assert {r.value for r in Refusal} == {
        "wrong_host",
        "deposed_leader",
        "stale_epoch",
        "out_of_scope",
        "invalid",
    }
    assert {r for r in Refusal if not r.acked} == {Refusal.STALE_EPOCH, Refusal.DEPOSED_LEADER}


def test_a_cleared_plan_is_said_once_until_a_plan_arrives() -> None:
    from structlog.testing import capture_logs

    core = _core()
    with capture_logs() as logs:
        assert core.plan_cleared(applied_epoch=3) == []
        core.plan_cleared(applied_epoch=3)
        core.plan_seen()
        core.plan_cleared(applied_epoch=3)
    assert [e["event"] for e in logs] == ["plan_cleared", "plan_cleared"]


# -- compact plans and peer routes ---------------------------------------------------------


def test_compact_plan_is_applied_expanded_with_the_peer_routes() -> None:
    solver = Solver(FABRIC)
    solver.update({PEER: {2}})  # the peer lost rail 2: whole hosts need a /32 for its GPU 2
    core = _core()
    compact = solver.compact_plan(HOST, epoch=3, now=1.0)
    raw = encode(compact)
    # no peer routes yet: the plan without the /32 exceptions
    effects = core.on_plan(compact, raw=raw, topic=TOPIC, applied=None, now=NOW)
    bare = expand_plan(compact, {})
    assert effects == [ApplyPlan(bare, same_epoch=True), PersistPlan(raw)]
    # the peer's routes: the expansion changes, applied again (same epoch), kept, persisted
    pr = solver.peer_routes(PEER, epoch=3, now=1.0)
    pr_raw = encode(pr)
    topic = f"linkguard/v1/peers/{PEER}"
    effects = core.on_peer_routes(PEER, pr, raw=pr_raw, topic=topic, applied=bare, now=NOW)
    full = solver.plan(HOST, epoch=3, now=1.0)
    (apply, persist) = effects
    assert isinstance(apply, ApplyPlan) and apply.same_epoch and not apply.persist_json
    assert apply.raw is None and apply.plan.same_assignments(full)
    assert persist == PersistPeerRoutes(PEER, pr_raw)
    assert core.peers == {PEER: pr}
    # the same peer routes again: a redelivery, nothing to do
    assert core.on_peer_routes(PEER, pr, raw=pr_raw, topic=topic, applied=full, now=NOW) == []
    # an unsigned deletion empties them (and re-applies) unless signatures are required
    effects = core.on_peer_routes(PEER, None, raw=b"", topic=topic, applied=full, now=NOW)
    emptied = pr.model_copy(update={"classes": [], "modulus": 1})
    assert effects[0] == PersistPeerRoutes(PEER, encode(emptied))
    assert isinstance(effects[1], ApplyPlan) and effects[1].plan.same_assignments(bare)
    strict = _core(signed_deletions_only=True)
    strict.restore(received=compact, peers={PEER: pr})
    assert strict.on_peer_routes(PEER, None, raw=b"", topic=topic, applied=full, now=NOW) == []
    assert strict.peers == {PEER: pr}


def test_peer_routes_outside_the_prefixes_are_dropped() -> None:
    solver = Solver(FABRIC)
    solver.update({PEER: {2}})
    core = AgentCore(host=HOST, netdevs=NETDEVS, prefixes=[ipaddress.IPv4Network("10.200.0.0/24")])
    pr = solver.peer_routes(PEER, epoch=3, now=1.0)
    topic = f"linkguard/v1/peers/{PEER}"
    assert core.on_peer_routes(PEER, pr, raw=b"{}", topic=topic, applied=None, now=NOW) == []
    assert core.stats.messages_dropped == {"out_of_scope": 1} and core.peers == {}


def test_a_compact_plan_that_cannot_expand_is_refused_invalid_and_keeps_the_peers() -> None:
    solver = Solver(FABRIC)
    solver.update({PEER: {2}})
    core = _core()
    compact = solver.compact_plan(HOST, epoch=3, now=1.0)
    core.on_plan(compact, raw=b"", topic=TOPIC, applied=None, now=NOW)
    pr = solver.peer_routes(PEER, epoch=3, now=1.0)
    # well-formed but unusable: a GPU the peer does not have
    classes = [c.model_copy(update={"routes": [7, 1] if c.routes else []}) for c in pr.classes]
    bad = pr.model_copy(update={"classes": classes})
    topic = f"linkguard/v1/peers/{PEER}"
    effects = core.on_peer_routes(PEER, bad, raw=b"", topic=topic, applied=None, now=NOW)
    (effect,) = effects
    assert isinstance(effect, SendAck) and effect.ack.result == AckResult.REFUSED
    assert effect.ack.error is not None and effect.ack.error.startswith("invalid: ")
    assert core.stats.plans_refused == {"invalid": 1} and core.peers == {}


# -- presence ------------------------------------------------------------------------------


def test_a_duplicate_that_started_first_makes_this_agent_yield() -> None:
    core = _core()
    me = Me(instance="aaaa", started_at=100.0)
    first = HostStatus(host=HOST, online=True, instance="bbbb", started_at=50.0)
    later = HostStatus(host=HOST, online=True, instance="cccc", started_at=150.0)
    gone = HostStatus(host=HOST, online=False, reason="stopped", instance="cccc")
    mine = HostStatus(host=HOST, online=True, instance="aaaa", started_at=100.0)
    assert core.on_status(first, me=me, retained=False) == [Yield(first)]
    assert core.on_status(later, me=me, retained=False) == [Reannounce()]
    assert core.on_status(gone, me=me, retained=False) == [Reannounce()]
    assert core.on_status(mine, me=me, retained=False) == []
    assert core.on_status(first, me=me, retained=True) == []  # an old retained copy


# -- purity --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "module", ["core", "effects", "plans", "monitor", "usability", "readmission", "portrecord"]
)
def test_the_core_imports_no_bus_asyncio_clock_or_disk(module: str) -> None:
    path = Path(core_module.__file__).with_name(f"{module}.py")
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    forbidden = {"asyncio", "time", "datetime", "os", "pathlib", "shutil", "socket"}
    forbidden |= {"linkguard.bus", "linkguard.broker", "linkguard.agent.applier"}
    assert not {m for m in imported if m in forbidden or m.split(".")[0] in forbidden}
