"""The oracle on the routes a real-time replay's agents installed
(:mod:`linkguard.simulations.live`).

Consumes: the fabric, the rails unusable in fact (host -> rails), each host's route table as
the agent left it (:class:`~linkguard.drivers.routes.KernelRoute` by destination) and the
agents' applied plans. Produces: the mismatches (:class:`~linkguard.simulations.oracle.Mismatch`
for a route against the model, a sentence for a table that differs from its plan). Pure: it
reads tables and plans, changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from ipaddress import IPv4Address

from linkguard.agent.applier import kernel_routes
from linkguard.agent.plans import effective
from linkguard.drivers.routes import Destination, KernelRoute
from linkguard.models import Plan
from linkguard.simulations.fleet import SimulatedFleet
from linkguard.simulations.oracle import Mismatch
from linkguard.topology.fabric import Fabric

__all__ = ["check_installed", "installed_mismatches", "table_drift", "table_egress"]


def table_egress(
    routes: Mapping[Destination, KernelRoute], rail_of: Mapping[str, int], dest: IPv4Address
) -> tuple[int, ...]:
    """Rails a route table sends ``dest`` out of, as the kernel looks it up: the longest
    prefix containing it; its netdev(s) (several: multipath) mapped to rails by ``rail_of``
    (a netdev the host does not have maps to -1, which no model counts as usable); () for an
    ``unreachable`` route or no route at all. Sorted."""
    best: KernelRoute | None = None
    for r in routes.values():
        net = r.network
        if dest in net and (best is None or net.prefixlen > best.network.prefixlen):
            best = r
    if best is None or best.kind != "unicast":
        return ()
    return tuple(sorted({rail_of.get(n, -1) for n in best.netdevs}))


def check_installed(
    fabric: Fabric,
    unusable: Mapping[str, Iterable[int]],
    tables: Mapping[str, Mapping[Destination, KernelRoute]],
    pairs: Iterable[tuple[str, str]],
) -> list[Mismatch]:
    """The oracle (:func:`linkguard.simulations.oracle.check`) on installed routes: for each
    (host, peer) of ``pairs`` and each of the peer's endpoints, the rails ``tables[host]``
    sends it out of (:func:`table_egress`) against the model. ``unrouted``: the model reaches
    it, the table does not; ``dead_rail``: the table may use a rail unusable at either end."""
    usable = {
        h.host: frozenset(c.rail for c in h.hcas) - frozenset(unusable.get(h.host, ()))
        for h in fabric.hosts
    }
    rails = {h.host: {c.netdev: c.rail for c in h.hcas if c.netdev} for h in fabric.hosts}
    out: list[Mismatch] = []
    for a, b in pairs:
        both = usable[a] & usable[b]
        table = tables.get(a, {})
        for ep in fabric.host(b).endpoints:
            got = table_egress(table, rails[a], ep)
            if both and not got:
                out.append(Mismatch("unrouted", a, b, ep, (), tuple(sorted(both))))
            elif got and not set(got) <= both:
                out.append(Mismatch("dead_rail", a, b, ep, got, tuple(sorted(both))))
    return out


def table_drift(
    plan: Plan, locally_down: Iterable[str], routes: Mapping[Destination, KernelRoute]
) -> str | None:
    """How a host's route table differs from what its applied ``plan`` with the backups of
    its ``locally_down`` ports asks for (:func:`~linkguard.agent.applier.kernel_routes`):
    routes left behind (leaked), missing or different, as one sentence; None when equal."""
    want = kernel_routes(effective(plan, locally_down))
    leaked = sorted(str(d) for d in routes.keys() - want.keys())
    missing = sorted(str(d) for d in want.keys() - routes.keys())
    wrong = sorted(str(d) for d in want.keys() & routes.keys() if want[d] != routes[d])
    parts = [
        f"{name} {len(ds)} ({', '.join(ds[:3])}{', ...' if len(ds) > 3 else ''})"
        for name, ds in (("leaked", leaked), ("missing", missing), ("different", wrong))
        if ds
    ]
    return (
        f"table differs from its plan (epoch {plan.epoch}): " + "; ".join(parts) if parts else None
    )


def installed_mismatches(
    fabric: Fabric,
    truth: Mapping[str, Iterable[int]],
    fleet: SimulatedFleet,
    agents_down: Iterable[str],
    pairs: Iterable[tuple[str, str]],
) -> list[Mismatch | str]:
    """Everything wrong with what ``fleet``'s agents installed: :func:`check_installed` on
    every host's table for ``pairs`` against ``truth`` (host -> rails unusable in fact), then,
    for each running agent (not in ``agents_down``) with an applied plan, its table against
    that plan (:func:`table_drift`, as ``"table: <host> <drift>"``)."""
    down = set(agents_down)
    tables = {h: t.routes for h, t in fleet.tables.items()}
    found: list[Mismatch | str] = list(check_installed(fabric, truth, tables, pairs))
    for host, agent in sorted(fleet.agents.items()):
        if host not in down and agent.applier.plan is not None:
            drift = table_drift(
                agent.applier.plan, agent.applier.locally_down, fleet.tables[host].routes
            )
            if drift:
                found.append(f"table: {host} {drift}")
    return found
