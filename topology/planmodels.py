"""Plan models: the solver's rail choices -> the pydantic messages on the bus.

Consumes a host's :class:`~linkguard.topology.hostbase.HostBase` and its row of peer
contributions (the rail choices of :mod:`linkguard.topology.solver`: (GPU, rail or None) per
endpoint that needs a /32, and per local rail the ones its backup changes). Produces the host's
:class:`~linkguard.models.Plan` (with one :class:`~linkguard.models.Backup` per usable local
port) and an impaired host's :class:`~linkguard.models.PeerRoutes`. Models are built with
``model_construct`` (the solver's output is valid by construction, as before this split), and
the frozen route and rail-assignment models are shared between plans. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from ipaddress import IPv4Address

from linkguard.models import (
    Backup,
    PeerClass,
    PeerRoutes,
    Plan,
    RailAssignment,
    RouteAssignment,
    SharedRoutes,
)
from linkguard.topology.hostbase import HostBase, IndexedHost

__all__ = ["Contrib", "PlanModels", "peer_routes_model"]

#: What peer P adds to host H's plan: the rail choices of the solver's ``_template`` (endpoints
#: needing a /32 and the backups that change them); made into route models by
#: :meth:`PlanModels.plan`.
Contrib = tuple[tuple, tuple]


class PlanModels:
    """Builds plans, sharing one frozen model per route and rail assignment (cached for the
    solver's life: the cache is bounded by peers x GPUs x rails x netdevs)."""

    def __init__(self) -> None:
        self._route_cache: dict[tuple[int, int, int, str | None], RouteAssignment] = {}
        self._ra_cache: dict[tuple[int, int, int], RailAssignment] = {}
        #: one frozen :class:`~linkguard.models.PeerClass` per rail-choice tuple: the hosts
        #: of one leaf share their classes (a leaf failure: 32 peers x up to 56 classes,
        #: built once instead of 32 times)
        self.peer_classes: dict[Contrib, PeerClass] = {}

    def plan(
        self,
        h: IndexedHost,
        base: HostBase,
        row: Mapping[int, Contrib],
        hosts: Sequence[IndexedHost],
        *,
        epoch: int,
        now: float,
        shared: SharedRoutes | None = None,
    ) -> Plan:
        """H's :class:`~linkguard.models.Plan`: ``base`` (its assignments, prefix routes and
        their backup changes) and ``row`` (peer position -> the rail choices that peer adds:
        /32 routes, ``unreachable``, backup routes and ``withdraw``); ``hosts`` by position.
        ``epoch``, ``now`` (wall-clock s) and ``shared`` are copied in."""
        routes: list[RouteAssignment] = []
        unreachable: list[IPv4Address] = []
        bk: dict[int, tuple[list[RouteAssignment], list[IPv4Address]]] = {
            r: ([], []) for r in h.rails if r in base.usable
        }
        rm = self.route
        for p in sorted(row):
            plan_t, backups_t = row[p]
            ph = hosts[p]
            eps = ph.inv.endpoints
            for g, x in plan_t:
                if x is None:
                    unreachable.append(eps[g])
                else:
                    routes.append(rm(h, ph, g, x))
            for r, ents in backups_t:
                rr, ww = bk[r]
                for g, x in ents:
                    if x is None:
                        ww.append(eps[g])
                    else:
                        rr.append(rm(h, ph, g, x))
        backups = []
        for r, (rr, ww) in bk.items():
            hca = h.by_rail[r]
            ra, pr = base.backups[r]
            backups.append(
                Backup.model_construct(
                    hca=hca.hca,
                    port=hca.port,
                    rail=r,
                    rail_assignments=[self.rail_assignment(h, g, x) for g, x in ra],
                    prefix_routes=list(pr),
                    routes=rr,
                    withdraw=ww,
                )
            )
        return Plan.model_construct(
            host=h.inv.host,
            epoch=epoch,
            issued_at=now,
            rail_assignments=[self.rail_assignment(h, g, x) for g, x in base.assignments],
            prefix_routes=list(base.prefix_routes),
            routes=routes,
            backups=backups,
            unreachable=unreachable,
            shared=shared,
        )

    def rail_assignment(self, h: IndexedHost, g: int, x: int) -> RailAssignment:
        """GPU g of H carried by the HCA of rail x (one shared frozen model per host, GPU, rail)."""
        key = (h.pos, g, x)
        m = self._ra_cache.get(key)
        if m is None:
            hca = h.by_rail[x]
            m = self._ra_cache[key] = RailAssignment.model_construct(
                gpu=g,
                endpoint=h.inv.endpoints[g],
                hca=hca.hca,
                port=hca.port,
                rail=x,
                home_rail=h.home[g],
            )
        return m

    def route(self, h: IndexedHost, p: IndexedHost, g: int, x: int) -> RouteAssignment:
        """H -> endpoint g of P out of rail x. Frozen models are shared between plans: one
        object per (peer, GPU, rail, netdev)."""
        netdev = h.by_rail[x].netdev
        key = (p.pos, g, x, netdev)
        m = self._route_cache.get(key)
        if m is None:
            gateway = p.by_rail[x].address
            assert gateway is not None  # a Fabric's every HCA has an address (its validation)
            m = RouteAssignment.model_construct(
                destination=p.inv.endpoints[g],
                peer=p.inv.host,
                peer_gpu=g,
                rail=x,
                home_rail=p.home[g],
                netdev=netdev,
                gateway=gateway,
            )
            self._route_cache[key] = m
        return m


def peer_routes_model(
    ph: IndexedHost,
    classes: Sequence[Contrib],
    *,
    position: int,
    modulus: int,
    degraded: list[int],
    epoch: int,
    now: float,
    cache: dict[Contrib, PeerClass] | None = None,
) -> PeerRoutes:
    """The :class:`~linkguard.models.PeerRoutes` of impaired host ``ph``: one
    :class:`~linkguard.models.PeerClass` per residue class, from that class's ``(plan,
    backups)`` rail choices (a route's rail -1 = unreachable); ``degraded`` (the fabric's
    degraded rails, sorted), ``epoch`` and ``now`` (wall-clock s) copied in. ``cache``:
    classes built before, by rail choices (frozen models, shared; cleared past 100,000)."""
    cache = {} if cache is None else cache
    if len(cache) > 100_000:  # bound memory over long runs of odd failures
        cache.clear()
    out = []
    for t in classes:
        pc = cache.get(t)
        if pc is None:
            plan_t, backups_t = t
            pc = cache[t] = PeerClass.model_construct(
                routes=[v for g, x in plan_t for v in (g, -1 if x is None else x)],
                backups=[
                    v for r, es in backups_t for g, x in es for v in (r, g, -1 if x is None else x)
                ],
            )
        out.append(pc)
    return PeerRoutes.model_construct(
        host=ph.inv.host,
        epoch=epoch,
        issued_at=now,
        position=position,
        modulus=modulus,
        endpoints=[str(e) for e in ph.inv.endpoints],
        home_rails=list(ph.home),
        addresses={r: str(ph.by_rail[r].address) for r in ph.rails},
        classes=out,
        degraded=degraded,
    )
