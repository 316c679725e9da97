"""The oracle: model reachability vs. what plans deliver, on solver output and on broken plans."""

from __future__ import annotations

from ipaddress import IPv4Address

from linkguard.models import RouteAssignment
from linkguard.simulations.oracle import check, pairs_to_check
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.solver import solve

FABRIC = generate_rail_optimized(hosts=8, rails=4)


def test_solver_plans_match_the_model() -> None:
    unusable = {"gpu001": frozenset({2}), "gpu004": frozenset({0, 1, 2, 3}), "gpu006": {1, 3}}
    plans = solve(FABRIC, unusable, epoch=1, now=0.0)
    assert check(FABRIC, unusable, plans) == []


def test_a_plan_over_a_dead_rail_and_a_missing_route_are_found() -> None:
    unusable = {"gpu001": frozenset({2})}
    # the plans of the all-up fabric, kept after gpu001 lost rail 2 (no service reaction)
    stale = solve(FABRIC, {}, epoch=1, now=0.0)
    found = check(FABRIC, unusable, stale)
    ep = FABRIC.host("gpu001").endpoints[2]  # home rail 2
    dead = {(m.host, m.destination) for m in found if m.kind == "dead_rail"}
    # every peer still sends to gpu001's rail-2 endpoint over rail 2 ...
    assert {(h, ep) for h in FABRIC.host_names if h != "gpu001"} <= dead
    # ... and gpu001 sends to every peer's rail-2 endpoint over its dead rail 2
    assert {(m.peer, m.rails) for m in found if m.host == "gpu001"} == {
        (h, (2,)) for h in FABRIC.host_names if h != "gpu001"
    }
    assert len(found) == 7 + 7
    text = str(found[0])
    assert text.startswith("dead_rail: gpu000 -> gpu001 10.200.2.2 via rails [2]")

    # a plan that lost a route (a /32 to the unreachable list) is 'unrouted'
    plans = solve(FABRIC, {}, epoch=1, now=0.0)
    broken = plans["gpu003"].model_copy(update={"unreachable": [ep]})
    found = check(FABRIC, {}, {**plans, "gpu003": broken})
    assert [(m.kind, m.host, m.destination, m.usable_both) for m in found] == [
        ("unrouted", "gpu003", ep, (0, 1, 2, 3))
    ]


def test_unreachable_in_the_model_must_not_be_routed() -> None:
    unusable = {"gpu005": frozenset({0, 1, 2, 3})}
    plans = solve(FABRIC, unusable, epoch=1, now=0.0)
    assert check(FABRIC, unusable, plans) == []
    forged = RouteAssignment(
        destination=FABRIC.host("gpu005").endpoints[0],
        peer="gpu005",
        peer_gpu=0,
        rail=0,
        home_rail=0,
        netdev="rail0",
        gateway=FABRIC.host("gpu005").hcas[0].address,
    )
    bad = plans["gpu000"].model_copy(
        update={"routes": [forged], "unreachable": plans["gpu000"].unreachable[1:]}
    )
    found = check(FABRIC, unusable, {**plans, "gpu000": bad}, pairs=[("gpu000", "gpu005")])
    assert [(m.kind, m.rails, m.usable_both) for m in found] == [("dead_rail", (0,), ())]


def test_a_host_without_plan() -> None:
    plans = solve(FABRIC, {}, epoch=1, now=0.0)
    plans["gpu002"] = None
    found = check(FABRIC, {}, plans)
    assert [(m.kind, m.host) for m in found] == [("no_plan", "gpu002")]
    # no usable rail: nothing to plan, nothing expected
    found = check(
        FABRIC, {"gpu002": {0, 1, 2, 3}}, {**plans, "gpu002": None}, [("gpu002", "gpu000")]
    )
    assert found == []


def test_pairs_to_check_keeps_impaired_pairs_and_samples_the_rest() -> None:
    big = generate_rail_optimized(hosts=64, rails=4)
    pairs = pairs_to_check(big, {"gpu010": {1}}, sample=100, seed=7)
    touching = [p for p in pairs if "gpu010" in p]
    assert len(touching) == 2 * 63
    assert len(pairs) == 2 * 63 + 100
    assert len(set(pairs)) == len(pairs)
    assert pairs == pairs_to_check(big, {"gpu010": {1}}, sample=100, seed=7)  # seeded
    assert pairs != pairs_to_check(big, {"gpu010": {1}}, sample=100, seed=8)
    # a small fabric: every pair
    assert len(pairs_to_check(FABRIC, {}, sample=1000)) == 8 * 7
    assert IPv4Address("10.200.2.2") == FABRIC.host("gpu001").endpoints[2]
