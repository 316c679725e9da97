"""The pure solver on generated rail-optimized fabrics (the DGX SU size and the 3x2 lab), in both
plan forms: compact (generated fabrics have endpoint subnets: one prefix route per rail plus /32
exceptions) and explicit (the same fabric without endpoint subnets: every peer endpoint a /32).

Where a plan sends a destination is read with :func:`egress` (longest prefix), so the assertions
hold whichever form carries the route."""

from __future__ import annotations

import ipaddress
import math
from collections import Counter
from collections.abc import Iterator

import pytest

from linkguard.models import Backup, HostInventory, Plan, decode, encode
from linkguard.topology import planlookup
from linkguard.topology import solver as solver_module
from linkguard.topology.fabric import Fabric, generate_rail_optimized, home_rails
from linkguard.topology.hostbase import multipath_rails
from linkguard.topology.solver import Solver, egress, load_report, nic_load, solve

IP = ipaddress.IPv4Address
A = "gpu005"  # the host that loses rails in most tests
NORMAL = 31  # endpoints per rail per host with 32 hosts x 8 GPUs: 31 peers x 1 endpoint
BOUND = math.ceil(NORMAL * 8 / 7)  # 36
# rail 3's survivors in the order routes are dealt to them: NUMA node 0 (mlx5_3's) first
SURVIVORS_3 = (0, 1, 2, 4, 5, 6, 7)


def _dealt(
    survivors: tuple[int, ...],
    pos_other: int,
    pos_failed: int,
    n: int = 32,
    k: int = 1,
    j: int = 0,
    *,
    viewer_failed: bool = False,
) -> int:
    """The survivor the module docstring's rule deals a route to: ``S[(offset * k + j) %
    len(S)]``, ``offset`` = circular distance from the host that lost the rail (``pos_failed``)
    to the other one, among ``n`` hosts; less ``n`` when the host that lost it is the one
    routing (``viewer_failed``: the same spread, rotated)."""
    offset = (pos_other - pos_failed - 1) % n - (n if viewer_failed else 0)
    return survivors[(offset * k + j) % len(survivors)]


def explicit(fabric: Fabric) -> Fabric:
    """The same fabric without endpoint subnets (re-validated): plans in the explicit form."""
    return Fabric.model_validate({**fabric.model_dump(), "endpoint_subnets": {}})


@pytest.fixture(scope="module")
def su() -> Fabric:
    return generate_rail_optimized()


@pytest.fixture(scope="module")
def su_explicit(su: Fabric) -> Fabric:
    return explicit(su)


@pytest.fixture(scope="module", params=["prefix", "explicit"])
def any_form(request, su: Fabric, su_explicit: Fabric) -> Fabric:
    return su if request.param == "prefix" else su_explicit


@pytest.fixture(scope="module")
def all_up(su: Fabric) -> dict[str, Plan]:
    return solve(su, {}, epoch=1, now=1000.0)


@pytest.fixture(scope="module")
def a_lost_3(su: Fabric) -> dict[str, Plan]:
    return solve(su, {A: frozenset({3})}, epoch=2, now=1001.0)


def _peer_endpoints(f: Fabric, host: str) -> Iterator[tuple[HostInventory, int, IP]]:
    """(peer, GPU, endpoint) of every host but ``host``."""
    for p in f.hosts:
        if p.host != host:
            for g, ep in enumerate(p.endpoints):
                yield p, g, ep


def _load(f: Fabric, plans: dict[str, Plan], host: str) -> dict[int, float]:
    """Peer endpoints ``host`` sends out of each local rail (multipath: 1/n per rail)."""
    per_rail = Counter(r for p in f.hosts if p.host != host for r in home_rails(p))
    return nic_load(plans[host], per_rail)


def _incoming(f: Fabric, plans: dict[str, Plan], host: str) -> dict[int, float]:
    """Per rail of ``host``: the (peer, endpoint of ``host``) pairs that arrive on it (traffic
    stays on one rail, so the peer's egress rail is the rail it arrives on)."""
    load: Counter[int] = Counter()
    for p in f.hosts:
        if p.host != host:
            for ep in f.host(host).endpoints:
                rails = egress(plans[p.host], ep)
                for r in rails:
                    load[r] += 1 / len(rails)
    return dict(sorted(load.items()))


def _usable(f: Fabric, unusable: dict[str, frozenset[int]], host: str) -> frozenset[int]:
    return frozenset(c.rail for c in f.host(host).hcas) - unusable.get(host, frozenset())


def _assert_safe_and_complete(f: Fabric, unusable: dict[str, frozenset[int]], plan: Plan) -> None:
    """Every peer endpoint goes out only over rails usable at both ends, and is routed exactly
    when such a rail exists (the solver's reachability model: traffic stays on one rail)."""
    mine = _usable(f, unusable, plan.host)
    for p, g, ep in _peer_endpoints(f, plan.host):
        both = mine & _usable(f, unusable, p.host)
        out = egress(plan, ep)
        assert set(out) <= both and bool(out) == bool(both), (plan.host, p.host, g, out, both)


def _overlay(plan: Plan, b: Backup) -> Plan:
    """``plan`` as the agent runs it once ``b``'s port is down: the backup's prefix routes
    replace the plan's for the same prefix, its /32 routes replace the plan's for the same
    destination, and withdrawn destinations become unreachable."""
    prefix = {p.prefix: p for p in plan.prefix_routes} | {p.prefix: p for p in b.prefix_routes}
    routes = {r.destination: r for r in plan.routes} | {r.destination: r for r in b.routes}
    for d in b.withdraw:
        routes.pop(d, None)
    return Plan(
        host=plan.host,
        epoch=plan.epoch,
        issued_at=plan.issued_at,
        prefix_routes=list(prefix.values()),
        routes=list(routes.values()),
        unreachable=sorted({*plan.unreachable, *b.withdraw} - set(routes)),
    )


def test_all_up_routes_every_endpoint_on_its_home_rail(su: Fabric, all_up) -> None:
    assert set(all_up) == set(su.host_names)
    for name, plan in all_up.items():
        assert (plan.host, plan.epoch, plan.issued_at) == (name, 1, 1000.0)
        # compact: one on-link prefix route per rail's endpoint subnet, no /32 at all
        assert plan.routes == [] and plan.unreachable == []
        assert [(str(p.prefix), p.home_rail, p.rails, p.netdevs) for p in plan.prefix_routes] == [
            (f"10.200.{r}.0/24", r, [r], [f"rail{r}"]) for r in range(8)
        ]
        for _, g, ep in _peer_endpoints(su, name):
            assert egress(plan, ep) == (g,)
        assert [(a.gpu, a.hca, a.rail) for a in plan.rail_assignments] == [
            (g, f"mlx5_{g}", g) for g in range(8)
        ]
        assert [b.hca for b in plan.backups] == [f"mlx5_{r}" for r in range(8)]
    assert _load(su, all_up, A) == dict.fromkeys(range(8), NORMAL)
    assert _incoming(su, all_up, A) == dict.fromkeys(range(8), NORMAL)


def test_all_up_explicit_form_routes_every_endpoint_as_a_32(su_explicit: Fabric) -> None:
    plans = solve(su_explicit, {}, epoch=1, now=1000.0)
    for name, plan in plans.items():
        assert plan.prefix_routes == [] and plan.unreachable == []
        assert len(plan.routes) == 31 * 8
        for r in plan.routes:
            peer = su_explicit.host(r.peer)
            assert r.rail == r.home_rail == r.peer_gpu
            assert r.destination == peer.endpoints[r.peer_gpu]
            assert r.gateway == peer.hcas[r.rail].address
            assert r.netdev == f"rail{r.rail}"
        assert [egress(plan, ep) for _, _, ep in _peer_endpoints(su_explicit, name)] == [
            (g,) for _, g, _ in _peer_endpoints(su_explicit, name)
        ]
    assert load_report(plans)[A] == dict.fromkeys(range(8), NORMAL)
    assert _load(su_explicit, plans, A) == dict.fromkeys(range(8), NORMAL)


def test_lost_rail_spreads_over_survivors(su: Fabric, all_up, a_lost_3) -> None:
    a = su.host(A)
    ep3 = a.endpoints[3]
    # Every peer gets one /32 exception for A's GPU-3 endpoint, off rail 3 and via A's address
    # on the new rail; its prefix routes do not change.
    for p in su.hosts:
        if p.host == A:
            continue
        (r,) = a_lost_3[p.host].routes
        assert (r.destination, r.peer, r.peer_gpu, r.home_rail) == (ep3, A, 3, 3)
        assert r.gateway == a.hcas[r.rail].address and r.netdev == f"rail{r.rail}"
        assert a_lost_3[p.host].prefix_routes == all_up[p.host].prefix_routes
    # ... dealt round-robin over the 7 survivors by position: at most ceil(31 / 7) = 5 each
    pos = {h: i for i, h in enumerate(su.host_names)}
    for p in su.host_names:
        if p != A:
            assert egress(a_lost_3[p], ep3) == (_dealt(SURVIVORS_3, pos[p], pos[A]),)
    towards = Counter(egress(a_lost_3[p], ep3)[0] for p in su.host_names if p != A)
    assert set(towards) == set(SURVIVORS_3) and sum(towards.values()) == 31
    assert max(towards.values()) == math.ceil(31 / 7)
    # A itself needs no /32: its rail-3 prefix route goes multipath over its 7 usable rails,
    # which every peer can use.
    assert a_lost_3[A].routes == [] and a_lost_3[A].unreachable == []
    moved = [p for p in a_lost_3[A].prefix_routes if p.home_rail == 3]
    assert [(str(p.prefix), p.rails, p.netdevs) for p in moved] == [
        ("10.200.3.0/24", [0, 1, 2, 4, 5, 6, 7], [f"rail{r}" for r in (0, 1, 2, 4, 5, 6, 7)])
    ]
    assert [p for p in a_lost_3[A].prefix_routes if p.home_rail != 3] == [
        p for p in all_up[A].prefix_routes if p.home_rail != 3
    ]
    for _, g, ep in _peer_endpoints(su, A):
        assert egress(a_lost_3[A], ep) == ((0, 1, 2, 4, 5, 6, 7) if g == 3 else (g,))
    # Loads: A's survivors carry 31 + 31/7 each; 31 + up to 5 peers arrive on each of them.
    assert _load(su, a_lost_3, A) == pytest.approx({r: 31 + 31 / 7 for r in SURVIVORS_3})
    incoming = _incoming(su, a_lost_3, A)
    assert incoming == {r: 31 + towards[r] for r in SURVIVORS_3}
    assert max(incoming.values()) == BOUND and sum(incoming.values()) == 31 * 8
    # Every host's busiest NIC stays within 8/7 of normal (peers: one extra endpoint at most).
    assert max(max(_load(su, a_lost_3, h).values()) for h in su.host_names) <= BOUND
    for h in su.host_names:
        _assert_safe_and_complete(su, {A: frozenset({3})}, a_lost_3[h])
    # A's GPU 3 moves to the least-used HCA on its NUMA node (0): mlx5_0.
    ra = {a.gpu: a for a in a_lost_3[A].rail_assignments}
    assert (ra[3].hca, ra[3].rail, ra[3].home_rail) == ("mlx5_0", 0, 3)
    assert [ra[g] for g in range(8) if g != 3] == [
        a for a in all_up[A].rail_assignments if a.gpu != 3
    ]
    assert [b.rail for b in a_lost_3[A].backups] == [0, 1, 2, 4, 5, 6, 7]


def test_lost_rail_explicit_form(su_explicit: Fabric) -> None:
    f = su_explicit
    plans = solve(f, {A: frozenset({3})}, epoch=2, now=0.0)
    ep3 = f.host(A).endpoints[3]
    pos = {h: i for i, h in enumerate(f.host_names)}
    # the same rule as the prefix form's exceptions
    towards: Counter[int] = Counter()
    for p in f.host_names:
        if p != A:
            r = next(r for r in plans[p].routes if r.destination == ep3)
            assert r.rail == _dealt(SURVIVORS_3, pos[p], pos[A])
            assert r.gateway == f.host(A).hcas[r.rail].address
            towards[r.rail] += 1
    # A's own 31 routes to the peers' rail-3 endpoints are dealt by the same rule (the prefix
    # form needs none of them: its multipath prefix route carries them)
    own = [r for r in plans[A].routes if r.home_rail == 3]
    assert len(own) == 31
    assert [r.rail for r in own] == [
        _dealt(SURVIVORS_3, pos[r.peer], pos[A], viewer_failed=True) for r in own
    ]
    assert all(r.gateway == f.host(r.peer).hcas[r.rail].address for r in own)
    spread = Counter(r.rail for r in own)
    assert max(spread.values()) == max(towards.values()) == math.ceil(31 / 7)
    assert load_report(plans)[A] == {r: 31 + spread[r] for r in SURVIVORS_3}
    assert _incoming(f, plans, A) == {r: 31 + towards[r] for r in SURVIVORS_3}
    assert max(load_report(plans)[A].values()) == BOUND
    assert max(max(v.values()) for v in load_report(plans).values()) <= BOUND
    for h in f.host_names:
        _assert_safe_and_complete(f, {A: frozenset({3})}, plans[h])


def test_other_hosts_otherwise_unchanged(any_form: Fabric) -> None:
    before = solve(any_form, {}, epoch=1, now=0.0)
    after = solve(any_form, {A: frozenset({3})}, epoch=1, now=0.0)
    ep3 = any_form.host(A).endpoints[3]
    for p in any_form.host_names:
        if p == A:
            continue
        assert after[p].rail_assignments == before[p].rail_assignments
        assert after[p].prefix_routes == before[p].prefix_routes
        assert after[p].unreachable == before[p].unreachable == []
        assert [r for r in before[p].routes if r.destination != ep3] == [
            r for r in after[p].routes if r.destination != ep3
        ]
        assert egress(after[p], ep3) != egress(before[p], ep3) == (3,)


@pytest.mark.parametrize(
    ("hosts", "gpus", "victim", "normal"),
    [(8, 16, "gpu002", 14), (8, 8, "gpu003", 7)],
    ids=["8x16-gpu002", "8x8-gpu003"],
)
def test_many_gpus_per_rail_spread_exactly(hosts, gpus, victim, normal) -> None:
    # (hosts - 1) * gpus / 8 endpoints per rail (14, 7); the victim loses rail 3 and 2 (1) per
    # peer move off it: 14 (7) over 7 survivors, exactly 2 (1) each, so every surviving NIC
    # carries normal * 8/7 = 16 (8) from every viewpoint. FAILS with the current index rule
    # (module docstring): the peers' indices towards the victim skip the ones the victim's own
    # position would take, so some survivors get a route less and others one more: 17 (9)
    # peer endpoints arrive on a NIC of the victim, above ceil(8/7) of normal.
    f = generate_rail_optimized(hosts=hosts, rails=8, gpus_per_host=gpus)
    plans = solve(f, {victim: frozenset({3})}, epoch=1, now=0.0)
    even = {r: normal * 8 // 7 for r in range(8) if r != 3}
    assert plans[victim].routes == []  # its own moved endpoints: the multipath prefix route
    assert _load(f, plans, victim) == pytest.approx(even)
    assert _incoming(f, plans, victim) == pytest.approx(even)


def test_both_ends_lost_different_rails(any_form: Fabric) -> None:
    f, b = any_form, "gpu020"
    unusable = {A: frozenset({3}), b: frozenset({5})}
    plans = solve(f, unusable, epoch=3, now=0.0)
    for src, dst in ((A, b), (b, A)):
        for g in (3, 5):
            out = egress(plans[src], f.host(dst).endpoints[g])
            assert out and not set(out) & {3, 5}
    assert egress(plans["gpu000"], f.host(A).endpoints[3]) == (_dealt(SURVIVORS_3, 0, 5),)
    if f.endpoint_subnets:
        # exceptions only where a prefix route cannot deliver: the other impaired host's
        # endpoints on its own lost rail and on ours (2 each), and A's GPU 3 + b's GPU 5 at
        # every other host
        want = {A: {(b, 3), (b, 5)}, b: {(A, 3), (A, 5)}}
        for h in f.host_names:
            got = {(r.peer, r.peer_gpu) for r in plans[h].routes}
            assert got == want.get(h, {(A, 3), (b, 5)}), h
    else:
        assert all(len(plans[h].routes) == 31 * 8 for h in f.host_names)
    for h in f.host_names:
        _assert_safe_and_complete(f, unusable, plans[h])
        assert plans[h].unreachable == []
    load = {h: _load(f, plans, h) for h in f.host_names}
    assert 3 not in load[A] and 5 not in load[b]
    assert sum(load[A].values()) == pytest.approx(31 * 8) == sum(load[b].values())
    # Two independent failures are spread independently (per-peer rule, no global balancing):
    # the busiest NIC is within one endpoint of the ideal ceil(248 / 7) = 36.
    assert max(max(v.values()) for v in load.values()) <= BOUND + 1


def test_all_rails_lost_is_unreachable(any_form: Fabric) -> None:
    f = any_form
    plans = solve(f, {A: frozenset(range(8))}, epoch=4, now=0.0)
    a = plans[A]
    assert a.routes == [] and a.rail_assignments == [] and a.backups == []
    if f.endpoint_subnets:  # every prefix route is `unreachable`: nothing to list one by one
        assert [(p.rails, p.netdevs) for p in a.prefix_routes] == [([], [])] * 8
        assert a.unreachable == []
    else:
        assert a.prefix_routes == [] and len(a.unreachable) == 31 * 8
    assert all(egress(a, ep) == () for _, _, ep in _peer_endpoints(f, A))
    mine = set(f.host(A).endpoints)
    for p in f.host_names:
        if p != A:
            assert set(plans[p].unreachable) == mine  # /32 unreachable inside the prefix routes
            assert not mine & {r.destination for r in plans[p].routes}
            assert all(egress(plans[p], ep) == () for ep in mine)
            _assert_safe_and_complete(f, {A: frozenset(range(8))}, plans[p])


SCENARIOS = pytest.mark.parametrize(
    "unusable",
    [{}, {A: frozenset({3})}, {A: frozenset({3}), "gpu020": frozenset({5})}],
    ids=["all-up", "A-lost-3", "two-hosts"],
)


@SCENARIOS
@pytest.mark.parametrize("host", [A, "gpu020", "gpu031"])
def test_backups_route_only_over_usable_rails_and_keep_valid_exceptions(
    su: Fabric, unusable, host
) -> None:
    plan = solve(su, unusable, epoch=5, now=0.0, hosts=[host])[host]
    assigned = {a.gpu: a for a in plan.rail_assignments}
    down = unusable.get(host, frozenset())
    assert [b.rail for b in plan.backups] == [r for r in range(8) if r not in down]
    for b in plan.backups:
        assert (b.hca, b.port) == (f"mlx5_{b.rail}", 1)
        worse = {**unusable, host: down | {b.rail}}
        real = solve(su, worse, epoch=6, now=0.0, hosts=[host])[host]
        eff = _overlay(plan, b)
        _assert_safe_and_complete(su, worse, eff)
        for _, _, ep in _peer_endpoints(su, host):
            now, fresh = egress(eff, ep), egress(real, ep)
            assert bool(now) == bool(fresh), ep  # reachable exactly when a fresh solve says so
            # either what a fresh solve does, or an exception of the plan that stays valid
            assert now in (fresh, egress(plan, ep)), ep
        # prefix routes and rail assignments depend on this host alone: exactly a fresh solve's
        assert b.prefix_routes == [p for p in real.prefix_routes if p not in plan.prefix_routes]
        assert b.prefix_routes and all(b.rail not in p.rails for p in b.prefix_routes)
        assert b.rail_assignments == [a for a in real.rail_assignments if assigned[a.gpu] != a]
        assert all(r.rail != b.rail and r not in plan.routes for r in b.routes)
        if not unusable:  # nobody impaired: the rail's prefix route goes multipath, no /32
            assert (len(b.prefix_routes), b.routes, b.withdraw) == (1, [], [])


@SCENARIOS
@pytest.mark.parametrize("host", [A, "gpu031"])
def test_explicit_backups_reroute_only_the_lost_rails_routes(
    su_explicit: Fabric, unusable, host
) -> None:
    plan = solve(su_explicit, unusable, epoch=5, now=0.0, hosts=[host])[host]
    assigned = {a.gpu: a for a in plan.rail_assignments}
    down = unusable.get(host, frozenset())
    assert [b.rail for b in plan.backups] == [r for r in range(8) if r not in down]
    for b in plan.backups:
        worse = {**unusable, host: down | {b.rail}}
        real = solve(su_explicit, worse, epoch=6, now=0.0, hosts=[host])[host]
        fresh = {r.destination: r for r in real.routes}
        # every /32 is an exception here: those on other rails stay valid and are kept, those
        # on the lost rail take what a fresh solve gives them, or are withdrawn
        moved = [r.destination for r in plan.routes if r.rail == b.rail]
        assert b.prefix_routes == []
        assert b.routes == [fresh[d] for d in moved if d in fresh]
        assert b.withdraw == [d for d in moved if d not in fresh]
        assert set(b.withdraw) <= set(real.unreachable)
        assert b.rail_assignments == [a for a in real.rail_assignments if assigned[a.gpu] != a]
        assert b.routes and all(r.rail != b.rail for r in b.routes)
        _assert_safe_and_complete(su_explicit, worse, _overlay(plan, b))


def test_backup_when_last_rail_goes_withdraws_everything(any_form: Fabric) -> None:
    f = any_form
    plan = solve(f, {A: frozenset(range(7))}, epoch=1, now=0.0, hosts=[A])[A]
    assert all(egress(plan, ep) == (7,) for _, _, ep in _peer_endpoints(f, A))
    (b,) = plan.backups
    assert b.rail == 7 and b.routes == []
    if f.endpoint_subnets:
        # no /32 anywhere: every prefix route goes out of rail 7, and the backup makes all 8
        # of them `unreachable`
        assert plan.routes == [] and {tuple(p.rails) for p in plan.prefix_routes} == {(7,)}
        assert [p.rails for p in b.prefix_routes] == [[]] * 8 and b.withdraw == []
    else:
        assert {r.rail for r in plan.routes} == {7} and len(b.withdraw) == 31 * 8
    eff = _overlay(plan, b)
    assert all(egress(eff, ep) == () for _, _, ep in _peer_endpoints(f, A))


def test_deterministic_and_valid_on_the_wire(su: Fabric, a_lost_3) -> None:
    again = solve(su, {A: frozenset({3})}, epoch=2, now=1001.0)
    assert again == a_lost_3
    assert all(encode(again[h]) == encode(a_lost_3[h]) for h in su.host_names)
    subset = solve(su, {A: frozenset({3})}, epoch=2, now=1001.0, hosts=["gpu009", A])
    assert list(subset) == ["gpu009", A]
    assert subset[A] == a_lost_3[A] and subset["gpu009"] == a_lost_3["gpu009"]
    wire = decode(Plan, encode(a_lost_3[A]), expect_host=A)  # full validation of the plan
    assert wire.same_assignments(a_lost_3[A])
    with pytest.raises(KeyError, match="no host 'nope'"):
        solve(su, {}, epoch=1, now=0.0, hosts=["nope"])


def test_incremental_updates_match_full_builds(su: Fabric, all_up, a_lost_3) -> None:
    s = Solver(su)
    assert s.plans(epoch=1, now=1000.0) == all_up
    # A's rail-3 prefix route goes multipath, every peer gains the /32 for A's GPU 3
    assert s.update({A: {3}}) == su.host_names
    assert s.plans(epoch=2, now=1001.0) == a_lost_3
    assert s.update({A: {3}, "nope": {1}}) == []  # nothing changed: nobody is re-planned
    assert s.update({"gpu020": {5}}) == su.host_names
    two = {A: frozenset({3}), "gpu020": frozenset({5})}
    assert s.plans(epoch=3, now=0.0) == solve(su, two, epoch=3, now=0.0)
    assert s.unusable_of("gpu020") == {5}
    # ports back: every plan returns to exactly what it was, in one step
    assert s.update({A: set(), "gpu020": set()}) == su.host_names
    assert s.plans(epoch=1, now=1000.0) == all_up


def _routes(plan: Plan | Backup) -> list[tuple[str, str | None, str]]:
    return [(str(r.destination), r.netdev, str(r.gateway)) for r in plan.routes]


def _prefixes(routes) -> list[tuple[str, list[str | None]]]:
    return [(str(p.prefix), p.netdevs) for p in routes]


def test_index_rule_exact_both_forms() -> None:
    # 4 hosts x 4 rails x 8 GPUs (2 per rail: GPU g is the (g // 4)-th of rail g % 4, endpoint
    # 10.200.(g % 4).(2h + g // 4 + 1)); h3 loses rail 3. Survivors ordered by NUMA: mlx5_3 is
    # on node 1 with mlx5_2, so [2, 0, 1]. A route between h3 and the host at position x for
    # GPU j of 2 on rail 3 takes survivors[((x + 3) * 2 + j) % 3] = survivors[(2x + j) % 3].
    gen = generate_rail_optimized(hosts=4, rails=4, gpus_per_host=8, host_name="h{h}")
    towards = {  # every peer's route to h3's GPU 3 (10.200.3.7) and GPU 7 (10.200.3.8)
        "h0": [("10.200.3.7", "rail2", "10.100.2.4"), ("10.200.3.8", "rail0", "10.100.0.4")],
        "h1": [("10.200.3.7", "rail1", "10.100.1.4"), ("10.200.3.8", "rail2", "10.100.2.4")],
        "h2": [("10.200.3.7", "rail0", "10.100.0.4"), ("10.200.3.8", "rail1", "10.100.1.4")],
    }
    for f in (gen, explicit(gen)):
        plans = solve(f, {"h3": frozenset({3})}, epoch=1, now=0.0)
        for h, want in towards.items():
            got = [r for r in _routes(plans[h]) if r[0].startswith("10.200.3.")]
            assert [r for r in got if r[0] in ("10.200.3.7", "10.200.3.8")] == want
        if f.endpoint_subnets:
            assert all(len(plans[h].routes) == 2 for h in towards)
            assert plans["h3"].routes == []
            assert _prefixes(plans["h3"].prefix_routes)[3] == (
                "10.200.3.0/24",
                ["rail0", "rail1", "rail2"],
            )
        else:
            assert [r for r in _routes(plans["h3"]) if r[0].startswith("10.200.3.")] == [
                # h3 lost the rail itself: its offsets count less 4 (n), the same spread
                # rotated: survivors[((x - 4) * 2 + j) % 3] = survivors[(2x + j + 1) % 3]
                ("10.200.3.1", "rail0", "10.100.0.1"),  # h0 GPU 3: index 1
                ("10.200.3.2", "rail1", "10.100.1.1"),  # h0 GPU 7: index 2
                ("10.200.3.3", "rail2", "10.100.2.2"),  # h1: indices 0, 1
                ("10.200.3.4", "rail0", "10.100.0.2"),
                ("10.200.3.5", "rail1", "10.100.1.3"),  # h2: indices 2, 0
                ("10.200.3.6", "rail2", "10.100.2.3"),
            ]
            assert load_report(plans)["h3"] == {0: 8, 1: 8, 2: 8}  # 6 + 2 each
        assert _incoming(f, plans, "h3") == {0: 8, 1: 8, 2: 8}


def test_lab_three_hosts_two_rails_exact() -> None:
    lab = explicit(generate_rail_optimized(hosts=3, rails=2, host_name="h{h}"))
    # rail-major endpoints: host h's GPU g (home rail g) is 10.200.g.(h+1)
    assert [[str(e) for e in h.endpoints] for h in lab.hosts] == [
        ["10.200.0.1", "10.200.1.1"],
        ["10.200.0.2", "10.200.1.2"],
        ["10.200.0.3", "10.200.1.3"],
    ]
    up = solve(lab, {}, epoch=1, now=0.0)
    assert up["h0"].prefix_routes == []
    assert _routes(up["h0"]) == [
        ("10.200.0.2", "rail0", "10.100.0.2"),
        ("10.200.1.2", "rail1", "10.100.1.2"),
        ("10.200.0.3", "rail0", "10.100.0.3"),
        ("10.200.1.3", "rail1", "10.100.1.3"),
    ]
    down = solve(lab, {"h1": frozenset({1})}, epoch=2, now=0.0)
    assert _routes(down["h0"]) == [
        ("10.200.0.2", "rail0", "10.100.0.2"),
        ("10.200.1.2", "rail0", "10.100.0.2"),
        ("10.200.0.3", "rail0", "10.100.0.3"),
        ("10.200.1.3", "rail1", "10.100.1.3"),
    ]
    assert _routes(down["h1"]) == [
        ("10.200.0.1", "rail0", "10.100.0.1"),
        ("10.200.1.1", "rail0", "10.100.0.1"),
        ("10.200.0.3", "rail0", "10.100.0.3"),
        ("10.200.1.3", "rail0", "10.100.0.3"),
    ]
    assert _routes(down["h2"]) == [
        ("10.200.0.1", "rail0", "10.100.0.1"),
        ("10.200.1.1", "rail1", "10.100.1.1"),
        ("10.200.0.2", "rail0", "10.100.0.2"),
        ("10.200.1.2", "rail0", "10.100.0.2"),
    ]
    assert [(a.gpu, a.hca) for a in down["h1"].rail_assignments] == [(0, "mlx5_0"), (1, "mlx5_0")]
    (b,) = down["h1"].backups
    assert (b.hca, b.routes, len(b.withdraw)) == ("mlx5_0", [], 4)
    # h0's fast path for mlx5_1: its rail-1 endpoints of h1 and h2 move to rail 0.
    b1 = next(b for b in up["h0"].backups if b.rail == 1)
    assert _routes(b1) == [
        ("10.200.1.2", "rail0", "10.100.0.2"),
        ("10.200.1.3", "rail0", "10.100.0.3"),
    ]
    assert [(a.gpu, a.hca, a.home_rail) for a in b1.rail_assignments] == [(1, "mlx5_0", 1)]


def test_lab_three_hosts_two_rails_exact_prefix_form() -> None:
    lab = generate_rail_optimized(hosts=3, rails=2, host_name="h{h}")
    on_link = [("10.200.0.0/24", ["rail0"]), ("10.200.1.0/24", ["rail1"])]
    up = solve(lab, {}, epoch=1, now=0.0)
    assert all(_prefixes(p.prefix_routes) == on_link and p.routes == [] for p in up.values())
    down = solve(lab, {"h1": frozenset({1})}, epoch=2, now=0.0)
    # h0 and h2: h1's GPU 1 (home rail 1, which h1 lost) is the only exception, via rail 0
    for h in ("h0", "h2"):
        assert _prefixes(down[h].prefix_routes) == on_link
        assert _routes(down[h]) == [("10.200.1.2", "rail0", "10.100.0.2")]
    # h1: its rail-1 prefix route goes out of rail 0, which both peers can use: no /32
    assert _prefixes(down["h1"].prefix_routes) == [
        ("10.200.0.0/24", ["rail0"]),
        ("10.200.1.0/24", ["rail0"]),
    ]
    assert down["h1"].routes == [] and down["h1"].unreachable == []
    (b,) = down["h1"].backups  # its last rail: both prefix routes become `unreachable`
    assert (b.hca, _prefixes(b.prefix_routes), b.routes, b.withdraw) == (
        "mlx5_0",
        [("10.200.0.0/24", []), ("10.200.1.0/24", [])],
        [],
        [],
    )
    # h0's fast path for mlx5_0: rail-0 endpoints go multipath over rail 1, except h1's (h1
    # has rail 0 only): its two endpoints are withdrawn; h0's exception via rail 0 goes too.
    b0 = next(b for b in down["h0"].backups if b.rail == 0)
    assert _prefixes(b0.prefix_routes) == [("10.200.0.0/24", ["rail1"])]
    assert (b0.routes, [str(d) for d in b0.withdraw]) == ([], ["10.200.0.2", "10.200.1.2"])
    # ... and for mlx5_1: the exception via rail 0 stays valid and is kept as it is
    b1 = next(b for b in down["h0"].backups if b.rail == 1)
    assert _prefixes(b1.prefix_routes) == [("10.200.1.0/24", ["rail0"])]
    assert (b1.routes, b1.withdraw) == ([], [])
    assert [(a.gpu, a.hca, a.home_rail) for a in b1.rail_assignments] == [(1, "mlx5_0", 1)]
    eff = _overlay(down["h0"], b1)
    assert [egress(eff, IP(d)) for d in ("10.200.0.2", "10.200.1.2", "10.200.1.3")] == [
        (0,),
        (0,),
        (0,),
    ]


def test_irregular_host_with_fewer_rails() -> None:
    f = generate_rail_optimized(hosts=3, rails=4, gpus_per_host=4, host_name="h{h}")
    small = f.hosts[2].model_copy(update={"hcas": f.hosts[2].hcas[:2]})  # rails 0 and 1 only
    f = Fabric(name="irregular", hosts=[f.hosts[0], f.hosts[1], small])
    plans = solve(f, {}, epoch=1, now=0.0)
    # h2's GPUs 2, 3 are homed on its rails 0, 1 (g % 2); h0 reaches them there.
    assert [(r.peer_gpu, r.rail) for r in plans["h0"].routes if r.peer == "h2"] == [
        (0, 0),
        (1, 1),
        (2, 0),
        (3, 1),
    ]
    # h2 reaches h0's rail-2/3 endpoints over the rails both have.
    assert {r.rail for r in plans["h2"].routes} == {0, 1}
    assert all(p.unreachable == [] for p in plans.values())


def test_the_plan_lookup_names_stay_importable_from_the_solver() -> None:
    for name in ("PlanLookup", "egress", "load_report", "nic_load"):
        assert getattr(solver_module, name) is getattr(planlookup, name)


def test_a_multipath_leaves_out_degraded_rails_unless_none_would_be_left() -> None:
    assert multipath_rails(frozenset({0, 1, 2}), frozenset({1})) == frozenset({0, 2})
    assert multipath_rails(frozenset({1}), frozenset({1})) == frozenset({1})
    assert multipath_rails(frozenset({0, 3}), frozenset()) == frozenset({0, 3})
