"""Plan lookup: which local rails a plan sends a destination out of, and the load per NIC.

Consumes plans (:class:`~linkguard.models.Plan`, either form: /32 routes and prefix routes, see
:mod:`linkguard.topology.solver`). Produces, per destination, the egress rails by longest
prefix (:class:`PlanLookup`, :func:`egress`), destinations carried per local egress rail
(:func:`nic_load`) and /32 routes per rail per host (:func:`load_report`). Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from ipaddress import IPv4Address

from linkguard.models import Plan

__all__ = ["PlanLookup", "egress", "load_report", "nic_load"]


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
