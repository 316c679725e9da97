"""Pure plan logic of the agent: scope checks, the local fast path, the rail map.

A plan is accepted only when it is for this host, newer than the applied epoch, and touches
nothing outside linkguard's scope (destinations and prefix routes inside the configured
endpoint prefixes, egress netdevs this host has). The effective assignments are the plan
overlaid with the precomputed :class:`~linkguard.models.Backup` of every local port that is
down right now and that the plan still counts as usable (the fast path).

Routes come in two layers: :class:`~linkguard.models.PrefixRoute`s (one per rail's endpoint
subnet, on-link) and /32 :class:`~linkguard.models.RouteAssignment` exceptions, which win by
longest prefix. A destination without a path gets no route, or an ``unreachable`` /32 where a
prefix route would otherwise carry it out over a rail that does not reach it.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from linkguard.models import Plan, PrefixRoute, RailAssignment, RouteAssignment

__all__ = [
    "Effective",
    "PlanRefused",
    "Refusal",
    "check_plan",
    "effective",
    "nccl_ib_hca",
    "rail_map",
]


class Refusal(enum.StrEnum):
    """Why a plan (or peer routes message) is not applied. The value is the ``reason`` of the
    ``plan_refused`` log line, the key of ``stats.plans_refused`` and the prefix of a refused
    ack's ``error`` (``"<reason>: <detail>"``)."""

    WRONG_HOST = "wrong_host"
    #: a lower leader term than the highest seen: a deposed service's (never acked)
    DEPOSED_LEADER = "deposed_leader"
    #: no newer than the plan applied or in hand (never acked: an old retained copy)
    STALE_EPOCH = "stale_epoch"
    OUT_OF_SCOPE = "out_of_scope"
    #: malformed beyond the schema: a prefix listed twice, a compact plan that cannot expand
    INVALID = "invalid"

    @property
    def acked(self) -> bool:
        """False for the refusals the service is not told of (an old retained message)."""
        return self not in (Refusal.STALE_EPOCH, Refusal.DEPOSED_LEADER)


class PlanRefused(ValueError):
    """A plan that must not be applied. ``reason``: a :class:`Refusal` (wrong_host,
    deposed_leader: a lower leader term than the applied plan's, stale_epoch, out_of_scope,
    invalid: one prefix listed twice in a plan's or a backup's ``prefix_routes``)."""

    def __init__(self, reason: Refusal, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


def check_plan(
    plan: Plan,
    *,
    host: str,
    applied_epoch: int | None,
    netdevs: Collection[str],
    prefixes: Collection[ipaddress.IPv4Network],
    checked: Plan | None = None,
    applied_term: int = 0,
) -> None:
    """Raise :class:`PlanRefused` unless ``plan`` may be applied on ``host``: for this host,
    of no lower leader term than ``applied_term`` (``deposed_leader``), newer than
    ``(applied_term, applied_epoch)`` (term first: a new leader's epochs may be lower),
    every route destination and prefix route inside one of ``prefixes`` (when given), every
    egress netdev one of ``netdevs`` (a prefix route with rails must name a netdev for each),
    no prefix twice in one ``prefix_routes`` list.
    ``checked``: a plan that passed with the same ``netdevs`` and ``prefixes``; its
    ``prefix_routes`` lists (the very objects, as an expanded compact plan shares them) are
    not checked again."""
    if plan.host != host:
        raise PlanRefused(Refusal.WRONG_HOST, f"plan for {plan.host!r}, this is {host!r}")
    if plan.term < applied_term:
        raise PlanRefused(
            Refusal.DEPOSED_LEADER, f"term {plan.term} < applied {applied_term}: a deposed leader's"
        )
    if applied_epoch is not None and (plan.term, plan.epoch) <= (applied_term, applied_epoch):
        raise PlanRefused(Refusal.STALE_EPOCH, f"epoch {plan.epoch} <= applied {applied_epoch}")
    routes = list(plan.routes)
    for b in plan.backups:
        routes.extend(b.routes)
    for r in routes:
        if prefixes and not any(r.destination in p for p in prefixes):
            raise PlanRefused(
                Refusal.OUT_OF_SCOPE,
                f"destination {r.destination} outside {sorted(map(str, prefixes))}",
            )
        if r.netdev is None or r.netdev not in netdevs:
            raise PlanRefused(
                Refusal.OUT_OF_SCOPE, f"netdev {r.netdev!r} is not one of this host's rails"
            )
    seen: set[int] = set()
    if checked is not None:
        seen = {id(checked.prefix_routes)} | {id(b.prefix_routes) for b in checked.backups}
    for where, prs in [("plan", plan.prefix_routes)] + [
        (f"backup {b.hca}/{b.port}", b.prefix_routes) for b in plan.backups
    ]:
        if id(prs) not in seen:
            _check_prefix_routes(where, prs, netdevs=netdevs, prefixes=prefixes)


def _check_prefix_routes(
    where: str,
    prefix_routes: Iterable[PrefixRoute],
    *,
    netdevs: Collection[str],
    prefixes: Collection[ipaddress.IPv4Network],
) -> None:
    seen: set[ipaddress.IPv4Network] = set()
    for pr in prefix_routes:
        if pr.prefix in seen:
            raise PlanRefused(Refusal.INVALID, f"{where}: prefix {pr.prefix} listed twice")
        seen.add(pr.prefix)
        if prefixes and not any(pr.prefix.subnet_of(p) for p in prefixes):
            raise PlanRefused(
                Refusal.OUT_OF_SCOPE, f"prefix {pr.prefix} outside {sorted(map(str, prefixes))}"
            )
        for rail, netdev in zip(pr.rails, pr.netdevs, strict=True):
            if netdev is None or netdev not in netdevs:
                raise PlanRefused(
                    Refusal.OUT_OF_SCOPE,
                    f"prefix {pr.prefix}: rail {rail} netdev {netdev!r} is not one of this "
                    "host's rails",
                )


@dataclass(frozen=True)
class Effective:
    """What the host should have in place now.

    ``prefix_routes``: by prefix; ``routes``: the /32 exceptions, by destination;
    ``unreachable``: the destinations without a path that the longest matching prefix route
    would carry (it has rails), so they need an ``unreachable`` /32, sorted. A destination
    without a path that no such prefix route covers gets nothing (it falls through to the
    main table, or to an ``unreachable`` prefix route)."""

    rail_assignments: tuple[RailAssignment, ...]
    routes: tuple[RouteAssignment, ...]
    fast_path_ports: tuple[str, ...]  # "hca/port" keys whose backups are overlaid
    prefix_routes: tuple[PrefixRoute, ...] = ()
    unreachable: tuple[ipaddress.IPv4Address, ...] = ()


def effective(plan: Plan, locally_down: Iterable[str]) -> Effective:
    """Overlay the backups of locally down ports (sorted by rail) on ``plan``: a backup's
    prefix routes replace the plan's for the same prefix, its routes add or replace /32
    exceptions, its ``withdraw`` destinations lose their /32 route and join the plan's
    ``unreachable`` ones (a later route for one of them takes it out again)."""
    down = set(locally_down)
    backups = sorted((b for b in plan.backups if f"{b.hca}/{b.port}" in down), key=lambda b: b.rail)
    rails = {a.gpu: a for a in plan.rail_assignments}
    prefix_routes = {p.prefix: p for p in plan.prefix_routes}
    routes = {r.destination: r for r in plan.routes}
    no_path = set(plan.unreachable) - set(routes)
    for b in backups:
        for a in b.rail_assignments:
            rails[a.gpu] = a
        for p in b.prefix_routes:
            prefix_routes[p.prefix] = p
        for r in b.routes:
            routes[r.destination] = r
            no_path.discard(r.destination)
        for d in b.withdraw:
            routes.pop(d, None)
            no_path.add(d)
    return Effective(
        rail_assignments=tuple(rails[g] for g in sorted(rails)),
        routes=tuple(routes[d] for d in sorted(routes)),
        fast_path_ports=tuple(f"{b.hca}/{b.port}" for b in backups),
        prefix_routes=tuple(prefix_routes[p] for p in sorted(prefix_routes)),
        unreachable=tuple(d for d in sorted(no_path) if _carried(d, prefix_routes.values())),
    )


def _carried(dest: ipaddress.IPv4Address, prefix_routes: Iterable[PrefixRoute]) -> bool:
    """True when the longest prefix route containing ``dest`` has rails (would send it out)."""
    covering = [p for p in prefix_routes if dest in p.prefix]
    return bool(covering) and bool(max(covering, key=lambda p: p.prefix.prefixlen).rails)


def nccl_ib_hca(assignments: Iterable[RailAssignment]) -> str:
    """``NCCL_IB_HCA`` value listing the HCA ports in use, exact-match form (``=mlx5_0:1,...``,
    see NCCL's environment variable documentation)."""
    seen: dict[str, None] = {}
    for a in sorted(assignments, key=lambda a: a.rail):
        seen[f"{a.hca}:{a.port}"] = None
    return "=" + ",".join(seen) if seen else ""


def rail_map(host: str, epoch: int, eff: Effective) -> dict[str, object]:
    """The rail map file's JSON document (schema ``linkguard.rail-map/v1``)."""
    return {
        "schema": "linkguard.rail-map/v1",
        "host": host,
        "epoch": epoch,
        "fast_path_ports": list(eff.fast_path_ports),
        "gpus": [a.model_dump(mode="json") for a in eff.rail_assignments],
        "nccl_ib_hca": nccl_ib_hca(eff.rail_assignments),
        "per_gpu_nccl_ib_hca": {str(a.gpu): f"={a.hca}:{a.port}" for a in eff.rail_assignments},
    }
