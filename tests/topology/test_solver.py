"""The pure solver on generated rail-optimized fabrics (the DGX SU size and the 3x2 lab)."""

from __future__ import annotations

import ipaddress
import math
from collections import Counter

import pytest

from linkguard.models import Plan, RouteAssignment, decode, encode
from linkguard.topology.fabric import Fabric, generate_rail_optimized
from linkguard.topology.solver import load_report, solve

A = "gpu005"  # the host that loses rails in most tests
NORMAL = 31  # routes per rail per host with 32 hosts x 8 GPUs: 31 peers x 1 endpoint
BOUND = math.ceil(NORMAL * 8 / 7)  # 36


@pytest.fixture(scope="module")
def su() -> Fabric:
    return generate_rail_optimized()


@pytest.fixture(scope="module")
def all_up(su: Fabric) -> dict[str, Plan]:
    return solve(su, {}, epoch=1, now=1000.0)


@pytest.fixture(scope="module")
def a_lost_3(su: Fabric) -> dict[str, Plan]:
    return solve(su, {A: frozenset({3})}, epoch=2, now=1001.0)


def _route(plan: Plan, dest: ipaddress.IPv4Address) -> RouteAssignment:
    return next(r for r in plan.routes if r.destination == dest)


def _incoming(su: Fabric, plans: dict[str, Plan], host: str) -> dict[int, int]:
    """Routes of all other hosts whose gateway is one of ``host``'s rail addresses, per rail."""
    rail_of = {c.address: c.rail for c in su.host(host).hcas}
    return dict(
        Counter(
            rail_of[r.gateway] for p in plans.values() for r in p.routes if r.gateway in rail_of
        )
    )


def test_all_up_routes_every_endpoint_on_its_home_rail(su: Fabric, all_up) -> None:
    assert set(all_up) == set(su.host_names)
    for name, plan in all_up.items():
        assert (plan.host, plan.epoch, plan.issued_at) == (name, 1, 1000.0)
        assert len(plan.routes) == 31 * 8 and plan.unreachable == []
        for r in plan.routes:
            peer = su.host(r.peer)
            assert r.rail == r.home_rail == r.peer_gpu
            assert r.destination == peer.endpoints[r.peer_gpu]
            assert r.gateway == peer.hcas[r.rail].address
            assert r.netdev == f"rail{r.rail}"
        assert [(a.gpu, a.hca, a.rail) for a in plan.rail_assignments] == [
            (g, f"mlx5_{g}", g) for g in range(8)
        ]
        assert [b.hca for b in plan.backups] == [f"mlx5_{r}" for r in range(8)]
    assert load_report(all_up)[A] == dict.fromkeys(range(8), NORMAL)
    assert _incoming(su, all_up, A) == dict.fromkeys(range(8), NORMAL)


def test_lost_rail_spreads_over_survivors(su: Fabric, all_up, a_lost_3) -> None:
    ep3 = su.host(A).endpoints[3]
    # Every peer's route to A's GPU-3 endpoint leaves rail 3, round-robin over the other 7
    # rails: 31 = 4 * 7 + 3, the 3 extra on rails 0-2 (same NUMA node as mlx5_3).
    towards = Counter(_route(a_lost_3[p], ep3).rail for p in su.host_names if p != A)
    assert towards == {0: 5, 1: 5, 2: 5, 4: 4, 5: 4, 6: 4, 7: 4}
    for p in su.host_names:
        if p == A:
            continue
        r = _route(a_lost_3[p], ep3)
        assert r.gateway == su.host(A).hcas[r.rail].address and r.netdev == f"rail{r.rail}"
    # A's own routes to peers' rail-3 endpoints move too, spread the same way.
    own = [r for r in a_lost_3[A].routes if r.home_rail == 3]
    assert len(own) == 31 and all(r.rail != 3 for r in own)
    assert all(r.gateway == su.host(r.peer).hcas[r.rail].address for r in own)
    assert load_report(a_lost_3)[A] == {0: 36, 1: 36, 2: 36, 4: 35, 5: 35, 6: 35, 7: 35}
    incoming = _incoming(su, a_lost_3, A)
    assert 3 not in incoming and max(incoming.values()) == BOUND
    assert sum(incoming.values()) == 31 * 8
    # Every host's busiest NIC stays within 8/7 of normal (peers: one extra route at most).
    assert max(max(v.values()) for v in load_report(a_lost_3).values()) <= BOUND
    # A's GPU 3 moves to the least-used HCA on its NUMA node (0): mlx5_0.
    ra = {a.gpu: a for a in a_lost_3[A].rail_assignments}
    assert (ra[3].hca, ra[3].rail, ra[3].home_rail) == ("mlx5_0", 0, 3)
    assert [ra[g] for g in range(8) if g != 3] == [
        a for a in all_up[A].rail_assignments if a.gpu != 3
    ]
    assert [b.rail for b in a_lost_3[A].backups] == [0, 1, 2, 4, 5, 6, 7]


def test_other_hosts_otherwise_unchanged(su: Fabric, all_up, a_lost_3) -> None:
    ep3 = su.host(A).endpoints[3]
    for p in su.host_names:
        if p == A:
            continue
        assert a_lost_3[p].rail_assignments == all_up[p].rail_assignments
        before = [r for r in all_up[p].routes if r.destination != ep3]
        after = [r for r in a_lost_3[p].routes if r.destination != ep3]
        assert before == after


def test_many_gpus_per_rail_spread_exactly() -> None:
    f = generate_rail_optimized(hosts=8, rails=8, gpus_per_host=16)
    plans = solve(f, {"gpu002": frozenset({3})}, epoch=1, now=0.0)
    # 7 peers x 2 GPUs homed on rail 3 = 14 moved routes over 7 survivors: exactly 2 each,
    # so every surviving NIC carries 14 + 2 = 16 = 14 * 8/7.
    assert load_report(plans)["gpu002"] == {r: 16 for r in range(8) if r != 3}
    assert _incoming(f, plans, "gpu002") == {r: 16 for r in range(8) if r != 3}


def test_both_ends_lost_different_rails(su: Fabric) -> None:
    b = "gpu020"
    plans = solve(su, {A: frozenset({3}), b: frozenset({5})}, epoch=3, now=0.0)
    for src, dst in ((A, b), (b, A)):
        for g in (3, 5):
            r = _route(plans[src], su.host(dst).endpoints[g])
            assert r.rail not in (3, 5)
    c = _route(plans["gpu000"], su.host(A).endpoints[3])
    assert c.rail != 3
    rep = load_report(plans)
    assert 3 not in rep[A] and 5 not in rep[b]
    assert sum(rep[A].values()) == sum(rep[b].values()) == 31 * 8
    # Two independent failures are spread independently (per-peer rule, no global balancing):
    # the busiest NIC is within one route of the ideal ceil(248 / 7) = 36.
    assert max(max(v.values()) for v in rep.values()) <= BOUND + 1
    assert all(p.unreachable == [] for p in plans.values())


def test_all_rails_lost_is_unreachable(su: Fabric) -> None:
    plans = solve(su, {A: frozenset(range(8))}, epoch=4, now=0.0)
    a = plans[A]
    assert a.routes == [] and a.rail_assignments == [] and a.backups == []
    assert len(a.unreachable) == 31 * 8
    mine = set(su.host(A).endpoints)
    for p in su.host_names:
        if p != A:
            assert set(plans[p].unreachable) == mine
            assert not mine & {r.destination for r in plans[p].routes}


@pytest.mark.parametrize(
    "unusable",
    [{}, {A: frozenset({3})}, {A: frozenset({3}), "gpu020": frozenset({5})}],
    ids=["all-up", "A-lost-3", "two-hosts"],
)
@pytest.mark.parametrize("host", [A, "gpu020", "gpu031"])
def test_backups_match_solving_with_the_port_down(su: Fabric, unusable, host) -> None:
    plan = solve(su, unusable, epoch=5, now=0.0, hosts=[host])[host]
    routes = {r.destination: r for r in plan.routes}
    assigned = {a.gpu: a for a in plan.rail_assignments}
    down = unusable.get(host, frozenset())
    assert [b.rail for b in plan.backups] == [r for r in range(8) if r not in down]
    for b in plan.backups:
        assert (b.hca, b.port) == (f"mlx5_{b.rail}", 1)
        worse = {**unusable, host: down | {b.rail}}
        real = solve(su, worse, epoch=6, now=0.0, hosts=[host])[host]
        assert b.routes == [r for r in real.routes if routes.get(r.destination) != r]
        assert b.withdraw == [d for d in real.unreachable if d in routes]
        assert b.rail_assignments == [a for a in real.rail_assignments if assigned[a.gpu] != a]
        assert b.routes and all(r.rail != b.rail for r in b.routes)


def test_backup_when_last_rail_goes_withdraws_everything(su: Fabric) -> None:
    plan = solve(su, {A: frozenset(range(7))}, epoch=1, now=0.0, hosts=[A])[A]
    assert {r.rail for r in plan.routes} == {7}
    (b,) = plan.backups
    assert b.rail == 7 and b.routes == [] and len(b.withdraw) == 31 * 8


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


def test_lab_three_hosts_two_rails_exact() -> None:
    lab = generate_rail_optimized(hosts=3, rails=2, host_name="h{h}")

    def routes(plan: Plan) -> list[tuple[str, str, str]]:
        return [(str(r.destination), r.netdev, str(r.gateway)) for r in plan.routes]

    up = solve(lab, {}, epoch=1, now=0.0)
    assert routes(up["h0"]) == [
        ("10.200.1.1", "rail0", "10.100.0.2"),
        ("10.200.1.2", "rail1", "10.100.1.2"),
        ("10.200.2.1", "rail0", "10.100.0.3"),
        ("10.200.2.2", "rail1", "10.100.1.3"),
    ]
    down = solve(lab, {"h1": frozenset({1})}, epoch=2, now=0.0)
    assert routes(down["h0"]) == [
        ("10.200.1.1", "rail0", "10.100.0.2"),
        ("10.200.1.2", "rail0", "10.100.0.2"),
        ("10.200.2.1", "rail0", "10.100.0.3"),
        ("10.200.2.2", "rail1", "10.100.1.3"),
    ]
    assert routes(down["h1"]) == [
        ("10.200.0.1", "rail0", "10.100.0.1"),
        ("10.200.0.2", "rail0", "10.100.0.1"),
        ("10.200.2.1", "rail0", "10.100.0.3"),
        ("10.200.2.2", "rail0", "10.100.0.3"),
    ]
    assert routes(down["h2"]) == [
        ("10.200.0.1", "rail0", "10.100.0.1"),
        ("10.200.0.2", "rail1", "10.100.1.1"),
        ("10.200.1.1", "rail0", "10.100.0.2"),
        ("10.200.1.2", "rail0", "10.100.0.2"),
    ]
    assert [(a.gpu, a.hca) for a in down["h1"].rail_assignments] == [(0, "mlx5_0"), (1, "mlx5_0")]
    (b,) = down["h1"].backups
    assert (b.hca, b.routes, len(b.withdraw)) == ("mlx5_0", [], 4)
    # h0's fast path for mlx5_1: its rail-1 endpoints of h2 move to rail 0.
    b1 = next(b for b in up["h0"].backups if b.rail == 1)
    assert routes(Plan(host="h0", epoch=0, issued_at=0, routes=b1.routes)) == [
        ("10.200.1.2", "rail0", "10.100.0.2"),
        ("10.200.2.2", "rail0", "10.100.0.3"),
    ]
    assert [(a.gpu, a.hca, a.home_rail) for a in b1.rail_assignments] == [(1, "mlx5_0", 1)]


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
