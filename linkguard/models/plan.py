"""The plan messages of the bus contract (:mod:`linkguard.models`): the service's
:class:`Plan` for one host (rail and route assignments, precomputed backups, per-peer routes;
:func:`expand_plan` flattens its shared routes), and the agent's :class:`Ack` of it."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated

from pydantic import (
    Field,
    model_validator,
)

from linkguard.models.base import Epoch, HCAName, HostName, NetdevName, PortNum, RailIndex, _Model

__all__ = [
    "Ack",
    "AckResult",
    "Backup",
    "PeerClass",
    "PeerRoutes",
    "Plan",
    "PrefixRoute",
    "RailAssignment",
    "RouteAssignment",
    "SharedRoutes",
    "ack_covers",
    "expand_plan",
]


class RailAssignment(_Model):
    """Which HCA port carries the traffic of one local GPU."""

    gpu: int = Field(ge=0, le=63)
    endpoint: ipaddress.IPv4Address
    hca: HCAName
    port: PortNum
    rail: RailIndex
    home_rail: RailIndex


class RouteAssignment(_Model):
    """How this host reaches one peer endpoint: a /32 via the peer's address on one rail."""

    destination: ipaddress.IPv4Address
    peer: HostName
    peer_gpu: int = Field(ge=0, le=63)
    rail: RailIndex
    home_rail: RailIndex
    netdev: NetdevName | None = Field(None, description="local egress netdev on that rail")
    gateway: ipaddress.IPv4Address


class PrefixRoute(_Model):
    """The route to every peer endpoint homed on one rail: that rail's endpoint subnet
    (``Fabric.endpoint_subnets``), on-link out of one local netdev, or several (a multipath
    route: the kernel hashes flows over equal-weight nexthops) when the home rail is not usable
    here. No gateway: the peer that owns a destination answers ARP for it on whichever rail the
    packet arrives. ``rails`` empty means no local rail is usable: an ``unreachable`` route.
    /32 :class:`RouteAssignment` exceptions of the same plan win over this route (longest
    prefix)."""

    prefix: ipaddress.IPv4Network
    home_rail: RailIndex
    rails: list[RailIndex] = Field(default_factory=list, max_length=64)
    netdevs: list[NetdevName | None] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _pairs(self) -> PrefixRoute:
        if len(self.rails) != len(self.netdevs):
            raise ValueError(f"{len(self.rails)} rails but {len(self.netdevs)} netdevs")
        if len(set(self.rails)) != len(self.rails):
            raise ValueError(f"rail listed twice: {self.rails}")
        return self


def _unique_prefixes(routes: list[PrefixRoute]) -> None:
    prefixes = [r.prefix for r in routes]
    if len(set(prefixes)) != len(prefixes):
        raise ValueError("a prefix is routed twice")


class Backup(_Model):
    """Precomputed fast-path change for one local port: what this host switches to on its own
    the moment that port goes down, before the service answers. Only the entries that differ
    from the plan are listed (``prefix_routes`` replace the plan's route for the same prefix,
    ``routes`` add or replace /32 exceptions); ``withdraw`` are destinations with no surviving
    path (no route, or an ``unreachable`` /32 where a prefix route would cover them)."""

    hca: HCAName
    port: PortNum
    rail: RailIndex
    rail_assignments: list[RailAssignment] = Field(default_factory=list, max_length=64)
    prefix_routes: list[PrefixRoute] = Field(default_factory=list, max_length=64)
    routes: list[RouteAssignment] = Field(default_factory=list, max_length=200_000)
    withdraw: list[ipaddress.IPv4Address] = Field(default_factory=list, max_length=200_000)


class SharedRoutes(_Model):
    """Marks a compact plan: the host takes its /32 routes to impaired peers (and its backups'
    changes of them) from the retained ``peers/<peer>`` messages (:class:`PeerRoutes`) instead
    of from the plan; :func:`expand_plan` combines the two. ``position``: this host's index in
    the fabric's host order; ``hosts``: how many hosts the fabric has; ``netdevs``: this host's
    egress netdev per rail."""

    position: int = Field(ge=0, le=1_000_000)
    hosts: int = Field(ge=1, le=1_000_001)
    netdevs: dict[RailIndex, NetdevName] = Field(max_length=64)

    @model_validator(mode="after")
    def _inside(self) -> SharedRoutes:
        if self.position >= self.hosts:
            raise ValueError(f"position {self.position} outside a fabric of {self.hosts} hosts")
        return self


#: An IPv4 address in dotted-quad text, checked by a pattern (no leading zeros): peer routes
#: reach every host, and parsing 16 ``IPv4Address`` fields was half of decoding one; the few a
#: host uses become ``IPv4Address`` in :func:`expand_plan`.
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"


IPv4Text = Annotated[str, Field(pattern=rf"^{_OCTET}(\.{_OCTET}){{3}}$", max_length=15)]


#: A GPU or rail number in :class:`PeerClass`'s flat lists; -1 for "no rail" (unreachable).
_Small = Annotated[int, Field(ge=-1, le=63)]


class PeerClass(_Model):
    """What one class of viewing hosts adds for one impaired peer, as flat integer lists (a
    peer message holds up to 56 classes and every host decodes it: flat lists decode about 5x
    faster than nested pairs). ``routes``: pairs ``g, x``: a /32 for the peer's GPU g via rail
    x (the viewer's prefix routes would not deliver it), x = -1: ``unreachable``.
    ``backups``: triples ``r, g, x``: when local rail r goes down at the viewer (its fast
    path), GPU g's /32 moves to rail x (-1: withdrawn). Their structure (lengths, GPU and rail
    numbers) is checked when a viewer uses the class (:func:`expand_plan`)."""

    routes: list[_Small] = Field(default_factory=list, max_length=128)
    backups: list[_Small] = Field(default_factory=list, max_length=64 * 64 * 3)


class PeerRoutes(_Model):
    """Routes every whole host needs towards one impaired peer, retained on ``peers/<host>``
    (one message per impaired host, so a host link event is one broker fan-out instead of a
    new plan for every host). Epochs come from the plans' counter.

    A viewer with a compact plan (:class:`SharedRoutes`) uses ``classes[c]`` with
    ``c = ((viewer.position - position - 1) mod hosts) mod modulus``: the solver spreads the
    routes one failed rail displaces round-robin over the survivors by that circular offset
    (:mod:`linkguard.topology.solver`), so viewers of one residue class need the same routes.
    ``classes`` empty: the peer is whole again (nothing to add). ``endpoints``/``home_rails``:
    per peer GPU; ``addresses``: the peer's address per rail (the /32s' gateways).

    ``degraded``: the fabric-wide change every whole host shares (issue 23). A rail at least
    ``degraded_after`` hosts cannot use (a leaf down or cut off: one rail of an SU) is left
    out of every multipath prefix route, and a whole host's only multipaths are its backups'
    (local rail r down: the prefix of home rail r spreads over the other rails). A compact
    plan lists them over every other rail whatever is degraded, and :func:`expand_plan`
    leaves out the degraded rails, so a leaf failure re-plans only the hosts that lost a
    rail. The set rides on the peer routes, not on a message of its own: a rail is degraded
    only while impaired hosts cause it, every change of the set re-publishes every impaired
    host's peer routes (their routes depend on it), so the newest peer routes *with classes*
    an agent holds carry the current set, and none at all means none is degraded. An agent
    that missed that message acks a lower epoch than it owes, as for any lost peer routes."""

    host: HostName
    epoch: Epoch
    term: Epoch = Field(
        0,
        description="the leader term of the service that issued it (0: no election); agents "
        "refuse a lower term than the highest they have seen and order by (term, epoch)",
    )
    issued_at: float = Field(ge=0)
    position: int = Field(ge=0, le=1_000_000)
    modulus: int = Field(ge=1, le=4096)
    endpoints: list[IPv4Text] = Field(max_length=64)
    home_rails: list[RailIndex] = Field(max_length=64)
    addresses: dict[RailIndex, IPv4Text] = Field(max_length=64)
    classes: list[PeerClass] = Field(default_factory=list, max_length=4096)
    degraded: list[RailIndex] = Field(
        default_factory=list,
        max_length=64,
        description="the fabric's degraded rails when this was issued (rails at least the "
        "solver's degraded_after hosts cannot use, e.g. a leaf's worth): a compact plan's "
        "multipath prefix routes leave them out (expand_plan)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> PeerRoutes:
        if len(self.home_rails) != len(self.endpoints):
            raise ValueError(
                f"{len(self.endpoints)} endpoints but {len(self.home_rails)} home rails"
            )
        if self.classes and len(self.classes) != self.modulus:
            raise ValueError(f"{len(self.classes)} classes, modulus {self.modulus}")
        return self

    def same_routes(self, other: PeerRoutes | None) -> bool:
        """True when ``other`` adds the same routes (epoch, term and time aside); None =
        whole."""
        if other is None:
            return not self.classes
        a, b = self.__dict__, other.__dict__
        return all(a[k] == b[k] for k in a if k not in ("epoch", "term", "issued_at"))


class Plan(_Model):
    """All assignments for one host, retained on ``plans/<host>``. Epochs only grow.

    On a fabric with endpoint subnets a plan is compact: one :class:`PrefixRoute` per rail's
    endpoint subnet, plus /32 ``routes`` only for the endpoints the prefix route would not
    deliver (their home rail is down at the peer, ...), so its size grows with the number of
    failures, not with the fleet. Without endpoint subnets every peer endpoint gets a /32 route.
    A host that can use all its rails gets a plan with ``shared`` set and no peer /32s at
    all: those come from the :class:`PeerRoutes` of the impaired peers (:func:`expand_plan`),
    so its plan changes only when its own ports do.
    ``unreachable``: endpoints with no usable rail in common; where a prefix route covers them
    the agent installs an ``unreachable`` /32 so no packet goes out over a dead rail.
    """

    host: HostName
    epoch: Epoch
    term: Epoch = Field(
        0,
        description="the leader term of the service that issued it (0: no election); agents "
        "refuse a lower term than the highest they have seen and order by (term, epoch)",
    )
    issued_at: float = Field(ge=0)
    rail_assignments: list[RailAssignment] = Field(default_factory=list, max_length=64)
    prefix_routes: list[PrefixRoute] = Field(default_factory=list, max_length=64)
    routes: list[RouteAssignment] = Field(default_factory=list, max_length=200_000)
    backups: list[Backup] = Field(default_factory=list, max_length=64)
    unreachable: list[ipaddress.IPv4Address] = Field(default_factory=list, max_length=200_000)
    shared: SharedRoutes | None = Field(
        None, description="compact plan: routes to impaired peers come from peers/<host>"
    )

    @model_validator(mode="after")
    def _unique_destinations(self) -> Plan:
        dests = [r.destination for r in self.routes]
        if len(set(dests)) != len(dests):
            raise ValueError("plan routes a destination twice")
        _unique_prefixes(self.prefix_routes)
        for b in self.backups:
            _unique_prefixes(b.prefix_routes)
        return self

    def same_assignments(self, other: Plan | None) -> bool:
        """True when ``other`` assigns exactly the same (epoch, term and time aside)."""
        if other is None:
            return False
        # Field-wise ==, not model_dump: lists of shared frozen models compare by identity first.
        a, b = self.__dict__, other.__dict__
        return all(a[k] == b[k] for k in a if k not in ("epoch", "term", "issued_at"))


def expand_plan(plan: Plan, peers: Mapping[str, PeerRoutes]) -> Plan:
    """The full plan a compact ``plan`` stands for, given the :class:`PeerRoutes` retained for
    impaired peers (by host; the host's own and whole peers' add nothing): their /32 routes,
    ``unreachable`` endpoints and backup changes, in peer position order, exactly as the
    solver writes them into a full plan. Multipath prefix routes (the plan's and its backups')
    leave out the degraded rails of the newest peer routes with classes (:class:`PeerRoutes`
    ``degraded``; none held: nothing is degraded) unless that leaves no rail, as the solver
    does. ``(term, epoch)`` is the highest of the plan's and all the peers' (the epoch is what
    the host acks; epochs are compared within a term only). A plan without ``shared`` is
    returned as it is. Raises ValueError when a peer message names a rail the plan has no
    netdev or backup for."""
    sv = plan.shared
    if sv is None:
        return plan
    version = (plan.term, plan.epoch)
    degraded = _degraded_rails(peers)
    routes: list[RouteAssignment] = list(plan.routes)
    unreachable: list[ipaddress.IPv4Address] = list(plan.unreachable)
    extra: dict[int, tuple[list[RouteAssignment], list[ipaddress.IPv4Address]]] = {
        b.rail: ([], []) for b in plan.backups
    }
    netdevs = sv.netdevs

    def route(pr: PeerRoutes, g: int, x: int) -> RouteAssignment:
        netdev, gateway = netdevs.get(x), pr.addresses.get(x)
        if netdev is None or gateway is None:
            raise ValueError(f"peer {pr.host}: rail {x} has no netdev here or no address there")
        return RouteAssignment.model_construct(
            destination=ipaddress.IPv4Address(pr.endpoints[g]),
            peer=pr.host,
            peer_gpu=g,
            rail=x,
            home_rail=pr.home_rails[g],
            netdev=netdev,
            gateway=ipaddress.IPv4Address(gateway),
        )

    for pr in sorted(peers.values(), key=lambda pr: pr.position):
        version = max(version, (pr.term, pr.epoch))
        if not pr.classes or pr.host == plan.host:
            continue
        c = (sv.position - pr.position - 1) % sv.hosts % pr.modulus
        cls = pr.classes[c]
        if len(cls.routes) % 2 or len(cls.backups) % 3:
            raise ValueError(f"peer {pr.host} class {c}: routes or backups cut short")
        n = len(pr.endpoints)
        flat = cls.routes
        for i in range(0, len(flat), 2):
            g, x = flat[i], flat[i + 1]
            if not 0 <= g < n:
                raise ValueError(f"peer {pr.host} class {c}: GPU {g} of {n}")
            if x < 0:
                unreachable.append(ipaddress.IPv4Address(pr.endpoints[g]))
            else:
                routes.append(route(pr, g, x))
        flat = cls.backups
        for i in range(0, len(flat), 3):
            r, g, x = flat[i], flat[i + 1], flat[i + 2]
            if r not in extra:
                raise ValueError(f"peer {pr.host} class {c}: the plan has no backup for rail {r}")
            if not 0 <= g < n:
                raise ValueError(f"peer {pr.host} class {c}: GPU {g} of {n}")
            if x < 0:
                extra[r][1].append(ipaddress.IPv4Address(pr.endpoints[g]))
            else:
                extra[r][0].append(route(pr, g, x))
    backups = [
        b
        if not (extra[b.rail][0] or extra[b.rail][1])
        and not _multipaths_touch(b.prefix_routes, degraded)
        else Backup.model_construct(  # model_copy costs 4x as much, and all is valid
            **{
                **b.__dict__,
                "prefix_routes": _leave_out(b.prefix_routes, degraded),
                "routes": b.routes + extra[b.rail][0],
                "withdraw": b.withdraw + extra[b.rail][1],
            }
        )
        for b in plan.backups
    ]
    dests = [r.destination for r in routes]
    if len(set(dests)) != len(dests):
        raise ValueError("peer routes route a destination twice")
    return Plan.model_construct(
        **{
            **plan.__dict__,
            "term": version[0],
            "epoch": version[1],
            "prefix_routes": _leave_out(plan.prefix_routes, degraded),
            "routes": routes,
            "unreachable": unreachable,
            "backups": backups,
            "shared": None,
        }
    )


def _degraded_rails(peers: Mapping[str, PeerRoutes]) -> frozenset[int]:
    """The degraded rails of the newest (term, epoch) peer routes with classes (empty: none
    held); see :class:`PeerRoutes`."""
    newest: PeerRoutes | None = None
    for pr in peers.values():
        if pr.classes and (newest is None or (pr.term, pr.epoch) > (newest.term, newest.epoch)):
            newest = pr
    return frozenset(newest.degraded) if newest is not None else frozenset()


def _multipaths_touch(routes: list[PrefixRoute], degraded: frozenset[int]) -> bool:
    """Does a multipath route (its home rail not among its rails) of ``routes`` use a rail of
    ``degraded``?"""
    return bool(degraded) and any(
        pr.home_rail not in pr.rails and not degraded.isdisjoint(pr.rails) for pr in routes
    )


def _leave_out(routes: list[PrefixRoute], degraded: frozenset[int]) -> list[PrefixRoute]:
    """``routes`` with the ``degraded`` rails left out of every multipath route, unless that
    leaves none (the solver's rule, :func:`~linkguard.topology.hostbase.multipath_rails`)."""
    if not _multipaths_touch(routes, degraded):
        return routes
    out = []
    for pr in routes:
        keep = [i for i, x in enumerate(pr.rails) if x not in degraded]
        if pr.home_rail in pr.rails or not keep or len(keep) == len(pr.rails):
            out.append(pr)
            continue
        out.append(
            PrefixRoute.model_construct(
                prefix=pr.prefix,
                home_rail=pr.home_rail,
                rails=[pr.rails[i] for i in keep],
                netdevs=[pr.netdevs[i] for i in keep],
            )
        )
    return out


class AckResult(StrEnum):
    APPLIED = "applied"
    REFUSED = "refused"  # failed validation / stale epoch / wrong host
    FAILED = "failed"  # valid but the kernel refused part of it


class Ack(_Model):
    """Agent -> service, on ``hosts/<host>/ack`` after every plan it handled."""

    host: HostName
    epoch: Epoch
    result: AckResult
    error: str | None = Field(None, max_length=2000)
    applied_at: float = Field(ge=0)
    apply_ms: float | None = Field(None, ge=0)
    fast_path: bool = Field(False, description="applied locally from a backup, not a plan")
    peers: dict[HostName, Epoch] | None = Field(
        None,
        max_length=65_536,
        description="with a compact plan in hand: the epoch of each peer's routes (peers/<host>) "
        "the agent holds, by peer host; None with a full plan (or an agent before this field)",
    )


class PlanRequest(_Model):
    """Agent -> service, on ``hosts/<host>/plan-request`` (not retained): this agent may be
    behind (it reconnected, or saw a newer epoch or leader term than its plan's) and asks for
    its plan and peer routes again. ``epoch``: the epoch it applied (None: none yet); the
    service answers (re-sends) only when that is below the epoch it owes an ack for, at most
    once per ``convergence.request_min_interval_s`` per host."""

    host: HostName
    epoch: Epoch | None = None
    reason: str = Field("reconnect", max_length=64, pattern=r"^[a-z_]+$")
    at: float = Field(ge=0, description="when it was asked (agent's Unix time, s)")


def ack_covers(ack: Ack, owed: int, plan: Plan, peers: Mapping[str, PeerRoutes]) -> bool:
    """True when ``ack`` answers everything the host owes: an epoch of at least ``owed``
    (:meth:`~linkguard.topology.state.FabricState.acked_epoch`) and, when ``plan`` (the host's
    plan on the bus) is compact and the ack names the peer routes it holds (``ack.peers``),
    every impaired peer's routes in ``peers`` (those on the bus, by peer host) at their epoch
    or newer. A solve publishes a compact plan and its peer routes with one epoch, so an
    agent that lost one peer routes message of that solve still acks that epoch: only the
    names tell that it routes without them (the lab chaos run found hosts acked and
    converged with a lost peer's ``unreachable`` routes missing). Likewise every peer the
    ack names (the agent holds routes for it) must be held at the epoch on the bus or newer:
    an agent that lost the emptied message of a peer that is whole again still routes to it
    with that peer's old classes and old degraded rails (issue 23's property test found one
    acked and converged so). An ack with names never covers a full ``plan``: it was made
    from a compact plan, whose expansion carries its newest peer routes' epoch, which may
    be above the full plan's that the agent missed (the same test found it). An ack without
    names (a full plan, an older agent) is judged on its epoch alone."""
    if ack.epoch < owed:
        return False
    held = ack.peers
    if plan.shared is None:
        return held is None
    if held is None:
        return True
    return all(
        held.get(h, 0) >= pr.epoch
        for h, pr in peers.items()
        if (pr.classes or h in held) and h != plan.host
    )
