"""The fleet report: what a generated fault timeline costs a training job, per transport, with
and without linkguard.

Consumes: a :class:`~linkguard.simulations.failures.FleetTimeline` and the engine's
:class:`~linkguard.simulations.engine.RunReport` of it. Produces: a :class:`FleetReport`
(:func:`fleet_report`) with a JSON form, a text table per transport and a PNG plot
(:func:`plot`). :func:`simulate` does it all: generate, replay, report.

An *outage* is one down transition of one timeline entry (a link going down, one down of a flap, a
leaf reboot taking its ports down); its length is the longest down episode of the ports it took down
(clipped at the end of the run), and it keeps each port's own episode and when linkguard used the
port again (the engine's re-admissions: hold-down and suppression). The pricing per transport
(``ip``, ``nccl-ib``, ``nccl-ib-failover``) is :mod:`linkguard.transportcost`'s, shared with
``linkguard report``; fused pairs come from each host's layout as ``linkguard nccl env --profile
failover`` forms them.

Clocks: every time here is on the simulated clock. The engine's time to reroute is the
service's solve back-off (solving, publishing and applying take no simulated time), so each
reroute is charged at least ``reroute_floor_s``, the lab's data-plane gap; only ``wall_s`` is
wall-clock time (how long the simulation took).
"""

from __future__ import annotations

import bisect
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypedDict

from linkguard.costreport import cost_rows, model_dict, quantiles, reroute_lines, transport_lines
from linkguard.failuremodel import FailureModel
from linkguard.jobcost import COMMON_ASSUMES, TRANSPORTS, Cost, Link, Outage, fused_rails, needless
from linkguard.simulations.engine import WALL0, PortReturn, RunReport, return_rail, run
from linkguard.simulations.failures import FleetTimeline, expected_counts, fleet_scenario
from linkguard.simulations.scenario import Event, Expect, GenerateSpec, LoadedScenario, expand
from linkguard.topology.fabric import Fabric, home_rails
from linkguard.topology.solver import Solver, nic_load
from linkguard.transportcost import PricedTransports, TransportCost, price_transports

__all__ = [
    "REPORT_SCHEMA",
    "Cost",
    "FleetReport",
    "Outage",
    "cost_rows",
    "fleet_report",
    "fused_of",
    "outages",
    "plot",
    "quantiles",
    "simulate",
    "stderr_progress",
]

#: The ``schema`` of :meth:`FleetReport.to_dict`. v2 (v1: one "follows the rail map" price):
#: ``transports`` has each transport's costs and assumptions; ``transport`` names the one the
#: top-level ``with_linkguard`` / ``without_linkguard`` repeat (the one asked for; ``ip`` when
#: all are); ``needless_reroutes`` counts reroutes that landed after their link was back.
REPORT_SCHEMA = "linkguard.fleet-report/v2"


def outages(loaded: LoadedScenario, events: list[Event] | None = None) -> list[Outage]:
    """The down transitions of ``loaded``'s timeline (``events``: its :func:`expand`, given to
    save the work), in time order, without ``reroute_ms``."""
    events = expand(loaded) if events is None else events
    fabric, sc = loaded.fabric, loaded.scenario
    end = sc.duration_s
    rails_of = {h.host: len(h.hcas) for h in fabric.hosts}
    down_rails: dict[str, set[int]] = {}
    since: dict[tuple[str, int], tuple[float, tuple[int, float]]] = {}
    episodes: dict[tuple[int, float], list[tuple[str, int, float]]] = {}
    isolated: set[tuple[int, float]] = set()
    opened: set[tuple[int, float]] = set()
    i = 0
    while i < len(events):
        key = (events[i].entry, events[i].at_s)
        touched: set[str] = set()
        while i < len(events) and (events[i].entry, events[i].at_s) == key:
            e = events[i]
            i += 1
            if not e.kind.startswith("port_"):
                continue
            assert e.host is not None and e.rail is not None
            port = (e.host, e.rail)
            if e.kind == "port_down":
                if port not in since:
                    since[port] = (e.at_s, key)
                    down_rails.setdefault(e.host, set()).add(e.rail)
                    episodes.setdefault(key, [])
                    touched.add(e.host)
            elif port in since:
                t0, cause = since.pop(port)
                down_rails[e.host].discard(e.rail)
                episodes[cause].append((e.host, e.rail, e.at_s - t0))
        if any(len(down_rails[h]) >= rails_of[h] for h in touched):
            isolated.add(key)
    for (host, rail), (t0, cause) in since.items():
        episodes[cause].append((host, rail, end - t0))
        opened.add(cause)
    return [
        Outage(
            entry=k[0],
            kind=sc.timeline[k[0]].kind,
            at_s=k[1],
            down_s=round(max(x[2] for x in d), 6),
            ports=len(d),
            open=k in opened,
            isolated=k in isolated,
            links=tuple(Link(h, r, round(x, 6)) for h, r, x in sorted(d)),
        )
        for k, d in sorted(episodes.items(), key=lambda x: (x[0][1], x[0][0]))
    ]


def _with_returns(o: Outage, returns: dict[tuple[str, int], list[float]], end: float) -> Outage:
    """``o`` with each port's ``out_s``: until its first return to use (the engine's
    ``returns``) at or after it was up again; a port never back in use by ``end`` is out until
    then."""
    links = []
    for x in o.links:
        up = o.at_s + x.down_s
        times = returns.get((x.host, x.rail), [])
        k = bisect.bisect_left(times, up - 1e-9)
        back = times[k] if k < len(times) else end
        links.append(replace(x, out_s=round(max(back - o.at_s, x.down_s), 6)))
    return replace(o, links=tuple(links))


def fused_of(fabric: Fabric) -> Callable[[str, int], tuple[int, ...]]:
    """(host, rail) -> the rails of its fused NIC, as ``nccl env --profile failover`` fuses
    each host's ports (:func:`linkguard.jobcost.fused_rails`; hosts with the same layout share
    one computation)."""
    by_layout: dict[tuple, dict[int, tuple[int, ...]]] = {}
    of_host: dict[str, dict[int, tuple[int, ...]]] = {}
    for h in fabric.hosts:
        sig = tuple((c.rail, c.link_layer, c.numa_node, c.pcie_switch) for c in h.hcas)
        if sig not in by_layout:
            by_layout[sig] = fused_rails(h)
        of_host[h.host] = by_layout[sig]
    return lambda host, rail: of_host.get(host, {}).get(rail, (rail,))


class WorstNicLoad(TypedDict):
    """:func:`worst_nic_load`'s answer."""

    host: str
    at_s: float
    rails_down: list[int]
    load: dict[str, float]
    max_load: float
    baseline_max: float
    ratio: float | None


def worst_nic_load(loaded: LoadedScenario, found: list[Outage]) -> WorstNicLoad | None:
    """NIC load (:func:`~linkguard.topology.solver.nic_load`: peer endpoints a host sends out
    of each local rail) at the worst moment: the outage after which one host had the most
    rails down. The plans are re-solved from the ports the scenario had down then (ports held
    down by damping at that moment are not included). None when nothing went down. Keys:
    ``host``, ``at_s``, ``rails_down``, ``load`` (rail -> endpoints), ``max_load``,
    ``baseline_max`` (the same host with every rail up) and ``ratio``."""
    if not found:
        return None
    events = expand(loaded)
    down: set[tuple[str, int]] = set()
    best: tuple[int, float, str, frozenset[tuple[str, int]]] | None = None
    wanted = {(o.entry, o.at_s) for o in found}
    for e in events:
        if e.kind == "port_down":
            down.add(e.port_key)
        elif e.kind == "port_up":
            down.discard(e.port_key)
        else:
            continue
        if (e.entry, e.at_s) in wanted and e.kind == "port_down":
            per_host = Counter(h for h, _ in down)
            host, n = min(per_host.items(), key=lambda x: (-x[1], x[0]))
            if best is None or n > best[0]:
                best = (n, e.at_s, host, frozenset(down))
    if best is None:
        return None
    n, at_s, host, snapshot = best
    fabric = loaded.fabric
    unusable: dict[str, set[int]] = {}
    for h, r in snapshot:
        unusable.setdefault(h, set()).add(r)
    per_rail = Counter(r for p in fabric.hosts if p.host != host for r in home_rails(p))
    baseline = Solver(fabric, {}).plan(host, epoch=1, now=WALL0)
    solver = Solver(fabric, {h: frozenset(r) for h, r in unusable.items()})
    load = nic_load(solver.plan(host, epoch=1, now=WALL0), per_rail)
    base = max(nic_load(baseline, per_rail).values(), default=0.0)
    top = max(load.values(), default=0.0)
    return {
        "host": host,
        "at_s": at_s,
        "rails_down": sorted(unusable[host]),
        "load": {str(k): round(v, 3) for k, v in load.items()},
        "max_load": round(top, 3),
        "baseline_max": round(base, 3),
        "ratio": round(top / base, 4) if base else None,
    }


@dataclass
class FleetReport(PricedTransports):
    """One fleet run (module docstring). :meth:`to_dict` is the JSON form (schema
    :data:`REPORT_SCHEMA`), :meth:`text` a table per transport. ``transports``: transport ->
    its costs (:class:`~linkguard.transportcost.TransportCost`), in the order printed;
    ``transport``: the one :attr:`with_linkguard` / :attr:`without_linkguard` repeat.
    ``returns``: the engine's ports back in use (``{host, rail, at_s}``; the ledger records
    them)."""

    hosts: int
    rails: int
    gpus: int
    duration_s: float
    seed: int
    model: FailureModel
    counts: dict[str, int]
    expected: dict[str, float]
    dropped: int
    entries: int
    events: int
    outages: list[Outage]
    transports: dict[str, TransportCost]
    reroutes: int
    solves: int
    time_to_reroute_ms: dict[str, float | int | None]
    needless_reroutes: int
    worst_nic_load: WorstNicLoad | None
    oracle: dict[str, object]
    wall_s: float | None = None
    returns: list[PortReturn] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, object]:
        m = self.model
        return {
            "schema": REPORT_SCHEMA,
            "fabric": {"hosts": self.hosts, "rails": self.rails, "gpus": self.gpus},
            "duration_s": self.duration_s,
            "days": self.duration_s / 86400,
            "seed": self.seed,
            "model": model_dict(m)
            | {
                "leaf_reboots_per_gpu_day": m.leaf_reboot_rate * 86400,
                "nic_losses_per_gpu_day": m.nic_loss_rate * 86400,
                "link_faults_per_link_day": m.link_fault_rate * 86400,
            },
            "faults": {
                "counts": self.counts,
                "expected": {k: round(v, 4) for k, v in self.expected.items()},
                "dropped": self.dropped,
                "timeline_entries": self.entries,
                "events": self.events,
                "outages": len(self.outages),
            },
            "transport": self.transport,
            "with_linkguard": self.with_linkguard.to_dict(),
            "without_linkguard": self.without_linkguard.to_dict(),
            "transports": {k: v.to_dict() for k, v in self.transports.items()},
            "assumes": COMMON_ASSUMES,
            "reroutes": self.reroutes,
            "solves": self.solves,
            "time_to_reroute_ms": self.time_to_reroute_ms,
            "needless_reroutes": self.needless_reroutes,
            "worst_nic_load": self.worst_nic_load,
            "oracle": self.oracle,
            "wall_s": self.wall_s,
            "outages": [o.to_dict() for o in self.outages],
        }

    def text(self) -> str:
        days = self.duration_s / 86400
        kinds = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in self.counts.items())
        lines = [
            f"fleet: {self.hosts} hosts x {self.rails} rails ({self.gpus:,} GPUs), {days:g} days, "
            f"seed {self.seed}: {kinds} ({self.dropped} dropped as overlapping), "
            f"{len(self.outages)} outages"
        ]
        for tc in self.transports.values():
            lines += transport_lines(tc)
        lines += reroute_lines(
            rerouted=sum(1 for o in self.outages if o.reroute_ms is not None),
            held=sum(1 for o in self.outages if o.reroute_ms is None and not o.isolated),
            model=self.model,
            ttr=self.time_to_reroute_ms,
            needless_count=self.needless_reroutes,
            changes=f"{self.reroutes} plan changes in {self.solves} solves (moving traffic off "
            "a down or back after a hold-down)",
            clock="simulated clock: the service's solve back-off; solving, publishing and "
            "applying take no simulated time",
        )
        n = self.worst_nic_load
        lines.append(
            f"  worst NIC load: {n['host']} with rails {n['rails_down']} down (day "
            f"{n['at_s'] / 86400:.2f}): {n['max_load']:g} peer endpoints on its busiest NIC vs "
            f"{n['baseline_max']:g} with all rails up"
            + (f" ({n['ratio']:g}x)" if n["ratio"] is not None else "")
            if n
            else "  worst NIC load: no outage"
        )
        o = self.oracle
        lines.append(
            f"  oracle: {o['settles']} settles, {o['mismatches']} mismatches"
            if o["run"]
            else "  oracle: not run (--oracle to check reachability after every solve)"
        )
        lines += textwrap.wrap(
            f"all transports assume: {COMMON_ASSUMES} (restart_s {self.model.restart_s:g} s, "
            f"checkpoint interval {self.model.checkpoint_interval_s:g} s)",
            96,
            initial_indent="  ",
            subsequent_indent="    ",
        )
        if self.wall_s is not None:
            lines.append(f"  wall time {self.wall_s:.1f} s (the simulation's own run time)")
        return "\n".join(lines) + "\n"


def fleet_report(
    timeline: FleetTimeline,
    report: RunReport,
    *,
    wall_s: float | None = None,
    transports: Iterable[str] = TRANSPORTS,
) -> FleetReport:
    """Combine the generated ``timeline`` and the engine's ``report`` of it (module
    docstring), pricing ``transports`` (ValueError for an unknown one)."""
    loaded, model = timeline.loaded, timeline.model
    sc, fabric = loaded.scenario, loaded.fabric
    events = expand(loaded)
    timing = {(f.entry, f.at_s): f.reroute_ms for f in report.faults}
    returns: dict[tuple[str, int], list[float]] = {}
    for r in report.returns:
        returns.setdefault((str(r["host"]), return_rail(r)), []).append(float(r["at_s"]))
    for times in returns.values():
        times.sort()
    found = [
        _with_returns(replace(o, reroute_ms=timing.get((o.entry, o.at_s))), returns, sc.duration_s)
        for o in outages(loaded, events)
    ]
    gpus = sum(len(h.endpoints) for h in fabric.hosts)
    priced = price_transports(
        found,
        model,
        gpus=gpus,
        duration_s=sc.duration_s,
        transports=transports,
        fused=fused_of(fabric),
    )
    rerouted = [o.reroute_ms for o in found if o.reroute_ms is not None]
    return FleetReport(
        hosts=len(fabric.hosts),
        rails=len(fabric.rails),
        gpus=gpus,
        duration_s=sc.duration_s,
        seed=sc.seed,
        model=model,
        counts=timeline.counts,
        expected=expected_counts(model, fabric, sc.duration_s),
        dropped=timeline.dropped,
        entries=len(sc.timeline),
        events=len(events),
        outages=found,
        transports=priced,
        reroutes=report.reroutes,
        solves=report.solves,
        time_to_reroute_ms=quantiles(rerouted),
        needless_reroutes=sum(1 for o in found if needless(o, model)),
        worst_nic_load=worst_nic_load(loaded, found),
        oracle={
            "run": sc.expect.reachability,
            "settles": report.settles,
            "mismatches": report.mismatch_count,
            "first": report.mismatches[:5],
        },
        wall_s=wall_s,
        returns=list(report.returns),
    )


def plot(rep: FleetReport, path: Path | str) -> None:
    """Write a PNG to ``path``: cumulative idled GPU-hours over the run with and without
    linkguard, per transport priced, and every outage's length against NCCL's budget and one
    RC retransmit timeout (the fail-fast policy's wait). Raises OSError when the file cannot be
    written."""
    import matplotlib  # lazy: only --plot draws (matplotlib takes ~1 s to import)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = rep.duration_s / 86400
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {"ip": "tab:green", "nccl-ib": "tab:red", "nccl-ib-failover": "tab:blue"}
    curves = [
        (c, f"{t} {side}", colors.get(t, "tab:gray"), style)
        for t, tc in rep.transports.items()
        for c, side, style in (
            (tc.without_linkguard, "without", ":"),
            (tc.with_linkguard, "with linkguard", "-"),
        )
    ]
    for cost, label, color, style in curves:
        xs, ys, total = [0.0], [0.0], 0.0
        for a, b in sorted(cost.intervals):
            xs += [a / 86400, b / 86400]
            ys += [total, total + (b - a) * rep.gpus / 3600]
            total = ys[-1]
        xs.append(days)
        ys.append(total)
        ax1.plot(xs, ys, label=f"{label}: {total:,.0f} GPU-h", color=color, ls=style)
    ax1.set_xlabel("day")
    ax1.set_ylabel("idled GPU-hours (cumulative)")
    ax1.set_title(f"{rep.hosts} hosts x {rep.rails} rails, {days:g} days, seed {rep.seed}")
    ax1.legend(loc="upper left", fontsize="small")
    ax1.grid(alpha=0.3)
    markers = {"link_down": "o", "flap": "x", "leaf_reboot": "s"}
    for kind, marker in markers.items():
        sel = [o for o in rep.outages if o.kind == kind]
        if sel:
            ax2.scatter(
                [o.at_s / 86400 for o in sel],
                [max(o.down_s, 1e-3) for o in sel],
                marker=marker,
                label=f"{kind} ({len(sel)})",
            )
    ax2.set_yscale("log")
    ax2.axhline(rep.model.nccl_budget_s, color="tab:red", ls="--", label="NCCL budget")
    ax2.axhline(rep.model.grace_s, color="tab:gray", ls=":", label="fail-fast wait")
    ax2.set_xlim(0, days)
    ax2.set_xlabel("day")
    ax2.set_ylabel("outage length (s)")
    ax2.set_title("outages (link downs include NIC losses)")
    ax2.legend(loc="best", fontsize="small")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


def simulate(
    spec: GenerateSpec,
    *,
    duration_s: float,
    seed: int,
    model: FailureModel | None = None,
    oracle: bool = False,
    progress: Callable[[str], None] | None = None,
    transports: Iterable[str] = TRANSPORTS,
) -> tuple[FleetTimeline, FleetReport]:
    """Generate a fault timeline (:func:`~linkguard.simulations.failures.fleet_scenario`),
    replay it through the engine (with the oracle after every solve when ``oracle``) and
    report on ``transports``. ``progress`` gets a line per phase. Raises ValueError for bad
    parameters."""
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    say(f"generating {spec.hosts} x {spec.rails} fabric and fault timeline")
    ft = fleet_scenario(spec, duration_s=duration_s, seed=seed, model=model)
    sc = ft.loaded.scenario.model_copy(update={"expect": Expect(reachability=oracle)})
    ft = replace(ft, loaded=replace(ft.loaded, scenario=sc))
    say(
        f"replaying {len(sc.timeline)} timeline entries through the engine"
        + (" with the oracle" if oracle else "")
    )

    def replayed(t: float) -> None:
        done = t / duration_s if duration_s else 1.0
        bar = "#" * round(done * 20)
        say(f"replay [{bar:<20}] {done:4.0%} (day {t / 86_400:.1f} of {duration_s / 86_400:g})")

    report = run(ft.loaded, progress=replayed if progress else None)
    say("costing outages, re-solving the worst moment")
    rep = fleet_report(ft, report, transports=transports)
    rep.wall_s = round(time.perf_counter() - t0, 3)
    return ft, rep


def stderr_progress(enabled: bool | None = None) -> Callable[[str], None] | None:
    """A progress callback writing ``fleet: <phase> (<elapsed> s)`` lines to stderr, or None
    when ``enabled`` is False (None: only when stderr is a terminal)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return None
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        print(f"fleet: {msg} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)

    return say
