"""The checks of a lab chaos run (:mod:`linkguard.simulations.labchaos`), pure: the kernel's
routes against the applied plan, the agents' port events against the ledger, the report's
outages against the agents' down episodes.

Consumes: ``ip -4 -j route show table all`` / ``ip -4 -j rule show`` rows of a host namespace
(iproute2's JSON: ``dst``, ``type``, ``table`` (absent for main), ``dev``, ``nexthops``,
``gateway``, ``prefsrc``), the plan the host acked, the port events the agents published (as
the proxy saw them leave), the ledger's ``port_events``, ``outages`` and ``outage_ports`` rows
and ``linkguard report --format json``'s ``outages``. Produces: lists of problems, each a
sentence naming the host, route, event or outage (empty: the check held). No clock, no I/O.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from linkguard.agent.applier import kernel_routes
from linkguard.agent.plans import effective
from linkguard.models import Plan

__all__ = [
    "Episode",
    "RouteKey",
    "down_episodes",
    "expected_routes",
    "outage_problems",
    "route_key",
    "route_problems",
    "rule_problems",
]

#: a route as compared: (table, destination, type, netdevs, gateway, preferred source)
RouteKey = tuple[str, str, str, tuple[str, ...], str | None, str | None]
#: times from the agent's event, through JSON and SQLite, agree to this (s)
TIME_TOLERANCE_S = 0.001


def route_key(row: Mapping[str, Any]) -> RouteKey:
    """One ``ip -j route`` row as a :data:`RouteKey` (a /32 destination without its length,
    as iproute2 prints it)."""
    hops = row.get("nexthops") or []
    devs = tuple(sorted({h["dev"] for h in hops if h.get("dev")} | ({row["dev"]} if row.get(
        "dev") else set())))  # fmt: skip
    return (
        str(row.get("table", "main")),
        str(ipaddress.ip_network(row["dst"] if row["dst"] != "default" else "0.0.0.0/0")),
        str(row.get("type", "unicast")),
        devs,
        row.get("gateway") or next((h.get("gateway") for h in hops if h.get("gateway")), None),
        row.get("prefsrc"),
    )


def expected_routes(plan: Plan, table: int, connected: Iterable[tuple[str, str]]) -> Counter:
    """What a host's routes should be once every port is up and ``plan`` (expanded) is
    applied: linkguard's table ``table`` as the plan asks
    (:func:`~linkguard.agent.plans.effective` with no port down, written as the agent's
    :func:`~linkguard.agent.applier.kernel_routes`), and in ``main`` only the kernel's
    connected routes, ``connected`` as (subnet, netdev). A Counter of :data:`RouteKey`."""
    want: Counter[RouteKey] = Counter()
    for r in kernel_routes(effective(plan, ())).values():
        devs = tuple(sorted(set(r.nexthops) | ({r.netdev} if r.netdev else set())))
        want[
            (
                str(table),
                str(ipaddress.ip_network(r.destination)),
                r.kind,
                devs,
                str(r.gateway) if r.gateway else None,
                str(r.src) if r.src else None,
            )
        ] += 1
    for net, dev in connected:
        want[("main", str(ipaddress.ip_network(net)), "unicast", (dev,), None, "*")] += 1
    return want


def route_problems(host: str, want: Counter, rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The namespace's IPv4 routes (``rows``, table ``local`` left out) against ``want``
    (:func:`expected_routes`; a ``*`` source matches any): every route there once, nothing
    else in any table."""
    have: Counter[RouteKey] = Counter()
    for row in rows:
        if row.get("table") == "local":
            continue
        key = route_key(row)
        if key[0] == "main" and (*key[:5], "*") in want:
            key = (*key[:5], "*")
        have[key] += 1
    out = []
    for key in sorted(set(want) | set(have), key=str):
        w, h = want.get(key, 0), have.get(key, 0)
        table, dst, kind, devs, gw, src = key
        what = f"table {table} {kind} {dst} dev {','.join(devs) or '-'} via {gw} src {src}"
        if h > w and w:
            out.append(f"{host}: duplicated route ({h} times): {what}")
        elif h > w:
            out.append(f"{host}: leaked route (not in the plan): {what}")
        elif h < w:
            out.append(f"{host}: missing route (the plan has it): {what}")
    return out


def rule_problems(host: str, rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """``ip -4 -j rule show`` rows: no two rules with the same selector and table at different
    priorities (the kernel refuses an exact duplicate; one left behind at another priority
    is a leak)."""
    seen = Counter(
        tuple(sorted((k, str(v)) for k, v in row.items() if k not in ("flags", "priority")))
        for row in rows
    )
    return [
        f"{host}: policy rule {n} times (at different priorities): {dict(k)}"
        for k, n in seen.items()
        if n > 1
    ]


@dataclass(frozen=True)
class Episode:
    """A port down in the agent's own times: from its event to ``down`` until its next event
    that leaves ``down`` (None: still down). ``seq``: the down event's journal number."""

    host: str
    hca: str
    port: int
    down_at: float
    up_at: float | None
    seq: int

    @property
    def length_s(self) -> float | None:
        return None if self.up_at is None else self.up_at - self.down_at


def down_episodes(events: Iterable[Mapping[str, Any]]) -> list[Episode]:
    """The down episodes in the agents' port events (dicts with host, hca, port, seq,
    current, at), each host's in journal order: a port goes down on an event to ``down``
    from another status, comes back on its next event that leaves ``down``."""
    out: list[Episode] = []
    open_: dict[tuple[str, str, int], tuple[float, int]] = {}
    for e in sorted(events, key=lambda e: (e["host"], e["journal"], e["seq"])):
        key = (e["host"], e["hca"], int(e["port"]))
        if e["current"] == "down" and key not in open_ and e["previous"] not in ("down", "unknown"):
            open_[key] = (float(e["at"]), int(e["seq"]))
        elif e["current"] != "down" and key in open_:
            at, seq = open_.pop(key)
            out.append(Episode(*key, at, float(e["at"]), seq))
    out += [Episode(*k, at, None, seq) for k, (at, seq) in open_.items()]
    return sorted(out, key=lambda ep: ep.down_at)


#: how many partial assignments :func:`outage_problems` tries before it judges the greedy one
SEARCH_LIMIT = 200_000


def _outage_faults(o: Mapping[str, Any], eps: list[Episode]) -> list[str]:
    """What is wrong with outage ``o`` holding the episodes ``eps`` (nothing: it is right)."""
    oid = int(o["id"])
    if not eps:
        return [f"outage {oid} at {o['at']:.3f}: no port of it went down then (invented or "
                "reported twice)"]  # fmt: skip
    out = []
    start = min(ep.down_at for ep in eps)
    if abs(o["at"] - start) > TIME_TOLERANCE_S:
        out.append(f"outage {oid}: starts at {o['at']:.3f}, its first port went down at "
                   f"{start:.3f} (the agent's time)")  # fmt: skip
    lengths = [ep.length_s for ep in eps]
    if None in lengths:
        if not o["open"]:
            out.append(f"outage {oid}: closed, but a port of it is still down")
        return out
    longest = max(x for x in lengths if x is not None)
    if o["open"] or abs(float(o["down_s"]) - longest) > TIME_TOLERANCE_S:
        out.append(f"outage {oid}: down_s {o['down_s']} (open {o['open']}), its longest "
                   f"port episode lasted {longest:.3f} s")  # fmt: skip
    return out


def _consistent(
    eps: list[Episode], choices: list[list[int]], by_id: Mapping[int, Mapping[str, Any]]
) -> dict[int, list[Episode]] | None:
    """An assignment of ``eps[i]`` to one of ``choices[i]`` (outage ids) under which every
    outage of ``by_id`` is right (:func:`_outage_faults`), or None (none within
    :data:`SEARCH_LIMIT` tries). Depth first; a branch ends as soon as an outage holds an
    episode longer than its ``down_s`` or still down while it is closed."""
    mine: dict[int, list[Episode]] = {oid: [] for oid in by_id}
    budget = [SEARCH_LIMIT]

    def fits(o: Mapping[str, Any], ep: Episode) -> bool:
        n = ep.length_s
        if n is None:
            return bool(o["open"])
        return bool(o["open"]) or n <= float(o["down_s"]) + TIME_TOLERANCE_S

    def walk(i: int) -> bool:
        if i == len(eps):
            return all(not _outage_faults(o, mine[oid]) for oid, o in by_id.items())
        for oid in choices[i]:
            budget[0] -= 1
            if budget[0] < 0:
                return False
            if fits(by_id[oid], eps[i]):
                mine[oid].append(eps[i])
                if walk(i + 1):
                    return True
                mine[oid].pop()
        return False

    return mine if walk(0) else None


def outage_problems(
    episodes: list[Episode],
    outages: list[Mapping[str, Any]],
    outage_ports: Iterable[tuple[int, str, str, int]],
) -> list[str]:
    """``linkguard report``'s ``outages`` (id, at, down_s, open) against the agents' down
    episodes, with the ledger's ``outage_ports`` (outage id, host, hca, port): each episode is
    in exactly one outage holding its port, each outage holds at least one episode (none is
    invented or reported twice), starts at its first episode's down (the agent's time) and
    lasts its longest episode. The ledger does not record which outage each episode of a
    port joined (a port down twice may be in two outages, and the ledger joins a down to the
    open outage whose first down was at most ``incident_window_s`` before or after it, even
    one started before the port's own last one), so the check passes when some assignment
    of the episodes to outages of their ports started at or before them makes every outage
    right. Where none does, the problems are named for the simple assignment: each episode in
    the outage of its port that started last at or before it (else the nearest one)."""
    ports: dict[int, set[tuple[str, str, int]]] = {}
    for oid, host, hca, port in outage_ports:
        ports.setdefault(int(oid), set()).add((host, hca, int(port)))
    by_id = {int(o["id"]): o for o in outages}
    out = []
    eps: list[Episode] = []
    choices: list[list[int]] = []
    for ep in sorted(episodes, key=lambda e: e.down_at):
        key = (ep.host, ep.hca, ep.port)
        have = [o for o in by_id.values() if key in ports.get(int(o["id"]), ())]
        if not have:
            out.append(f"{ep.host} {ep.hca}/{ep.port} down at {ep.down_at:.3f}: in no outage")
            continue
        before = [o for o in have if o["at"] <= ep.down_at + TIME_TOLERANCE_S]
        ranked = sorted(before, key=lambda o: -o["at"]) or [
            min(have, key=lambda o: abs(o["at"] - ep.down_at))  # started late: named below
        ]
        eps.append(ep)
        choices.append([int(o["id"]) for o in ranked])
    found = _consistent(eps, choices, by_id) if not out else None
    if found is None:
        found = {oid: [] for oid in by_id}
        for ep, ids in zip(eps, choices, strict=True):
            found[ids[0]].append(ep)
    for oid, o in sorted(by_id.items()):
        out += _outage_faults(o, found[oid])
    return out
