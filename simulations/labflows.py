"""The UDP flows of a namespace-lab replay (:mod:`linkguard.simulations.labrun`): which flows a
scenario gets, and the gap a fault leaves in each.

Consumes: the fabric, the (host, rail) ports a scenario faults, and the flow records
(:class:`~linkguard.simulations.labprocs.Flow`: arrivals as (sequence, monotonic s)). Produces:
the flows to start (:func:`choose_flows`: :class:`~linkguard.simulations.labprocs.FlowSpec`
and a role) and per flow and fault the longest silence (ms), the datagrams lost around it and
whether it resumed (:func:`flow_gap`). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from ipaddress import IPv4Address

from linkguard.simulations.labprocs import Flow, FlowSpec
from linkguard.topology.fabric import Fabric

__all__ = [
    "FLOW_INTERVAL_MS",
    "FLOW_PORT_BASE",
    "MAX_TARGETS",
    "choose_flows",
    "endpoint_on",
    "flow_gap",
    "flow_spec",
    "home_rail",
]

#: UDP ports: flows from FLOW_PORT_BASE on (the probe echo is on labreach's PROBE_PORT).
FLOW_PORT_BASE = 46000
#: At most this many (host, rail) targets get flows (two each).
MAX_TARGETS = 16
#: One datagram per flow this often (ms): the resolution of a measured gap.
FLOW_INTERVAL_MS = 2.0


def flow_spec(fl: Flow) -> FlowSpec:
    """What ``fl`` carries (every flow a run starts has its spec)."""
    assert fl.spec is not None
    return fl.spec


def home_rail(fabric: Fabric, ep: IPv4Address) -> int | None:
    """The rail whose endpoint subnet holds ``ep`` (None: none does)."""
    for r, net in fabric.endpoint_subnets.items():
        if ep in net:
            return r
    return None


def endpoint_on(fabric: Fabric, host: str, rail: int) -> IPv4Address | None:
    """``host``'s endpoint whose home rail is ``rail`` (None: it has none there)."""
    for ep in fabric.host(host).endpoints:
        if home_rail(fabric, ep) == rail:
            return ep
    return None


def _su_of(fabric: Fabric) -> dict[str, int]:
    sus = {s.name: s.su for s in fabric.switches}
    out: dict[str, int] = {}
    for link in fabric.links:
        if link.kind == "host-leaf":
            port, leaf = (link.a, link.b) if ":" in link.a else (link.b, link.a)
            su = sus.get(leaf)
            if su is not None:
                out.setdefault(port.split(":", 1)[0], su)
    return out


def choose_flows(fabric: Fabric, targets: Iterable[tuple[str, int]]) -> list[tuple[FlowSpec, str]]:
    """Flows for the (host, rail) ``targets`` a scenario faults: per target, one flow to its
    endpoint on that rail and one from it, with a peer whose port on that rail is not a
    target (in another SU when there is one), plus one control flow between two hosts on a
    rail no target touches. Returns (spec, role) with role "to", "from" or "control"."""
    names = fabric.host_names
    su = _su_of(fabric)
    tset = sorted(set(targets), key=lambda t: (names.index(t[0]), t[1]))[:MAX_TARGETS]
    hit = set(tset)
    touched = {h for h, _ in tset}
    out: list[tuple[FlowSpec, str]] = []
    port = FLOW_PORT_BASE
    uses: dict[str, int] = {}
    for host, rail in tset:
        i = names.index(host)
        order = names[i + 1 :] + names[:i]
        cands = [p for p in order if (p, rail) not in hit] or order
        cands.sort(key=lambda p: (su.get(p) == su.get(host), p in touched, uses.get(p, 0)))
        if not cands:
            continue
        peer = cands[0]
        uses[peer] = uses.get(peer, 0) + 1
        mine, theirs = endpoint_on(fabric, host, rail), endpoint_on(fabric, peer, rail)
        if mine is None or theirs is None:
            continue
        out.append((FlowSpec(peer, theirs, host, mine, port), "to"))
        out.append((FlowSpec(host, mine, peer, theirs, port + 1), "from"))
        port += 2
    for rail in sorted(fabric.rails):
        free = [h for h in names if (h, rail) not in hit and h not in touched] or [
            h for h in names if (h, rail) not in hit
        ]
        if len(free) >= 2:
            a, b = free[0], free[-1]
            ea, eb = endpoint_on(fabric, a, rail), endpoint_on(fabric, b, rail)
            if ea is not None and eb is not None:
                out.append((FlowSpec(a, ea, b, eb, port), "control"))
                break
    return out


def flow_gap(flow: Flow, t_from: float, t_to: float, t_end: float) -> tuple[float, int, bool]:
    """(longest silence in ms that ends after ``t_from`` and starts before ``t_to``, datagrams
    lost around it, resumed); an unresumed flow's silence runs until ``t_end``. Times are
    monotonic seconds, as the flow records them; the gap is NaN when fewer than two datagrams
    surround it (nothing to measure)."""
    rows = sorted((ts, seq) for seq, ts in flow.arrivals())
    best: tuple[float, int, int] | None = None  # (gap s, index of a, index of b)
    prev: tuple[float, int] | None = None
    for k, (ts, _) in enumerate(rows):
        if prev is not None and ts >= t_from and rows[prev[1]][0] <= t_to:
            g = ts - rows[prev[1]][0]
            if best is None or g > best[0]:
                best = (g, prev[1], k)
        prev = (ts, k)
    last_before = max((k for k, (ts, _) in enumerate(rows) if ts <= t_to), default=None)
    if last_before is not None and last_before == len(rows) - 1:
        g = t_end - rows[last_before][0]  # silent from there to the end
        if best is None or g > best[0]:
            return g * 1000, -1, False
    if best is None:
        return float("nan"), -1, True
    g, a, b = best
    lost = rows[b][1] - rows[a][1] - 1
    return g * 1000, max(lost, 0), True
