"""Solver at fleet scale: incremental plans vs. a naive networkx recompute, in one run.

Usage: ``python benchmarks/solver.py [--hosts 2048] [--rails 8] [--runs 5] [--baseline-hosts 8]
[--baseline-full]``.

Prints, for a generated rail-optimized fabric (DGX SuperPOD layout, rail-major endpoints):

- full build: :class:`~linkguard.topology.solver.Solver` over all hosts, then every plan
  materialized as a :class:`~linkguard.models.Plan`; peak Python memory (tracemalloc, measured in
  a separate pass because tracing slows the code down);
- time to the new plans after one host link event, a leaf failure (the 32 ports of one leaf)
  and a spine failure (switch-level assessment + update), each from the all-up state, median of
  ``--runs``: ``update`` = every route decision made and the changed hosts known;
  ``+plans`` = the changed hosts' Plan models built; ``+json`` = their bus payloads encoded;
- busiest NIC after one rail of one host is lost, outbound and inbound, as a ratio of its normal
  load (destinations carried; a multipath prefix route counts 1/n per nexthop), against 8/7;
- the naive baseline: for every host, networkx BFS from each of its usable NIC ports over the
  fabric graph (host ports, leaves, spines, core; failed links removed), then per peer endpoint
  its home rail if that peer port is reached, else the first rail that reaches it, into a plain
  dict (no models: generous to the baseline). A naive solver has no incremental mode: any event
  costs a full recompute. Unless ``--baseline-full``, it runs on ``--baseline-hosts`` hosts and
  is extrapolated linearly (every host does the same work), and the output says so.

Ratios are computed within this run. No I/O besides stdout.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable

import networkx as nx

from linkguard.models import encode
from linkguard.topology.fabric import Fabric
from linkguard.topology.generator import generate_rail_optimized
from linkguard.topology.health import SwitchModel
from linkguard.topology.solver import Solver, nic_load


def _ms(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def _peak_mib(fn: Callable[[], object]) -> float:
    gc.collect()
    tracemalloc.start()
    keep = fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del keep
    return peak / 2**20


def _event(
    solver: Solver, down: dict[str, frozenset[int]], runs: int, pre: Callable[[], object] | None
) -> dict[str, float]:
    """Median ms of update / +plans / +json for ``down`` applied to the all-up solver."""
    names = solver.host_names
    up = {h: frozenset() for h in down}
    res: dict[str, list[float]] = {"update": [], "plans": [], "json": [], "changed": []}
    for _ in range(runs):
        gc.collect()
        t0 = time.perf_counter()
        if pre is not None:
            pre()
        changed = solver.update(down)
        t1 = time.perf_counter()
        plans = [solver.plan(h, epoch=2, now=0.0) for h in changed]
        t2 = time.perf_counter()
        for p in plans:
            encode(p)
        t3 = time.perf_counter()
        res["update"].append((t1 - t0) * 1000)
        res["plans"].append((t2 - t0) * 1000)
        res["json"].append((t3 - t0) * 1000)
        res["changed"].append(len(changed))
        solver.update(up)  # back to all up (not timed)
    assert len(names) == solver.n
    return {k: statistics.median(v) for k, v in res.items()}


def _loads(fabric: Fabric, solver: Solver) -> tuple[float, float]:
    """Busiest NIC (outbound, inbound) as a ratio of its normal load, over all hosts."""
    per_rail = Counter(r for h in fabric.hosts for r in _homes(h))
    plans = solver.plans(epoch=1, now=0.0)
    out_ratio = 0.0
    inbound: dict[tuple[str, int], float] = Counter()
    sig_count: Counter[tuple] = Counter()
    for h in fabric.hosts:
        plan = plans[h.host]
        mine = Counter(_homes(h))
        others = {d: n - mine.get(d, 0) for d, n in per_rail.items()}
        for x, v in nic_load(plan, others).items():
            out_ratio = max(out_ratio, v / others[x])
        sig_count[tuple(tuple(pr.rails) for pr in plan.prefix_routes)] += 1
    # inbound: every host's prefix routes deliver each endpoint homed on d over their rails;
    # exceptions and unreachable entries take theirs out of the prefix and add their own rail
    share: dict[int, Counter] = {}
    for sig, count in sig_count.items():
        for d, rails in enumerate(sig):
            c = share.setdefault(d, Counter())
            for x in rails:
                c[x] += count / len(rails)
    in_ratio = 0.0
    for p in fabric.hosts:
        own = plans[p.host]
        load: Counter = Counter()
        for d in _homes(p):
            for x, v in share[d].items():
                load[x] += v
            for x in own.prefix_routes[d].rails:  # not from itself
                load[x] -= 1 / len(own.prefix_routes[d].rails)
        inbound[p.host] = load
    for h in fabric.hosts:
        plan = plans[h.host]
        for r in plan.routes:
            pr = plan.prefix_routes[r.home_rail]
            for x in pr.rails:
                inbound[r.peer][x] -= 1 / len(pr.rails)
            inbound[r.peer][r.rail] += 1
    normal = len(fabric.hosts) - 1
    for load in inbound.values():
        in_ratio = max(in_ratio, max(load.values()) / normal)
    return out_ratio, in_ratio


def _homes(h) -> list[int]:
    rails = sorted(c.rail for c in h.hcas)
    return [rails[g % len(rails)] for g in range(len(h.endpoints))]


def _naive_graph(fabric: Fabric, down_ports: set[str]) -> nx.Graph:
    g = nx.Graph()
    for link in fabric.links:
        if link.a in down_ports or link.b in down_ports:
            continue
        g.add_edge(link.a, link.b)
    return g


def _naive_host(fabric: Fabric, g: nx.Graph, host) -> dict:
    """One host's routes the naive way: BFS per local port, then a rail per peer endpoint."""
    reach = {}
    for c in host.hcas:
        port = f"{host.host}:{c.key}"
        reach[c.rail] = set(nx.single_source_shortest_path_length(g, port)) if port in g else set()
    routes = {}
    for p in fabric.hosts:
        if p is host:
            continue
        ports = {c.rail: f"{p.host}:{c.key}" for c in p.hcas}
        homes = _homes(p)
        for ep, d in zip(p.endpoints, homes, strict=True):
            if ports[d] in reach.get(d, ()):
                routes[ep] = d
                continue
            routes[ep] = next((x for x in sorted(reach) if ports.get(x) in reach[x]), None)
    return routes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=2048)
    ap.add_argument("--rails", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline-hosts", type=int, default=8, help="hosts the baseline runs on")
    ap.add_argument("--baseline-full", action="store_true", help="run the baseline on all hosts")
    args = ap.parse_args()

    gen_ms, fabric = _ms(lambda: generate_rail_optimized(hosts=args.hosts, rails=args.rails))
    n, rails = len(fabric.hosts), args.rails
    print(
        f"fabric: {n} hosts x {rails} rails = {n * rails} GPUs, {len(fabric.switches)} "
        f"switches, {len(fabric.links)} cables (generated in {gen_ms:.0f} ms)"
    )

    build_ms, solver = _ms(lambda: Solver(fabric, {}))
    plans_ms, _ = _ms(lambda: solver.plans(epoch=1, now=0.0))
    peak = _peak_mib(lambda: (s := Solver(fabric, {}), s.plans(epoch=1, now=0.0)))
    print(
        f"full build: {build_ms:.0f} ms solve + {plans_ms:.0f} ms plans = "
        f"{build_ms + plans_ms:.0f} ms; peak memory {peak:.0f} MiB"
    )

    victim = fabric.hosts[n // 2].host
    lost = 3 % rails
    leaves = [s for s in fabric.switches if s.role == "leaf" and s.rail == 2 % rails]
    leaf = next((s for s in leaves if s.su == 5), leaves[0])  # SU 5 when there is one
    model = SwitchModel(fabric)
    leaf_hosts = model.assess(switches_down=[leaf.name]).unusable
    # an SU spine (the core tier's switches are role "spine" too, named cg*-core*)
    spines = [s for s in fabric.switches if s.role == "spine" and s.su is not None]
    cases = {
        f"host link ({victim} rail {lost})": ({victim: frozenset({lost})}, None),
        f"leaf failure ({leaf.name}, {len(leaf_hosts)} ports)": (leaf_hosts, None),
    }
    if spines:
        spine = spines[len(spines) // 2].name
        holder: dict[str, frozenset[int]] = {}

        def assess_spine() -> None:
            holder.update(model.assess(switches_down=[spine]).unusable)

        assess_spine()
        cases[f"spine failure ({spine})"] = (dict(holder), assess_spine)
    print(f"\n{'event':<42} {'update':>9} {'+plans':>9} {'+json':>9} {'hosts changed':>14}")
    results = {}
    for name, (down, pre) in cases.items():
        r = _event(solver, down, args.runs, pre)
        results[name] = r
        print(
            f"{name:<42} {r['update']:>6.2f} ms {r['plans']:>6.1f} ms {r['json']:>6.1f} ms "
            f"{int(r['changed']):>14}"
        )

    solver.update({victim: frozenset({lost})})
    out_ratio, in_ratio = _loads(fabric, solver)
    solver.update({victim: frozenset()})
    bound = 8 / 7 if rails == 8 else rails / (rails - 1)
    print(
        f"\nbusiest NIC after {victim} loses rail {lost}: outbound {out_ratio:.4f}x, inbound "
        f"{in_ratio:.4f}x of normal (bound {bound:.4f}x; integer routes give at most "
        f"ceil({n - 1}/{rails - 1}) = {-(-(n - 1) // (rails - 1))} extra)"
    )

    # naive baseline
    sample = fabric.hosts if args.baseline_full else fabric.hosts[: args.baseline_hosts]
    g_ms, g = _ms(lambda: _naive_graph(fabric, set()))
    t0 = time.perf_counter()
    for h in sample:
        _naive_host(fabric, g, h)
    per_host = (time.perf_counter() - t0) * 1000 / len(sample)
    naive_ms = g_ms + per_host * n
    peak_one = _peak_mib(lambda: [_naive_host(fabric, g, h) for h in sample[:1]])
    how = "measured" if args.baseline_full else f"extrapolated from {len(sample)} hosts"
    print(
        f"\nnaive baseline (networkx BFS per port, recompute all): graph {g_ms:.0f} ms + "
        f"{per_host:.0f} ms/host -> {naive_ms / 1000:.1f} s for {n} hosts ({how}); "
        f"peak {peak_one:.0f} MiB for one host's plan, ~{peak_one * n / 1024:.1f} GiB for all"
    )
    print(f"\n{'ratio (naive / linkguard)':<42} {'update':>9} {'+plans':>9} {'+json':>9}")
    print(f"{'full build':<42} {naive_ms / (build_ms + plans_ms):>8.0f}x")
    for name, r in results.items():
        print(
            f"{name:<42} {naive_ms / r['update']:>8.0f}x {naive_ms / r['plans']:>8.0f}x "
            f"{naive_ms / r['json']:>8.0f}x"
        )
    targets = [
        ("one link event < 10 ms", next(iter(results.values()))["update"] < 10),
        ("leaf failure < 50 ms", list(results.values())[1]["update"] < 50),
        (
            ">= 50x faster than naive (every event, update)",
            all(naive_ms / r["update"] >= 50 for r in results.values()),
        ),
        (
            "busiest surviving NIC <= 8/7 (rounded up to whole routes)",
            max(out_ratio, in_ratio) <= (n - 1 + -(-(n - 1) // (rails - 1))) / (n - 1) + 1e-9,
        ),
    ]
    print()
    for what, ok in targets:
        print(f"target {what}: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
