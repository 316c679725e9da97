"""Property tests of the solver (hypothesis): for random rail-optimized fabrics, in both plan
forms (prefix routes + exceptions; explicit /32s), and random sets of unusable (host, rail)
ports, whatever the solver decides is safe and complete, its backups too, and the incremental
solver after any sequence of changes equals a full rebuild.

The reachability model is the one the solver implements: a peer endpoint is reachable from a
host when some rail is usable on both (traffic stays on one rail; a leaf cut off from its spines
makes its rail unusable for its hosts, see test_failure_classes).
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from linkguard.models import PeerRoutes, Plan, decode, encode, expand_plan
from linkguard.topology.fabric import Fabric
from linkguard.topology.generator import generate_rail_optimized
from linkguard.topology.solver import Solver, egress, solve

#: PCIe switch ids drawn for a host's HCAs and GPUs (None: unknown)
SWITCH_IDS = st.sampled_from([None, "sw0", "sw1", "sw2"])


def _fabric(draw) -> Fabric:
    """A generated fabric with a PCIe layout that is none (today's NUMA-only order), the
    generator's (``rails_per_pcie_switch``), or drawn per host (one NUMA node; hosts then
    differ in layout, so in hardware signature)."""
    hosts = draw(st.integers(2, 6))
    rails = draw(st.integers(1, 4))
    gpus = draw(st.integers(1, 6))
    layout = draw(st.sampled_from(["none", "generated", "drawn"]))
    per_switch = draw(st.integers(1, rails)) if layout == "generated" else 0
    kw = dict(hosts=hosts, rails=rails, gpus_per_host=gpus, hosts_per_su=draw(st.integers(2, 4)))
    try:
        fabric = generate_rail_optimized(**kw, rails_per_pcie_switch=per_switch)
    except ValueError:  # a switch across both NUMA nodes: one node instead
        fabric = generate_rail_optimized(**kw, rails_per_pcie_switch=per_switch, numa_split=False)
    if layout == "drawn":
        fabric = generate_rail_optimized(**kw, numa_split=False)
        out = []
        for h in fabric.hosts:
            d = h.model_dump()
            for c in d["hcas"]:
                c["pcie_switch"] = draw(SWITCH_IDS)
            if draw(st.booleans()):  # else each GPU takes its home HCA's switch
                d["gpu_pcie_switch"] = [draw(SWITCH_IDS) for _ in range(gpus)]
            out.append(d)
        fabric = Fabric.model_validate({**fabric.__dict__, "hosts": out})
    if draw(st.booleans()):  # the explicit form: no endpoint subnets
        fabric = Fabric.model_validate({**fabric.__dict__, "endpoint_subnets": {}})
    return fabric


def _failures(draw, fabric: Fabric) -> dict[str, frozenset[int]]:
    rails = len(fabric.rails)
    unusable = {}
    for h in fabric.hosts:
        down = draw(st.frozensets(st.integers(0, rails - 1), max_size=rails))
        if down:
            unusable[h.host] = down
    return unusable


#: ``degraded_after`` values: off, and low enough that small fabrics reach it
DEGRADED = st.sampled_from([0, 1, 2, 3])


@st.composite
def fabrics_and_failures(draw) -> tuple[Fabric, dict[str, frozenset[int]], int]:
    fabric = _fabric(draw)
    return fabric, _failures(draw, fabric), draw(DEGRADED)


@st.composite
def fabrics_and_histories(draw) -> tuple[Fabric, list[dict[str, frozenset[int]]], int]:
    fabric = _fabric(draw)
    steps = draw(st.integers(1, 4))
    return fabric, [_failures(draw, fabric) for _ in range(steps)], draw(DEGRADED)


def _overlay(plan: Plan, rail: int) -> Plan:
    """``plan`` with the backup of local ``rail`` applied, as the agent's fast path does."""
    b = next(b for b in plan.backups if b.rail == rail)
    prefixes = {p.prefix: p for p in plan.prefix_routes}
    prefixes.update({p.prefix: p for p in b.prefix_routes})
    routes = {r.destination: r for r in plan.routes}
    routes.update({r.destination: r for r in b.routes})
    unreachable = set(plan.unreachable) - {r.destination for r in b.routes}
    for d in b.withdraw:
        routes.pop(d, None)
        unreachable.add(d)
    return plan.model_copy(
        update={
            "prefix_routes": list(prefixes.values()),
            "routes": list(routes.values()),
            "unreachable": sorted(unreachable),
        }
    )


def _check_routing(fabric: Fabric, unusable, h, plan: Plan, mine: set[int]) -> None:
    by_rail = {c.rail: c for c in h.hcas}
    for r in plan.routes:  # exceptions: the right netdev and gateway, never to ourselves
        p = fabric.host(r.peer)
        assert r.destination == p.endpoints[r.peer_gpu]
        assert r.netdev == by_rail[r.rail].netdev
        assert r.gateway == {c.rail: c for c in p.hcas}[r.rail].address
    for pr in plan.prefix_routes:
        assert pr.netdevs == [by_rail[x].netdev for x in pr.rails]
    for p in fabric.hosts:
        if p.host == h.host:
            continue
        theirs = {c.rail for c in p.hcas} - unusable.get(p.host, frozenset())
        for ep in p.endpoints:
            out = egress(plan, ep)
            if mine & theirs:
                # reachable in the graph -> routed, and never over a failed or held-down
                # port on either end (a multipath route may hash onto any of its rails)
                assert out, f"{h.host} -> {ep} reachable over {mine & theirs} but not routed"
                assert set(out) <= mine & theirs, f"{h.host} -> {ep} via {out}"
            else:
                assert out == ()


@settings(max_examples=150, deadline=None)
@given(fabrics_and_failures())
def test_plans_and_backups_are_safe_and_complete(case) -> None:
    fabric, unusable, degraded_after = case
    plans = solve(fabric, unusable, epoch=1, now=0.0, degraded_after=degraded_after)
    assert set(plans) == set(fabric.host_names)
    for h in fabric.hosts:
        plan = plans[h.host]
        mine = {c.rail for c in h.hcas} - unusable.get(h.host, frozenset())
        _check_routing(fabric, unusable, h, plan, mine)
        # no route to this host's own endpoints, nothing routed twice (the model checks that)
        assert not set(h.endpoints) & {r.destination for r in plan.routes}
        # every GPU with a usable local NIC has one, and never an unusable one
        assigned = Counter(a.gpu for a in plan.rail_assignments)
        assert all(n == 1 for n in assigned.values())
        for a in plan.rail_assignments:
            assert a.rail in mine
        assert set(assigned) == (set(range(len(h.endpoints))) if mine else set())
        # one backup per usable local port; applied, it is as safe and complete as a plan
        assert sorted(b.rail for b in plan.backups) == sorted(mine)
        for rail in mine:
            less = unusable | {h.host: frozenset(unusable.get(h.host, ())) | {rail}}
            _check_routing(fabric, less, h, _overlay(plan, rail), mine - {rail})


@settings(max_examples=150, deadline=None)
@given(fabrics_and_histories())
def test_incremental_equals_full_rebuild(case) -> None:
    """After every batch of changes the incremental plans equal a fresh full build, and the
    hosts it reports as changed are exactly those whose plan changed."""
    fabric, history, degraded_after = case
    solver = Solver(fabric, {}, degraded_after=degraded_after)
    before = solver.plans(epoch=1, now=0.0)
    for unusable in history:
        batch = {h: unusable.get(h, frozenset()) for h in fabric.host_names}
        changed = solver.update(batch)
        after = solver.plans(epoch=1, now=0.0)
        full = Solver(fabric, unusable, degraded_after=degraded_after)
        assert after == full.plans(epoch=1, now=0.0)
        assert changed == [h for h in fabric.host_names if after[h] != before[h]]
        before = after


@settings(max_examples=60, deadline=None)
@given(fabrics_and_failures())
def test_solver_is_deterministic(case) -> None:
    fabric, unusable, k = case
    once = solve(fabric, unusable, epoch=3, now=1.0, degraded_after=k)
    assert once == solve(fabric, unusable, epoch=3, now=1.0, degraded_after=k)


def _wire_peer_routes(solver: Solver, epoch: int) -> dict[str, PeerRoutes]:
    """Every host's peer routes as an agent receives them (encoded, fully validated)."""
    return {
        n: decode(PeerRoutes, encode(solver.peer_routes(n, epoch=epoch, now=0.0)))
        for n in solver.host_names
    }


@settings(max_examples=150, deadline=None)
@given(fabrics_and_histories())
def test_compact_plans_with_peer_routes_expand_to_the_full_plans(case) -> None:
    """A whole host's compact plan, expanded with every host's peer routes as they come off
    the wire, is exactly its full plan, after every batch of changes; the peers reported as
    changed cover every peer routes message that changed; other hosts' plans are full."""
    fabric, history, degraded_after = case
    solver = Solver(fabric, {}, degraded_after=degraded_after)
    assert solver.shared_mode == bool(fabric.endpoint_subnets)
    last = _wire_peer_routes(solver, 1)
    solver.take_changed_peers()
    for step, unusable in enumerate(history, start=2):
        solver.update({h: unusable.get(h, frozenset()) for h in fabric.host_names})
        changed = set(solver.take_changed_peers())
        peers = _wire_peer_routes(solver, step)
        for n, pr in peers.items():
            assert pr.classes == [] or n in solver.host_names
            if not pr.same_routes(last[n]):
                assert n in changed
        last = peers
        for h in fabric.host_names:
            full = solver.plan(h, epoch=step, now=0.0)
            compact = decode(Plan, encode(solver.compact_plan(h, epoch=step, now=0.0)))
            if solver.is_shared(h):
                assert compact.shared is not None and compact.routes == []
                assert all(b.routes == [] and b.withdraw == [] for b in compact.backups)
                assert expand_plan(compact, peers) == full
            else:
                assert compact.shared is None and compact == full


@settings(max_examples=100, deadline=None)
@given(fabrics_and_histories())
def test_compact_plans_reported_unchanged_are_unchanged(case) -> None:
    """A host in shared mode left out of take_changed_compact() has the compact plan it had."""
    fabric, history, degraded_after = case
    solver = Solver(fabric, {}, degraded_after=degraded_after)
    assert solver.take_changed_compact() == set(fabric.host_names)
    last = {h: solver.compact_plan(h, epoch=1, now=0.0) for h in fabric.host_names}
    for unusable in history:
        solver.update({h: unusable.get(h, frozenset()) for h in fabric.host_names})
        changed = solver.take_changed_compact()
        for h in fabric.host_names:
            now = solver.compact_plan(h, epoch=1, now=0.0)
            if h not in changed and now.shared is not None:
                assert now == last[h]
            last[h] = now
