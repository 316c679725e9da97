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
  per class of host instead of every (host, peer) pair. A whole host's compact plan ignores
  the degraded rails: the peer routes carry them (``PeerRoutes.degraded``), the expansion
  leaves them out, so a leaf failure re-plans only the hosts that lost a rail.
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

Here: the peer contributions and their incremental upkeep. A host's own part of its plan is
:mod:`linkguard.topology.hostbase`; the egress rail of one /32 (the rule above) is
:mod:`linkguard.topology.railchoice`; the pydantic models are built in
:mod:`linkguard.topology.planmodels`; reading a plan back (:class:`PlanLookup`, :func:`egress`,
:func:`nic_load`, :func:`load_report`) is :mod:`linkguard.topology.planlookup`, re-exported here.
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Network

from linkguard.models import PeerRoutes, Plan, SharedRoutes
from linkguard.topology.fabric import Fabric
from linkguard.topology.hostbase import HostBase, HostBases, IndexedHost, index_hosts
from linkguard.topology.hostbase import multipath_rails as _multipath_rails
from linkguard.topology.planlookup import PlanLookup, egress, load_report, nic_load
from linkguard.topology.planmodels import Contrib, PlanModels, peer_routes_model
from linkguard.topology.railchoice import RailChoice

__all__ = ["PlanLookup", "Solver", "egress", "load_report", "nic_load", "solve"]


#: Default of :attr:`Solver.degraded_after`: below this, a rail lost on a few hosts stays in
#: every multipath (best spread); from it on (a leaf reboot loses one rail on a whole SU of 31-32
#: hosts) multipaths avoid the rail, which keeps plans and backups free of one /32 per
#: affected peer (a plan after a leaf failure: ~70 routes instead of ~400).
DEGRADED_AFTER_HOSTS = 8

#: Marker: the endpoint is delivered by the plan's prefix route (no /32 needed).
_DEFAULT = "default"
_NOTHING: tuple[tuple, tuple] = ((), ())


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
        self._hosts = index_hosts(self.fabric)
        self._pos = {h.inv.host: h.pos for h in self._hosts}
        self._names = [h.inv.host for h in self._hosts]
        self.n = len(self._hosts)
        self.all_rails = frozenset(self.fabric.rails)
        self.prefix_mode = bool(self.fabric.endpoint_subnets)
        self._subnets: tuple[tuple[int, IPv4Network], ...] = tuple(
            sorted(self.fabric.endpoint_subnets.items())
        )
        self._rails = RailChoice()
        self._templates: dict[tuple, tuple[tuple, tuple]] = {}
        self._bases = HostBases(self._subnets if self.prefix_mode else ())
        self._models = PlanModels()
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
        self._contrib: list[dict[int, Contrib]] = [{} for _ in self._hosts]
        # hosts grouped by (sig id, usable rails): a peer's contribution is the same for every
        # host of a group whose positions agree modulo the survivor counts (module docstring)
        sids: dict[tuple, int] = {}
        self._sid = [sids.setdefault(h.sig, len(sids)) for h in self._hosts]
        self._groups: dict[tuple[int, frozenset[int]], list[int]] = {}
        for h in self._hosts:
            self._groups.setdefault((self._sid[h.pos], self._usable[h.pos]), []).append(h.pos)
        # group -> m -> position modulo m -> sorted positions; kept in step with the groups
        # by :meth:`_move` (rebuilding them on every event costs O(hosts))
        self._residues: dict[tuple, dict[int, dict[int, list[int]]]] = {}
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
        return list(self._names)

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
        for p in changed_pos:
            self._move(p, (self._sid[p], old_usable[p]), (self._sid[p], self._usable[p]))
        degraded = self._degraded_rails()
        if degraded != self.degraded:  # every multipath may change: rebuild all, compare
            self.degraded = degraded
            if self.shared_mode:
                # they carry the degraded rails (compact plans ignore them: compact_plan)
                self._peers_changed.update(self._impaired)
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
        names = self._names
        return [names[p] for p in sorted(dirty)]

    def _move(self, p: int, old: tuple, new: tuple) -> None:
        """Move P from host group ``old`` to ``new``, and its position in the cached residue
        lists with it (O(groups x moduli) list edits, not a rebuild of every list)."""
        members = self._groups[old]
        members.remove(p)
        if members:
            for m, by_res in self._residues.get(old, {}).items():
                lst = by_res[p % m]
                lst.remove(p)
                if not lst:
                    del by_res[p % m]
        else:
            del self._groups[old]
            self._residues.pop(old, None)
        insort(self._groups.setdefault(new, []), p)
        for m, by_res in self._residues.get(new, {}).items():
            insort(by_res.setdefault(p % m, []), p)

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
        return _multipath_rails(usable, self.degraded)

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
                if c is None:  # P's entry leaves every row of the class that has one
                    dirty.update([pos for pos in lst if rows[pos].pop(p, None) is not None])
                    continue
                for pos in lst:
                    row = rows[pos]
                    old = row.get(p)
                    if old is c:
                        continue
                    row[p] = c
                    if old is None or old != c:
                        dirty.add(pos)

    def _classes(self, key: tuple, members: list[int], m: int, p: int) -> Iterable[list[int]]:
        """``members`` other than ``p`` split by their offset from P, ``(pos - p - 1) mod n``,
        modulo ``m``: the hosts of one list get the same contribution from P."""
        cached = self._residues.setdefault(key, {})
        by_res = cached.get(m)
        if by_res is None:  # members by position modulo m (sorted); _move keeps them current
            by_res = {}
            for pos in members:
                by_res.setdefault(pos % m, []).append(pos)
            cached[m] = by_res
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
        :func:`~linkguard.models.expand_plan` of the two is exactly :meth:`plan` (its backups'
        multipaths list every other rail; the expansion leaves out the degraded rails the
        peer routes carry). Any other host: :meth:`plan`. KeyError if unknown."""
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
        # the degraded rails ignored: expand_plan leaves them out (see the module docstring)
        base = self._bases.base(h, self._usable[pos], frozenset())
        return self._models.plan(h, base, {}, self._hosts, epoch=epoch, now=now, shared=shared)

    def peer_routes(self, name: str, *, epoch: int, now: float) -> PeerRoutes:
        """The :class:`~linkguard.models.PeerRoutes` of ``name``: for every residue class of
        the whole hosts of the shared signature, the rail choices of :meth:`_template` (the
        same ones their full plans hold) and the degraded rails; no classes (and no degraded
        rails) when ``name`` is not impaired or the solver is not in shared mode. KeyError if
        unknown."""
        pos = self._index_of(name)
        ph = self._hosts[pos]
        classes: list[Contrib] = []
        modulus = 1
        if self.shared_mode and pos in self._impaired:
            rep = self._hosts[self._ref_rep]
            uh = rep.rail_set
            a = len(uh & self._usable[pos])
            modulus = math.lcm(a, a - 1) if a > 1 else 1
            classes = [self._template(rep, ph, uh=uh, offset=c) for c in range(modulus)]
        degraded = sorted(self.degraded) if classes else []
        return peer_routes_model(
            ph,
            classes,
            position=pos,
            modulus=modulus,
            degraded=degraded,
            epoch=epoch,
            now=now,
            cache=self._models.peer_classes,
        )

    def take_changed_compact(self) -> set[str]:
        """Hosts in shared mode whose :meth:`compact_plan` may have changed since the last
        call (their own usable rails changed; at first: all; a change of the degraded rails
        changes none: they travel in the peer routes); clears the set. The compact plan of
        any other host in shared mode is as it was."""
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
        h: IndexedHost,
        row: Mapping[int, Contrib],
        *,
        epoch: int,
        now: float,
        shared: SharedRoutes | None = None,
    ) -> Plan:
        base = self._base[h.pos]
        return self._models.plan(h, base, row, self._hosts, epoch=epoch, now=now, shared=shared)

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

    def _make_base(self, h: IndexedHost) -> HostBase:
        """H's base; shared by hosts with the same rails, NUMA and PCIe layout and usable set."""
        return self._bases.base(h, self._usable[h.pos], self.degraded)

    def _fill_row(self, h: IndexedHost) -> None:
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

    def _contribution(self, h: IndexedHost, p: IndexedHost) -> Contrib | None:
        """P's contribution to H (None when it adds nothing)."""
        t = self._template(h, p)
        return None if t is _NOTHING or (not t[0] and not t[1]) else t

    def _template(
        self,
        h: IndexedHost,
        p: IndexedHost,
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
        choose = self._rails.choose
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
