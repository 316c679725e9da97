"""The oracle of fault-injection runs: reachability the model expects vs. what the plans deliver.

Consumes: a :class:`~linkguard.topology.fabric.Fabric`, the ports that are truly unusable at a
settle point (``unusable[host]`` = rails: links the scenario took down, ports behind a leaf that
is down or cut off, ports still inside their hold-down) and the plan each host has applied.
Produces: :class:`Mismatch` records; an empty list means the run matched the model there.

Model: GPU endpoint (P, g) is reachable from host H when some rail is usable at both H and P
(traffic stays on one rail from NIC to NIC; a leaf cut off from its spines makes its rail
unusable for its hosts, :mod:`linkguard.topology.health`). Observed: the rails H's plan sends
the endpoint out of (:func:`linkguard.topology.solver.egress`: longest prefix over /32
exceptions, unreachable entries and prefix routes). A pair matches when the model and the plan
agree that it is reachable and every rail the plan may use (all of a multipath) is usable at
both ends, or agree that it is not.

Scenario expectations are not hand-written per scenario: the oracle is the expectation. At
2,048 hosts there are 33 million (host, endpoint) pairs; :func:`pairs_to_check` keeps every pair
that touches an impaired host (where failures show) plus a seeded sample of the rest.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address

from linkguard.models import Plan
from linkguard.topology.fabric import Fabric
from linkguard.topology.solver import PlanLookup

__all__ = ["Mismatch", "check", "pairs_to_check"]


@dataclass(frozen=True)
class Mismatch:
    """One (host, peer endpoint) where the plan and the model disagree.

    ``kind``: ``unrouted`` (the model reaches it, the plan does not), ``dead_rail`` (the plan
    may send it over a rail that is unusable at this host or at the peer), ``no_plan`` (the
    host has usable rails but no plan; ``destination`` None)."""

    kind: str
    host: str
    peer: str | None
    destination: IPv4Address | None
    rails: tuple[int, ...]  # what the plan uses
    usable_both: tuple[int, ...]  # what the model allows

    def __str__(self) -> str:
        to = f" -> {self.peer} {self.destination}" if self.peer else ""
        return (
            f"{self.kind}: {self.host}{to} via rails {list(self.rails)}, usable at both ends: "
            f"{list(self.usable_both)}"
        )


def _usable(fabric: Fabric, unusable: Mapping[str, Iterable[int]]) -> dict[str, frozenset[int]]:
    return {
        h.host: frozenset(c.rail for c in h.hcas) - frozenset(unusable.get(h.host, ()))
        for h in fabric.hosts
    }


def pairs_to_check(
    fabric: Fabric,
    unusable: Mapping[str, Iterable[int]],
    *,
    sample: int = 2000,
    seed: int = 0,
) -> list[tuple[str, str]]:
    """(host, peer) pairs worth checking: every pair with an impaired end (a host that cannot
    use all its rails), plus ``sample`` other pairs drawn with ``seed`` (all of them on a small
    fabric). In fabric order, each pair once."""
    usable = _usable(fabric, unusable)
    names = fabric.host_names
    full = {h.host: frozenset(c.rail for c in h.hcas) for h in fabric.hosts}
    impaired = [n for n in names if usable[n] != full[n]]
    chosen: set[tuple[str, str]] = set()
    for a in impaired:
        for b in names:
            if a != b:
                chosen.add((a, b))
                chosen.add((b, a))
    n = len(names)
    if n * (n - 1) - len(chosen) <= sample:
        chosen.update((a, b) for a in names for b in names if a != b)
    else:
        rng = random.Random(seed)
        want = len(chosen) + sample
        while len(chosen) < want:
            i, j = rng.randrange(n), rng.randrange(n)
            if i != j:
                chosen.add((names[i], names[j]))
    order = {name: i for i, name in enumerate(names)}
    return sorted(chosen, key=lambda p: (order[p[0]], order[p[1]]))


def check(
    fabric: Fabric,
    unusable: Mapping[str, Iterable[int]],
    plans: Mapping[str, Plan | None],
    pairs: Iterable[tuple[str, str]] | None = None,
) -> list[Mismatch]:
    """Compare ``plans`` (host -> applied plan, None when it has none) with the model for
    ``pairs`` (default: every ordered pair of hosts). Raises KeyError for a host the fabric
    does not have."""
    usable = _usable(fabric, unusable)
    if pairs is None:
        names = fabric.host_names
        pairs = [(a, b) for a in names for b in names if a != b]
    out: list[Mismatch] = []
    no_plan: set[str] = set()
    lookups: dict[str, PlanLookup] = {}
    for a, b in pairs:
        plan = plans.get(a)
        both = usable[a] & usable[b]
        if plan is None:
            if usable[a] and a not in no_plan:
                no_plan.add(a)
                out.append(Mismatch("no_plan", a, None, None, (), tuple(sorted(usable[a]))))
            continue
        look = lookups.get(a)
        if look is None or look.plan is not plan:
            look = lookups[a] = PlanLookup(plan)
        for ep in fabric.host(b).endpoints:
            rails = look.egress(ep)
            if both and not rails:
                out.append(Mismatch("unrouted", a, b, ep, (), tuple(sorted(both))))
            elif rails and not set(rails) <= both:
                out.append(Mismatch("dead_rail", a, b, ep, rails, tuple(sorted(both))))
    return out
