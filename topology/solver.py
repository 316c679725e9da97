"""The pure solver: fabric + which rails each host cannot use -> one plan per host.

Consumes: a :class:`~linkguard.topology.fabric.Fabric` and ``unusable[host]`` (rails that host
cannot use now; a host not listed can use all its rails). Produces: a
:class:`~linkguard.models.Plan` per host with rail assignments (GPU -> HCA port), routes to every
peer endpoint (egress rail, local netdev, gateway = the peer's address on that rail), the
destinations with no surviving rail (``unreachable``) and one precomputed :class:`Backup` per
usable local port. No I/O, no clock: ``epoch`` and ``now`` come from the caller; the same input
always gives the same plans.

Rules (rails of a host are its HCAs' rails; ``home(P, g)`` = the ``g % n``-th of P's n sorted
rails, which is rail ``g % R`` on a regular fabric):

- Rail assignment of local GPU g: its home HCA if usable; else the usable local HCA on the GPU's
  NUMA node (``gpu_numa[g]``, else the home HCA's node) first, then the one carrying the fewest
  GPUs moved so far (GPUs in ascending order), then the lowest rail. A GPU with no usable HCA
  gets no rail assignment.
- Route from H to endpoint (P, g) with home rail r: rail r when both H and P can use it. Else
  the survivors ``S`` = rails both can use, ordered same NUMA node as the failed HCA first (the
  HCA of rail r on the side that lost it, H when both did), then by rail; the route takes
  ``S[i % len(S)]`` with ``i = offset * k + j``: ``offset`` is the circular distance in fabric
  order from the failed side to the other host (0 for the next host), ``k`` the number of P's
  GPUs homed on r, ``j`` the rank of g among them. The routes one failed rail displaces get
  consecutive ``i`` from every viewpoint (the failed host's own routes to all peers, and all
  peers' routes towards it), so they spread round-robin over the survivors: with 1 of 8 rails
  lost and 32 hosts, the busiest surviving NIC goes from 31 to 36 routes (ceil(31 * 8/7)), not
  62, and the remainder lands on same-NUMA survivors. ``S`` empty -> ``unreachable``.
- Backups: for each usable local port, H is solved again with that rail added to its own
  unusable set (peers unchanged: the fast path only uses local knowledge); the backup lists the
  rail assignments and routes that differ and ``withdraw`` for destinations that lose their
  last rail. Only routes whose rail or survivor set can change are recomputed (routes on their
  home rail that is not the one going down stay as they are, exactly as a full re-solve keeps
  them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from linkguard.models import (
    Backup,
    HCAInfo,
    HostInventory,
    Plan,
    RailAssignment,
    RouteAssignment,
)
from linkguard.topology.fabric import Fabric

__all__ = ["load_report", "solve"]


@dataclass(frozen=True, slots=True)
class _Host:
    inv: HostInventory
    pos: int
    rails: tuple[int, ...]  # sorted
    by_rail: dict[int, HCAInfo]
    home: tuple[int, ...]  # home rail per GPU
    gpu_numa: tuple[int | None, ...]
    # per GPU: (rank among the GPUs homed on the same rail, number of GPUs homed on that rail)
    rank: tuple[tuple[int, int], ...]
    home_set: frozenset[int]
    netdevs: tuple[str | None, ...]  # local netdev per rail, in rail order (a cache key)


def _index(fabric: Fabric) -> dict[str, _Host]:
    out: dict[str, _Host] = {}
    for pos, inv in enumerate(fabric.hosts):
        by_rail = {c.rail: c for c in inv.hcas}
        rails = tuple(sorted(by_rail))
        n = len(rails)
        home = tuple(rails[g % n] for g in range(len(inv.endpoints))) if n else ()
        per_rail = Counter(home)
        seen: Counter[int] = Counter()
        rank = []
        for r in home:
            rank.append((seen[r], per_rail[r]))
            seen[r] += 1
        numa = []
        for g in range(len(inv.endpoints)):
            v = inv.gpu_numa[g] if g < len(inv.gpu_numa) else None
            if v is None and home:
                v = by_rail[home[g]].numa_node
            numa.append(v)
        out[inv.host] = _Host(
            inv,
            pos,
            rails,
            by_rail,
            home,
            tuple(numa),
            tuple(rank),
            frozenset(home),
            tuple(by_rail[r].netdev for r in rails),
        )
    return out


def _rail_assignments(h: _Host, usable: frozenset[int]) -> list[RailAssignment]:
    moved: Counter[int] = Counter()
    out = []
    for g, ep in enumerate(h.inv.endpoints):
        r = h.home[g]
        if r in usable:
            x = r
        else:
            cands = [c for c in h.rails if c in usable]
            if not cands:
                continue
            numa = h.gpu_numa[g]
            x = min(
                cands,
                key=lambda c: (h.by_rail[c].numa_node != numa or numa is None, moved[c], c),
            )
            moved[x] += 1
        hca = h.by_rail[x]
        out.append(
            RailAssignment.model_construct(
                gpu=g, endpoint=ep, hca=hca.hca, port=hca.port, rail=x, home_rail=r
            )
        )
    return out


#: A route as a plain tuple while solving: (rail, netdev, gateway) or None when unreachable.
_Choice = tuple[int, str | None, object] | None


class _Solver:
    def __init__(self, fabric: Fabric, unusable: Mapping[str, frozenset[int]]) -> None:
        self.fabric = fabric
        self.hosts = _index(fabric)
        self.order = [self.hosts[n] for n in fabric.host_names]
        self.n = len(self.order)
        self.unusable = unusable
        self._usable = {
            name: frozenset(c for c in h.rails if c not in unusable.get(name, frozenset()))
            for name, h in self.hosts.items()
        }
        # (rails usable on both ends, failed rail, failed host position) -> ordered survivors
        self._survivors: dict[tuple[frozenset[int], int, int], list[int]] = {}
        self._route_cache: dict[tuple[int, int, int, str | None], RouteAssignment] = {}
        self._home_cache: dict[tuple[int, tuple[str | None, ...]], list[RouteAssignment]] = {}

    @staticmethod
    def _order_survivors(failed: _Host, both: frozenset[int], r: int) -> list[int]:
        """Survivors on the failed HCA's NUMA node first, then the rest, each by rail."""
        hca = failed.by_rail.get(r)
        numa = hca.numa_node if hca is not None else None

        def key(c: int) -> tuple[bool, int]:
            other = failed.by_rail.get(c)
            same = numa is not None and other is not None and other.numa_node == numa
            return (not same, c)

        return sorted(both, key=key)

    def choose(self, h: _Host, uh: frozenset[int], p: _Host, up: frozenset[int], g: int) -> _Choice:
        """Egress rail for H -> endpoint g of P (see module docstring)."""
        r = p.home[g]
        if r in uh and r in up and r in h.by_rail:
            x = r
        else:
            if r not in uh and r in h.by_rail:
                failed, other = h, p
            elif r not in up and r in p.by_rail:
                failed, other = p, h
            else:  # rail missing on one side (irregular fabric): index from H
                failed, other = h, p
            both = uh & up
            key = (both, r, failed.pos)
            s = self._survivors.get(key)
            if s is None:
                s = self._order_survivors(failed, both, r)
                self._survivors[key] = s
            if not s:
                return None
            j, k = p.rank[g]
            offset = (other.pos - failed.pos - 1) % self.n
            x = s[(offset * k + j) % len(s)]
        hca = h.by_rail[x]
        return (x, hca.netdev, p.by_rail[x].address)

    def home_choice(self, h: _Host, p: _Host, g: int) -> tuple[int, str | None, object]:
        r = p.home[g]
        return (r, h.by_rail[r].netdev, p.by_rail[r].address)

    def route_model(self, p: _Host, g: int, c: tuple[int, str | None, object]) -> RouteAssignment:
        # Frozen models are shared between plans: one object per (peer, GPU, rail, netdev).
        key = (p.pos, g, c[0], c[1])
        m = self._route_cache.get(key)
        if m is None:
            m = RouteAssignment.model_construct(
                destination=p.inv.endpoints[g],
                peer=p.inv.host,
                peer_gpu=g,
                rail=c[0],
                home_rail=p.home[g],
                netdev=c[1],
                gateway=c[2],
            )
            self._route_cache[key] = m
        return m

    def _home_routes(self, h: _Host, p: _Host) -> list[RouteAssignment]:
        """H's routes to all of P's endpoints on their home rails (cached per netdev naming)."""
        key = (p.pos, h.netdevs)
        models = self._home_cache.get(key)
        if models is None:
            models = [
                self.route_model(p, g, self.home_choice(h, p, g))
                for g in range(len(p.inv.endpoints))
            ]
            self._home_cache[key] = models
        return models

    def plan(self, name: str, *, epoch: int, now: float) -> Plan:
        h = self.hosts[name]
        uh = self._usable[name]
        routes: list[RouteAssignment] = []
        unreachable = []
        # For the backups: routes on their home rail, per rail, and every other one (moved or
        # unreachable) with its current choice.
        on_home: dict[int, list[tuple[_Host, int]]] = {}
        off_home: dict[tuple[int, int], _Choice] = {}
        for p in self.order:
            if p is h:
                continue
            up = self._usable[p.inv.host]
            both = uh & up
            if p.home_set <= both:
                routes.extend(self._home_routes(h, p))
                for g, r in enumerate(p.home):
                    on_home.setdefault(r, []).append((p, g))
                continue
            for g in range(len(p.inv.endpoints)):
                c = self.choose(h, uh, p, up, g)
                if c is None:
                    unreachable.append(p.inv.endpoints[g])
                    off_home[(p.pos, g)] = None
                    continue
                routes.append(self.route_model(p, g, c))
                if c[0] == p.home[g]:
                    on_home.setdefault(c[0], []).append((p, g))
                else:
                    off_home[(p.pos, g)] = c
        assignments = _rail_assignments(h, uh)
        moved = [(self.order[pos], g) for pos, g in off_home]
        backups = []
        for rail in h.rails:
            if rail not in uh:
                continue
            # Routes that can change when `rail` goes down too: those on it as their home rail
            # and every moved one (its survivor set shrinks). A route on its home rail r != rail
            # keeps r in a full re-solve as well.
            redo = on_home.get(rail, [])
            if moved:
                redo = sorted(redo + moved, key=lambda pg: (pg[0].pos, pg[1]))
            backups.append(self._backup(h, uh, rail, off_home, redo, assignments))
        return Plan(
            host=name,
            epoch=epoch,
            issued_at=now,
            rail_assignments=assignments,
            routes=routes,
            backups=backups,
            unreachable=unreachable,
        )

    def _backup(
        self,
        h: _Host,
        uh: frozenset[int],
        rail: int,
        off_home: dict[tuple[int, int], _Choice],
        redo: list[tuple[_Host, int]],
        assignments: list[RailAssignment],
    ) -> Backup:
        less = uh - {rail}
        routes = []
        withdraw = []
        for p, g in redo:
            c = self.choose(h, less, p, self._usable[p.inv.host], g)
            key = (p.pos, g)
            old = off_home[key] if key in off_home else self.home_choice(h, p, g)
            if c == old:
                continue
            if c is None:
                withdraw.append(p.inv.endpoints[g])
            else:
                routes.append(self.route_model(p, g, c))
        before = {a.gpu: a for a in assignments}
        changed = [a for a in _rail_assignments(h, less) if before.get(a.gpu) != a]
        hca = h.by_rail[rail]
        return Backup(
            hca=hca.hca,
            port=hca.port,
            rail=rail,
            rail_assignments=changed,
            routes=routes,
            withdraw=withdraw,
        )


def solve(
    fabric: Fabric,
    unusable: Mapping[str, frozenset[int]],
    *,
    epoch: int,
    now: float,
    hosts: Iterable[str] | None = None,
) -> dict[str, Plan]:
    """Plans for ``hosts`` (default: every host of ``fabric``, in fabric order).

    ``unusable[host]`` is the set of rails that host cannot use now (down, held down,
    suppressed); rails not listed, and hosts not listed, are usable. Unknown hosts in
    ``unusable`` are ignored; an unknown name in ``hosts`` raises KeyError. ``epoch`` and ``now``
    (wall-clock seconds) are copied into every plan. Deterministic: the same arguments give
    equal plans. See the module docstring for the rules.
    """
    s = _Solver(fabric, unusable)
    names = fabric.host_names if hosts is None else list(hosts)
    out: dict[str, Plan] = {}
    for name in names:
        fabric.host(name)  # KeyError with a clear message
        out[name] = s.plan(name, epoch=epoch, now=now)
    return out


def load_report(plans: Mapping[str, Plan]) -> dict[str, dict[int, int]]:
    """Per host, the number of routes per egress rail (rails with no route are left out)."""
    return {
        host: dict(sorted(Counter(r.rail for r in plan.routes).items()))
        for host, plan in plans.items()
    }
