"""The pure solver: fabric + which rails each host cannot use -> one plan per host, kept up to
date incrementally.

Consumes: a :class:`~linkguard.topology.fabric.Fabric` and ``unusable[host]`` (rails that host
cannot use now; a host not listed can use all its rails), then changes of ``unusable`` one batch
at a time (:meth:`Solver.update`). Produces: the hosts whose plan changed and, on demand, their
:class:`~linkguard.models.Plan` (rail assignments, routes, ``unreachable``, one precomputed
:class:`~linkguard.models.Backup` per usable local port). No I/O, no clock: ``epoch`` and ``now``
come from the caller; the same input always gives the same plans, whether reached by one full
build or by any sequence of updates (the property tests check exactly that).

Two plan forms:

- **Prefix form** (the fabric has ``endpoint_subnets``: rail-major endpoint addressing, as the
  generator makes): host H gets one :class:`~linkguard.models.PrefixRoute` per rail d: on-link
  out of its rail-d netdev when it can use d, else multipath over all its usable rails, else
  ``unreachable``. A /32 exception is added for endpoint (P, g) with home rail d only when that
  prefix route would not deliver it: ``d`` usable at H but not at P, or ``d`` not usable at H
  and P cannot use every rail H's multipath spreads over. Multipaths leave out *degraded*
  rails (ones at least ``degraded_after`` hosts cannot use, e.g. a leaf's worth) unless that
  leaves nothing: a leaf failure then costs every other plan one /32 per host of that leaf,
  and its backups a few, instead of one per host and backup. Only *impaired* peers (hosts that
  cannot use every rail of the fabric) can need exceptions, so a plan's size grows with the
  failures, not with the fleet, and an event on host P touches one small, shared computation
  per class of host instead of every (host, peer) pair.
- **Explicit form** (no ``endpoint_subnets``: imported or hand-written fabrics): every peer
  endpoint gets a /32 route, as if every endpoint were its own prefix that is never covered.

Choice of the egress rail where a route cannot use its home rail r (``home(P, g)`` = the
``g % n``-th of P's n sorted rails): the survivors ``S`` = rails both ends can use, ordered by
nearness to the failed HCA (the HCA of rail r on the side that lost it, H when both did): on its
PCIe switch first (``HCAInfo.pcie_switch``), then on its NUMA node, then the rest, each tier by
rail; the route takes ``S[(offset * k + j) % len(S)]``: ``offset`` is the circular
distance in fabric order from the side that lost r to the other host (0 for the next host;
counted as ``-(o + 2)`` when H lost r, with ``o`` below: the same distance shifted by N), ``k``
the number of P's GPUs homed on r and ``j`` the rank of g among them. The routes one failed rail
displaces get consecutive indices from every viewpoint (the failed host's own routes to all
peers, and all peers' routes towards it), so they spread round-robin over the survivors: with
1 of 8 rails lost the busiest survivor carries at most ceil(8/7) of its normal load in routes.
``S`` empty -> ``unreachable``. Since both offsets of a pair follow from
``o = (pos(H) - pos(P) - 1) mod N``, the choices for (H, P) depend on the positions only through
``o mod lcm(a, a - 1)`` (``a`` = rails usable at both; at most 56 classes on 8 rails): the solver
computes them once per class and shares them, so a leaf failure costs one computation per class
and peer, not one per (host, peer).

Rail assignment of local GPU g: its home HCA if usable; else the usable local HCA on the GPU's
PCIe switch (``gpu_pcie_switch[g]``, else the home HCA's ``pcie_switch``) first, then one on the
GPU's NUMA node (``gpu_numa[g]``, else the home HCA's node), then the one carrying the fewest
GPUs moved so far (GPUs in ascending order), then the lowest rail. No usable HCA: no assignment.
An unknown switch or node (None) matches nothing: without switch ids (the default) the order is
NUMA node, load, rail. The host layout (:mod:`linkguard.layout`, read from sysfs or an NCCL
topology file) fills switch ids and nodes into a fabric's inventories
(:func:`~linkguard.layout.annotate_inventory`).

Backups (the agent's fast path, local knowledge only): for each usable local rail r, H is
solved again with r added to its own unusable set (peers unchanged); the backup lists the prefix
routes, rail assignments and /32 routes that differ, and ``withdraw`` for destinations that lose
their last rail. An exception that stays valid is kept rather than re-spread.

Returning ports: the rules are static, so once a rail is usable again (after the agent's
hold-down) every plan returns to exactly what it was before the failure, in one step.
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network

from linkguard.models import (
    Backup,
    HCAInfo,
    HostInventory,
    PeerClass,
    PeerRoutes,
    Plan,
    PrefixRoute,
    RailAssignment,
    RouteAssignment,
    SharedRoutes,
)
from linkguard.topology.fabric import Fabric, home_rails

__all__ = ["PlanLookup", "Solver", "egress", "load_report", "nic_load", "solve"]


@dataclass(frozen=True, slots=True)
class _Host:
    inv: HostInventory
    pos: int
    rails: tuple[int, ...]  # sorted
    by_rail: dict[int, HCAInfo]
    home: tuple[int, ...]  # home rail per GPU
    gpu_numa: tuple[int | None, ...]
    gpu_switch: tuple[str | None, ...]  # PCIe switch per GPU
    # per GPU: (rank among the GPUs homed on the same rail, number of GPUs homed on that rail)
    rank: tuple[tuple[int, int], ...]
    # what the choice of a route depends on besides the usable sets: rail, netdev, NUMA node,
    # PCIe switch
    sig: tuple[tuple[int, str | None, int | None, str | None], ...]
    rail_set: frozenset[int]
    home_set: frozenset[int]


def _index(fabric: Fabric) -> list[_Host]:
    out = []
    for pos, inv in enumerate(fabric.hosts):
        by_rail = {c.rail: c for c in inv.hcas}
        rails = tuple(sorted(by_rail))
        home = tuple(home_rails(inv))
        per_rail = Counter(home)
        seen: Counter[int] = Counter()
        rank = []
        for r in home:
            rank.append((seen[r], per_rail[r]))
            seen[r] += 1
        numa = []
        switch = []
        for g in range(len(inv.endpoints)):
            v = inv.gpu_numa[g] if g < len(inv.gpu_numa) else None
            if v is None and home:
                v = by_rail[home[g]].numa_node
            numa.append(v)
            sw = inv.gpu_pcie_switch[g] if g < len(inv.gpu_pcie_switch) else None
            if sw is None and home:
                sw = by_rail[home[g]].pcie_switch
            switch.append(sw)
        sig = tuple(
            (r, by_rail[r].netdev, by_rail[r].numa_node, by_rail[r].pcie_switch) for r in rails
        )
        out.append(
            _Host(
                inv,
                pos,
                rails,
                by_rail,
                home,
                tuple(numa),
                tuple(switch),
                tuple(rank),
                sig,
                frozenset(rails),
                frozenset(home),
            )
        )
    return out


def _rail_choices(h: _Host, usable: frozenset[int]) -> tuple[tuple[int, int], ...]:
    """(GPU, rail of the HCA that carries it) for every GPU that has a usable HCA."""
    moved: Counter[int] = Counter()
    out = []
    for g in range(len(h.home)):
        r = h.home[g]
        if r in usable:
            x = r
        else:
            cands = [c for c in h.rails if c in usable]
            if not cands:
                continue
            numa, sw = h.gpu_numa[g], h.gpu_switch[g]
            x = min(
                cands,
                key=lambda c: (
                    sw is None or h.by_rail[c].pcie_switch != sw,
                    numa is None or h.by_rail[c].numa_node != numa,
                    moved[c],
                    c,
                ),
            )
            moved[x] += 1
        out.append((g, x))
    return tuple(out)


#: Default of :attr:`Solver.degraded_after`: below this, a rail lost on a few hosts stays in
#: every multipath (best spread); from it on (a leaf reboot loses one rail on a whole SU of 31-32
#: hosts) multipaths avoid the rail, which keeps plans and backups free of one /32 per
#: affected peer (a plan after a leaf failure: ~70 routes instead of ~400).
DEGRADED_AFTER_HOSTS = 8

#: Marker: the endpoint is delivered by the plan's prefix route (no /32 needed).
_DEFAULT = "default"
_NOTHING: tuple[tuple, tuple] = ((), ())


#: What peer P adds to host H's plan: the rail choices of :meth:`Solver._template` (endpoints
#: needing a /32 and the backups that change them); made into route models by :meth:`Solver.plan`.
_Contrib = tuple[tuple, tuple]


@dataclass(slots=True)
class _Base:
    """The part of H's plan that depends on H alone: rail assignments, prefix routes and the
    backups' changes of both."""

    usable: frozenset[int]
    assignments: tuple[tuple[int, int], ...]  # (GPU, rail)
    prefix_routes: tuple[PrefixRoute, ...]
    # rail -> (changed (GPU, rail) assignments, changed prefix routes) when that rail goes down
    backups: dict[int, tuple[tuple[tuple[int, int], ...], tuple[PrefixRoute, ...]]]


@dataclass
class Solver:
    """Plans of every host of ``fabric``, kept current under changes of the unusable rails.

    ``Solver(fabric, unusable)`` does the full build (start-up, and the reference the
    incremental result is checked against); :meth:`update` applies a batch of changes and
    returns the hosts whose plan changed; :meth:`plan` materializes one host's
    :class:`~linkguard.models.Plan`. Not thread-safe: one caller at a time.
    """

    fabric: Fabric
    unusable: Mapping[str, Iterable[int]] = field(default_factory=dict)
    #: a rail that at least this many hosts cannot use is *degraded*: multipath prefix routes
    #: leave it out (see the module docstring); 0 disables
    degraded_after: int = DEGRADED_AFTER_HOSTS
    #: compact plans for whole hosts + one shared :class:`~linkguard.models.PeerRoutes` per
    #: impaired host, where the fabric allows (see :meth:`compact_plan`)
    shared: bool = True

    def __post_init__(self) -> None:
        self._hosts = _index(self.fabric)
        self._pos = {h.inv.host: h.pos for h in self._hosts}
        self.n = len(self._hosts)
        self.all_rails = frozenset(self.fabric.rails)
        self.prefix_mode = bool(self.fabric.endpoint_subnets)
        self._subnets: tuple[tuple[int, IPv4Network], ...] = tuple(
            sorted(self.fabric.endpoint_subnets.items())
        )
        self._survivors: dict[tuple, tuple[int, ...]] = {}
        self._templates: dict[tuple, tuple[tuple, tuple]] = {}
        self._route_cache: dict[tuple[int, int, int, str | None], RouteAssignment] = {}
        self._prefix_cache: dict[tuple, tuple[PrefixRoute, ...]] = {}
        self._base_cache: dict[tuple, _Base] = {}
        self._ra_cache: dict[tuple[int, int, int], RailAssignment] = {}
        given = {k: frozenset(v) for k, v in self.unusable.items()}
        self._usable = [
            frozenset(c for c in h.rails if c not in given.get(h.inv.host, ())) for h in self._hosts
        ]
        self._impaired = {h.pos for h in self._hosts if self._is_impaired(h.pos)}
        self._lacking: Counter[int] = Counter()
        for h in self._hosts:
            self._lacking.update(h.rail_set - self._usable[h.pos])
        self.degraded = self._degraded_rails()
        self._base = [self._make_base(h) for h in self._hosts]
        self._contrib: list[dict[int, _Contrib]] = [{} for _ in self._hosts]
        # hosts grouped by (sig id, usable rails): a peer's contribution is the same for every
        # host of a group whose positions agree modulo the survivor counts (module docstring)
        sids: dict[tuple, int] = {}
        self._sid = [sids.setdefault(h.sig, len(sids)) for h in self._hosts]
        self._groups: dict[tuple[int, frozenset[int]], list[int]] = {}
        for h in self._hosts:
            self._groups.setdefault((self._sid[h.pos], self._usable[h.pos]), []).append(h.pos)
        # (group, m) -> position modulo m -> sorted positions; valid until the groups change
        self._residues: dict[tuple, dict[int, list[int]]] = {}
        self._cover_cache: dict[tuple, tuple] = {}
        for p in sorted(self._impaired):
            self._column(p, set(), fresh=True)
        # shared peer routes: prefix form, every host with the same rails and netdevs; the
        # viewers are the whole hosts of the most common hardware signature
        self.shared_mode = (
            self.shared
            and self.prefix_mode
            and all(h.rail_set == self.all_rails for h in self._hosts)
            and all(c.netdev is not None for h in self._hosts for c in h.by_rail.values())
        )
        counts = Counter(self._sid)
        self._ref_sid = max(counts, key=lambda k: (counts[k], -k)) if counts else -1
        self._ref_rep = self._sid.index(self._ref_sid) if counts else -1
        #: positions whose :meth:`peer_routes` may have changed since :meth:`take_changed_peers`
        self._peers_changed: set[int] = set(self._impaired) if self.shared_mode else set()
        #: positions whose compact plan may differ from their full plan's base since
        #: :meth:`take_changed_compact` (a whole host's compact plan depends on it alone)
        self._compact_changed: set[int] = set(range(self.n))

    # ----------------------------------------------------------------------------------------
    # public API

    @property
    def host_names(self) -> list[str]:
        return [h.inv.host for h in self._hosts]

    def unusable_of(self, name: str) -> frozenset[int]:
        """Rails of ``name`` the solver currently counts as unusable; KeyError if unknown."""
        h = self._hosts[self._index_of(name)]
        return h.rail_set - self._usable[h.pos]

    def update(self, unusable: Mapping[str, Iterable[int]]) -> list[str]:
        """Apply a batch: ``unusable[host]`` is the host's complete new set of unusable rails
        (hosts not listed keep theirs; unknown hosts and rails the host lacks are ignored).
        Returns the hosts whose plan changed, in fabric order."""
        changed_pos = []
        old_usable: dict[int, frozenset[int]] = {}
        for name, rails in unusable.items():
            p = self._pos.get(name)
            if p is None:
                continue
            h = self._hosts[p]
            bad = frozenset(rails)
            u = frozenset(c for c in h.rails if c not in bad)
            if u != self._usable[p]:
                old_usable.setdefault(p, self._usable[p])
                self._lacking.subtract(h.rail_set - self._usable[p])
                self._lacking.update(h.rail_set - u)
                self._usable[p] = u
                changed_pos.append(p)
        if not changed_pos:
            return []
        if self.shared_mode:
            self._peers_changed.update(changed_pos)
        self._compact_changed.update(changed_pos)
        was = {p: p in self._impaired for p in changed_pos}
        for p in changed_pos:
            if self._is_impaired(p):
                self._impaired.add(p)
            else:
                self._impaired.discard(p)
        dirty: set[int] = set()
        for p in changed_pos:  # move to the new group
            key = (self._sid[p], old_usable[p])
            members = self._groups[key]
            members.remove(p)
            if not members:
                del self._groups[key]
            insort(self._groups.setdefault((self._sid[p], self._usable[p]), []), p)
        self._residues.clear()
        degraded = self._degraded_rails()
        if degraded != self.degraded:  # every multipath may change: rebuild all, compare
            self.degraded = degraded
            if self.shared_mode:
                self._peers_changed.update(self._impaired)
            self._compact_changed.update(range(self.n))
            return self._rebuild()
        # the changed hosts themselves: everything is recomputed
        for p in changed_pos:
            h = self._hosts[p]
            old_base, old_row = self._base[p], self._contrib[p]
            self._base[p] = self._make_base(h)
            self._contrib[p] = {}
            self._fill_row(h)
            if old_base != self._base[p] or old_row != self._contrib[p]:
                dirty.add(p)
        # everyone else: only the columns of the changed peers
        skip = {k for k, members in self._groups.items() if all(m in was for m in members)}
        for p in sorted(changed_pos):
            if was[p] or p in self._impaired:
                self._column(p, dirty, skip, fresh=not was[p])
        return [self._hosts[p].inv.host for p in sorted(dirty)]

    def _degraded_rails(self) -> frozenset[int]:
        if not self.prefix_mode or self.degraded_after <= 0:
            return frozenset()
        return frozenset(r for r, n in self._lacking.items() if n >= self.degraded_after)

    def _rebuild(self) -> list[str]:
        """Recompute every base and row (the degraded rails changed); the hosts whose plan
        changed, in fabric order."""
        old_base, old_rows = self._base, self._contrib
        self._base = [self._make_base(h) for h in self._hosts]
        self._contrib = [{} for _ in self._hosts]
        for p in sorted(self._impaired):
            self._column(p, set(), fresh=True)
        return [
            h.inv.host
            for h in self._hosts
            if old_rows[h.pos] != self._contrib[h.pos] or old_base[h.pos] != self._base[h.pos]
        ]

    def _multipath(self, usable: frozenset[int]) -> frozenset[int]:
        """The rails a multipath prefix route spreads over: the usable ones that are not
        degraded, or all usable ones when that leaves none."""
        return (usable - self.degraded) or usable

    def _column(
        self, p: int, dirty: set[int], skip: Collection[tuple] = (), *, fresh: bool = False
    ) -> None:
        """Set P's contribution in every host's row (None: removed), one computation per
        residue class of each host group; hosts whose contribution changed go to ``dirty``.
        Groups in ``skip`` hold only hosts whose rows were just rebuilt whole; ``fresh``: no
        row holds an entry for P (it was not impaired)."""
        ph = self._hosts[p]
        up = self._usable[p]
        impaired = p in self._impaired
        rows = self._contrib
        for key, members in self._groups.items():
            if key in skip:
                continue
            a = len(key[1] & up)
            m = math.lcm(a, a - 1) if a > 1 else 1
            for lst in self._classes(key, members, m, p):
                c = self._contribution(self._hosts[lst[0]], ph) if impaired else None
                if fresh:  # P was not impaired: no row has an entry for it yet
                    if c is not None:
                        for pos in lst:
                            rows[pos][p] = c
                        dirty.update(lst)
                    continue
                for pos in lst:
                    row = rows[pos]
                    old = row.get(p)
                    if old is c:
                        continue
                    if c is None:
                        del row[p]
                    else:
                        row[p] = c
                    if old is None or old != c:
                        dirty.add(pos)

    def _classes(self, key: tuple, members: list[int], m: int, p: int) -> Iterable[list[int]]:
        """``members`` other than ``p`` split by their offset from P, ``(pos - p - 1) mod n``,
        modulo ``m``: the hosts of one list get the same contribution from P."""
        by_res = self._residues.get((key, m))
        if by_res is None:  # members by position modulo m (sorted), cached per update
            by_res = {}
            for pos in members:
                by_res.setdefault(pos % m, []).append(pos)
            self._residues[(key, m)] = by_res
        n = self.n
        out: dict[int, list[int]] = {}
        for c, lst in by_res.items():
            i = bisect_right(lst, p)
            after = lst[i:]  # offset pos - p - 1
            before = lst[: i - 1] if i and lst[i - 1] == p else lst[:i]  # offset + n
            if after:
                out.setdefault((c - p - 1) % m, []).extend(after)
            if before:
                out.setdefault((c - p - 1 + n) % m, []).extend(before)
        return out.values()

    def is_shared(self, name: str) -> bool:
        """Does ``name`` get a compact plan (:meth:`compact_plan`)? KeyError if unknown."""
        return self._is_shared(self._index_of(name))

    def _is_shared(self, pos: int) -> bool:
        return (
            self.shared_mode
            and self._sid[pos] == self._ref_sid
            and self._usable[pos] == self._hosts[pos].rail_set
        )

    def compact_plan(self, name: str, *, epoch: int, now: float) -> Plan:
        """What ``name``'s plan is on the bus: for a host in shared mode (prefix form, every
        host with the same rails and netdevs, this one of the most common hardware signature
        and able to use all its rails) the plan without routes to impaired peers, with
        ``shared`` set; they come from those peers' :meth:`peer_routes`, and
        :func:`~linkguard.models.expand_plan` of the two is exactly :meth:`plan`. Any other
        host: :meth:`plan`. KeyError if unknown."""
        pos = self._index_of(name)
        if not self._is_shared(pos):
            return self.plan(name, epoch=epoch, now=now)
        h = self._hosts[pos]
        netdevs: dict[int, str] = {}
        for r in h.rails:
            netdev = h.by_rail[r].netdev
            assert netdev is not None  # shared mode: every HCA of the fabric has a netdev
            netdevs[r] = netdev
        shared = SharedRoutes.model_construct(position=pos, hosts=self.n, netdevs=netdevs)
        return self._plan(h, {}, epoch=epoch, now=now, shared=shared)

    def peer_routes(self, name: str, *, epoch: int, now: float) -> PeerRoutes:
        """The :class:`~linkguard.models.PeerRoutes` of ``name``: for every residue class of
        the whole hosts of the shared signature, the rail choices of :meth:`_template` (the
        same ones their full plans hold); no classes when ``name`` is not impaired or the
        solver is not in shared mode. KeyError if unknown."""
        pos = self._index_of(name)
        ph = self._hosts[pos]
        classes: list[PeerClass] = []
        modulus = 1
        if self.shared_mode and pos in self._impaired:
            rep = self._hosts[self._ref_rep]
            uh = rep.rail_set
            a = len(uh & self._usable[pos])
            modulus = math.lcm(a, a - 1) if a > 1 else 1
            for c in range(modulus):
                plan_t, backups_t = self._template(rep, ph, uh=uh, offset=c)
                classes.append(
                    PeerClass.model_construct(
                        routes=[v for g, x in plan_t for v in (g, -1 if x is None else x)],
                        backups=[
                            v
                            for r, es in backups_t
                            for g, x in es
                            for v in (r, g, -1 if x is None else x)
                        ],
                    )
                )
        return PeerRoutes.model_construct(
            host=ph.inv.host,
            epoch=epoch,
            issued_at=now,
            position=pos,
            modulus=modulus,
            endpoints=[str(e) for e in ph.inv.endpoints],
            home_rails=list(ph.home),
            addresses={r: str(ph.by_rail[r].address) for r in ph.rails},
            classes=classes,
        )

    def take_changed_compact(self) -> set[str]:
        """Hosts in shared mode whose :meth:`compact_plan` may have changed since the last
        call (their own usable rails, or the degraded rails, changed; at first: all); clears
        the set. The compact plan of any other host in shared mode is as it was."""
        out, self._compact_changed = self._compact_changed, set()
        return {self._hosts[p].inv.host for p in out}

    def take_changed_peers(self) -> list[str]:
        """Hosts whose :meth:`peer_routes` may have changed since the last call (at first:
        every impaired host), in fabric order; clears the set. Empty outside shared mode."""
        out, self._peers_changed = sorted(self._peers_changed), set()
        return [self._hosts[p].inv.host for p in out]

    def plan(self, name: str, *, epoch: int, now: float) -> Plan:
        """The current plan of ``name`` (KeyError if unknown) with ``epoch`` and ``issued_at``."""
        h = self._hosts[self._index_of(name)]
        return self._plan(h, self._contrib[h.pos], epoch=epoch, now=now)

    def _plan(
        self,
        h: _Host,
        row: Mapping[int, _Contrib],
        *,
        epoch: int,
        now: float,
        shared: SharedRoutes | None = None,
    ) -> Plan:
        base = self._base[h.pos]
        routes: list[RouteAssignment] = []
        unreachable: list[IPv4Address] = []
        bk: dict[int, tuple[list[RouteAssignment], list[IPv4Address]]] = {
            r: ([], []) for r in h.rails if r in base.usable
        }
        rm = self._route_model
        for p in sorted(row):
            plan_t, backups_t = row[p]
            ph = self._hosts[p]
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
                    rail_assignments=[self._ra_model(h, g, x) for g, x in ra],
                    prefix_routes=list(pr),
                    routes=rr,
                    withdraw=ww,
                )
            )
        return Plan.model_construct(
            host=h.inv.host,
            epoch=epoch,
            issued_at=now,
            rail_assignments=[self._ra_model(h, g, x) for g, x in base.assignments],
            prefix_routes=list(base.prefix_routes),
            routes=routes,
            backups=backups,
            unreachable=unreachable,
            shared=shared,
        )

    def plans(
        self, names: Iterable[str] | None = None, *, epoch: int, now: float
    ) -> dict[str, Plan]:
        """Plans of ``names`` (default: every host, in fabric order)."""
        names = self.host_names if names is None else list(names)
        return {n: self.plan(n, epoch=epoch, now=now) for n in names}

    # ----------------------------------------------------------------------------------------
    # internals

    def _index_of(self, name: str) -> int:
        try:
            return self._pos[name]
        except KeyError:
            raise KeyError(f"no host {name!r} in fabric {self.fabric.name!r}") from None

    def _is_impaired(self, p: int) -> bool:
        """Can P's endpoints need a /32 at some host? Always in explicit form."""
        return (not self.prefix_mode) or self._usable[p] != self.all_rails

    def _prefix_routes(self, h: _Host, usable: frozenset[int]) -> tuple[PrefixRoute, ...]:
        if not self.prefix_mode:
            return ()
        key = (h.sig, usable, self.degraded)
        out = self._prefix_cache.get(key)
        if out is not None:
            return out
        multi = sorted(self._multipath(usable))
        routes = []
        for d, net in self._subnets:
            rails = [d] if d in usable else multi
            routes.append(
                PrefixRoute.model_construct(
                    prefix=net,
                    home_rail=d,
                    rails=list(rails),
                    netdevs=[h.by_rail[r].netdev for r in rails],
                )
            )
        out = tuple(routes)
        self._prefix_cache[key] = out
        return out

    def _make_base(self, h: _Host) -> _Base:
        """H's base; shared by hosts with the same rails, NUMA and PCIe layout and usable set."""
        u = self._usable[h.pos]
        key = (h.sig, h.home, h.gpu_numa, h.gpu_switch, u, self.degraded)
        base = self._base_cache.get(key)
        if base is not None:
            return base
        ra = _rail_choices(h, u)
        pr = self._prefix_routes(h, u)
        backups = {}
        before = dict(ra)
        for r in h.rails:
            if r not in u:
                continue
            less = u - {r}
            ra2 = tuple((g, x) for g, x in _rail_choices(h, less) if before.get(g) != x)
            pr2 = tuple(b for a, b in zip(pr, self._prefix_routes(h, less), strict=True) if a != b)
            backups[r] = (ra2, pr2)
        base = self._base_cache[key] = _Base(u, ra, pr, backups)
        return base

    def _ra_model(self, h: _Host, g: int, x: int) -> RailAssignment:
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

    def _fill_row(self, h: _Host) -> None:
        """H's contributions from every impaired peer (full build of one row)."""
        row = self._contrib[h.pos]
        for p in sorted(self._impaired):
            if p == h.pos:
                continue
            c = self._contribution(h, self._hosts[p])
            if c is not None:
                row[p] = c

    def _covers(self, uh: frozenset[int], up: frozenset[int]) -> tuple:
        """For H (usable ``uh``) and P (``up``): the home rails H's prefix routes deliver, and
        per usable local rail r: (r, uh - {r}, the home rails delivered once r is down too),
        and the home rails delivered in all those cases."""
        key = (uh, up, self.degraded)
        out = self._cover_cache.get(key)
        if out is None:
            rails = self.all_rails | up
            cov = frozenset(d for d in rails if self._covered(uh, up, d))
            bcov = []
            full = cov
            for r in sorted(uh):
                less = uh - {r}
                bc = frozenset(d for d in rails if self._covered(less, up, d))
                bcov.append((r, less, bc))
                full &= bc
            out = self._cover_cache[key] = (cov, tuple(bcov), full)
        return out

    def _covered(self, uh: frozenset[int], up: frozenset[int], d: int) -> bool:
        """Does H's prefix route for rail d deliver to an endpoint of P homed on d?"""
        if not self.prefix_mode:
            return False
        if not uh:
            return True  # the prefix route is `unreachable`: so is every endpoint
        if d in uh:
            return d in up
        return self._multipath(uh) <= up

    def _contribution(self, h: _Host, p: _Host) -> _Contrib | None:
        """P's contribution to H (None when it adds nothing)."""
        t = self._template(h, p)
        return None if t is _NOTHING or (not t[0] and not t[1]) else t

    def _template(
        self,
        h: _Host,
        p: _Host,
        *,
        uh: frozenset[int] | None = None,
        offset: int | None = None,
    ) -> tuple[tuple, tuple]:
        """The rail choices behind P's contribution to H, as ``(plan, backups)``: ``plan`` =
        ((g, rail or None), ...) for P's endpoints that need a /32 (None: unreachable),
        ``backups`` = ((r, ((g, rail or None), ...)), ...) per local rail r whose backup
        changes them. Shared by every (H, P) with the same rails, usable sets, NUMA layout
        and ``pos(H) + pos(P)`` modulo the survivor counts (all a choice depends on).
        ``uh``/``offset`` override H's usable rails and ``(pos(H) - pos(P) - 1) mod N`` (the
        shared :class:`~linkguard.models.PeerRoutes` are computed per residue class)."""
        if uh is None:
            uh = self._usable[h.pos]
        up = self._usable[p.pos]
        cov, bcov, full = self._covers(uh, up)
        if p.home_set <= full:
            return _NOTHING  # every endpoint delivered by the prefix routes, backups too
        a = len(uh & up)
        m = math.lcm(a, a - 1) if a > 1 else 1
        o = (h.pos - p.pos - 1) % self.n if offset is None else offset
        key = (h.sig, uh, p.sig, p.home, up, o % m, self.degraded)
        t = self._templates.get(key)
        if t is not None:
            return t
        plan: list[tuple[int, int | None]] = []
        bk: dict[int, list[tuple[int, int | None]]] = {}
        choose = self._choose
        for g, d in enumerate(p.home):
            if d in cov:
                cur: object = _DEFAULT
            else:
                cur = choose(h, uh, p, up, g, o)
                plan.append((g, cur))
            for r, less, bc in bcov:
                if cur is _DEFAULT:
                    if d in bc:
                        continue  # the prefix route still delivers it
                elif cur is None or cur != r:
                    continue  # still unreachable, or an exception that stays valid: kept
                new = choose(h, less, p, up, g, o)
                if new != cur:
                    bk.setdefault(r, []).append((g, new))
        t = (tuple(plan), tuple((r, tuple(e)) for r, e in sorted(bk.items())))
        if len(self._templates) > 200_000:  # bound memory over long runs of odd failures
            self._templates.clear()
        self._templates[key] = t
        return t

    def _order_survivors(self, failed: _Host, both: frozenset[int], r: int) -> tuple[int, ...]:
        """Survivors on the failed HCA's PCIe switch first, then on its NUMA node, then the
        rest, each by rail."""
        key = (both, r, failed.sig)
        s = self._survivors.get(key)
        if s is not None:
            return s
        hca = failed.by_rail.get(r)
        numa = hca.numa_node if hca is not None else None
        switch = hca.pcie_switch if hca is not None else None

        def order(c: int) -> tuple[bool, bool, int]:
            other = failed.by_rail.get(c)
            near = switch is not None and other is not None and other.pcie_switch == switch
            same = numa is not None and other is not None and other.numa_node == numa
            return (not near, not same, c)

        s = tuple(sorted(both, key=order))
        self._survivors[key] = s
        return s

    def _choose(
        self, h: _Host, uh: frozenset[int], p: _Host, up: frozenset[int], g: int, o: int
    ) -> int | None:
        """Egress rail for H -> endpoint g of P (see module docstring), None if none; ``o`` =
        (pos(H) - pos(P) - 1) mod N, or any number congruent to it modulo the survivor counts."""
        r = p.home[g]
        if r in uh and r in up and r in h.by_rail:
            return r
        if r not in up and r in p.by_rail and not (r not in uh and r in h.by_rail):
            failed, offset = p, o
        else:  # H lost r (or lacks it: irregular fabric); -o - 2 = pos(P) - pos(H) - 1 - N
            failed, offset = h, -o - 2
        s = self._order_survivors(failed, uh & up, r)
        if not s:
            return None
        j, k = p.rank[g]
        return s[(offset * k + j) % len(s)]

    def _route_model(self, h: _Host, p: _Host, g: int, x: int) -> RouteAssignment:
        # Frozen models are shared between plans: one object per (peer, GPU, rail, netdev).
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


def solve(
    fabric: Fabric,
    unusable: Mapping[str, frozenset[int]],
    *,
    epoch: int,
    now: float,
    hosts: Iterable[str] | None = None,
    degraded_after: int = DEGRADED_AFTER_HOSTS,
) -> dict[str, Plan]:
    """Plans for ``hosts`` (default: every host of ``fabric``, in fabric order): a full build.

    ``unusable[host]`` is the set of rails that host cannot use now (down, held down,
    suppressed); rails not listed, and hosts not listed, are usable. Unknown hosts in
    ``unusable`` are ignored; an unknown name in ``hosts`` raises KeyError. ``epoch`` and ``now``
    (wall-clock seconds) are copied into every plan. Deterministic: the same arguments give
    equal plans. See the module docstring for the rules.
    """
    s = Solver(fabric, unusable, degraded_after=degraded_after)
    return s.plans(hosts, epoch=epoch, now=now)


class PlanLookup:
    """The rails one plan sends destinations out of, by longest prefix: a destination's /32
    route, else ``()`` when it is listed unreachable, else the rails of the prefix route
    covering it (several = multipath, ``()`` = an unreachable prefix), else ``()`` (no route).
    Indexes the plan once; :func:`egress` is the one-off form."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._routes: dict[IPv4Address, tuple[int, ...]] = {
            r.destination: (r.rail,) for r in plan.routes
        }
        self._unreachable = set(plan.unreachable)
        self._prefixes = [(pr.prefix, tuple(pr.rails)) for pr in plan.prefix_routes]

    def egress(self, destination: IPv4Address) -> tuple[int, ...]:
        rails = self._routes.get(destination)
        if rails is not None:
            return rails
        if destination in self._unreachable:
            return ()
        for prefix, rails in self._prefixes:
            if destination in prefix:
                return rails
        return ()


def egress(plan: Plan, destination: IPv4Address) -> tuple[int, ...]:
    """The local rails ``plan`` sends ``destination`` out of (see :class:`PlanLookup`)."""
    return PlanLookup(plan).egress(destination)


def nic_load(
    plan: Plan, fabric_endpoints_per_rail: Mapping[int, int] | None = None
) -> dict[int, float]:
    """Destinations carried per local egress rail of one plan (a multipath prefix route counts
    1/n of its endpoints on each of its n rails; /32 exceptions count 1 on their rail and are
    taken out of the prefix they override). ``fabric_endpoints_per_rail``: endpoints homed on
    each rail in the whole fabric excluding this host's own (needed for prefix routes; without
    it only /32 routes are counted)."""
    load: dict[int, float] = {}
    over: Counter[int] = Counter(r.home_rail for r in plan.routes)
    over.update(Counter(_home_of_unreachable(plan)))
    for r in plan.routes:
        load[r.rail] = load.get(r.rail, 0) + 1
    if fabric_endpoints_per_rail:
        for pr in plan.prefix_routes:
            n = fabric_endpoints_per_rail.get(pr.home_rail, 0) - over.get(pr.home_rail, 0)
            for x in pr.rails:
                load[x] = load.get(x, 0) + n / len(pr.rails)
    return dict(sorted(load.items()))


def _home_of_unreachable(plan: Plan) -> list[int]:
    nets = {pr.home_rail: pr.prefix for pr in plan.prefix_routes}
    out = []
    for ep in plan.unreachable:
        for d, net in nets.items():
            if ep in net:
                out.append(d)
                break
    return out


def load_report(plans: Mapping[str, Plan]) -> dict[str, dict[int, int]]:
    """Per host, the number of /32 routes per egress rail (rails with no route are left out).
    For prefix-form plans see :func:`nic_load`."""
    return {
        host: dict(sorted(Counter(r.rail for r in plan.routes).items()))
        for host, plan in plans.items()
    }
