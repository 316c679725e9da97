"""Pure plan logic of the agent: scope checks, the local fast path, the rail map.

A plan is accepted only when it is for this host, newer than the applied epoch, and touches
nothing outside linkguard's scope (destinations inside the configured endpoint prefixes,
egress netdevs this host has). The effective assignments are the plan overlaid with the
precomputed :class:`~linkguard.models.Backup` of every local port that is down right now and
that the plan still counts as usable (the fast path).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from linkguard.models import Plan, RailAssignment, RouteAssignment

__all__ = ["Effective", "PlanRefused", "check_plan", "effective", "nccl_ib_hca", "rail_map"]


class PlanRefused(ValueError):
    """A plan that must not be applied. ``reason``: wrong_host, stale_epoch, out_of_scope."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def check_plan(
    plan: Plan,
    *,
    host: str,
    applied_epoch: int | None,
    netdevs: Collection[str],
    prefixes: Collection[ipaddress.IPv4Network],
) -> None:
    """Raise :class:`PlanRefused` unless ``plan`` may be applied on ``host``."""
    if plan.host != host:
        raise PlanRefused("wrong_host", f"plan for {plan.host!r}, this is {host!r}")
    if applied_epoch is not None and plan.epoch <= applied_epoch:
        raise PlanRefused("stale_epoch", f"epoch {plan.epoch} <= applied {applied_epoch}")
    routes = list(plan.routes)
    for b in plan.backups:
        routes.extend(b.routes)
    for r in routes:
        if prefixes and not any(r.destination in p for p in prefixes):
            raise PlanRefused(
                "out_of_scope", f"destination {r.destination} outside {sorted(map(str, prefixes))}"
            )
        if r.netdev is None or r.netdev not in netdevs:
            raise PlanRefused(
                "out_of_scope", f"netdev {r.netdev!r} is not one of this host's rails"
            )


@dataclass(frozen=True)
class Effective:
    """What the host should have in place now."""

    rail_assignments: tuple[RailAssignment, ...]
    routes: tuple[RouteAssignment, ...]
    fast_path_ports: tuple[str, ...]  # "hca/port" keys whose backups are overlaid


def effective(plan: Plan, locally_down: Iterable[str]) -> Effective:
    """Overlay the backups of locally down ports (sorted by rail) on ``plan``."""
    down = set(locally_down)
    backups = sorted((b for b in plan.backups if f"{b.hca}/{b.port}" in down), key=lambda b: b.rail)
    rails = {a.gpu: a for a in plan.rail_assignments}
    routes = {r.destination: r for r in plan.routes}
    for b in backups:
        for a in b.rail_assignments:
            rails[a.gpu] = a
        for r in b.routes:
            routes[r.destination] = r
        for d in b.withdraw:
            routes.pop(d, None)
    return Effective(
        rail_assignments=tuple(rails[g] for g in sorted(rails)),
        routes=tuple(routes[d] for d in sorted(routes)),
        fast_path_ports=tuple(f"{b.hca}/{b.port}" for b in backups),
    )


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
