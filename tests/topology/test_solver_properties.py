"""Property tests of the solver (hypothesis): for random rail-optimized fabrics and random sets
of unusable (host, rail) ports, whatever the solver decides is safe and complete.

The reachability model is the one the solver implements today: a peer endpoint is reachable
from a host when some rail is usable on both (traffic stays on one rail's leaf; cross-rail paths
through spines are not modelled yet).
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from linkguard.topology.fabric import Fabric
from linkguard.topology.generator import generate_rail_optimized
from linkguard.topology.solver import solve


@st.composite
def fabrics_and_failures(draw) -> tuple[Fabric, dict[str, frozenset[int]]]:
    hosts = draw(st.integers(2, 6))
    rails = draw(st.integers(1, 4))
    gpus = draw(st.integers(1, 6))
    fabric = generate_rail_optimized(
        hosts=hosts, rails=rails, gpus_per_host=gpus, hosts_per_su=draw(st.integers(2, 4))
    )
    unusable = {}
    for h in fabric.hosts:
        down = draw(st.frozensets(st.integers(0, rails - 1), max_size=rails))
        if down:
            unusable[h.host] = down
    return fabric, unusable


@settings(max_examples=120, deadline=None)
@given(fabrics_and_failures())
def test_plans_are_safe_and_complete(case) -> None:
    fabric, unusable = case
    plans = solve(fabric, unusable, epoch=1, now=0.0)
    assert set(plans) == set(fabric.host_names)
    for h in fabric.hosts:
        plan = plans[h.host]
        mine = {c.rail for c in h.hcas} - unusable.get(h.host, frozenset())
        by_rail = {c.rail: c for c in h.hcas}
        routed = {r.destination: r for r in plan.routes}
        for p in fabric.hosts:
            if p.host == h.host:
                continue
            theirs = {c.rail for c in p.hcas} - unusable.get(p.host, frozenset())
            peer_rail = {c.rail: c for c in p.hcas}
            for ep in p.endpoints:
                if mine & theirs:
                    r = routed[ep]  # reachable in the graph -> routed
                    # never over a failed or held-down port, on either end
                    assert r.rail in mine and r.rail in theirs
                    assert r.netdev == by_rail[r.rail].netdev
                    assert r.gateway == peer_rail[r.rail].address
                    assert r.peer == p.host
                else:
                    assert ep not in routed and ep in plan.unreachable
        # no route to this host's own endpoints, nothing routed twice (the model checks that)
        assert not set(h.endpoints) & set(routed)
        # every GPU with a usable local NIC has one, and never an unusable one
        assigned = Counter(a.gpu for a in plan.rail_assignments)
        assert all(n == 1 for n in assigned.values())
        for a in plan.rail_assignments:
            assert a.rail in mine
        assert set(assigned) == (set(range(len(h.endpoints))) if mine else set())


@settings(max_examples=60, deadline=None)
@given(fabrics_and_failures())
def test_solver_is_deterministic(case) -> None:
    fabric, unusable = case
    assert solve(fabric, unusable, epoch=3, now=1.0) == solve(fabric, unusable, epoch=3, now=1.0)
