"""When the agent learns it is behind (linkguard.agent.behind, through AgentCore), pure: a
newer version seen elsewhere, still unexplained after the grace, makes one plan request with
the epoch of the plan in hand; a plan that comes in time, an older version, a compact plan
taking newer peer routes in: none. The bus side is tests/test_plan_behind_bus.py."""

from __future__ import annotations

from linkguard.agent.behind import GRACE_S, MIN_INTERVAL_S, BehindWatch
from linkguard.agent.core import AgentCore
from linkguard.agent.effects import CheckBehind, RequestPlan
from linkguard.models import ServiceStatus, encode
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.solver import Solver

FABRIC = generate_rail_optimized(hosts=4, rails=2)
HOST, PEER = FABRIC.host_names[0], FABRIC.host_names[1]


def _core() -> AgentCore:
    netdevs = {h.netdev for h in FABRIC.host(HOST).hcas if h.netdev}
    return AgentCore(host=HOST, netdevs=netdevs, prefixes=list(FABRIC.endpoint_subnets.values()))


def _requests(effects: list) -> list[tuple[int | None, str]]:
    return [(e.epoch, e.reason) for e in effects if isinstance(e, RequestPlan)]


def test_newer_peer_routes_with_a_full_plan_in_hand_ask_after_the_grace_once() -> None:
    core = _core()
    impaired = Solver(FABRIC, {HOST: [0], PEER: [1]})
    full = impaired.compact_plan(HOST, epoch=10, now=1.0)
    assert full.shared is None  # impaired: a full plan
    core.on_plan(full, raw=encode(full), topic="p", applied=None, now=1.0)
    pr = impaired.peer_routes(PEER, epoch=12, now=1.0)
    effects = core.on_peer_routes(PEER, pr, raw=encode(pr), topic="peers", applied=full, now=1.0)
    assert CheckBehind() in effects
    assert core.due(100.0) == ([], 100.0 + GRACE_S)  # the plan may be a moment behind
    effects, due = core.due(100.0 + GRACE_S)
    assert _requests(effects) == [(10, "behind")] and due is None
    assert core.due(200.0) == ([], None)  # one request per evidence
    assert core.behind.asked == 1


def test_a_plan_that_comes_within_the_grace_asks_nothing() -> None:
    core = _core()
    impaired = Solver(FABRIC, {HOST: [0], PEER: [1]})
    full = impaired.compact_plan(HOST, epoch=10, now=1.0)
    core.on_plan(full, raw=encode(full), topic="p", applied=None, now=1.0)
    pr = impaired.peer_routes(PEER, epoch=12, now=1.0)
    core.on_peer_routes(PEER, pr, raw=encode(pr), topic="peers", applied=full, now=1.0)
    core.due(100.0)
    newer = impaired.compact_plan(HOST, epoch=12, now=2.0)
    core.on_plan(newer, raw=encode(newer), topic="p", applied=full, now=2.0)
    assert core.due(100.0 + GRACE_S) == ([], None) and core.behind.asked == 0


def test_a_compact_plan_takes_newer_peer_routes_in_but_its_own_ones_reveal_a_lost_plan() -> None:
    core = _core()
    whole = Solver(FABRIC, {PEER: [1]})
    compact = whole.compact_plan(HOST, epoch=10, now=1.0)
    assert compact.shared is not None
    core.on_plan(compact, raw=encode(compact), topic="p", applied=None, now=1.0)
    pr = whole.peer_routes(PEER, epoch=12, now=1.0)
    effects = core.on_peer_routes(PEER, pr, raw=encode(pr), topic="peers", applied=None, now=1.0)
    assert CheckBehind() not in effects
    assert core.due(50.0) == ([], None)
    # this host impaired: its own peer routes, while the full plan it gets is lost
    mine = Solver(FABRIC, {PEER: [1], HOST: [0]}).peer_routes(HOST, epoch=13, now=1.0)
    assert mine.classes
    effects = core.on_peer_routes(HOST, mine, raw=encode(mine), topic="pe", applied=None, now=1.0)
    assert CheckBehind() in effects
    core.due(60.0)
    effects, _ = core.due(60.0 + GRACE_S)
    assert _requests(effects) == [(10, "behind")]  # the compact plan's epoch, not 13


def test_a_new_leaders_term_reveals_a_lost_plan() -> None:
    core = _core()
    plan = Solver(FABRIC, {}).compact_plan(HOST, epoch=10, now=1.0)
    core.on_plan(plan, raw=encode(plan), topic="p", applied=None, now=1.0)
    old = ServiceStatus(online=True, instance="aa", started_at=1.0, role="leader", term=0)
    assert CheckBehind() not in core.on_service_status(old, retained=True)
    new = ServiceStatus(online=True, instance="bb", started_at=2.0, role="leader", term=3)
    assert CheckBehind() in core.on_service_status(new, retained=False)
    core.due(10.0)
    effects, _ = core.due(10.0 + GRACE_S)
    assert _requests(effects) == [(10, "behind")]


def test_requests_are_rate_limited() -> None:
    w = BehindWatch()
    assert w.note(0, 5, "peer_routes", held=None)
    w.due(0.0, held=None)
    assert w.due(GRACE_S, held=None) == (None, None, True)
    assert w.note(0, 6, "peer_routes", held=None)
    _, at, ask = w.due(GRACE_S + 0.1, held=None)
    assert not ask and at == GRACE_S + MIN_INTERVAL_S  # the grace ends sooner: the limit
    assert w.due(GRACE_S + MIN_INTERVAL_S, held=None)[2]
    assert not w.note(0, 0, "peer_routes", held=None)  # nothing newer than (0, 0)
